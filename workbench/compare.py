"""Compare two runs: every metric both measured, cell by cell, with the ratio and what changed.

``compare_runs(a, b)`` joins both runs' study tables on their parameter columns (those before
``metric``, less ``device`` and the report's own), one row per cell and metric in both: the two
values, ``ratio`` = b / a and ``flag``: a verdict (unit ``bool``) that changed, or a timing that
moved past both runs' own [p10, p90] spread ([median, p90] without a p10; no flag without a p90).
A run is a folder, a folder name under the results folder or its ``reference/``, or ``latest``;
only regular files of a run folder are read. ``write_csv`` never writes inside a run folder nor
over a file compare did not write (`csv_target`). Imports no torch.
"""
from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any, Iterable, Mapping

from .files import atomic_write_text, file_kind, open_regular, read_regular
from .provenance import results_root
from .runmeta import META_NAME

REFERENCE_DIRNAME = "reference"
ADDED_COLUMNS = ("run", "reference", "run_date")       # what the report adds to a study table
NOT_KEYS = ("device", "note")                          # not part of a cell's identity
TIME_UNITS = ("us", "ms", "s")
VERDICT_UNIT = "bool"
LATEST = "latest"
CSV_SIGNATURE = ",metric,unit,a,b,ratio,flag"          # how the header of a CSV compare wrote ends


class CompareError(ValueError):
    """A run that cannot be found or read; the message names it and says what was looked for."""


class BadArgument(CompareError):
    """An argument that names nothing valid (a study neither run holds) or a place compare may not
    write its CSV; the message names the value and says what is valid."""


# --------------------------------------------------------------------------- finding runs


def _started(path: Path) -> str:
    import json

    try:
        meta = json.loads(read_regular(path / META_NAME).decode("utf-8"))
    except (OSError, ValueError, RecursionError):
        return ""
    return str(meta.get("started_at") or "") if isinstance(meta, dict) else ""


def _run_folders(results: Path) -> list[Path]:
    out = []
    for base in (results, results / REFERENCE_DIRNAME):
        if not base.is_dir():
            continue
        for child in sorted(base.iterdir()):
            if child.is_dir() and not child.name.startswith(".") and child.name not in ("report", REFERENCE_DIRNAME) \
                    and any(child.glob("*.parquet")):
                out.append(child)
    return out


def resolve_run(spec: str | Path, results: str | Path | None = None) -> Path:
    """The run folder ``spec`` names: a folder, a folder name under ``results`` or
    ``results/reference``, or ``latest``. CompareError (listing what was tried) otherwise."""
    results = Path(results) if results is not None else results_root()
    text = str(spec)
    if text == LATEST:
        runs = _run_folders(results)
        if not runs:
            raise CompareError(f"'latest': no run folder with a table under {results}")
        return max(runs, key=lambda p: (_started(p), p.name))
    tried = [Path(text), results / text, results / REFERENCE_DIRNAME / text]
    for p in tried:
        if p.is_dir() and any(p.glob("*.parquet")):
            return p
    raise CompareError(f"no run folder with tables named {text!r}: tried {', '.join(map(str, tried))} "
                       f"(give a folder, a run name under {results} or its reference/, or 'latest')")


def table_files(path: Path) -> dict[str, Path]:
    """{study: its table file} of one run folder; CompareError naming a table that is not a
    regular file (a link, a FIFO...), which is never read."""
    files = {p.stem: p for p in sorted(Path(path).glob("*.parquet"))}
    for p in files.values():
        what = file_kind(p, follow=False)
        if what:
            raise CompareError(f"{p}: it is {what}, not a regular file, so it is not read")
    return files


def run_tables(path: Path, studies: Iterable[str] | None = None) -> dict[str, Any]:
    """{study: its checked table} of one run folder (`load_table`), only ``studies`` where given."""
    from .studies.tables import load_table

    wanted = None if studies is None else set(studies)
    return {s: load_table(p) for s, p in table_files(path).items() if wanted is None or s in wanted}


def check_studies(studies: Iterable[str], held: Iterable[str]) -> None:
    """BadArgument naming each of ``studies`` that no run holds (``held``), with those it does."""
    unknown = sorted(set(studies) - set(held))
    if unknown:
        raise BadArgument(f"no study named {', '.join(map(repr, unknown))} in either run; the studies they "
                          f"hold: {', '.join(sorted(set(held))) or 'none'}")


