"""A study's notebook and what a run keeps of it: its papermill execution into the run folder, its
HTML copy, the study's figures of the run; and the ``parameters`` cells kept in step with the
declarations (the ``notebooks`` command). Heavy imports stay inside the functions.
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

from .files import atomic_write_text
from .provenance import REPO_ROOT


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

    # the kernel inherits this: studies show no progress bars inside the executed notebook
    os.environ[PROGRESS_ENV] = "0"
    pm.execute_notebook(
        str(nb), str(run_dir / f"{study.name}.ipynb"),
        parameters={**params, "device": device, "run_dir": str(run_dir.resolve())},
        kernel_name=kernel, cwd=str(REPO_ROOT),
        progress_bar=sys.stderr.isatty(),         # in a log file a bar's carriage returns are noise
        # the kernel's own log (a transport warning at start, an interrupt at shutdown) is not the
        # study's output; the cells' warnings and errors still reach the executed notebook
        extra_arguments=["--IPKernelApp.log_level=CRITICAL"])


def export_html(notebook: Path) -> str | None:
    """``<study>.html`` beside the executed notebook, for the report to link; where the export fails
    (no nbconvert, a full disk), the problem as a string for the run to record."""
    try:
        import nbconvert
        import nbformat

        body, _ = nbconvert.HTMLExporter().from_notebook_node(nbformat.read(str(notebook), as_version=4))
        atomic_write_text(notebook.with_suffix(".html"), body)
    except Exception as e:  # noqa: BLE001 - the measurement is done; only its readable copy is missing
        return f"{notebook.stem}: no HTML export ({type(e).__name__}: {e})"
    return None


def save_run_figures(study: Any, table: Path, run_dir: Path) -> str | None:
    """The study's figures of this run alone, PNG and SVG, into ``<run_dir>/figures/``; where one
    fails to draw, the problem as a string (the table stays; the run records the failed stage)."""
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


def _parameters_cell_index(doc: dict) -> int:
    tagged = [i for i, c in enumerate(doc["cells"])
              if c["cell_type"] == "code" and "parameters" in c.get("metadata", {}).get("tags", [])]
    if len(tagged) != 1:
        raise ValueError(f"expected one cell tagged 'parameters', found {len(tagged)}")
    return tagged[0]


def sync_notebook(study: Any, check: bool = False) -> bool:
    """Write the study's declared parameters into its notebook's ``parameters`` cell (``check``: only
    compare); whether the notebook was (or would be) changed."""
    path = REPO_ROOT / study.notebook
    doc = json.loads(path.read_text(encoding="utf-8"))
    i = _parameters_cell_index(doc)
    text = study.params.parameters_cell()
    lines = text.splitlines(keepends=True)
    if "".join(doc["cells"][i]["source"]) == text:
        return False
    if not check:
        doc["cells"][i]["source"] = lines
        path.write_text(json.dumps(doc, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    return True


PROJECT_KERNEL = "workbench"          # "Python (workbench)": `make lab` registers it inside the venv
FALLBACK_KERNEL = "python3"           # what a fresh venv (CI, a GPU host's bundle) has


def default_kernel() -> str:
    """The project's kernel where it is registered and starts this very interpreter (one from another
    environment would measure another install), else python3; never fails."""
    try:
        from jupyter_client.kernelspec import KernelSpecManager, NoSuchKernel

        try:
            spec = KernelSpecManager().get_kernel_spec(PROJECT_KERNEL)
        except NoSuchKernel:
            return FALLBACK_KERNEL
        exe = spec.argv[0] if spec.argv else ""
        same = exe in ("python", "python3") or (
            os.path.exists(exe) and os.path.samefile(exe, sys.executable))
        return PROJECT_KERNEL if same else FALLBACK_KERNEL
    except Exception:  # noqa: BLE001 - the kernel choice must never stop a sweep
        return FALLBACK_KERNEL
