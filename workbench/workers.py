"""``sweep --gpus`` (`execute_on_gpus`): a worker process per GPU (``python -m workbench worker``: `work`), each
taking the next study nobody has claimed (a claim file per study) and recording how it went beside the claim."""
from __future__ import annotations

import importlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from . import cpu_share
from .provenance import REPO_ROOT

# N pretend GPUs, for tests of the worker plumbing on a host without them (meta.json says so)
EMULATE_GPUS_ENV = "WORKBENCH_EMULATE_GPUS"
CLAIMS_DIR = ".claims"
# comma-separated modules outside the package that a worker imports to register the studies they define
STUDY_MODULES_ENV = "WORKBENCH_STUDY_MODULES"


def check_gpus(gpus: list[int] | tuple[int, ...] | None, profile: str) -> None:
    """SystemExit unless every GPU of ``gpus`` is on this host (or emulated) and ``profile`` runs on GPUs."""
    if not gpus:
        return
    emulated = os.environ.get(EMULATE_GPUS_ENV)
    if emulated and not emulated.isdigit():
        raise SystemExit(f"{EMULATE_GPUS_ENV}={emulated!r}: give a number of GPUs to pretend, e.g. 2")
    if not emulated and profile != "gpu":
        raise SystemExit(f"--gpus {','.join(map(str, gpus))}: the {profile} profile runs on the CPU; --gpus "
                         f"needs the gpu profile on a CUDA host (--profile gpu)")
    if emulated:
        n = int(emulated)
    else:
        import torch
        n = torch.cuda.device_count()
    if bad := [g for g in gpus if g >= n]:
        raise SystemExit(f"--gpus: {bad} not on this host; it has {n} GPU(s): {list(range(n))}")


def one_gpu_warnings(selected: list, plan: dict, device: str) -> list[str]:
    """A warning for each study that wants more GPUs than the one a worker sees (correctness's dp rows on CUDA)."""
    return [f"{s.name}: wants {n} GPUs with these parameters, but each --gpus worker has one, "
            f"so its rows that need {n} are skipped; run it without --gpus for them"
            for s in selected if (n := s.gpus_wanted(plan[s.name], device)) > 1]


def study_modules(selected: list) -> tuple[list[str], list[str]]:
    """(modules, import roots) of the studies defined outside the package (not in ``__main__``) for a worker."""
    modules, roots = [], []
    for study in selected:
        name = getattr(study.run, "__module__", None) or ""
        file = getattr(sys.modules.get(name), "__file__", None)
        if name in ("", "__main__", *modules) or name.split(".")[0] == "workbench" or not file:
            continue
        path = Path(file).resolve()
        modules.append(name)
        roots.append(str((path.parent if path.name == "__init__.py" else path).parents[name.count(".")]))
    return modules, list(dict.fromkeys(roots))


def work(run_dir: Path, names: list[str], direct: bool, kernel: str) -> None:
    """One GPU's worker: claim the next study of ``names``, run it, record the outcome in ``.claims/<study>.json``."""
    from .files import atomic_write_text
    from .runstate import RunFolder
    from .stages import finish_study
    from .studies import discover
    meta = RunFolder(run_dir).meta()
    device = (meta.params or {}).get("device") or "cpu"
    for module in filter(None, os.environ.get(STUDY_MODULES_ENV, "").split(",")):
        importlib.import_module(module)
    studies = discover()
    for name in names:
        try:        # exactly one process can create a study's claim file
            with open(run_dir / CLAIMS_DIR / f"{name}.claim", "x") as claim:
                claim.write(f"{os.getpid()} gpu {os.environ.get('CUDA_VISIBLE_DEVICES', '')}\n")
        except FileExistsError:
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
    """Run ``selected`` (in this order) with one worker process per GPU: (failures, {study: {gpu, seconds,
    threads}}, {study: seconds} of those that finished without failure)."""
    claims = run_dir / CLAIMS_DIR
    shutil.rmtree(claims, ignore_errors=True)       # a killed sweep's claims mean nothing now
    claims.mkdir()
    modules, roots = study_modules(selected)
    cmd = [sys.executable, "-m", "workbench", "worker", str(run_dir), "--studies", ",".join(s.name for s in selected),
           "--kernel", kernel, *(["--direct"] if direct else [])]
    procs = []
    for g in gpus:
        env = {**os.environ, "CUDA_VISIBLE_DEVICES": str(g)}
        # a share of the cores each (torch's default oversubscribes: results/reference/README.md); the user's wins
        env.setdefault("OMP_NUM_THREADS", str(cpu_share(len(gpus))))
        if modules:
            env[STUDY_MODULES_ENV] = ",".join(modules)
            env["PYTHONPATH"] = os.pathsep.join([*roots, *filter(None, [os.environ.get("PYTHONPATH")])])
        procs.append((g, subprocess.Popen(cmd, env=env, cwd=str(REPO_ROOT))))
    codes = {g: p.wait() for g, p in procs}
    failures, placed, seconds = [], {}, {}
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
