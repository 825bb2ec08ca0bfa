"""A fault-tolerant local launcher: `launch(fn, world_size)` runs `fn` on `world_size` local
processes joined in a torch.distributed process group (gloo on CPU, NCCL with one GPU per rank),
with no torchrun, which is what a notebook or a test uses; workbench.dp runs its encoder on it.
`launch(fn, world_size, process_group=False)` runs plain processes (RANK and WORLD_SIZE in their
environment, no process group): a rank then imports nothing but what `fn` needs (not torch).

Failures: the launcher watches every rank at once (its result pipe, its stderr and its process), so
the first rank that raises or dies ends the whole group within about a second, and `launch` raises
`RankError` with that rank's own traceback, or, for a rank that died without one, its exit code or
signal and the last lines it wrote to stderr. `timeout_s` bounds the work, counted from the moment
every rank has started (spawned and imported); `start_timeout_s` bounds the start, which on a
loaded machine can take far longer than the work. A TimeoutError names the ranks that had not
finished (or not started) and shows where each one was. Ranks never outlive their launcher, even
when it is killed with SIGKILL.
"""
from __future__ import annotations

import codecs
import ctypes
import datetime
import faulthandler
import io
import math
import numbers
import os
import pickle
import signal
import socket
import sys
import threading
import time
import traceback
import warnings

from . import cpu_share, limits

# torch is imported where a process group or a tensor needs it, never here: a rank without a
# process group starts with nothing heavy imported (its start is then a process start, not
# seconds of torch's import), and only what `fn` itself imports.


# ---------------------------------------------------------------------------------------------
# How the pieces fit (and why):
# - every rank gets two one-way pipes to the launcher: one carries "started", then its single
#   result or its formatted traceback; the other is its stderr, forwarded to the launcher's
#   stderr, whose tail the launcher keeps, so a rank that dies without a Python traceback (a gloo
#   abort, a segfault) still says why: faulthandler writes its Python stack there;
# - the launcher waits on those pipes and on every process sentinel at once, so it sees the first
#   traceback or death at once: the failed rank's peers cannot tell it, as they sit blocked in a
#   collective until the process-group timeout;
# - on the first failure the launcher stops the whole group (terminate, then kill) and raises;
# - ranks die with their launcher (PR_SET_PDEATHSIG), even when it is SIGKILLed;
# - pipes, not a multiprocessing.Queue: no semaphores, so nothing for the resource tracker to
#   clean up or warn about. (The spawn context still starts that tracker process; it exits by
#   itself once the launcher and every rank have closed their end of its pipe.)
# ---------------------------------------------------------------------------------------------

_SETTLE_S = 1.0          # after a peer-lost error, how long to wait for the report of the rank that caused it
_TERM_GRACE_S = 2.0      # between terminate() and kill() when stopping the group
_EXIT_GRACE_S = 10.0     # for ranks to exit after every rank has returned its result
_DUMP_WAIT_S = 1.5       # for hung ranks to write their stacks (SIGUSR1 -> faulthandler) on a timeout
_TAIL_BYTES = 8192       # of each rank's stderr, kept for the error message
_TAIL_LINES = 40

# A rank whose exception says it lost a peer failed because of another rank, not by itself:
# report it only when no rank has a better story (gloo, NCCL and socket wordings).
_PEER_LOST = ("connection reset by peer", "connection closed by peer", "broken pipe", "remote worker",
              "ncclremoteerror", "nccl communicator was aborted", "timed out", "timeout")


class RankError(RuntimeError):
    """A rank started by `launch` failed.

    `rank` is the rank that failed first; `exitcode` its exit code when it died without a traceback
    (negative: killed by that signal), else None; `remote_traceback` its formatted traceback, if any.
    """

    def __init__(self, message: str, rank: int, exitcode: int | None = None, remote_traceback: str | None = None):
        super().__init__(message)
        self.rank, self.exitcode, self.remote_traceback = rank, exitcode, remote_traceback


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _die_with_parent(parent_pid: int) -> None:
    """Make this rank die with its launcher, however the launcher ends (kill -9 included).

    A SIGKILLed launcher runs no cleanup, so its ranks would live on as orphans: one blocked in a
    collective until the process-group timeout, one in user code for ever. Linux sends
    PR_SET_PDEATHSIG's signal when the parent *thread* ends; `launch` blocks its calling thread
    until every rank has ended, so that thread outlives the ranks. Elsewhere, a thread polls.
    """
    armed = False
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            armed = libc.prctl(1, int(signal.SIGKILL), 0, 0, 0) == 0  # 1 = PR_SET_PDEATHSIG
        except (OSError, AttributeError):
            pass
    if not armed:
        def watch():
            while os.getppid() == parent_pid:
                time.sleep(0.5)
            os._exit(1)
        threading.Thread(target=watch, name="dp-parent-watch", daemon=True).start()
    # The launcher may have died before prctl ran (a rank first spends seconds importing torch):
    # the rank was then already re-parented, and no signal will ever come.
    if os.getppid() != parent_pid:
        os._exit(1)


