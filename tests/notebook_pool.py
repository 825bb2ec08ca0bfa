"""The study notebooks the session's tests execute with their defaults, run by papermill two at a
time in processes of their own, in the order the tests will ask for them: each test of a notebook
(marked ``@pytest.mark.notebook(study)``) waits for its own run only, and the runs of the others
go on meanwhile. One torch thread per kernel: two one-thread kernels side by side finish sooner
on 2 cores than one after the other with two threads each (as `sweep --workers` runs studies)."""
from __future__ import annotations

import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LANES = 2
TIMEOUT_S = 900


@dataclass(frozen=True)
class NotebookRun:
    run_dir: Path          # the study's run folder (the notebook's ``run_dir`` parameter)
    executed: Path         # the executed notebook, outputs included


def _execute(study: str, folder: Path) -> NotebookRun:
    folder.mkdir(parents=True)
    run = NotebookRun(folder / "run", folder / "out.ipynb")
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    p = subprocess.run([sys.executable, "-m", "papermill", str(ROOT / "notebooks" / f"{study}.ipynb"),
                        str(run.executed), "-p", "run_dir", str(run.run_dir), "--cwd", str(ROOT), "-k", "python3",
                        "--no-progress-bar"], env=env, capture_output=True, text=True, timeout=TIMEOUT_S)
    if p.returncode:
        raise AssertionError(f"papermill {study}.ipynb exited with {p.returncode}:\n{p.stderr[-4000:]}")
    return run


class NotebookPool:
    def __init__(self, studies: list[str], folder: Path):
        self._pool = ThreadPoolExecutor(max_workers=LANES, thread_name_prefix="notebook")
        self._runs = {s: self._pool.submit(_execute, s, folder / s) for s in dict.fromkeys(studies)}

    def run(self, study: str) -> NotebookRun:
        """The finished run of ``study``'s notebook (the AssertionError of a failed one, with its stderr)."""
        return self._runs[study].result()

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)


def studies_of(items) -> list[str]:
    """The notebooks the collected tests will ask for, in their order."""
    return [m.args[0] for item in items for m in item.iter_markers("notebook")]
