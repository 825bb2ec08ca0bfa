"""The results store: the one code that lists, reads, writes and locks run folders.

A run folder is ``<results>/<UTC time>-<short sha>[-name]/`` (committed GPU runs under ``reference/``) holding its
record (``meta.json``, `RunMeta`), one table per study (``<study>.parquet``, the format of `tables`), and what the
later stages leave (executed notebooks, their HTML, figures). Everything that reads or writes one goes through
here: the sweep (`RunFolder`: create, lock, write a table, state for a resume; `timings` and `run_of_commit` for
its prediction and reuse), the report (`find_runs`, `load_tables`), ``advise`` (`newest_rows`), ``compare``
(`resolve_run`), ``audit`` (`saved_audits`) and the notebooks (`save_table`). The rules hold once, here: regular
files only and no link followed (`workbench.files`), size caps on records and tables, atomic writes, a finished
table or record never replaced, one process at a time in a folder (`RunLock`).

Modules: `meta` (the record), `folder` (one folder: create, lock, stages), `tables` (the table format, its reader
and writer), `store` (listing and queries).
"""
from __future__ import annotations

from .folder import (FIGURES_DIR, STAGES, RunFolder, RunLock, RunState, figures_marker, holds_run, lists_run,
                     notebook_done, run_in_use, slug)
from .meta import META_NAME, MetaError, RunMeta
from .store import (AUDITS_DIR, ERRATA_NAME, REFERENCE_DIRNAME, REPORT_DIRNAME, ReportError, Run, RunNotFound,
                    TableProblem, file_problem, find_runs, load_errata, load_tables, missing_columns, newest_rows,
                    newest_timings, one_line, read_table, reference_files, resolve_run, run_folders, run_of_commit,
                    run_table, save_table, saved_audits, started_at, study_table, table_file, timings,
                    why_unreadable)

__all__ = ["AUDITS_DIR", "ERRATA_NAME", "FIGURES_DIR", "META_NAME", "REFERENCE_DIRNAME", "REPORT_DIRNAME", "STAGES",
           "MetaError", "ReportError", "Run", "RunFolder", "RunLock", "RunMeta", "RunNotFound", "RunState",
           "TableProblem", "figures_marker", "file_problem", "find_runs", "holds_run", "lists_run", "load_errata",
           "load_tables", "missing_columns", "newest_rows", "newest_timings", "notebook_done", "one_line",
           "read_table", "reference_files", "resolve_run", "run_folders", "run_in_use", "run_of_commit",
           "run_table", "save_table", "saved_audits", "slug", "started_at", "study_table", "table_file", "timings",
           "why_unreadable"]