def _stderr_to(conn) -> None:
    """Send this process's stderr (fd 2, so C++ aborts too) into the launcher's pipe."""
    sys.stderr.flush()
    os.dup2(conn.fileno(), 2)
    conn.close()
    # a hard crash (SIGSEGV, SIGABRT from a gloo/NCCL abort, ...) writes every thread's Python stack
    faulthandler.enable(all_threads=True)
    if hasattr(faulthandler, "register") and hasattr(signal, "SIGUSR1"):
        # the launcher asks a hung rank where it is (on a timeout) before stopping it
        faulthandler.register(signal.SIGUSR1, all_threads=True)


def _exception_line(e: BaseException) -> str:
    line = "".join(traceback.format_exception_only(type(e), e)).strip().splitlines()
    return line[0] if line else type(e).__name__


def _pack(result) -> tuple[str, bytes]:
    """The result as bytes: through torch.save where torch is loaded (tensors travel as bytes, not
    as shared-memory handles: the rank exits before the parent reads them), else pickle."""
    if "torch" not in sys.modules:      # fn never imported torch: its result holds no tensor
        return "pickle", pickle.dumps(result)
    import torch

    buf = io.BytesIO()
    torch.save(result.cpu() if torch.is_tensor(result) else result, buf)
    return "torch", buf.getvalue()


def _unpack(kind: str, data: bytes):
    if kind == "pickle":
        return pickle.loads(data)
    import torch

    return torch.load(io.BytesIO(data), weights_only=False)


def _worker(rank, world_size, backend, port, fn, args, conn, err_conn=None, parent_pid=None, timeout_s=None):
    """One rank. ``backend`` None: a plain process (no process group, no torch import here)."""
    if parent_pid is not None:
        _die_with_parent(parent_pid)
    if err_conn is not None:
        _stderr_to(err_conn)
    try:
        dist = None
        if backend is not None:     # torch's import is part of the start (start_timeout_s), not of the work
            import torch
            import torch.distributed as dist
        conn.send(("started",))
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                          WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank))
        if backend is None:
            # torch, if fn imports it, reads this at its start: the ranks share the host's cores
            os.environ.setdefault("OMP_NUM_THREADS", str(cpu_share(world_size)))
        else:
            if backend == "nccl":
                torch.cuda.set_device(rank)
            else:
                torch.set_num_threads(cpu_share(world_size))
            # A collective whose peer is gone fails after this timeout instead of blocking for ever.
            # The launcher stops the group long before; this is the backstop when nothing watches.
            kw = {} if timeout_s is None else dict(timeout=datetime.timedelta(seconds=float(timeout_s)))
            dist.init_process_group(backend, rank=rank, world_size=world_size, **kw)
        result = fn(*args)
        conn.send(("ok", *_pack(result)))
        if dist is not None:
            # the peers may still be receiving from this rank: leave the group together
            dist.barrier()
            dist.destroy_process_group()
    except BaseException as e:  # report every failure to the launcher instead of hanging it
        # At once, and with no barrier or destroy first: a peer may be blocked in another
        # collective, and a barrier here would block this rank too, with its report unsent.
        try:
            conn.send(("error", traceback.format_exc(), _exception_line(e)))
        except (OSError, ValueError):
            pass  # the launcher is gone
        return
    # Result sent, group left: end now. The interpreter's own teardown (with torch loaded, seconds
    # of module cleanup) would only delay the exit the launcher waits for, past its grace period on
    # a loaded machine; nothing of this rank needs it.
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (AttributeError, OSError, ValueError):
            pass
    os._exit(0)


