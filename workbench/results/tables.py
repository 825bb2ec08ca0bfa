"""The one table format of every study, its writer and its loader.

A study table is tidy and long: one row per measurement. Parameter columns come first (``device``
among them: where the number was measured), then exactly ``metric``, ``value``, ``unit``:

    family    norm         budget  fill  device       metric      value   unit
    qwen2-vl  triton_rows  1024    0.75  NVIDIA H200  staging_us  9.1     us

`check_table` enforces it and `write_study_table` refuses, before writing anything, a table that
breaks it: a missing ``device``/``metric``/``value``/``unit`` column, a row without a metric or a
unit, a metric whose unit changes between rows, a non-numeric value, a list or dict in a
parameter column, or two rows for the same measurement. Writes are atomic (a reader sees the old
file or the new one). `load_table` reads and checks one; `wide` turns a long table back into one
row per cell with a column per metric, for plots; `tidy` turns such a wide frame into the long
format (studies build rows wide, then call it once).
"""
from __future__ import annotations

import io
from pathlib import Path
from typing import Iterable, Mapping

import numpy as np
import pandas as pd

from ..files import atomic_write_bytes, read_regular

VALUE_COLUMNS = ("metric", "value", "unit")
MAX_TABLE_BYTES = 256 << 20       # a study table is kilobytes to a few megabytes; far more is not one
REQUIRED_PARAMS = ("device",)
BOOL_UNIT = "bool"


class TableError(ValueError):
    """A table that breaks the study table format."""


def param_columns(df: pd.DataFrame) -> list[str]:
    return [c for c in df.columns if c not in VALUE_COLUMNS]


def check_table(df: pd.DataFrame, name: str = "table") -> pd.DataFrame:
    """``df`` with its columns in schema order (parameters, then metric, value, unit), or
    TableError saying what is wrong. The value column becomes float64."""
    if not isinstance(df, pd.DataFrame):
        raise TableError(f"{name}: a study table is a pandas DataFrame, got {type(df).__name__}")
    missing = [c for c in (*REQUIRED_PARAMS, *VALUE_COLUMNS) if c not in df.columns]
    if missing:
        raise TableError(f"{name}: missing column(s) {missing}; a study table has parameter columns "
                         f"(device among them) then metric, value, unit")
    if df.empty:
        raise TableError(f"{name}: no rows")
    for col in ("metric", "unit", "device"):
        bad = df[col].isna() | ~df[col].map(lambda v: isinstance(v, str) and bool(v.strip()))
        if bad.any():
            row = df[bad].iloc[0]
            raise TableError(f"{name}: {int(bad.sum())} row(s) without a {col} (first: metric "
                             f"{row.get('metric')!r}, {col} {row[col]!r}); every row needs one")
    units = df.groupby("metric", sort=True)["unit"].unique()
    mixed = {m: list(u) for m, u in units.items() if len(u) > 1}
    if mixed:
        raise TableError(f"{name}: metric(s) with more than one unit: {mixed}; a metric keeps one unit")
    try:
        values = pd.to_numeric(df["value"].map(lambda v: float(v) if isinstance(v, (bool, np.bool_)) else v),
                               errors="raise").astype("float64")
    except (ValueError, TypeError) as e:
        raise TableError(f"{name}: non-numeric value(s) in the value column ({e})") from None
    params = param_columns(df)
    for col in params:
        if df[col].dtype == object and df[col].map(lambda v: isinstance(v, (list, tuple, dict, set))).any():
            raise TableError(f"{name}: parameter column {col!r} holds lists/dicts; give each "
                             f"parameter value its own row (or a string)")
    key = df[params + ["metric"]].astype(str)
    dup = key.duplicated(keep=False)
    if dup.any():
        raise TableError(f"{name}: {int(dup.sum())} rows measure the same thing twice (same parameters "
                         f"and metric), e.g. {dict(key[dup].iloc[0])}; add the parameter that tells them apart")
    out = df[params + list(VALUE_COLUMNS)].copy()
    out["value"] = values
    return out.reset_index(drop=True)


