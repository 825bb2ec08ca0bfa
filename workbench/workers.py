"""``sweep --gpus`` and ``sweep --workers N`` (`execute_in_workers`): a worker process per GPU, or N of them side by
side on the CPU (``python -m workbench.workers``: `work`), each taking the next study nobody has claimed (a claim file
per study) and recording how it went beside the claim."""
from __future__ import annotations

import importlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from . import cpu_share, limits, procs
from .provenance import REPO_ROOT

# N pretend GPUs, for tests of the worker plumbing on a host without them (meta.json says so)
EMULATE_GPUS_ENV = "WORKBENCH_EMULATE_GPUS"
CLAIMS_DIR = ".claims"
# set for a CPU worker of `sweep --workers N`: its index (a GPU worker has CUDA_VISIBLE_DEVICES instead)
CPU_WORKER_ENV = "WORKBENCH_CPU_WORKER"
# comma-separated modules outside the package that a worker imports to register the studies they define
STUDY_MODULES_ENV = "WORKBENCH_STUDY_MODULES"


def check_gpus(gpus: list[int] | tuple[int, ...] | None, profile: str) -> None:
    """SystemExit unless every GPU of ``gpus`` is on this host (or emulated) and ``profile`` runs on GPUs."""
    if not gpus:
        return
    emulated = os.environ.get(EMULATE_GPUS_ENV)
    if emulated and not (emulated.isascii() and emulated.isdigit()):
        raise SystemExit(f"{EMULATE_GPUS_ENV}={emulated!r}: give a number of GPUs to pretend, e.g. 2")
    if not emulated and profile not in ("gpu", "gpu-full"):
        raise SystemExit(f"--gpus {','.join(map(str, gpus))}: the {profile} profile runs on the CPU; --gpus "
                         f"needs a gpu profile on a CUDA host (--profile gpu or gpu-full)")
    if emulated:
        try:        # the GPUs of one host: as many as the ranks of one data-parallel launch at most
            cap = limits.current().world_size
        except ValueError as e:         # a malformed $WORKBENCH_LIMITS
            raise SystemExit(str(e)) from None
        digits = emulated.lstrip("0") or "0"
        if len(digits) > len(str(cap)) or int(digits) > cap:
            raise SystemExit(f"{EMULATE_GPUS_ENV}={emulated!r}: more GPUs to pretend than the cap of {cap} (limit "
                             f"'world_size'); valid: 0..{cap}, raise it on purpose with "
                             f"{limits.LIMITS_ENV}=world_size=N")
        n = int(digits)
    else:
        import torch
        n = torch.cuda.device_count()
    if bad := [g for g in gpus if g >= n]:
        raise SystemExit(f"--gpus: {bad} not on this host; it has {n} GPU(s): {list(range(n))}")


def parse_workers(text: str | int | None) -> int | str | None:
    """``--workers 2`` -> 2, ``auto`` -> "auto", None -> None (the command's default); SystemExit otherwise, a
    count over the cap ``workers`` included."""
    if text is None or str(text).strip().lower() == "auto":
        return None if text is None else "auto"
    try:
        n = int(str(text))
    except ValueError:
        n = 0
    if n < 1:
        raise SystemExit(f"--workers {text!r}: give a number of worker processes >= 1, or auto (one per core on "
                         f"the cpu profile, at most one per study); 1 runs the studies one after the other here")
    try:
        return limits.check("workers", n, f"--workers {text!r}: a count of worker processes (valid: 1.."
                                          f"{limits.current().workers:,}, or auto)")
    except ValueError as e:       # over the cap, or a malformed $WORKBENCH_LIMITS
        raise SystemExit(str(e)) from None


