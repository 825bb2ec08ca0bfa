"""Rank functions for the launcher's supervision tests (tests/test_dp_faults.py), run with
``launch(..., process_group=False)``: they import nothing but the standard library, so a spawned
rank starts in a fraction of a second whatever torch costs to import, and `no_torch` checks that
the launcher's own child side imported nothing heavy either.

A rank learns its rank from the environment the launcher sets (RANK, WORLD_SIZE). Where a test
needs a rank that waits for a failed peer, the peer sleeps: the launcher must stop it, as it stops
a rank blocked in a collective.
"""
import os
import sys
import time
from pathlib import Path


def rank() -> int:
    return int(os.environ["RANK"])


def stamp(path) -> None:
    """Record when this rank is about to fail or hang, so a test can time the launcher's reaction."""
    Path(path).write_text(repr(time.time()))


def no_torch():
    """What the rank had imported when fn ran: the launcher's child side must not import torch."""
    return {"rank": rank(), "pid": os.getpid(), "world_size": int(os.environ["WORLD_SIZE"]),
            "torch": "torch" in sys.modules}


def raise_on_rank_1(path):
    if rank() == 1:
        stamp(path)
        raise ValueError("rank 1 fails on purpose while rank 0 waits for it")
    time.sleep(3600)        # rank 0 waits for a peer that never answers


def die_on_rank_1(path, how):
    import signal

    if rank() == 1:
        stamp(path)
        if how == "exit3":
            os._exit(3)
        os.kill(os.getpid(), getattr(signal, how))
        time.sleep(60)      # not reached: the signal ends the process
    time.sleep(3600)


def peer_error_first_then_real_cause():
    if rank() == 0:         # what a peer of a crashed rank reports, but before the cause is known
        raise RuntimeError("[pair.cc:537] Read error: Connection reset by peer (simulated)")
    time.sleep(0.3)
    raise ValueError("the real cause, reported second")


def sleep_forever_on_rank_1(path=None):
    if rank() == 1:
        if path:
            stamp(path)
        time.sleep(3600)
    return rank()


def print_pid_then_block():
    os.write(1, f"rank-pid {rank()} {os.getpid()}\n".encode())  # one write: the ranks share the pipe
    time.sleep(3600)


def _slow_start(seconds):
    time.sleep(seconds)


class SlowStart:
    """An argument that takes ``seconds`` to unpickle: a rank given it cannot start (report to the
    launcher) before then, however fast the machine, so a start timeout shorter than that fires."""

    def __init__(self, seconds):
        self.seconds = seconds

    def __reduce__(self):
        return _slow_start, (self.seconds,)