def write_study_table(df: pd.DataFrame, path: str | Path) -> Path:
    """Check ``df`` against the schema, then write it as parquet atomically; returns the path.

    An existing table is never replaced (FileExistsError), even by a concurrent writer: a
    finished measurement is evidence."""
    path = Path(path)
    table = check_table(df, name=path.name)
    buf = io.BytesIO()
    table.to_parquet(buf, engine="pyarrow", index=False)
    return atomic_write_bytes(path, buf.getvalue(), exclusive=True)


def read_raw(path: str | Path) -> pd.DataFrame:
    """One parquet file as it is, unchecked: a regular file (a run folder may come from anyone: never through a
    link, never a FIFO), at most MAX_TABLE_BYTES; TableError naming the file otherwise."""
    path = Path(path)
    try:
        return pd.read_parquet(io.BytesIO(read_regular(path, MAX_TABLE_BYTES)))
    except Exception as e:  # noqa: BLE001 - pyarrow raises several types for a bad file
        raise TableError(f"{path}: unreadable parquet ({type(e).__name__}: {str(e)[:300]})") from None


def load_table(path: str | Path) -> pd.DataFrame:
    """Read one study table and check it (TableError names the file and what is wrong)."""
    return check_table(read_raw(path), name=str(path))


def tidy(frame: pd.DataFrame, metrics: Mapping[str, str]) -> pd.DataFrame:
    """Long format from a wide frame: each column named in ``metrics`` (name -> unit) that the frame
    has becomes rows (metric, value, unit); every other column is a parameter. Cells whose metric is missing
    (NaN) are dropped, unless the cell would then have no row at all."""
    metrics = {m: u for m, u in metrics.items() if m in frame.columns}   # a device may lack some
    if not metrics:
        raise TableError("tidy: none of the metric columns is in the frame")
    params = [c for c in frame.columns if c not in metrics]
    frame = frame.reset_index(drop=True)
    long = frame.melt(id_vars=params, value_vars=list(metrics), var_name="metric", value_name="value",
                      ignore_index=False)
    long["unit"] = long["metric"].map(dict(metrics))
    long["value"] = long["value"].map(lambda v: float(v) if isinstance(v, (bool, np.bool_)) else v)
    long["value"] = pd.to_numeric(long["value"], errors="raise").astype("float64")
    # keep NaN rows only for cells that have no finite metric at all (a skipped cell stays visible)
    has_any = long.groupby(level=0)["value"].transform(lambda s: s.notna().any())
    first = ~long.index.duplicated(keep="first")
    long = long[long["value"].notna() | (~has_any & first)]
    long = long.sort_index(kind="stable").reset_index(drop=True)
    return long[params + list(VALUE_COLUMNS)]


def wide(table: pd.DataFrame, metrics: Iterable[str] | None = None) -> pd.DataFrame:
    """One row per cell (the parameter columns), one column per metric. Metrics with unit 'bool'
    come back as booleans (nullable only where a cell lacks them). ``metrics`` limits the columns (default: every metric)."""
    t = table if metrics is None else table[table.metric.isin(list(metrics))]
    params = param_columns(t)
    units = dict(zip(t.metric, t.unit))
    # NaN parameters (a column that does not apply to a cell) must survive the reshaping
    key = t[params].astype(object).where(t[params].notna(), "\0na")
    w = (pd.concat([key, t[["metric", "value"]]], axis=1)
         .set_index(params + ["metric"])["value"].unstack("metric")
         .reset_index())
    w.columns.name = None
    for col in params:
        w[col] = w[col].map(lambda v: np.nan if isinstance(v, str) and v == "\0na" else v)
        w[col] = w[col].infer_objects() if w[col].dtype == object else w[col]
        try:
            w[col] = pd.to_numeric(w[col]) if t[col].dtype.kind in "iufb" else w[col]
        except (ValueError, TypeError):
            pass
    for m, unit in units.items():
        if unit == BOOL_UNIT and m in w:
            col = w[m].map(lambda v: pd.NA if pd.isna(v) else bool(v)).astype("boolean")
            w[m] = col.astype(bool) if col.notna().all() else col   # plain numpy bool when complete
    return w
