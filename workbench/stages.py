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
from .provenance import REPO_ROOT
from .runstate import FIGURES_DIR, RunFolder, figures_marker

PROJECT_KERNEL = "workbench"          # "Python (workbench)": `make lab` registers it inside the venv
FALLBACK_KERNEL = "python3"           # what a fresh venv (CI, a GPU host's bundle) has


def run_notebook(study: Any, params: dict[str, Any], device: str, run_dir: Path, kernel: str) -> None:
    """Execute the study's notebook with ``params`` into ``<run_dir>/<study>.ipynb``."""
    nb = REPO_ROOT / study.notebook
    if not nb.is_file():
        raise FileNotFoundError(f"notebook {study.notebook} is missing (--direct skips notebooks)")
    try:
        import papermill as pm
    except ImportError as e:
        raise RuntimeError("papermill is not installed (make setup, or make wheels on a GPU "
                           "host; --direct runs studies without notebooks)") from e
    from .studies.plotting import PROGRESS_ENV
    os.environ[PROGRESS_ENV] = "0"      # the kernel inherits it: no progress bars in the executed notebook
    pm.execute_notebook(str(nb), str(run_dir / f"{study.name}.ipynb"),
                        parameters={**params, "device": device, "run_dir": str(run_dir.resolve())},
                        kernel_name=kernel, cwd=str(REPO_ROOT),
                        progress_bar=sys.stderr.isatty(),  # in a log file a bar's carriage returns are noise
                        # the kernel's own log (a transport warning, an interrupt at shutdown) is not the study's
                        extra_arguments=["--IPKernelApp.log_level=CRITICAL"])


def export_html(notebook: Path) -> str | None:
    """``<study>.html`` beside the executed notebook; the problem, for the run to record, where that fails."""
    try:
        import nbconvert
        import nbformat
        body, _ = nbconvert.HTMLExporter().from_notebook_node(nbformat.read(str(notebook), as_version=4))
        atomic_write_text(notebook.with_suffix(".html"), body)
    except Exception as e:  # noqa: BLE001 - the measurement is done; only its readable copy is missing
        return f"{notebook.stem}: no HTML export ({type(e).__name__}: {e})"
    return None


def save_run_figures(study: Any, table: Path, run_dir: Path) -> str | None:
    """The study's figures of this run alone, PNG and SVG, into ``<run_dir>/figures/``; the problem where that fails."""
    import matplotlib
    matplotlib.use("Agg")
    from .report.runs import Run, run_table
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


def sync_notebook(study: Any, check: bool = False) -> bool:
    """Whether the declared parameters changed (``check``: would change) the notebook's ``parameters`` cell."""
    path = REPO_ROOT / study.notebook
    doc = json.loads(path.read_text(encoding="utf-8"))
    tagged = [c for c in doc["cells"]
              if c["cell_type"] == "code" and "parameters" in c.get("metadata", {}).get("tags", [])]
    if len(tagged) != 1:
        raise ValueError(f"expected one cell tagged 'parameters', found {len(tagged)}")
    text = study.params.parameters_cell()
    if "".join(tagged[0]["source"]) == text:
        return False
    if not check:
        tagged[0]["source"] = text.splitlines(keepends=True)
        path.write_text(json.dumps(doc, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    return True


def default_kernel() -> str:
    """The project's kernel where it is registered and starts this very interpreter, else python3."""
    try:   # no such kernel, or any other problem: the kernel choice must never stop a sweep
        from jupyter_client.kernelspec import KernelSpecManager
        exe = (KernelSpecManager().get_kernel_spec(PROJECT_KERNEL).argv or [""])[0]
        same = exe in ("python", "python3") or (os.path.exists(exe) and os.path.samefile(exe, sys.executable))
        return PROJECT_KERNEL if same else FALLBACK_KERNEL
    except Exception:  # noqa: BLE001
        return FALLBACK_KERNEL


def check_kernel(name: str) -> None:
    """SystemExit where papermill's Jupyter kernel ``name`` is not installed."""
    try:
        from jupyter_client.kernelspec import KernelSpecManager
    except ImportError:
        return          # no jupyter_client: the notebook stage records why it cannot run
    known = sorted(KernelSpecManager().find_kernel_specs())
    if name not in known:
        raise SystemExit(f"--kernel {name!r}: no Jupyter kernel of that name; installed: {known or 'none'} "
                         f"(make lab registers {PROJECT_KERNEL!r}; --direct runs without notebooks)")


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
        for p in (path, Path(f"{path}.tmp")):
            p.unlink(missing_ok=True)


def time_left(done: int, total: int | None, t0: float, done0: int, now: float) -> str:
    """", about N s left" (or min) at the pace since ``done0`` at ``t0``; "" until it moves, without total, done."""
    if not total or done >= total or done <= done0 or now <= t0:
        return ""
    left = (now - t0) / (done - done0) * (total - done)
    return f", about {left:.0f} s left" if left < 120 else f", about {left / 60:.0f} min left"


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
                    from .studies.tables import write_study_table
                    write_study_table(study.run(device=device, progress=False, **params), table)
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