class _Rank:
    """The launcher's view of one rank: its process, its two pipes, what it has reported."""

    def __init__(self, rank: int):
        self.rank, self.proc, self.conn, self.err = rank, None, None, None
        self.started = self.returned = False
        self.result = None
        self.tail = bytearray()        # the last _TAIL_BYTES of its stderr
        self.capture = None            # everything since a stack-dump request, when one is pending
        self.decoder = codecs.getincrementaldecoder("utf-8")("replace")

    @property
    def exited(self) -> bool:
        return self.proc is not None and self.proc.exitcode is not None

    def start(self, ctx, world_size, backend, port, fn, args, timeout_s):
        self.conn, conn_w = ctx.Pipe(duplex=False)
        self.err, err_w = ctx.Pipe(duplex=False)
        self.proc = ctx.Process(target=_worker, name=f"dp-rank-{self.rank}", daemon=False,
                                args=(self.rank, world_size, backend, port, fn, args, conn_w, err_w, os.getpid(),
                                      timeout_s))
        try:
            self.proc.start()
        finally:
            # the child has its own copies now; ours must go, or the pipes never report EOF
            conn_w.close()
            err_w.close()
        os.set_blocking(self.err.fileno(), False)

    def read_stderr(self) -> None:
        """Forward whatever the rank wrote to stderr and keep its tail; close the pipe at EOF."""
        while self.err is not None:
            try:
                data = os.read(self.err.fileno(), 65536)
            except BlockingIOError:
                return
            except OSError:
                data = b""
            if not data:
                self.err.close()
                self.err = None
                return
            self.tail += data
            del self.tail[:-_TAIL_BYTES]
            if self.capture is not None:
                self.capture += data
            try:
                sys.stderr.write(self.decoder.decode(data))
                sys.stderr.flush()
            except (AttributeError, OSError, ValueError):
                pass  # no usable stderr here (pythonw, closed): the tail still has it

    def stderr_tail(self) -> str:
        lines = bytes(self.tail).decode(errors="replace").rstrip().splitlines()
        return "\n".join(lines[-_TAIL_LINES:])

    def stack_dump(self) -> str:
        # the head: faulthandler writes the current (main) thread first, most recent call first
        lines = bytes(self.capture or b"").decode(errors="replace").rstrip().splitlines()
        return "\n".join(lines[:_TAIL_LINES])


class _Failure:
    def __init__(self, rank: _Rank, traceback_text: str | None = None, summary: str | None = None):
        self.rank, self.traceback, self.exitcode = rank.rank, traceback_text, None
        if traceback_text is None:  # died without a report
            self.exitcode = rank.proc.exitcode
            self.summary = _death(rank.rank, self.exitcode)
        else:
            self.summary = summary
        # a traceback that only says a peer went away is a consequence: rank it below real causes
        self.consequence = traceback_text is not None and any(p in summary.lower() for p in _PEER_LOST)


def _death(rank: int, code: int | None) -> str:
    if code is not None and code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = str(-code)
        return f"rank {rank} was killed by signal {name} (no traceback: the process died)"
    if code == 0:  # e.g. os._exit(0) or sys.exit() outside the worker's reach
        return f"rank {rank} exited with code 0 without returning a result (no traceback)"
    return f"rank {rank} exited with code {code} (no traceback: the process died)"


def launch(fn, world_size: int = 2, backend: str | None = None, args: tuple = (), timeout_s: float = 600,
           start_timeout_s: float = 600, process_group: bool = True):
    """Run `fn(*args)` on `world_size` local ranks; returns the list of per-rank results.

    fn must be importable (a module-level function): ranks are spawned processes. backend:
    'gloo' (CPU) or 'nccl' (one GPU per rank); default nccl when enough GPUs are visible.
    process_group=False: no process group (and no backend): plain processes with RANK,
    WORLD_SIZE and LOCAL_RANK in their environment, which import only what fn needs.
    Raises RankError (a RuntimeError) as soon as a rank fails or dies, after stopping every rank,
    and TimeoutError when the ranks have not all started within start_timeout_s, or not all
    returned within timeout_s of the moment the last one started (give or take a few seconds to
    stop the ranks). The two are apart because starting (a process, torch's import) is the
    machine's business, and a loaded machine can take minutes for it, while timeout_s is about fn.
    A rank counts as started once it runs (spawned, fn's module and args imported), before its
    process group forms.
    """
    import multiprocessing as mp

    world_size = limits.integer(world_size, "world_size", cap="world_size")
    for name, value in (("timeout_s", timeout_s), ("start_timeout_s", start_timeout_s)):
        if isinstance(value, bool) or not isinstance(value, numbers.Real) or not 0 < value < math.inf:
            raise ValueError(f"{name} must be a finite number of seconds > 0, got {value!r}")
    if process_group not in (True, False):
        raise ValueError(f"process_group must be True or False, got {process_group!r}")
    if not process_group:
        if backend is not None:
            raise ValueError(f"backend={backend!r} needs a process group; process_group=False starts none")
    else:
        import torch

        if backend is None:
            backend = "nccl" if torch.cuda.is_available() and torch.cuda.device_count() >= world_size else "gloo"
        if backend not in ("gloo", "nccl"):
            raise ValueError(f"backend must be 'gloo' or 'nccl', got {backend!r}")
        if backend == "nccl" and torch.cuda.device_count() < world_size:
            raise ValueError(f"nccl with world_size={world_size} needs {world_size} GPUs, "
                             f"{torch.cuda.device_count()} visible")
        os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    ctx = mp.get_context("spawn")
    port = _free_port()
    ranks = [_Rank(r) for r in range(world_size)]
    try:
        for rk in ranks:
            rk.start(ctx, world_size, backend, port, fn, args, timeout_s)
        return _watch(ranks, timeout_s, start_timeout_s)
    finally:
        _stop(ranks)


