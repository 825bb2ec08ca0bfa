"""`launch(fn, world_size)`: `fn(*args)` on local ranks of a torch.distributed process group, without torchrun.
It is `torch.multiprocessing.start_processes` plus a deadline, the results, the failing rank's story, no orphans."""
from __future__ import annotations

import datetime
import faulthandler
import math
import numbers
import os
import pickle
import signal
import socket
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.multiprocessing.spawn import ProcessException

from . import cpu_share, limits, procs

_TAIL_LINES = 40         # of a dead rank's stderr, and of a hung rank's stack, in the error message


class RankError(RuntimeError):
    """`rank` (the first to fail) failed with `remote_traceback`, or died with `exitcode` (negative: a signal)."""

    def __init__(self, message: str, rank: int, exitcode: int | None = None, remote_traceback: str | None = None):
        super().__init__(message)
        self.rank, self.exitcode, self.remote_traceback = rank, exitcode, remote_traceback


def _file(folder: str, rank: int, kind: str) -> Path:
    """A rank's file in the launch folder: 'log' (its fd 2), 'part' then 'pt' (its result, by torch.save)."""
    return Path(folder, f"{rank}.{kind}")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank_main(rank, world_size, backend, port, fn, folder, parent_pid, timeout_s):
    # die with the launcher, kill -9 included (start_processes' SIGINT is lost on a rank blocked in C++); a rank
    # whose launcher died while it imported torch leaves at once
    procs.die_with_parent(parent_pid)
    # the stderr file also says to the launcher that this rank has started (spawned, imported)
    log = open(_file(folder, rank, "log"), "ab", buffering=0)
    sys.stderr.flush()
    os.dup2(log.fileno(), 2)
    faulthandler.enable(all_threads=True)                    # a crash writes every thread's stack
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # the launcher asks a hung rank where it is
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank))
    if backend == "nccl":
        torch.cuda.set_device(rank)
    else:
        torch.set_num_threads(cpu_share(world_size))  # the ranks share the host's cores
    # a collective whose peer is gone fails after this instead of blocking when nothing watches
    dist.init_process_group(backend, rank=rank, world_size=world_size,
                            timeout=datetime.timedelta(seconds=float(timeout_s)))
    result = fn(*torch.load(Path(folder, "args.pt"), map_location="cpu", weights_only=False))
    torch.save(result, _file(folder, rank, "part"))
    os.replace(_file(folder, rank, "part"), _file(folder, rank, "pt"))  # the launcher never reads half a file
    dist.barrier()  # the peers may still be receiving from this rank: leave the group together
    dist.destroy_process_group()


def launch(fn, world_size: int = 2, backend: str | None = None, args: tuple = (), timeout_s: float = 600,
           start_timeout_s: float = 600) -> list:
    """`fn(*args)` (module-level) on `world_size` spawned ranks (gloo, or nccl with one GPU a rank): the results in
    rank order. RankError within seconds of a failure; TimeoutError when the ranks have not all started (spawn,
    imports) within start_timeout_s, or ended within timeout_s of that. Either way every rank is stopped first."""
    world_size = limits.integer(world_size, "world_size", cap="world_size")
    for name, value in (("timeout_s", timeout_s), ("start_timeout_s", start_timeout_s)):
        if isinstance(value, bool) or not isinstance(value, numbers.Real) or not 0 < value < math.inf:
            raise ValueError(f"{name} must be a finite number of seconds > 0, got {value!r}")
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    backend = backend or ("nccl" if gpus >= world_size else "gloo")
    if backend not in ("gloo", "nccl"):
        raise ValueError(f"backend must be 'gloo' or 'nccl', got {backend!r}")
    if backend == "nccl" and gpus < world_size:
        raise ValueError(f"nccl with world_size={world_size} needs {world_size} GPUs, {gpus} visible")
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")  # NVLink multicast off (see the GPU host notes)
    with tempfile.TemporaryDirectory(prefix="wb-launch-") as folder:
        # in a file: a write into the pipe of a rank that died unread (no main guard) blocks for ever
        torch.save(args, Path(folder, "args.pt"))
        ctx = mp.start_processes(_rank_main, (world_size, backend, _free_port(), fn, folder, os.getpid(), timeout_s),
                                 nprocs=world_size, join=False, start_method="spawn")
        try:
            _wait(ctx, folder, timeout_s, start_timeout_s)
            return [torch.load(_file(folder, r, "pt"), map_location="cpu", weights_only=False)
                    for r in range(world_size)]
        finally:
            _stop(ctx, folder)


def _wait(ctx, folder: str, timeout_s: float, start_timeout_s: float) -> None:
    ranks = range(len(ctx.processes))
    started, deadline = False, time.monotonic() + start_timeout_s
    while True:
        if not started and all(_file(folder, r, "log").exists() for r in ranks):
            started, deadline = True, time.monotonic() + timeout_s
        left = deadline - time.monotonic()
        if left <= 0:
            raise _timeout_error(ctx, folder, timeout_s if started else start_timeout_s, started)
        try:
            # join stops the other ranks itself on a failure (SIGTERM, then SIGKILL); before the start, poll
            if ctx.join(timeout=left if started else min(left, 0.2)):
                break
        except ProcessException as e:
            raise _rank_error(ctx, folder, e.error_index) from None
    # os._exit(0), or a KeyboardInterrupt, which start_processes counts as a clean exit
    if missing := [r for r in ranks if not _file(folder, r, "pt").exists()]:
        raise _rank_error(ctx, folder, missing[0])


