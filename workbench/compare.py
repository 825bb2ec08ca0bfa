"""Compare two runs (`compare_runs`): every metric both measured, cell by cell, with the ratio and what changed
(`_flag`); ``python -m workbench compare`` prints it (`compare_command`). It never compares unlike things
silently: a metric whose unit differs is flagged not comparable and never ratioed, a verdict (unit bool) is
compared as a verdict and never ratioed, a metric whose values are not numbers (text, booleans outside a verdict)
is left out and named (`not_numbers`), a parameter column one run lacks is named with the other's values (rows
then matched on the common columns), and a table that cannot be read is an error naming the file. Its CSV is
safe to open (workbench.csvsafe). Imports no torch."""
from __future__ import annotations

import math
import os
import sys
from pathlib import Path
from typing import Any, Iterable, Mapping

from .csvsafe import safe_csv
from .files import atomic_write_text, open_regular
from .provenance import results_folder
from .results import META_NAME, RunNotFound, file_problem, holds_run
from .results import resolve_run as store_resolve

ADDED_COLUMNS = ("run", "reference", "run_date")       # what the report adds to a study table
# not part of a cell's identity: a run on another device, or with another attention backend (FlashAttention-4
# against torch's flash) or MLP GEMM (quack against cuBLAS), is what a comparison is for
NOT_KEYS = ("device", "attention", "gemm", "note", "value", "unit")
# the kernels a run resolved to, which a comparison names where the two runs differ (not cell keys: NOT_KEYS)
KERNEL_COLUMNS = {"attention": "attention", "gemm": "MLP gemm"}
TIME_UNITS = ("us", "ms", "s")
VERDICT_UNIT = "bool"
LATEST = "latest"
CSV_SIGNATURE = ",metric,unit,a,b,ratio,flag"          # how the header of a CSV compare wrote ends
VALUE_COLUMNS = ("metric", "unit", "a", "b", "ratio", "flag")
# rows a match on fewer columns than a table has (a parameter column one run lacks) may pair: beyond it, refused
MAX_PAIRS = 2_000_000
NOT_COMPARABLE = "not comparable"


class CompareError(ValueError):
    """A run that cannot be found or read; the message names it and says what was looked for."""


class BadArgument(CompareError):
    """A study neither run holds, or a place compare may not write its CSV; the message says what is valid."""


def resolve_run(spec: str | Path, results: str | Path | None = None) -> Path:
    """The run folder ``spec`` names (`workbench.results.resolve_run`: a folder, a folder name under ``results`` or
    its reference/, or ``latest``); CompareError listing what was tried otherwise."""
    try:
        return store_resolve(spec, results, latest=LATEST)
    except (RunNotFound, ValueError) as e:      # ValueError: an empty spec or results ("" is no folder)
        raise CompareError(str(e)) from None


def param_columns(table) -> list[str]:
    """The columns that say which cell a row measured: those before ``metric``, less NOT_KEYS and ADDED_COLUMNS."""
    cols = list(table.columns)
    head = cols[:cols.index("metric")] if "metric" in cols else cols
    return [c for c in head if c not in ADDED_COLUMNS and c not in NOT_KEYS]


def _key(v: Any) -> str:
    """One spelling per parameter value: 4 and 4.0 alike, every missing value alike."""
    import pandas as pd
    if hasattr(v, "item") and not isinstance(v, (str, bytes)):
        v = v.item()                                   # a numpy scalar
    if v is None or v is pd.NA or v is pd.NaT or (isinstance(v, float) and math.isnan(v)):
        return "-"
    return str(int(v)) if isinstance(v, float) and v.is_integer() else str(v)


def spread_names(metric: str) -> tuple[str, str] | None:
    """(p10 name, p90 name) beside a median timing: ``p50_ms`` -> (``p10_ms``, ``p90_ms``), ``staging_us`` ->
    (``staging_p10_us``, ``staging_p90_us``); None for a name that is itself a percentile or has no time unit."""
    if metric.startswith("p50_"):
        return "p10_" + metric[4:], "p90_" + metric[4:]
    base, _, unit = metric.rpartition("_")
    if not base or unit not in TIME_UNITS or base.endswith(("_p10", "_p90")) or base in ("p10", "p90"):
        return None
    return f"{base}_p10_{unit}", f"{base}_p90_{unit}"