def _watch(ranks: list[_Rank], timeout_s: float, start_timeout_s: float) -> list:
    """Wait for every rank's result; raise on the first failure or at the deadline (start_timeout_s
    while some rank has not started, then timeout_s from the moment the last one did)."""
    from multiprocessing.connection import wait

    failures: list[_Failure] = []
    settle_until = all_returned_at = None
    deadline = time.monotonic() + start_timeout_s
    starting = True
    while True:
        now = time.monotonic()
        if starting and all(r.started for r in ranks):
            starting, deadline = False, now + timeout_s
        if failures:
            # real causes (own tracebacks, deaths) in the order seen, then peer-lost errors
            first = min(failures, key=lambda f: f.consequence)
            if not first.consequence or now >= settle_until or all(r.exited for r in ranks):
                raise _rank_error(first, failures, ranks)
        elif all(r.returned for r in ranks):
            all_returned_at = all_returned_at or now
            if all(r.exited for r in ranks) or now >= min(deadline, all_returned_at + _EXIT_GRACE_S):
                late = [r.rank for r in ranks if not r.exited]
                if late:
                    warnings.warn(f"dp ranks {late} returned their results but had not exited "
                                  f"{_EXIT_GRACE_S:g} s later; stopping them", RuntimeWarning, stacklevel=3)
                return [r.result for r in ranks]
        elif now >= deadline:
            raise _timeout_error(ranks, start_timeout_s if starting else timeout_s, starting)

        until = settle_until if failures else (min(deadline, all_returned_at + _EXIT_GRACE_S)
                                               if all_returned_at else deadline)
        owners = {}
        for r in ranks:
            for obj in (r.conn, r.err, None if r.exited else r.proc.sentinel):
                if obj is not None:
                    owners[obj] = r
        ready = wait(list(owners), timeout=max(0.0, until - now))
        for obj in ready:
            r = owners[obj]
            if obj is r.err:
                r.read_stderr()
            elif obj is r.conn:
                _receive(r, ranks, failures)
            else:  # the process ended: read what it left before judging how it ended
                # (its sentinel closes a moment before it can be reaped: join, not exitcode, waits for that)
                r.proc.join(timeout=1.0)
                while r.conn is not None and r.conn.poll():
                    _receive(r, ranks, failures)
                r.read_stderr()
                _judge_exit(r, ranks, failures)
        if failures and settle_until is None:
            settle_until = time.monotonic() + _SETTLE_S


def _receive(r: _Rank, ranks: list[_Rank], failures: list[_Failure]) -> None:
    try:
        msg = r.conn.recv()
    except (EOFError, OSError):  # the rank closed its end (exited, or died mid-message)
        r.conn.close()
        r.conn = None
        return
    if msg[0] == "started":
        r.started = True
    elif msg[0] == "ok":
        r.result = _unpack(msg[1], msg[2])
        r.returned = True
    elif not all(x.returned for x in ranks):
        failures.append(_Failure(r, msg[1], f"rank {r.rank} failed: {msg[2]}"))
    else:  # e.g. the final barrier failed after every rank had returned: the results stand
        warnings.warn(f"dp rank {r.rank} failed after every rank had returned its result: {msg[2]}",
                      RuntimeWarning, stacklevel=4)


