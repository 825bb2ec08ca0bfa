"""Two workloads side by side: what a busy preprocessor takes from an encoder on the same device, and
what the encoder takes from it.

The harness times a *victim* (the encoder's call) while an *aggressor* (the preprocessor: decode,
resize, patchify, normalize) runs beside it at a **duty cycle** d, the fraction of time it is busy:
after each call that took b seconds it rests b (1 - d) / d, so d = 1 is a preprocessor that never
rests and d = 0.25 one that works a quarter of the time, as a preprocessor serving a quarter of its
own highest rate does. The aggressor runs

- ``same_process``: on a thread of this process, and on a CUDA device on a CUDA stream of its own (the
  engines' GPU processors): kernels of both may run at once, and the two share one host process
  (its GIL, its allocator);
- ``other_process``: in a child process (an engine's worker pool), a fresh interpreter; on a CUDA
  device a second context on the same GPU, which time-slices with this one (no MPS). The child dies
  with this process however it ends (`workbench.procs.die_with_parent`).

On a CPU the same harness runs: the "streams" are threads sharing the cores, which is what a CPU run
measures (a smoke test of the harness, labelled by its ``device`` column like every table).

Each call of either side is stamped with ``time.monotonic`` (one clock for every process of the
machine), so the aggressor's calls that fall inside the victim's timed window are the contended
ones. `NvmlSampler` samples the GPU's utilization and memory through NVML (``pynvml``) meanwhile,
where it is installed.

Works are objects with ``setup()`` (once, in the process that runs them), ``__call__()`` (one unit of
work) and ``sync()`` (wait for the work it queued on its own stream): `PreprocessWork` is the study's
preprocessor; `WaitWork` a stand-in that only waits (the harness's tests).
"""
from __future__ import annotations

import math
import os
import statistics
import threading
import time
import traceback
from dataclasses import dataclass, field
from typing import Any, Callable

BESIDE = ("same_process", "other_process")
START_TIMEOUT_S = 600.0        # a child's start: spawn, imports, its first CUDA context
STOP_TIMEOUT_S = 120.0         # the longest a child's last call may take once asked to stop
WARMUP_CALLS = 2               # calls of a work before it is timed: first calls pay one-off costs (allocator, caches)


def check_duty(duty: Any) -> float:
    """A duty cycle, the fraction of time the aggressor is busy: a number in (0, 1]."""
    if isinstance(duty, bool) or not isinstance(duty, (int, float)) or not 0 < duty <= 1:
        raise ValueError(f"duty cycle {duty!r} is outside (0, 1]; valid: the fraction of time the preprocessor is "
                         "busy, 0 < duty <= 1 (e.g. 0.25, 0.5, 1.0)")
    return float(duty)


def check_beside(beside: Any) -> str:
    if beside not in BESIDE:
        raise ValueError(f"unknown beside {beside!r}; valid: {', '.join(BESIDE)}")
    return beside


@dataclass(frozen=True)
class WaitWork:
    """A work that waits ``ms`` without using a core (the harness's own tests: two of them overlap fully)."""

    ms: float

    def setup(self) -> None:
        pass

    def __call__(self) -> None:
        time.sleep(self.ms / 1e3)

    def sync(self) -> None:
        pass


@dataclass
class PreprocessWork:
    """The preprocessor of the study, one call = one batch of request files to normalized patch rows on
    ``device``: decode (nvJPEG on the GPU where ``gpu_decode``, else Pillow on the host, then a copy to
    the device), then `workbench.preprocess` with backend ``cuda`` (resize, patchify, normalize on the
    device; on a CPU its emulation). Picklable: a child process gets it whole and calls ``setup``."""

    items: tuple                     # workbench.decode.Encoded
    preset: str
    depth: int | None
    device: str
    gpu_decode: bool = False
    state: dict = field(default_factory=dict, repr=False, compare=False)

    def __getstate__(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if k != "state"} | {"state": {}}

    def setup(self) -> None:
        import torch

        from .checkpoints import resolve_config
        dev = torch.device(self.device)
        self.state.update(cfg=resolve_config(self.preset, self.depth), dev=dev,
                          stream=torch.cuda.Stream(dev) if dev.type == "cuda" else None)

    def __call__(self):
        import contextlib

        import torch

        from .decode import decode_gpu, decode_host
        from .preprocess import preprocess
        from .torch_images import hwc_rgb
        if not self.state:
            self.setup()
        s = self.state
        with torch.cuda.stream(s["stream"]) if s["stream"] is not None else contextlib.nullcontext():
            if self.gpu_decode:
                images = decode_gpu(self.items, s["dev"])
            else:
                images = [hwc_rgb(decode_host(e), i, e.name) for i, e in enumerate(self.items)]
            return preprocess(images, s["cfg"], backend="cuda", device=s["dev"], normalize=True)

    def sync(self) -> None:
        if self.state.get("stream") is not None:
            self.state["stream"].synchronize()