def _rank_error(ctx, folder: str, rank: int) -> RankError:
    tb = _traceback(ctx, rank)
    code = None if tb else ctx.processes[rank].exitcode
    if tb:
        parts = [f"dp rank {rank} failed: {_exception_line(tb)}\n--- traceback from rank {rank} ---\n{tb.rstrip()}"]
    elif code == 0:
        parts = [f"dp rank {rank} exited with code 0 without returning a result (no traceback)"]
    else:
        signals = {-s.value: s.name for s in signal.Signals}
        how = f"was killed by signal {signals[code]}" if code in signals else f"exited with code {code}"
        parts = [f"dp rank {rank} {how} (no traceback: the process died)"]
    if not tb:
        tail = "\n".join(_stderr(folder, rank).rstrip().splitlines()[-_TAIL_LINES:])
        parts.append(f"--- last lines rank {rank} wrote to stderr ---\n{tail}" if _file(folder, rank, "log").exists()
                     else "It died before it started (its error is on stderr). A script without an "
                     "`if __name__ == '__main__':` guard re-runs itself in every spawned rank.")
    for r in (r for r in range(len(ctx.processes)) if r != rank):
        other = _traceback(ctx, r)
        fate = ("returned its result" if _file(folder, r, "pt").exists() else
                f"failed too: {_exception_line(other)}" if other else "still running; stopped by the launcher")
        parts.append(f"  rank {r}: {fate}")
    return RankError("\n".join(parts), rank, code, tb)


def _traceback(ctx, rank: int) -> str | None:
    """The formatted traceback start_processes pickles into a rank's error file."""
    try:
        with open(ctx.error_files[rank], "rb") as f:
            return pickle.load(f)
    except (OSError, EOFError, pickle.UnpicklingError):
        return None


def _exception_line(tb: str) -> str:
    """The first line of the exception after a formatted traceback's last frame."""
    lines = tb.rstrip().splitlines()
    last = max((i for i, line in enumerate(lines) if line.startswith('  File "')), default=-1)
    rest = [line for line in lines[last + 1:] if not line.startswith("    ")]  # skip source and carets
    return rest[0] if rest else lines[-1]


def _timeout_error(ctx, folder: str, seconds: float, started: bool) -> TimeoutError:
    ranks = range(len(ctx.processes))
    if not started:
        late = [r for r in ranks if not _file(folder, r, "log").exists()]
        return TimeoutError(f"dp launch: ranks {late} had not started {seconds:g} s after they were spawned (a "
                            "process start and torch's import); the machine may be overloaded: raise "
                            "start_timeout_s; the launcher stopped every rank")
    stuck = [r for r in ranks if not _file(folder, r, "pt").exists()]
    done = [r for r in ranks if r not in stuck]
    text = (f"dp launch timed out after {seconds:g} s: " + ", ".join(f"rank {r}" for r in stuck)
            + " had not finished" + (f" (ranks {done} had returned their results)" if done else "")
            + "; the launcher stopped every rank")
    # SIGUSR1: faulthandler in the rank writes its stacks to its stderr file, after what is there now
    asked = {r: len(_stderr(folder, r)) for r in stuck if ctx.processes[r].is_alive()}
    for r in asked:
        os.kill(ctx.processes[r].pid, signal.SIGUSR1)
    end = time.monotonic() + 2.0     # for the stacks to come
    while time.monotonic() < end and not all(" line " in _stderr(folder, r)[n:] for r, n in asked.items()):
        time.sleep(0.1)
    time.sleep(0.1)  # one handler writes every thread's stack: the rest follows the first frame at once
    for r, n in asked.items():
        stack = "\n".join(_stderr(folder, r)[n:].strip().splitlines()[:_TAIL_LINES])
        text += f"\n--- where rank {r} was (Python stacks, most recent call first) ---\n{stack}" if stack else ""
    return TimeoutError(text)


def _stderr(folder: str, rank: int) -> str:
    path = _file(folder, rank, "log")
    return path.read_bytes().decode(errors="replace") if path.exists() else ""


def _stop(ctx, folder: str) -> None:
    """Stop the ranks still running, drop start_processes' error files, copy the ranks' stderr to ours."""
    alive = [p for p in ctx.processes if p.is_alive()]
    for p in alive:
        p.terminate()
    end = time.monotonic() + 2.0     # between terminate() and kill()
    for p in alive:
        p.join(max(0.0, end - time.monotonic()))
        if p.is_alive():  # terminate is ignored by a rank that handles SIGTERM and sits in a C call
            p.kill()
            p.join()
    for r, path in enumerate(ctx.error_files):
        Path(path).unlink(missing_ok=True)
        if _stderr(folder, r).strip():
            print(f"--- stderr of dp rank {r} ---\n{_stderr(folder, r).rstrip()}", file=sys.stderr, flush=True)