def _judge_exit(r: _Rank, ranks: list[_Rank], failures: list[_Failure]) -> None:
    if any(f.rank == r.rank for f in failures):
        return  # its own traceback already says more than its exit code
    code = r.proc.exitcode
    if not r.returned or (code != 0 and not all(x.returned for x in ranks)):
        failures.append(_Failure(r))
    elif code != 0:
        warnings.warn(f"dp {_death(r.rank, code)} after every rank had returned its result",
                      RuntimeWarning, stacklevel=4)


def _rank_error(first: _Failure, failures: list[_Failure], ranks: list[_Rank]) -> RankError:
    rank = ranks[first.rank]
    parts = [f"dp {first.summary}"]
    if first.traceback is not None:
        parts.append(f"--- traceback from rank {first.rank} ---\n{first.traceback.rstrip()}")
    else:
        if not rank.started:
            parts.append("It died before reaching the dp worker. If the launching script has no "
                         "`if __name__ == '__main__':` guard, each spawned rank re-runs it; see its stderr.")
        tail = rank.stderr_tail()
        if tail:
            parts.append(f"--- last lines rank {first.rank} wrote to stderr ---\n{tail}")
    others = [f"  {f.summary}" + ("  (it lost a peer: likely a consequence)" if f.consequence else "")
              for f in failures if f is not first]
    failed = {f.rank for f in failures}
    others += [f"  rank {r.rank}: {'returned its result' if r.returned else 'still running'}; stopped by the launcher"
               for r in ranks if r.rank not in failed and not r.exited]
    if others:
        parts.append("--- the other ranks ---\n" + "\n".join(others))
    return RankError("\n".join(parts), first.rank, first.exitcode, first.traceback)


def _timeout_error(ranks: list[_Rank], timeout_s: float, starting: bool = False) -> TimeoutError:
    """Ask every unfinished rank where it is (faulthandler on SIGUSR1), then describe them."""
    from multiprocessing.connection import wait

    stuck = [r for r in ranks if not r.returned]
    asked = [r for r in stuck if r.started and not r.exited and r.err is not None]
    for r in asked:
        r.capture = bytearray()
        try:
            os.kill(r.proc.pid, signal.SIGUSR1)
        except (AttributeError, ProcessLookupError):
            pass
    end = time.monotonic() + _DUMP_WAIT_S
    while asked and time.monotonic() < end:
        # a dump is complete once it names a frame and then the pipe goes quiet for a moment
        pending = [r for r in asked if r.err is not None and b" line " not in r.capture]
        quiet = not wait([r.err for r in asked if r.err is not None], timeout=0.2)
        if not pending and quiet:
            break
        for r in asked:
            r.read_stderr()
    done = [r.rank for r in ranks if r.returned]
    if starting:
        late = [r.rank for r in ranks if not r.started]
        return TimeoutError(f"dp launch: ranks {late} had not started {timeout_s:g} s after they were spawned "
                            "(a process start and its imports: torch's, for a process group); the machine may be "
                            "overloaded: raise start_timeout_s; the launcher stopped every rank")
    parts = [f"dp launch timed out after {timeout_s:g} s: "
             + ", ".join(f"rank {r.rank}" + ("" if r.started else " (still starting)") for r in stuck)
             + " had not finished" + (f" (ranks {done} had returned their results)" if done else "")
             + "; the launcher stopped every rank"]
    for r in asked:
        if r.capture:
            parts.append(f"--- where rank {r.rank} was (Python stacks, most recent call first) ---\n"
                         f"{r.stack_dump()}")
    return TimeoutError("\n".join(parts))


def _stop(ranks: list[_Rank]) -> None:
    """Stop every rank still running (terminate, then kill), reap them all, close the pipes."""
    from multiprocessing.connection import wait

    alive = [r.proc for r in ranks if r.proc is not None and r.proc.is_alive()]
    for p in alive:
        p.terminate()
    end = time.monotonic() + _TERM_GRACE_S
    while alive and time.monotonic() < end:
        wait([p.sentinel for p in alive], timeout=max(0.0, end - time.monotonic()))
        alive = [p for p in alive if p.is_alive()]
    for p in alive:  # terminate is ignored by a rank stuck in some C calls; kill is not
        p.kill()
    for r in ranks:
        if r.proc is not None and r.proc.pid is not None:
            r.proc.join(timeout=5)
            if r.proc.exitcode is not None:
                r.proc.close()  # its sentinel fd, now rather than at garbage collection
        if r.err is not None:
            r.read_stderr()
            if r.err is not None:
                r.err.close()
                r.err = None
        if r.conn is not None:
            r.conn.close()
            r.conn = None