# --------------------------------------------------------------------------- comparing tables


def param_columns(table) -> list[str]:
    """The columns that say which cell a row measured: those before ``metric``, less ``device``,
    ``note`` and the report's own."""
    cols = list(table.columns)
    head = cols[:cols.index("metric")] if "metric" in cols else cols
    return [c for c in head if c not in ADDED_COLUMNS and c not in NOT_KEYS and c not in ("value", "unit")]


def _key(v: Any) -> str:
    """One spelling per parameter value: 4 and 4.0 alike, every missing value alike."""
    import pandas as pd

    if hasattr(v, "item") and not isinstance(v, (str, bytes)):
        v = v.item()                                   # a numpy scalar
    if v is None or v is pd.NA or v is pd.NaT or (isinstance(v, float) and math.isnan(v)):
        return "-"
    if isinstance(v, float) and v.is_integer():
        return str(int(v))
    return str(v)


def spread_names(metric: str) -> tuple[str, str] | None:
    """(p10 name, p90 name) beside a median timing: ``p50_ms`` -> (``p10_ms``, ``p90_ms``),
    ``staging_us`` -> (``staging_p10_us``, ``staging_p90_us``); None for a name that is itself
    a percentile or has no time unit."""
    if metric.startswith("p50_"):
        return "p10_" + metric[4:], "p90_" + metric[4:]
    base, _, unit = metric.rpartition("_")
    if not base or unit not in TIME_UNITS or base.endswith(("_p10", "_p90")) or base in ("p10", "p90"):
        return None
    return f"{base}_p10_{unit}", f"{base}_p90_{unit}"


def _verdict_word(metric: str, v: float) -> str:
    if metric == "ok":
        return "ok" if v else "WRONG"
    return "true" if v else "false"


def compare_tables(a, b, study: str = ""):
    """Two tables of one study, joined cell by cell (see the module's docstring); columns:
    ``study``, the shared parameter columns, ``metric``, ``unit``, ``a``, ``b``, ``ratio``,
    ``flag``."""
    import pandas as pd

    keys = [c for c in param_columns(a) if c in set(param_columns(b))]

    def keyed(t):
        t = t.copy()
        for c in keys:
            t[c] = t[c].map(_key)
        t = t[keys + ["metric", "value", "unit"]].drop_duplicates(subset=keys + ["metric"], keep="first")
        return t

    ka, kb = keyed(a), keyed(b)
    both = ka.merge(kb, on=keys + ["metric"], suffixes=("_a", "_b"), how="inner")
    lookup = {side: {tuple(r[:-1]): r[-1] for r in t[keys + ["metric", "value"]].itertuples(index=False)}
              for side, t in (("a", ka), ("b", kb))}
    flags = []
    for r in both.itertuples(index=False):
        row = r._asdict() if hasattr(r, "_asdict") else dict(zip(both.columns, r))
        flags.append(_flag(row, keys, lookup))
    out = pd.DataFrame({"study": study, **{c: both[c] for c in keys}, "metric": both["metric"],
                        "unit": both["unit_b"], "a": both["value_a"].astype(float),
                        "b": both["value_b"].astype(float)})
    out["ratio"] = out["b"] / out["a"].where(out["a"] != 0)
    out["flag"] = flags
    return out.reset_index(drop=True)


def _flag(row: Mapping[str, Any], keys: list[str], lookup: Mapping[str, Mapping[tuple, float]]) -> str:
    metric, unit = str(row["metric"]), str(row.get("unit_b") or row.get("unit_a"))
    va, vb = float(row["value_a"]), float(row["value_b"])
    if unit == VERDICT_UNIT:
        if (va != 0) != (vb != 0):
            return f"verdict changed: {_verdict_word(metric, va)} -> {_verdict_word(metric, vb)}"
        return ""
    if unit not in TIME_UNITS:
        return ""
    names = spread_names(metric)
    if names is None:
        return ""
    cell = tuple(row[k] for k in keys)
    p10, p90 = names
    ha, hb = lookup["a"].get(cell + (p90,)), lookup["b"].get(cell + (p90,))
    if ha is None and hb is None:
        return ""
    la = lookup["a"].get(cell + (p10,), va)
    lb = lookup["b"].get(cell + (p10,), vb)
    ha = va if ha is None else ha
    hb = vb if hb is None else hb
    if lb > ha:
        return "slower beyond spread"
    if hb < la:
        return "faster beyond spread"
    return ""