def _present(table) -> list[str]:
    """The parameter columns of ``table`` that hold a value in some row: a column with none (the report's
    concatenated tables give a run the columns only other runs recorded) is one this side lacks."""
    return [c for c in param_columns(table) if table[c].notna().any()]


def _some_values(values: Iterable[str], shown: int = 8) -> str:
    vals = sorted(set(values))
    more = f", ... ({len(vals)} in all)" if len(vals) > shown else ""
    return ", ".join(map(repr, vals[:shown])) + more


def one_side_label(col: str, side: str) -> str:
    """The output column of a parameter only run ``side`` records: its name says which run has it."""
    return f"{col} ({side} only)"


def column_lines(diffs: Iterable[Mapping[str, Any]]) -> list[str]:
    """One sentence per parameter column one run lacks: which column, which run lacks it, the other's values,
    and how rows were matched (`compare_tables`)."""
    return [f"parameter column {d['column']!r} is in {d['has']} only ({d['has']}'s values: {d['values']}); "
            f"{d['lacks']} lacks it, so rows are matched on the common columns only "
            f"({', '.join(d['common']) or 'none but the metric'}) and each {d['has']} row keeps its value in "
            f"column {d['label']!r}" for d in diffs]


def compare_tables(a, b, study: str = "", names: tuple[str, str] = ("a", "b")):
    """Two tables of one study joined on their shared parameter columns: ``study``, the parameters, then
    VALUE_COLUMNS. A parameter column one table lacks is never a reason to drop or collapse rows: the other's
    rows keep it (as ``"<col> (a only)"``/``(b only)``) and are matched on the common columns, each such column
    described in ``attrs["columns_differ"]`` (`column_lines`); ``names``: the two runs' names in these words
    (the report names them by their folders). A metric whose unit differs between the two is
    never ratioed: its rows are flagged "not comparable", naming both units. CompareError where matching on
    the common columns alone would pair more than MAX_PAIRS rows."""
    import pandas as pd
    pa, pb = _present(a), _present(b)
    common = [c for c in pa if c in pb]
    only = {"a": [c for c in pa if c not in pb], "b": [c for c in pb if c not in pa]}
    name = dict(zip("ab", names))
    label = {c: one_side_label(c, name[side]) for side, cols in only.items() for c in cols}
    own = {"a": common + only["a"], "b": common + only["b"]}
    ka, kb = ((t.assign(**{c: t[c].map(_key) for c in own[s]})[own[s] + ["metric", "value", "unit"]]
               .drop_duplicates(subset=own[s] + ["metric"], keep="first").rename(columns=label))
              for s, t in (("a", a), ("b", b)))
    on = common + ["metric"]
    if only["a"] or only["b"]:       # a loose match pairs every row of a cell with every other: counted first
        sizes = ka.groupby(on).size().to_frame("a").join(kb.groupby(on).size().to_frame("b"), how="inner")
        pairs = int((sizes["a"] * sizes["b"]).sum())
        if pairs > MAX_PAIRS:
            raise CompareError(f"{study or 'the tables'}: the parameter columns differ ({', '.join(only['a'])} "
                               f"in {names[0]} only; {', '.join(only['b'])} in {names[1]} only) and matching on "
                               f"the common ones ({', '.join(common) or 'none'}) would pair {pairs} rows (at most "
                               f"{MAX_PAIRS})")
    both = ka.merge(kb, on=on, suffixes=("_a", "_b"), how="inner")
    keys = {s: [label.get(c, c) for c in own[s]] for s in ("a", "b")}
    lookup = {s: {tuple(r[:-2]): (r[-2], r[-1]) for r in t[keys[s] + ["metric", "value", "unit"]]
                  .itertuples(index=False, name=None)} for s, t in (("a", ka), ("b", kb))}
    flags = [_flag(dict(zip(both.columns, r)), keys, lookup, names) for r in both.itertuples(index=False, name=None)]
    same_unit = both["unit_a"].astype(str) == both["unit_b"].astype(str)
    params = common + [label[c] for c in only["a"] + only["b"]]
    out = pd.DataFrame({"study": study, **{c: both[c] for c in params}, "metric": both["metric"],
                        "unit": both["unit_b"].where(same_unit, both["unit_a"].astype(str) + f" ({names[0]}), "
                                                     + both["unit_b"].astype(str) + f" ({names[1]})"),
                        "a": both["value_a"].astype(float), "b": both["value_b"].astype(float)})
    # a verdict (unit bool) is compared as a verdict (`_flag`), never as a ratio of its 0 and 1
    out["ratio"] = (out["b"] / out["a"].where(out["a"] != 0)).where(same_unit & (both["unit_b"] != VERDICT_UNIT))
    out["flag"] = flags
    out = out.reset_index(drop=True)
    out.attrs["columns_differ"] = [
        {"column": c, "has": name[side], "lacks": name["b" if side == "a" else "a"], "label": label[c],
         "common": common, "values": _some_values(t[c].map(_key))}
        for side, t in (("a", a), ("b", b)) for c in only[side]]
    return out


