"""What a run folder holds, read from the folder itself: the state a resume starts from.

A sweep takes each planned study through four stages, and each stage leaves a file behind, so a
run killed at any moment (SIGKILL included) can be read back and finished:

- ``table``: ``<study>.parquet`` (written atomically: present means complete);
- ``notebook``: ``<study>.ipynb`` executed to its end without an exception (papermill records
  both in the notebook's metadata); runs in ``direct`` mode have no notebooks;
- ``html``: ``<study>.html``, the readable copy of the executed notebook (papermill mode);
- ``figures``: ``figures/.<study>.drawn``, the list of figure files, written after the study's
  figures of this run were all saved.

Nothing here writes; ``meta.json`` says what was planned (``params.studies``) and whether the
sweep reached its end (``finished_at``).
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from .files import read_regular

STAGES = ("table", "notebook", "html", "figures")
FIGURES_DIR = "figures"


def figures_marker(run_dir: Path | str, study: str) -> Path:
    """The file that says the study's figures of this run are all saved (it lists them)."""
    return Path(run_dir) / FIGURES_DIR / f".{study}.drawn"


def notebook_done(path: Path) -> bool:
    """Whether ``path`` is a notebook papermill executed to its end without an exception."""
    try:
        # a run folder may come from anyone: never through a link, never a FIFO (which blocks)
        doc = json.loads(read_regular(path).decode("utf-8"))
        pm = doc["metadata"]["papermill"]
    except (OSError, ValueError, KeyError, TypeError, RecursionError):
        return False
    return isinstance(pm, dict) and bool(pm.get("end_time")) and not pm.get("exception")


def _figures_drawn(run_dir: Path, study: str) -> bool:
    if figures_marker(run_dir, study).is_file():
        return True
    # runs made before the marker existed: the study's own figure files
    folder = run_dir / FIGURES_DIR
    return folder.is_dir() and any(p.name.startswith(f"{study}_") for p in folder.iterdir())


@dataclass
class StudyState:
    """One planned study's stages: which are done, which are left (in order)."""

    name: str
    done: dict[str, bool]

    @property
    def left(self) -> list[str]:
        return [s for s in STAGES if s in self.done and not self.done[s]]

    @property
    def complete(self) -> bool:
        return not self.left


@dataclass
class RunState:
    run_dir: Path
    finished: bool                    # meta.json has finished_at: the sweep (or a resume) reached its end
    direct: bool                      # studies ran without notebooks
    studies: dict[str, StudyState] = field(default_factory=dict)

    @property
    def left(self) -> dict[str, list[str]]:
        """{study: stages left} for every study that is not complete, in plan order."""
        return {n: s.left for n, s in self.studies.items() if s.left}

    def describe_left(self) -> str:
        """'fp32_memory (notebook, html, figures); correctness (table, ...)' or 'nothing'."""
        return "; ".join(f"{n} ({', '.join(stages)})" for n, stages in self.left.items()) or "nothing"


def study_state(run_dir: Path | str, study: str, direct: bool) -> StudyState:
    run_dir = Path(run_dir)
    done = {"table": (run_dir / f"{study}.parquet").is_file()}
    if not direct:
        done["notebook"] = notebook_done(run_dir / f"{study}.ipynb")
        done["html"] = (run_dir / f"{study}.html").is_file()
    done["figures"] = _figures_drawn(run_dir, study)
    return StudyState(study, done)


def run_state(run_dir: Path | str, meta: Mapping[str, Any]) -> RunState:
    """The state of every study ``meta`` (the run's meta.json, already read) planned."""
    run_dir = Path(run_dir)
    params = meta.get("params") or {}
    direct = params.get("mode") != "papermill"
    plan = params.get("studies") or {}
    return RunState(run_dir=run_dir, finished=bool(meta.get("finished_at")), direct=direct,
                    studies={name: study_state(run_dir, name, direct) for name in plan})


def open_failures(meta: Mapping[str, Any]) -> list[str]:
    """The failures of a run that no later resume has mended.

    A sweep records ``failures`` once, when it finishes. A resume of a finished run appends an
    entry to ``resumed`` with the studies it re-ran and their own ``failures`` (what was
    recorded before is never rewritten): a study re-run there drops its earlier failures and
    takes the entry's. Entries without ``failures`` (resumes of a killed run, which wrote the
    run's first ``failures`` themselves) change nothing here.
    """
    failures = [str(f) for f in (meta.get("failures") or [])]
    for entry in meta.get("resumed") or []:
        if not isinstance(entry, Mapping) or "failures" not in entry:
            continue
        redone = set(entry.get("studies") or [])
        failures = [f for f in failures if f.split(":", 1)[0] not in redone]
        failures += [str(f) for f in entry.get("failures") or []]
    return failures
