"""A study's notebook run by papermill into a run folder, its HTML copy, the run's figures, and the notebooks'
``parameters`` cells kept in step with the declarations (the ``notebooks`` command)."""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

from .files import atomic_write_text
from .provenance import REPO_ROOT

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
    from .runstate import FIGURES_DIR, RunFolder, figures_marker
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