def worker_count(wanted: int | str | None, profile: str, n_studies: int, gpus=None, default: int | str = 1) -> int:
    """How many CPU worker processes a sweep of ``n_studies`` runs: ``wanted`` (None: ``default``, which applies on
    the cpu profile without --gpus only), ``auto`` the usable cores, never more than the studies. SystemExit for
    more than one on the gpu profile or beside --gpus."""
    if wanted is None:
        return 1 if gpus or profile != "cpu" else worker_count(default, profile, n_studies)
    if wanted != 1 and profile != "cpu":
        raise SystemExit(f"--workers {wanted}: the {profile} profile spreads studies over GPUs, with one worker "
                         f"process per GPU: give --gpus 0,1,... instead (--workers is for the cpu profile)")
    if wanted != 1 and gpus:
        raise SystemExit(f"--workers {wanted} with --gpus {','.join(map(str, gpus))}: --gpus already starts one "
                         f"worker per GPU; give one of the two")
    return max(1, min(cpu_share(1) if wanted == "auto" else wanted, n_studies))


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
    """One worker (a GPU's or a CPU's): claim the next study of ``names``, run it, record the outcome in
    ``.claims/<study>.json``."""
    from .files import atomic_write_text
    from .results import RunFolder
    from .stages import finish_study
    from .studies import discover
    cpu, gpu = os.environ.get(CPU_WORKER_ENV), os.environ.get("CUDA_VISIBLE_DEVICES", "")
    if cpu is not None and not (cpu.isascii() and cpu.isdigit()):
        raise SystemExit(f"{CPU_WORKER_ENV}={cpu!r}: expected the worker's index, a whole number >= 0 (the sweep "
                         f"sets it for each worker it starts)")
    for module in filter(None, (m.strip() for m in os.environ.get(STUDY_MODULES_ENV, "").split(","))):
        try:
            importlib.import_module(module)
        except (ImportError, TypeError, ValueError) as e:      # not found, or not a module name (".x", "a..b")
            raise SystemExit(f"{STUDY_MODULES_ENV}={os.environ[STUDY_MODULES_ENV]!r}: cannot import {module!r} "
                             f"({e}); expected comma-separated importable modules that register studies") from None
    meta = RunFolder(run_dir).meta()
    device = (meta.params or {}).get("device") or "cpu"
    studies = discover()
    place = {"worker": int(cpu)} if cpu is not None else {"gpu": gpu}
    for name in names:
        try:        # exactly one process can create a study's claim file
            with open(run_dir / CLAIMS_DIR / f"{name}.claim", "x") as claim:
                claim.write(f"{os.getpid()} " + (f"cpu worker {cpu}" if cpu is not None else f"gpu {gpu}") + "\n")
        except FileExistsError:
            continue
        t0 = time.perf_counter()
        if name in studies:
            failures = finish_study(studies[name], meta.plan[name], device, run_dir, direct, kernel)
        else:
            failures = [f"{name}: not registered in the worker process (a study defined in a script "
                        f"or notebook cannot run under --gpus or --workers: define it in an importable module)"]
        record = {"study": name, **place, "pid": os.getpid(),
                  "threads": os.environ.get("OMP_NUM_THREADS", ""),
                  "seconds": round(time.perf_counter() - t0, 1), "failures": failures}
        atomic_write_text(run_dir / CLAIMS_DIR / f"{name}.json", json.dumps(record))


def execute_in_workers(selected: list, run_dir: Path, direct: bool, kernel: str, gpus: list[int] | tuple[int, ...]
                       | None = None, workers: int = 1) -> tuple[list[str], dict, dict]:
    """Run ``selected`` (in this order) with one worker process per GPU of ``gpus``, else ``workers`` processes on
    the CPU: (failures, {study: {gpu, seconds, threads}} with GPUs, {study: seconds} of those that finished without
    failure)."""
    claims = run_dir / CLAIMS_DIR
    shutil.rmtree(claims, ignore_errors=True)       # a killed sweep's claims mean nothing now
    claims.mkdir()
    modules, roots = study_modules(selected)
    cmd = [sys.executable, "-m", "workbench.workers", str(run_dir), ",".join(s.name for s in selected), kernel,
           *(["--direct"] if direct else [])]
    places = ([{"CUDA_VISIBLE_DEVICES": str(g)} for g in gpus] if gpus
              else [{CPU_WORKER_ENV: str(k)} for k in range(workers)])
    started, watch = [], procs.ParentWatch()
    try:
        for k, place in enumerate(places):
            env = {**os.environ, **place, **watch.child_env()}      # each worker dies with this process
            # a share of the cores each (torch's default oversubscribes: results/reference/README.md); the user's wins
            env.setdefault("OMP_NUM_THREADS", str(cpu_share(len(places))))
            if modules:
                env[STUDY_MODULES_ENV] = ",".join(modules)
                env["PYTHONPATH"] = os.pathsep.join([*roots, *filter(None, [os.environ.get("PYTHONPATH")])])
            started.append((gpus[k] if gpus else k, subprocess.Popen(cmd, env=env, cwd=str(REPO_ROOT),
                                                                     pass_fds=watch.pass_fds)))
        codes = {w: p.wait() for w, p in started}
    finally:        # a failed start, or interrupted here (Ctrl-C in a notebook): no worker goes on unwatched
        for _, p in started:
            if p.poll() is None:
                p.kill()
                p.wait()
        watch.close()
    failures, placed, seconds = [], {}, {}
    for s in selected:
        record, claim = claims / f"{s.name}.json", claims / f"{s.name}.claim"
        if record.is_file():
            rec = json.loads(record.read_text())
            failures += rec["failures"]
            if "gpu" in rec:     # the report names each study's GPU; a CPU worker's index says little
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


if __name__ == "__main__":      # a worker process of `execute_in_workers`: RUN_DIR STUDY,STUDY,... KERNEL [--direct]
    procs.from_env()            # first: a sweep killed while this process imports leaves nothing behind
    work(Path(sys.argv[1]), sys.argv[2].split(","), "--direct" in sys.argv[4:], sys.argv[3])