def _flag(row: Mapping[str, Any], keys: Mapping[str, list[str]],
          lookup: Mapping[str, Mapping[tuple, tuple[float, str]]], names: tuple[str, str] = ("a", "b")) -> str:
    """A metric whose unit differs ("not comparable"), a verdict (unit ``bool``) that changed, or a timing that
    moved past both runs' own [p10, p90] spread ([median, p90] without a p10; no flag without a p90; a spread
    in another unit is no spread); "" otherwise."""
    metric, ua, ub = str(row["metric"]), str(row["unit_a"]), str(row["unit_b"])
    if ua != ub:
        return f"{NOT_COMPARABLE}: unit {ua} in {names[0]}, {ub} in {names[1]}"
    va, vb = float(row["value_a"]), float(row["value_b"])
    if ub == VERDICT_UNIT:
        words = ("WRONG", "ok") if metric == "ok" else ("false", "true")
        return f"verdict changed: {words[va != 0]} -> {words[vb != 0]}" if (va != 0) != (vb != 0) else ""
    spread = spread_names(metric) if ub in TIME_UNITS else None
    if spread is None:
        return ""
    cells = {s: tuple(row[k] for k in keys[s]) for s in ("a", "b")}

    def get(side: str, name: str) -> float | None:
        value, unit = lookup[side].get(cells[side] + (name,), (None, None))
        return float(value) if value is not None and str(unit) == ub else None

    p10, p90 = spread
    ha, hb = get("a", p90), get("b", p90)
    if ha is None and hb is None:
        return ""
    la, lb = get("a", p10), get("b", p10)
    la, lb = va if la is None else la, vb if lb is None else lb
    if lb > (va if ha is None else ha):
        return "slower beyond spread"
    if (vb if hb is None else hb) < la:
        return "faster beyond spread"
    return ""


