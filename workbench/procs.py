"""Child processes that die with the command that started them, however it dies.

A command that is killed outright (``kill -9``, the OOM killer, a CI runner's timeout) runs no cleanup: the
processes it started (the report's summary workers, the sweep's workers, the dp ranks) would live on under init,
blocked for ever on a queue, a collective or a pipe that nobody will touch again, holding the pipes a caller
reads to its end. So every child calls `die_with_parent` first thing:

- on Linux it asks the kernel for SIGKILL when its parent goes (``prctl(PR_SET_PDEATHSIG)``), then looks whether
  the parent it was started by is still its parent: one that died before the request (while the child started or
  imported) sends no signal, so the child leaves at once;
- where there is no prctl, a daemon thread watches instead: it waits on the read end of a pipe whose write end
  only the parent holds (`ParentWatch`; end of file = the parent is gone), and checks the parent id too, which
  also covers a child that could not be handed the pipe (a spawned one).

A child started with `subprocess` finds its parent's id (and the pipe, where there is one) in `PARENT_ENV`
(`child_env`, `from_env`); a forked or spawned one is handed them as arguments. The kernel's "parent" is the
thread that started the child: start children from the thread that waits for them, as every caller here does.
"""
from __future__ import annotations

import ctypes
import os
import select
import signal
import sys
import threading

PARENT_ENV = "WORKBENCH_PARENT"     # "<parent pid>" or "<parent pid>:<fd of the watch pipe>" in a started child
PR_SET_PDEATHSIG = 1
WATCH_POLL_S = 0.5                  # the watchdog's look at the parent id between waits on the pipe
EXIT_ORPHANED = 1                   # the exit status of a child that found its parent gone

# whether `die_with_parent` asks the kernel; the tests turn it off to try the watchdog on Linux
use_prctl = sys.platform.startswith("linux")


def _pdeathsig() -> bool:
    """Ask for SIGKILL at the parent's death: True where the kernel took the request."""
    if not use_prctl:
        return False
    try:
        return ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) == 0
    except (OSError, AttributeError):      # no libc prctl here
        return False


def _watch(parent_pid: int, fd: int | None) -> None:
    """Leave (os._exit: no cleanup may block) once the pipe ends or the parent id changes."""
    while True:
        if fd is not None:
            try:
                ready, _, _ = select.select([fd], [], [], WATCH_POLL_S)
                if ready and not os.read(fd, 1):        # end of file: every write end is closed
                    os._exit(EXIT_ORPHANED)
            except OSError:                              # the fd is gone: the parent id still tells
                fd = None
        else:
            threading.Event().wait(WATCH_POLL_S)
        if os.getppid() != parent_pid:
            os._exit(EXIT_ORPHANED)


def die_with_parent(parent_pid: int, watch_fd: int | None = None, close_fd: int | None = None) -> None:
    """Make this (child) process die with ``parent_pid``, the process that started it; leave now if it already
    has. ``watch_fd`` is the read end of the parent's `ParentWatch` pipe where it has one; ``close_fd`` its write
    end, which a forked child inherits and must close, or the pipe would never end."""
    if close_fd is not None:
        try:
            os.close(close_fd)
        except OSError:
            pass
    armed = _pdeathsig()
    if os.getppid() != parent_pid:     # it died before the request: no signal will come
        os._exit(EXIT_ORPHANED)
    if not armed or watch_fd is not None:
        threading.Thread(target=_watch, args=(parent_pid, watch_fd), name="parent-watch", daemon=True).start()


class ParentWatch:
    """The parent's side: the pipe a child's watchdog waits on where the kernel cannot signal (no prctl); no pipe
    where it can. Its write end is never inherited across exec; a forked child closes it (`die_with_parent`)."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.read_fd = self.write_fd = None
        if not use_prctl:
            self.read_fd, self.write_fd = os.pipe()     # both non-inheritable

    def args(self) -> tuple:
        """`die_with_parent`'s arguments for a forked child."""
        return self.pid, self.read_fd, self.write_fd

    def child_env(self) -> dict[str, str]:
        """The environment entry a child started with subprocess reads (`from_env`); pass `pass_fds` with it."""
        return {PARENT_ENV: f"{self.pid}" + (f":{self.read_fd}" if self.read_fd is not None else "")}

    @property
    def pass_fds(self) -> tuple[int, ...]:
        return () if self.read_fd is None else (self.read_fd,)

    def close(self) -> None:
        """Once the children have ended: the pipe goes (while they run, its write end stays open here, so this
        process's death, and only that, ends it for them)."""
        for fd in (self.read_fd, self.write_fd):
            if fd is not None:
                os.close(fd)
        self.read_fd = self.write_fd = None

    def __enter__(self) -> "ParentWatch":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def from_env(environ=None) -> None:
    """`die_with_parent` for a child started with `ParentWatch.child_env`; SystemExit naming the variable where
    it is malformed, nothing where it is not set (the module was run by hand)."""
    env = os.environ if environ is None else environ
    text = env.get(PARENT_ENV)
    if text is None:
        return
    pid, sep, fd = text.partition(":")
    if not (pid.isascii() and pid.isdigit() and (not sep or (fd.isascii() and fd.isdigit()))):
        raise SystemExit(f"{PARENT_ENV}={text!r}: expected PID or PID:FD (the starting process's id and the read "
                         f"end of its watch pipe), as the parent process sets it; unset it to run this by hand")
    die_with_parent(int(pid), int(fd) if sep else None)
