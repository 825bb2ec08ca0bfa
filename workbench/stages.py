"""A study of a run folder through the stages it has not reached: table, executed notebook (papermill), HTML,
figures; the notebooks' ``parameters`` cells kept in step with the declarations (the ``notebooks`` command)."""
from __future__ import annotations

import json
import os
import sys
import tempfile
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from .files import atomic_write_text
from .notebook_path import export_html, run_notebook
from .progress import time_left
from .results import FIGURES_DIR, RunFolder, figures_marker



def save_run_figures(study: Any, table: Path, run_dir: Path) -> str | None:
    """The study's figures of this run alone, PNG and SVG, into ``<run_dir>/figures/``; the problem where that fails."""
    import matplotlib
    matplotlib.use("Agg")
    from .results import Run, run_table
    folder = run_dir / FIGURES_DIR
    try:   # the same columns the report adds (run, reference, run_date), from the same code
        run = Run(path=run_dir, meta=RunFolder(run_dir).meta(), tables={study.name: table})
        summary = study.summarize(run_table(run, study.name), folder)
        pngs = [folder / Path(f).name for f in getattr(summary, "figures", None) or []]
        drawn = [p.name for png in pngs for p in (png, png.with_suffix(".svg")) if p.is_file()]
        atomic_write_text(figures_marker(run_dir, study.name), json.dumps(drawn) + "\n")
    except Exception as e:  # noqa: BLE001
        return f"{study.name}: figures not saved ({type(e).__name__}: {e})"
    return None


@contextmanager
def console_progress(name: str):
    """While a study runs (here or in its notebook's kernel, which inherits the variable), its bars count into
    a file (`plotting.PROGRESS_FILE_ENV`) that a thread prints as plain lines, every 10% or 30 s."""
    from .studies.plotting import PROGRESS_FILE_ENV
    path = Path(tempfile.gettempdir()) / f"workbench-progress-{os.getpid()}-{name}.json"
    old = os.environ.get(PROGRESS_FILE_ENV)
    os.environ[PROGRESS_FILE_ENV] = str(path)
    stop = threading.Event()

    def watch():
        shown, at, first = (None, -1), time.monotonic(), {}
        while not stop.wait(2.0):
            try:
                d = json.loads(path.read_text())
                done, total, desc = int(d["done"]), d.get("total"), d.get("desc") or name
            except (OSError, ValueError, KeyError, TypeError):
                continue
            now = time.monotonic()
            t0, done0 = first.setdefault(desc, (now, done))
            pct = int(100 * done / total) if total else -1
            if (desc, pct) != shown and (desc != shown[0] or pct >= shown[1] + 10 or now - at > 30):
                print(f"sweep: {desc}: {done}/{total or '?'}{time_left(done, total, t0, done0, now)}", flush=True)
                shown, at = (desc, pct), now

    thread = threading.Thread(target=watch, daemon=True, name=f"progress-{name}")
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=5)
        os.environ.pop(PROGRESS_FILE_ENV, None)
        if old is not None:
            os.environ[PROGRESS_FILE_ENV] = old
        for p in (path, *path.parent.glob(f"{path.name}.*.tmp")):      # a writer killed between its two steps
            p.unlink(missing_ok=True)


def finish_study(study: Any, params: dict, device: str, run_dir: Path, direct: bool, kernel: str) -> list[str]:
    """Take a study of ``run_dir`` through the stages it has not reached; its failures, recorded, not raised."""
    run = RunFolder(run_dir)
    done = run.stages_done(study.name, direct)
    table = run.table(study.name)
    measure = not done["table"] or not done.get("notebook", True)
    if measure and not direct:
        done["html"] = False        # the notebook runs again: so does its readable copy
    try:
        if measure:
            with console_progress(study.name):
                if direct:
                    from .studies import run_study
                    run_study(study.name, params, device, run_dir, progress=False)
                else:   # a notebook loads a table the run holds instead of measuring again
                    run_notebook(study, params, device, run_dir, kernel)
        if not table.is_file():
            raise RuntimeError(f"the study wrote no {table.name}")
    except Exception as e:  # noqa: BLE001 - record it, go on with the other studies
        saved = " after saving its table" if table.is_file() else ""
        print(f"sweep: {study.name} FAILED{saved}: {type(e).__name__}: {e}", file=sys.stderr)
        return [f"{study.name}: {type(e).__name__}{saved}: {e}"]
    # the table stays whatever happens here; a later stage that fails is a failure to resume
    failures = []
    for stage, do in (("html", lambda: export_html(run.file(study.name, ".ipynb"))),
                      ("figures", lambda: save_run_figures(study, table, run_dir))):
        if done.get(stage) is False and (problem := do()):
            failures.append(problem)
            print(f"sweep: {study.name} FAILED: {problem}", file=sys.stderr)
    return failures