def compare_runs(a: str | Path, b: str | Path, results: str | Path | None = None,
                 studies: Iterable[str] | None = None):
    """Every metric in both runs (`resolve_run`), study by study (`compare_tables`): a DataFrame of ``study``,
    the union of parameter columns ("" where a study has none) and VALUE_COLUMNS; ``attrs``: the two runs."""
    import pandas as pd

    wanted = None if studies is None else set(studies)
    pa, pb = resolve_run(a, results), resolve_run(b, results)
    files = [{p.stem: p for p in sorted(run.glob("*.parquet"))} for run in (pa, pb)]     # {study: its table}
    for p in (p for f in files for p in f.values()):
        what = file_problem(p)        # a link, a FIFO...: never read
        if what:
            raise CompareError(f"{p}: it is {what}, not a regular file, so it is not read")
    held = {*files[0], *files[1]}
    if wanted is not None and not wanted:      # --studies ',': not "nothing in common", which would blame the runs
        raise BadArgument(f"the list of studies to compare names none; the studies they hold: "
                          f"{', '.join(sorted(held)) or 'none'}")
    unknown = sorted(wanted - held) if wanted is not None else []
    if unknown:                    # a name neither run holds is a mistake, not "nothing to compare"
        raise BadArgument(f"no study named {', '.join(map(repr, unknown))} in either run; the studies they "
                          f"hold: {', '.join(sorted(held)) or 'none'}")
    read = [{s: _read_table(p, held) for s, p in f.items() if wanted is None or s in wanted} for f in files]
    ta, tb = ({s: table for s, (table, _) in r.items()} for r in read)
    left_out = {s: [f"metric {m!r} of {side}: {why}" for side, r in zip("ab", read) if s in r
                    for m, why in r[s][1].items()] for s in sorted(set(ta) | set(tb))}
    compared = {s: compare_tables(ta[s], tb[s], study=s) for s in sorted(set(ta) & set(tb))}
    frames = [f for f in compared.values() if len(f)]
    if frames:
        df = pd.concat(frames, ignore_index=True, sort=False)
        params = [c for c in df.columns if c not in ("study", *VALUE_COLUMNS)]
        df = df[["study", *params, *VALUE_COLUMNS]]
        df[params] = df[params].fillna("")
    else:
        df = pd.DataFrame(columns=["study", *VALUE_COLUMNS])
    df.attrs.update(a=str(pa), b=str(pb), studies_a=sorted(ta), studies_b=sorted(tb),
                    left_out={s: lines for s, lines in left_out.items() if lines},
                    columns_differ={s: f.attrs["columns_differ"] for s, f in compared.items()
                                    if f.attrs.get("columns_differ")},
                    **{col: {s: tuple(",".join(recorded(t[s], col)) for t in (ta, tb)) for s in set(ta) & set(tb)}
                       for col in KERNEL_COLUMNS})
    return df


def _check_kinds(raw) -> None:
    """TableError where ``metric``, ``unit`` or ``device`` holds other than text, or ``value`` dates: the
    table checker would call a number in ``metric`` a missing metric, and read a date as a number."""
    import pandas as pd

    from .results.tables import TableError
    for col in ("metric", "unit", "device"):
        if col in raw.columns:
            odd = raw[col].map(lambda v: not isinstance(v, str) and not (pd.api.types.is_scalar(v) and pd.isna(v)))
            if odd.any():
                first = raw.loc[odd, col].iloc[0]
                raise TableError(f"column {col!r} holds {type(first).__name__} values (first: {str(first)[:80]!r}), "
                                 "not text")
    if "value" in raw.columns and raw["value"].dtype.kind in "mM":
        raise TableError(f"column 'value' holds {raw['value'].dtype} values, not numbers")


def not_numbers(raw) -> dict[str, str]:
    """{metric: why} of the metrics whose values in ``raw`` (a table as read) are not all numbers: text, which
    the table checker would parse ("1.5" -> 1.5), or booleans outside a verdict (unit bool), which it would
    count as 0 and 1. Compare leaves them out, named, instead of ratioing what was never measured as a number."""
    import numbers

    import numpy as np

    def why(v, unit) -> str | None:
        if isinstance(v, (bool, np.bool_)):
            return None if unit == VERDICT_UNIT else f"booleans under unit {unit!r} (first: {v!r})"
        if v is None or isinstance(v, numbers.Real):
            return None
        return f"{type(v).__name__} values, not numbers (first: {str(v)[:40]!r})"

    out: dict[str, str] = {}
    if raw["value"].dtype.kind in "iuf":      # a numeric column: nothing to look at row by row
        return out
    for metric, value, unit in zip(raw["metric"], raw["value"], raw["unit"]):
        if str(metric) not in out and (problem := why(value, unit)):
            out[str(metric)] = problem
    return out