def warmed(work):
    """``work`` set up and called WARMUP_CALLS times (its one-off costs paid before any timing)."""
    work.setup()
    for _ in range(WARMUP_CALLS):
        work()
        work.sync()
    return work


def paced(work, duty: float, stop: threading.Event | Callable[[float], bool], calls: list,
          started: threading.Event | None = None) -> None:
    """Call ``work`` until ``stop``, busy a ``duty`` fraction of the time: after a call of b seconds, rest
    b (1 - duty) / duty. Each call's (start, end) monotonic stamps are appended to ``calls``; ``started`` is
    set after the first. ``stop``: an Event, or ``stop(timeout_s) -> bool`` that waits up to that long."""
    wait = stop.wait if isinstance(stop, threading.Event) else stop
    while True:
        t0 = time.monotonic()
        work()
        work.sync()
        t1 = time.monotonic()
        calls.append((t0, t1))
        if started is not None and not started.is_set():
            started.set()
        if wait((t1 - t0) * (1 - duty) / duty if duty < 1 else 0.0):
            return


class SameProcess:
    """The aggressor on a thread of this process (its work on a CUDA stream of its own)."""

    beside = "same_process"

    def __init__(self, work):
        self.work = warmed(work)
        self.thread = None

    def start(self, duty: float) -> None:
        self.calls, self.stop_event, started = [], threading.Event(), threading.Event()
        self.error: list[BaseException] = []

        def body():
            try:
                paced(self.work, duty, self.stop_event, self.calls, started)
            except BaseException as e:  # noqa: BLE001 - raised again in stop(), in the caller's thread
                self.error.append(e)
                started.set()
        self.thread = threading.Thread(target=body, name="aggressor", daemon=True)
        self.thread.start()
        started.wait()
        if self.error:
            raise self.error[0]

    def stop(self) -> list[tuple[float, float]]:
        self.stop_event.set()
        self.thread.join()
        if self.error:
            raise self.error[0]
        return self.calls

    def close(self) -> None:
        pass


def serve(conn, work) -> None:
    """A child process's work: set ``work`` up, then on each ("run", duty) run it paced until ("stop",) and
    send back its calls' stamps; ("quit",) or the parent's end ends it. An error is sent back with its
    traceback."""
    try:
        warmed(work)
        conn.send(("ready",))
        while True:
            msg = conn.recv()
            if msg[0] != "run":
                return
            calls: list = []
            first = [True]

            def stop(timeout: float) -> bool:
                if first[0]:
                    first[0] = False
                    conn.send(("started",))
                return conn.poll(timeout)
            paced(work, msg[1], stop, calls)
            conn.recv()
            conn.send(("calls", calls))
    except EOFError:
        return
    except BaseException:  # noqa: BLE001 - the parent raises it with the child's traceback
        conn.send(("error", traceback.format_exc()))
    finally:
        conn.close()


class OtherProcess:
    """The aggressor in a child process: a fresh interpreter (``python -m workbench.interference FD``, so no
    script of the caller is imported again) that dies with this one (`workbench.procs`); the work and the
    commands travel over a socket pair."""

    beside = "other_process"

    def __init__(self, work, start_timeout_s: float = START_TIMEOUT_S):
        import socket
        import subprocess
        import sys
        from multiprocessing.connection import Connection
        from pathlib import Path

        from .procs import ParentWatch
        mine, theirs = socket.socketpair()
        self.watch = ParentWatch()
        root = str(Path(__file__).resolve().parents[1])      # where this package is importable from
        env = {**os.environ, **self.watch.child_env(),
               "PYTHONPATH": os.pathsep.join([root, *filter(None, [os.environ.get("PYTHONPATH")])])}
        fd = theirs.fileno()
        self.proc = subprocess.Popen([sys.executable, "-m", "workbench.interference", str(fd)],
                                     pass_fds=(fd, *self.watch.pass_fds), env=env)
        theirs.close()
        self.conn = Connection(mine.detach())
        self.conn.send(work)
        self._expect("ready", start_timeout_s)

    def _expect(self, what: str, timeout_s: float):
        if not self.conn.poll(timeout_s):
            self.close()
            raise TimeoutError(f"the aggressor process sent no {what!r} within {timeout_s:.0f} s")
        try:
            msg = self.conn.recv()
        except EOFError:
            self.close()
            raise RuntimeError(f"the aggressor process ended (exit code {self.proc.poll()}) before {what!r}") from None
        if msg[0] == "error":
            self.close()
            raise RuntimeError(f"the aggressor process failed:\n{msg[1]}")
        return msg

    def start(self, duty: float) -> None:
        self.conn.send(("run", duty))
        self._expect("started", STOP_TIMEOUT_S)

    def stop(self) -> list[tuple[float, float]]:
        self.conn.send(("stop",))
        return self._expect("calls", STOP_TIMEOUT_S)[1]

    def close(self) -> None:
        import subprocess
        if self.proc.poll() is None:
            try:
                self.conn.send(("quit",))
            except OSError:
                pass
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.conn.close()
        self.watch.close()