def compare_runs(a: str | Path, b: str | Path, results: str | Path | None = None,
                 studies: Iterable[str] | None = None):
    """Every metric present in both runs ``a`` and ``b`` (folders, names or ``latest``), joined on
    the parameter columns of each study's table: a pandas DataFrame with ``study``, the parameter
    columns (the union over studies; empty where a study has no such column), ``metric``,
    ``unit``, ``a``, ``b``, ``ratio`` (b / a) and ``flag``. ``df.attrs`` holds the two folders."""
    import pandas as pd

    pa, pb = resolve_run(a, results), resolve_run(b, results)
    if studies is not None:                  # a name neither run holds is a mistake, not "nothing to compare"
        check_studies(studies, [*table_files(pa), *table_files(pb)])
    ta, tb = run_tables(pa, studies), run_tables(pb, studies)
    frames = [compare_tables(ta[s], tb[s], study=s) for s in sorted(set(ta) & set(tb))]
    frames = [f for f in frames if len(f)]
    if frames:
        df = pd.concat(frames, ignore_index=True, sort=False)
        front = ["study"] + [c for c in df.columns if c not in ("study", "metric", "unit", "a", "b", "ratio", "flag")]
        df = df[front + ["metric", "unit", "a", "b", "ratio", "flag"]]
        params = front[1:]
        df[params] = df[params].fillna("")
    else:
        df = pd.DataFrame(columns=["study", "metric", "unit", "a", "b", "ratio", "flag"])
    df.attrs.update(a=str(pa), b=str(pb), studies_a=sorted(ta), studies_b=sorted(tb))
    return df


# --------------------------------------------------------------------------- the CSV


def _run_folder_above(target: Path, results: Path) -> str | None:
    """Why ``target`` (resolved) lies in a run folder: a folder above it holds meta.json or a
    table, or it is below the results folder (every folder there is a run folder or the
    report's); None where it does not."""
    for d in target.parents:
        try:
            names = os.listdir(d)
        except OSError:
            continue
        if META_NAME in names or any(n.endswith(".parquet") for n in names):
            return f"it is inside the run folder {d} (it holds {META_NAME} or a table)"
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
    """Where ``compare --csv path`` writes: ``path`` in its real folder. BadArgument, naming the
    path, for a folder, a folder that does not exist, a place inside a run folder
    (`_run_folder_above`), and a file that exists, unless compare wrote it and ``force``."""
    path = Path(path)
    results = (Path(results) if results is not None else results_root()).resolve()
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


def write_csv(df, path: str | Path, results: str | Path | None = None, force: bool = False) -> Path:
    """Save the comparison ``df`` to ``path`` where `csv_target` allows (checked again here),
    atomically: an interrupted write leaves the old file or none, never half a file."""
    target = csv_target(path, results, force)
    atomic_write_text(target, df.to_csv(index=False))
    return target


def summary_line(df) -> str:
    """'N metrics in both; k timing changes beyond spread; v verdict changes' of a comparison."""
    flags = df["flag"] if len(df) else []
    timing = sum(1 for f in flags if "beyond spread" in f)
    verdict = sum(1 for f in flags if f.startswith("verdict"))
    return (f"{len(df)} metric value{'s' if len(df) != 1 else ''} in both; {timing} timing change"
            f"{'s' if timing != 1 else ''} beyond the runs' p10-p90 spread; {verdict} verdict change"
            f"{'s' if verdict != 1 else ''}")


def verdict_changes(df) -> list[str]:
    """One line per changed verdict: the cell (its non-empty parameters) and the change."""
    out = []
    params = [c for c in df.columns if c not in ("study", "metric", "unit", "a", "b", "ratio", "flag")]
    for _, r in df[df["flag"].str.startswith("verdict")].iterrows():
        cell = ", ".join(f"{c}={r[c]}" for c in params if str(r[c]) not in ("", "-"))
        out.append(f"{r['metric']} [{cell}]: {r['flag'][len('verdict changed: '):]}")
    return out