def _read_table(path: Path, held: Iterable[str]):
    """One run's study table, read and checked (its kinds by `_check_kinds`, then the study table format by
    workbench.results.tables.check_table: the metric, value and unit columns...), with one scalar per parameter
    cell, and {metric: why} of those left out (`not_numbers`); CompareError naming the file and what is wrong
    otherwise, since a traceback names neither."""
    import numpy as np

    from .results.tables import TableError, check_table, read_raw
    others = sorted(set(held) - {path.stem})
    hint = (f"; compare the other studies with --studies {','.join(others)}" if others else "")
    try:
        raw = read_raw(path)
        _check_kinds(raw)
        left = not_numbers(raw) if "value" in raw.columns and "metric" in raw.columns and "unit" in raw.columns else {}
        raw = raw[~raw["metric"].astype(str).isin(left)] if left else raw
        if raw.empty and left:          # every metric left out: nothing of this study to compare
            return raw.assign(value=raw["value"].astype(float)), left
        table = check_table(raw, name=str(path))
        for col in param_columns(table):
            bad = table[col].map(lambda v: isinstance(v, (list, tuple, dict, set, np.ndarray)))
            if bad.any():
                first = table.loc[bad, col].iloc[0]
                raise TableError(f"{path}: parameter column {col!r} holds {type(first).__name__} values "
                                 f"(first: {str(first)[:80]!r}), not one value per row")
    except TableError as e:
        raise CompareError(f"cannot compare the table {path}: {str(e).removeprefix(f'{path}: ')}{hint}") from None
    except (MemoryError, RecursionError, OSError, ValueError, TypeError, KeyError, AttributeError) as e:
        raise CompareError(f"cannot compare the table {path}: it cannot be read as a study table "
                           f"({type(e).__name__}: {str(e)[:300]}){hint}") from None
    return table, left


def recorded(table, col: str) -> list[str]:
    """The values of ``col`` a table's rows name ([] where it records none: runs made before it was recorded)."""
    return sorted(set(table[col].dropna().astype(str))) if col in table else []


def _run_folder_above(target: Path, results: Path) -> str | None:
    """Why ``target`` (resolved) lies in a run folder (or below the results folder); None where it does not."""
    from .studies import discover        # the declarations only: no torch
    tables = {f"{name}.parquet" for name in discover()}     # a stray x.parquet does not make /tmp a run folder
    run = next((d for d in target.parents if holds_run(d, tables)), None)
    if run is not None:
        return f"it is inside the run folder {run} (it holds {META_NAME} or a table)"
    if results in target.parents and target.parent != results:
        return (f"it is inside {target.parent}, below the results folder {results}, where every folder "
                "is a run folder or the report's")
    return None


def _written_by_compare(path: Path) -> bool:
    """Whether ``path`` is a regular file whose first line is the header of a CSV compare wrote."""
    try:        # the header only: a CSV of every value can be large
        with open_regular(path, follow=False) as f:
            first = f.readline(64 * 1024).rstrip(b"\r\n").decode("utf-8")
    except (OSError, UnicodeDecodeError):
        return False
    return first.startswith("study,") and first.endswith(CSV_SIGNATURE)


def csv_target(path: str | Path, results: str | Path | None = None, force: bool = False) -> Path:
    """Where ``compare --csv path`` writes (``path`` in its real folder); BadArgument naming why it may not."""
    path = Path(path)
    results = results_folder(results).resolve()
    if path.is_dir():
        raise BadArgument(f"--csv {path}: it is a folder; give a file name, e.g. {path / 'compare.csv'}")
    if not path.parent.is_dir():
        raise BadArgument(f"--csv {path}: the folder {path.parent} does not exist; create it first, or give "
                          "a file in an existing folder")
    target = path.parent.resolve() / path.name
    inside = _run_folder_above(target, results)
    if inside:
        raise BadArgument(f"--csv {path}: {inside}; a run folder holds results only: write the CSV elsewhere")
    if os.path.lexists(target) and not _written_by_compare(target):
        raise BadArgument(f"--csv {path}: the file exists and is not a CSV compare wrote, so it is never "
                          "replaced: give a new file name")
    if os.path.lexists(target) and not force:
        raise BadArgument(f"--csv {path}: the file exists (a CSV compare wrote); pass --force to replace it, "
                          "or give a new file name")
    return target


