"""The time a user has left to wait, as every long command of the workbench prints it."""
from __future__ import annotations


def time_left(done: int, total: int | None, t0: float, done0: int, now: float) -> str:
    """", about N s left" (or min) at the pace since ``done0`` at ``t0``; "" until it moves, without total, done."""
    if not total or done >= total or done <= done0 or now <= t0:
        return ""
    left = (now - t0) / (done - done0) * (total - done)
    return f", about {left:.0f} s left" if left < 120 else f", about {left / 60:.0f} min left"