def aggressor(beside: str, work):
    """The aggressor of kind ``beside`` (`BESIDE`) for ``work``, set up and ready; ``close()`` it."""
    return SameProcess(work) if check_beside(beside) == "same_process" else OtherProcess(work)


def timed(fn, sync: Callable[[], None], reps: int, min_window_s: float = 0.0, max_window_s: float = math.inf):
    """(seconds of each call of ``fn`` + ``sync``, the window's (start, end) monotonic stamps): ``reps`` calls,
    more until the window lasts ``min_window_s``, never past ``max_window_s`` (one call at least)."""
    out, w0 = [], time.monotonic()
    while True:
        t0 = time.monotonic()
        fn()
        sync()
        t1 = time.monotonic()
        out.append(t1 - t0)
        if (len(out) >= reps and t1 - w0 >= min_window_s) or t1 - w0 >= max_window_s:
            return out, (w0, t1)


def inside(calls: list[tuple[float, float]], window: tuple[float, float]) -> list[float]:
    """Durations (s) of the calls within ``window``; where none falls wholly inside, those overlapping it."""
    whole = [b - a for a, b in calls if a >= window[0] and b <= window[1]]
    return whole or [b - a for a, b in calls if b > window[0] and a < window[1]]


def beside_run(victim, victim_sync, side, duty: float, reps: int, aggressor_s: float,
               max_window_s: float = 60.0, sampler=None) -> dict:
    """The victim timed while ``side`` (an `aggressor`) runs at ``duty``: dict(victim_s: the victim's call
    times, aggressor_s: those of the aggressor's calls inside the window, window_s, aggressor_busy_s: the
    aggressor's busy seconds inside it, and ``sampler``'s readings where one is given). The window lasts
    at least 2.5 aggressor periods (``aggressor_s`` / duty, its call time alone) so that it holds whole
    aggressor calls."""
    duty = check_duty(duty)
    side.start(duty)
    try:
        if sampler is not None:
            sampler.start()
        victim_s, window = timed(victim, victim_sync, reps, min_window_s=2.5 * aggressor_s / duty,
                                 max_window_s=max_window_s)
        readings = sampler.stop() if sampler is not None else {}
    finally:
        calls = side.stop()
    busy = sum(max(0.0, min(b, window[1]) - max(a, window[0])) for a, b in calls)
    return dict(victim_s=victim_s, aggressor_s=inside(calls, window), window_s=window[1] - window[0],
                aggressor_busy_s=busy, **readings)


def alone(fn, sync, reps: int) -> list[float]:
    """``reps`` call times (s) of ``fn`` + ``sync`` with nothing beside, after one warm-up call."""
    fn()
    sync()
    return timed(fn, sync, reps)[0]


def median_ms(seconds: list[float]) -> float:
    return statistics.median(seconds) * 1e3 if seconds else math.nan


class NvmlSampler:
    """The GPU's utilization (fraction of time a kernel ran, NVML's ``utilization.gpu``) and used memory,
    sampled every ``period_s`` from `start` to `stop` on a thread; where NVML cannot run (no pynvml, no
    driver, a CPU) ``available`` is False and `stop` gives {}. ``index``: the device's NVML index (the
    CUDA index where CUDA_VISIBLE_DEVICES does not reorder them)."""

    def __init__(self, index: int = 0, period_s: float = 0.02):
        self.period_s, self.handle, self.nvml = period_s, None, None
        try:
            import pynvml
            pynvml.nvmlInit()
            self.nvml, self.handle = pynvml, pynvml.nvmlDeviceGetHandleByIndex(index)
        except Exception:  # noqa: BLE001 - no library, no driver, no device: nothing sampled
            self.handle = None

    @property
    def available(self) -> bool:
        return self.handle is not None

    def start(self) -> None:
        self.util, self.mem, self.halt = [], [], threading.Event()
        if not self.available:
            return

        def body():
            while not self.halt.is_set():
                self.util.append(self.nvml.nvmlDeviceGetUtilizationRates(self.handle).gpu / 100.0)
                self.mem.append(self.nvml.nvmlDeviceGetMemoryInfo(self.handle).used)
                self.halt.wait(self.period_s)
        self.thread = threading.Thread(target=body, name="nvml", daemon=True)
        self.thread.start()

    def stop(self) -> dict:
        if not self.available:
            return {}
        self.halt.set()
        self.thread.join()
        return dict(gpu_util=statistics.fmean(self.util) if self.util else math.nan,
                    gpu_mem_bytes=float(max(self.mem)) if self.mem else math.nan)


if __name__ == "__main__":       # the other_process aggressor (OtherProcess starts it)
    import sys
    from multiprocessing.connection import Connection

    from .procs import from_env
    from_env()
    channel = Connection(int(sys.argv[1]))
    serve(channel, channel.recv())
