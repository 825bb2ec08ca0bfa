"""``sweep --gpus``: one worker process per GPU of this host, each pinned to its GPU with
CUDA_VISIBLE_DEVICES, each taking the next study nobody has taken (a claim file per study decides
who runs it) and recording how it went beside the claim. The parent side is `execute_on_gpus`;
each worker is ``python -m workbench worker RUN --studies A,B,...``, whose body is `work`.
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from . import cpu_share
from .provenance import REPO_ROOT

# N pretend GPUs, for tests of the worker plumbing on a host without them (meta.json says so)
EMULATE_GPUS_ENV = "WORKBENCH_EMULATE_GPUS"

CLAIMS_DIR = ".claims"

# the modules outside the package that define the selected studies (a user's, a test's stub),
# comma-separated: a worker imports them so that the studies they register run under --gpus too
STUDY_MODULES_ENV = "WORKBENCH_STUDY_MODULES"


def check_gpus(gpus: list[int] | tuple[int, ...] | None, profile: str) -> None:
    """SystemExit unless every GPU of ``gpus`` is on this host (or emulated) and ``profile`` runs on GPUs."""
    if not gpus:
        return
    emulated = os.environ.get(EMULATE_GPUS_ENV)
    if emulated:
        if not emulated.isdigit():
            raise SystemExit(f"{EMULATE_GPUS_ENV}={emulated!r}: give a number of GPUs to pretend, e.g. 2")
        n = int(emulated)
    else:
        if profile != "gpu":
            raise SystemExit(f"--gpus {','.join(map(str, gpus))}: the {profile} profile runs on the CPU; --gpus "
                             f"needs the gpu profile on a CUDA host (--profile gpu)")
        import torch

        n = torch.cuda.device_count()
    bad = [g for g in gpus if g >= n]
    if bad:
        raise SystemExit(f"--gpus: {bad} not on this host; it has {n} GPU(s): {list(range(n))}")


def one_gpu_warnings(selected: list, plan: dict, device: str) -> list[str]:
    """Each worker sees one GPU, so a study that wants more (correctness's dp path on CUDA) skips
    those rows, as on a one-GPU host: a warning each."""
    out = []
    for s in selected:
        n = s.gpus_wanted(plan[s.name], device)
        if n > 1:
            out.append(f"{s.name}: wants {n} GPUs with these parameters, but each --gpus worker has one, "
                       f"so its rows that need {n} are skipped; run it without --gpus for them")
    return out


def study_modules(selected: list) -> tuple[list[str], list[str]]:
    """(modules, import roots) of the selected studies defined outside the workbench package: what a
    worker imports to register them. One defined in ``__main__`` (a script, a notebook) has none."""
    modules: list[str] = []
    roots: list[str] = []
    for study in selected:
        name = getattr(study.run, "__module__", None) or ""
        if not name or name == "__main__" or name.split(".")[0] == "workbench" or name in modules:
            continue
        file = getattr(sys.modules.get(name), "__file__", None)
        if not file:
            continue
        path = Path(file).resolve()
        if path.name == "__init__.py":
            path = path.parent
        modules.append(name)
        root = str(path.parents[name.count(".")])
        if root not in roots:
            roots.append(root)
    return modules, roots


def _study_registry() -> dict:
    import importlib

    from .studies import discover

    for name in filter(None, os.environ.get(STUDY_MODULES_ENV, "").split(",")):
        importlib.import_module(name)
    return discover()


def _claim(run_dir: Path, study: str) -> bool:
    """Take ``study`` for this worker: exactly one process can create its claim file."""
    try:
        fd = os.open(run_dir / CLAIMS_DIR / f"{study}.claim", os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        return False
    os.write(fd, f"{os.getpid()} gpu {os.environ.get('CUDA_VISIBLE_DEVICES', '')}\n".encode())
    os.close(fd)
    return True


def work(run_dir: Path, names: list[str], direct: bool, kernel: str) -> None:
    """One GPU's worker: claim the next study of ``names``, run it here with the parameters the run
    planned, record the outcome in ``.claims/<study>.json``; until every study is taken."""
    import time

    from .files import atomic_write_text
    from .runstate import RunFolder
    from .stages import finish_study

    meta = RunFolder(run_dir).meta()
    device = (meta.params or {}).get("device") or "cpu"
    studies = _study_registry()
    for name in names:
        if not _claim(run_dir, name):
            continue
        t0 = time.perf_counter()
        if name in studies:
            failures = finish_study(studies[name], meta.plan[name], device, run_dir, direct, kernel)
        else:
            failures = [f"{name}: not registered in the worker process (a study defined in a script "
                        f"or notebook cannot run under --gpus: define it in an importable module)"]
        record = {"study": name, "gpu": os.environ.get("CUDA_VISIBLE_DEVICES", ""), "pid": os.getpid(),
                  "threads": os.environ.get("OMP_NUM_THREADS", ""),
                  "seconds": round(time.perf_counter() - t0, 1), "failures": failures}
        atomic_write_text(run_dir / CLAIMS_DIR / f"{name}.json", json.dumps(record))


def execute_on_gpus(selected: list, run_dir: Path, direct: bool, kernel: str,
                    gpus: list[int] | tuple[int, ...]) -> tuple[list[str], dict, dict]:
    """Run ``selected`` (in this order) with one worker process per GPU. Returns (failures,
    {study: {gpu, seconds, threads}}, {study: seconds} of the studies that finished without one)."""
    import shutil
    import subprocess

    claims = run_dir / CLAIMS_DIR
    shutil.rmtree(claims, ignore_errors=True)       # a killed sweep's claims mean nothing now
    claims.mkdir()
    order = ",".join(s.name for s in selected)
    modules, roots = study_modules(selected)
    procs = []
    for g in gpus:
        cmd = [sys.executable, "-m", "workbench", "worker", str(run_dir), "--studies", order, "--kernel", kernel]
        if direct:
            cmd.append("--direct")
        env = {**os.environ, "CUDA_VISIBLE_DEVICES": str(g)}
        # a share of the host's cores each: torch's default of one thread per core in every worker
        # oversubscribes the host (results/reference/README.md has by how much); the user's value wins
        env.setdefault("OMP_NUM_THREADS", str(cpu_share(len(gpus))))
        if modules:
            env[STUDY_MODULES_ENV] = ",".join(modules)
            env["PYTHONPATH"] = os.pathsep.join([*roots, *filter(None, [os.environ.get("PYTHONPATH")])])
        procs.append((g, subprocess.Popen(cmd, env=env, cwd=str(REPO_ROOT))))
    codes = {g: p.wait() for g, p in procs}
    failures: list[str] = []
    placed: dict[str, dict] = {}
    seconds: dict[str, float] = {}
    for s in selected:
        record, claim = claims / f"{s.name}.json", claims / f"{s.name}.claim"
        if record.is_file():
            rec = json.loads(record.read_text())
            failures += rec["failures"]
            placed[s.name] = {"gpu": rec["gpu"], "seconds": rec["seconds"], "threads": rec["threads"]}
            if not rec["failures"]:
                seconds[s.name] = rec["seconds"]
        elif claim.is_file():
            failures.append(f"{s.name}: its worker ({claim.read_text().strip()}) died before finishing it "
                            f"(exit codes {codes}); resume the run to re-run it")
        else:
            failures.append(f"{s.name}: no worker took it (exit codes {codes}); resume the run to run it")
    shutil.rmtree(claims, ignore_errors=True)
    return failures, placed, seconds
