"""CSV files safe to open in a spreadsheet: a text cell a spreadsheet would run as a formula gets a leading
apostrophe (`neutralize`); numbers stay numbers, and so does text that is a plain number (``"-4"``). Every CSV
the workbench writes for people to open (the report's tables, ``compare --csv``) goes through `safe_csv`,
because a cell's text comes from run folders, tables and notebooks that anyone may have written (a parameter
value ``=HYPERLINK(...)`` is a click away from running). Imports no pandas at import time."""
from __future__ import annotations

import datetime
import decimal
import numbers
import re
from pathlib import Path
from typing import Any

# what starts a formula in Excel, LibreOffice or Google Sheets (OWASP's list), and the full-width forms some of
# them read as the same
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r", "\n", "\uff1d", "\uff0b", "\uff0d", "\uff20")
QUOTE = "'"


# a plain decimal number written as text ("-4", a parameter compare spelled as text): a spreadsheet reads it as
# the number, exactly as it reads a float column's "-4.0", so it is left as it is
PLAIN_NUMBER = re.compile(r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?", re.ASCII)


def risky(text: str) -> bool:
    """Whether a spreadsheet may read ``text`` as a formula: it starts with one of FORMULA_STARTS, or does so
    after leading blanks (some spreadsheets trim them before parsing), and is not a plain number."""
    starts = text.startswith(FORMULA_STARTS) or text.lstrip(" \u00a0\u3000\v\f").startswith(FORMULA_STARTS)
    return starts and PLAIN_NUMBER.fullmatch(text) is None


def neutral_text(text: str) -> str:
    """``text`` with a leading apostrophe where `risky`, unchanged otherwise."""
    return QUOTE + text if risky(text) else text


def neutral_cell(v: Any) -> Any:
    """A cell as written safely: text neutralized (`neutral_text`); numbers, booleans, dates and missing values
    unchanged (a negative float stays a number); any other object as its text, neutralized, since the CSV writer
    would write its text anyway."""
    if isinstance(v, str):
        return neutral_text(v)
    if v is None or isinstance(v, (numbers.Number, decimal.Decimal, datetime.date, datetime.time,
                                   datetime.timedelta)):
        return v
    import pandas as pd
    if v is pd.NA or v is pd.NaT or isinstance(v, (pd.Timestamp, pd.Timedelta, pd.Period, pd.Interval)):
        return v
    if hasattr(v, "dtype") and getattr(v, "ndim", None) == 0:      # a numpy scalar: a number, a date or a bool
        return v if v.dtype.kind in "biufcmM" else neutral_text(str(v))
    if isinstance(v, bytes):
        return neutral_text(v.decode("utf-8", errors="replace"))
    return neutral_text(str(v))


def neutralize(df):
    """A copy of ``df`` with every text cell and column name neutralized (`neutral_cell`); numeric, boolean and
    date columns are kept as they are, so they stay numeric in the file and when read back."""
    out = df.copy()
    for i in range(df.shape[1]):                   # by position: two columns may share a name
        s = df.iloc[:, i]
        if s.dtype.kind in "biufcmM":               # numbers, booleans, dates: nothing a spreadsheet runs
            continue
        out.isetitem(i, s.astype(object).map(neutral_cell).astype(object))
    out.columns = [neutral_cell(c) if isinstance(c, str) else c for c in df.columns]
    return out


def safe_csv(df, path: str | Path | None = None) -> str | None:
    """``df.to_csv(path, index=False)`` after `neutralize`: the text where ``path`` is None, else None. Lines end
    in CRLF (RFC 4180), which makes the writer quote every cell holding a carriage return: with pandas' "\n" a
    bare "\r" is written unquoted, and a reader splits the row there, so ``"\r=1+1"`` would become a cell
    ``=1+1`` of its own, past the apostrophe."""
    return neutralize(df).to_csv(path, index=False, lineterminator="\r\n")
