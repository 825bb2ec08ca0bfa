"""The study notebooks the session's tests execute with their defaults, run by papermill in processes
of their own. When a test (marked ``@pytest.mark.notebook(study)``) asks for its notebook, the
notebooks of every test of its module start, two at a time in the order the tests will ask for
them, and each test waits for its own run only: the module's tests do nothing else meanwhile, so
the two runs have the cores to themselves. Two runs side by side get one torch thread each: two
one-thread kernels finish sooner on 2 cores than one after the other with two threads each (as
`sweep --workers` runs studies); two-thread kernels side by side, or beside the other tests, spin
against each other (the six took 1239 s instead of 162)."""
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


def _execute(study: str, folder: Path, threads: dict) -> NotebookRun:
    folder.mkdir(parents=True)
    run = NotebookRun(folder / "run", folder / "out.ipynb")
    env = dict(os.environ, **threads)
    p = subprocess.run([sys.executable, "-m", "papermill", str(ROOT / "notebooks" / f"{study}.ipynb"),
                        str(run.executed), "-p", "run_dir", str(run.run_dir), "--cwd", str(ROOT), "-k", "python3",
                        "--no-progress-bar"], env=env, capture_output=True, text=True, timeout=TIMEOUT_S)
    if p.returncode:
        raise AssertionError(f"papermill {study}.ipynb exited with {p.returncode}:\n{p.stderr[-4000:]}")
    return run


class NotebookPool:
    def __init__(self, groups: list[list[str]], folder: Path):
        self._groups, self._folder, self._runs = groups, folder, {}
        self._pool = ThreadPoolExecutor(max_workers=LANES, thread_name_prefix="notebook")

    def run(self, study: str) -> NotebookRun:
        """The finished run of ``study``'s notebook (the AssertionError of a failed one, with its stderr)."""
        if study not in self._runs:
            group = next((g for g in self._groups if study in g), [study])
            threads = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"} if len(group) > 1 else {}
            for s in group:
                if s not in self._runs:
                    self._runs[s] = self._pool.submit(_execute, s, self._folder / s, threads)
        return self._runs[study].result()

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)


def studies_of(items) -> list[list[str]]:
    """The notebooks the collected tests will ask for, per module, in their order."""
    groups: dict[str, list[str]] = {}
    for item in items:
        for m in item.iter_markers("notebook"):
            groups.setdefault(item.module.__name__, []).append(m.args[0])
    return [list(dict.fromkeys(g)) for g in groups.values()]