def summary_line(df) -> str:
    """'N metrics in both; k timing changes beyond spread; v verdict changes' of a comparison, and where some
    are, 'u not comparable (units differ: the metrics)'."""
    flags = list(df["flag"]) if len(df) else []
    n, timing, verdict = len(df), sum("beyond spread" in f for f in flags), sum(f.startswith("verdict") for f in flags)
    line = (f"{n} metric value{'s' * (n != 1)} in both; {timing} timing change{'s' * (timing != 1)} beyond the "
            f"runs' p10-p90 spread; {verdict} verdict change{'s' * (verdict != 1)}")
    unlike = df[df["flag"].str.startswith(NOT_COMPARABLE)] if len(df) else df
    if len(unlike):
        metrics = "; ".join(f"{m}: {u}" for m, u in dict(zip(unlike["metric"], unlike["unit"])).items())
        line += f"; {len(unlike)} not comparable, never ratioed (units differ: {metrics})"
    return line


def verdict_changes(df) -> list[str]:
    """One line per changed verdict: the cell (its non-empty parameters) and the change."""
    out = []
    params = [c for c in df.columns if c not in ("study", *VALUE_COLUMNS)]
    for _, r in df[df["flag"].str.startswith("verdict")].iterrows():
        cell = ", ".join(f"{c}={r[c]}" for c in params if str(r[c]) not in ("", "-"))
        out.append(f"{r['metric']} [{cell}]: {r['flag'][len('verdict changed: '):]}")
    return out


def compare_command(args) -> int:
    """``python -m workbench compare``: exit 1 where the runs share no study, SystemExit 2 for a bad value."""
    studies = [s.strip() for s in args.studies.split(",") if s.strip()] if args.studies is not None else None
    try:
        runs = [resolve_run(run, args.results) for run in (args.run_a, args.run_b)]     # named before pandas loads
        if args.csv:                                 # refused before the comparison, not after it
            csv_target(args.csv, args.results, args.force)
        df = compare_runs(*runs, args.results, studies=studies)
        shared = sorted(set(df.attrs["studies_a"]) & set(df.attrs["studies_b"]))
        if args.csv and shared:     # where csv_target allows (checked again), atomically: never half a file
            atomic_write_text(csv_target(args.csv, args.results, args.force), safe_csv(df))
    except BadArgument as e:
        print(f"compare: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    except CompareError as e:
        raise SystemExit(f"compare: {e}") from None
    import pandas as pd
    print(f"a: {Path(df.attrs['a'])}\nb: {Path(df.attrs['b'])}")
    if not shared:
        print(f"compare: the two runs have no study in common (a: {', '.join(df.attrs['studies_a']) or 'none'}; "
              f"b: {', '.join(df.attrs['studies_b']) or 'none'})")
        return 1
    only = sorted(set(df.attrs["studies_a"]) ^ set(df.attrs["studies_b"]))
    if only:
        print(f"studies in one run only (not compared): {', '.join(only)}")
    for study in shared:
        g = df[df["study"] == study]
        kernels = ""
        for col, name in KERNEL_COLUMNS.items():     # named where the two runs differ
            ka, kb = df.attrs[col].get(study, ("", ""))
            if ka != kb:
                kernels += f"; {name} a: {ka or 'not recorded'}, b: {kb or 'not recorded'}"
        print(f"{study}: {summary_line(g)}"
              + ("" if len(g) else " (no cell measured in both: other presets, sizes or parameters)") + kernels)
        for line in column_lines(df.attrs["columns_differ"].get(study, [])):
            print(f"  {study}: {line}")
        for line in df.attrs["left_out"].get(study, []):
            print(f"  {study}: left out {line}: only numbers are compared")
    if args.csv:
        print(f"compare: every value written to {args.csv}")
    show = df if args.all else df[df["flag"] != ""]
    if not len(show):
        print("no flagged change (--all lists every value)")
        return 0
    show = show[[c for c in show.columns if not show[c].astype(str).isin(["", "-"]).all()]]
    with pd.option_context("display.max_rows", args.rows, "display.width", 200,
                           "display.max_columns", 40, "display.float_format", "{:.4g}".format):
        print(show.head(args.rows).to_string(index=False))
    if len(show) > args.rows:
        print(f"... {len(show) - args.rows} more rows (--rows N, or --csv FILE for all)")
    return 0
