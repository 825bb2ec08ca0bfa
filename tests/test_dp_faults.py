"""Faults in the local launcher (workbench.launch): a failing, dying or hanging rank must end
`launch` within seconds with the failing rank's own story, and no rank may outlive its launcher.

Every case runs inside a real gloo process group (a peer blocked in a collective, a peer that
loses its connection), plus two dp faults that only a process group has (different batches, a
mismatched collective). The rank functions are module-level so spawned ranks can import them (as
`test_dp_faults`, from the tests folder that pytest puts on sys.path and spawn hands to its
children).
"""
import os
import re
import selectors
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from workbench.dp import encode_dp
from workbench.encoder import build_encoder
from workbench.launch import RankError, launch
from workbench.preprocess import preprocess
from workbench.samples import random_images

REPO = Path(__file__).resolve().parents[1]
TESTS = Path(__file__).resolve().parent

# How long a rank may take to report a failure to the launcher's error, and the work timeout the
# faults must beat by far: "within seconds", with room for a loaded 2-core machine.
REACT_S = 15
WORK_TIMEOUT_S = 120
START_S = 600          # the ranks' start (spawn; torch's import for gloo) may take minutes under load

GLOO = dict(backend="gloo", timeout_s=WORK_TIMEOUT_S, start_timeout_s=START_S)


# ------------------------------------------------------------------ rank functions

def _stamp(path) -> None:
    """Record when this rank is about to fail or hang, so a test can time the launcher's reaction."""
    Path(path).write_text(repr(time.time()))


class SlowStart:
    """An object that takes ``seconds`` to unpickle: a rank given it as its function cannot start before
    then, however fast the machine, so a start timeout shorter than that fires."""

    def __init__(self, seconds):
        self.seconds = seconds

    def __reduce__(self):
        return time.sleep, (self.seconds,)


def _gather_small():
    t = torch.full((3,), float(dist.get_rank()))
    out = [torch.empty(3) for _ in range(dist.get_world_size())]
    dist.all_gather(out, t)
    return torch.stack(out)


def _raise_before_gather(stamp):
    if dist.get_rank() == 1:
        _stamp(stamp)
        raise ValueError("rank 1 fails on purpose while rank 0 waits for it")
    return _gather_small()  # rank 0 waits here for a peer that never comes


def _die_before_gather(stamp, how):
    if dist.get_rank() == 1:
        _stamp(stamp)
        if how == "exit3":
            os._exit(3)
        os.kill(os.getpid(), getattr(signal, how))
        time.sleep(60)  # not reached: the signal ends the process
    return _gather_small()


def _gather_mismatched_sizes():
    n = 3 + 2 * dist.get_rank()
    out = [torch.empty(n) for _ in range(dist.get_world_size())]
    dist.all_gather(out, torch.zeros(n))
    return out


def _encode_rank_dependent_batch(seed):
    """Every rank should get the same batch; here rank 1 gets one item fewer."""
    enc = build_encoder("tiny-qwen2-vl", placement="tower", norm="eager", dtype=torch.float32, device="cpu")
    images = random_images(3, seed=seed, min_side=60, max_side=120)
    batch = preprocess(images[: 3 - dist.get_rank()], enc.cfg)
    return encode_dp(enc, batch)


def _sleep_forever_on_rank_1(stamp=None):
    if dist.get_rank() == 1:
        if stamp:
            _stamp(stamp)
        time.sleep(3600)
    return dist.get_rank()


def _print_pid_then_block():
    os.write(1, f"rank-pid {dist.get_rank()} {os.getpid()}\n".encode())  # one write: ranks share the pipe
    if dist.get_rank() == 0:
        _gather_small()  # blocks: rank 1 never joins
    time.sleep(3600)


def _rank_and_pid():
    return {"rank": dist.get_rank(), "world_size": int(os.environ["WORLD_SIZE"]), "pid": os.getpid(),
            "torch": "torch" in sys.modules}


def _latency(stamp, t_error):
    return t_error - float(Path(stamp).read_text())


# ------------------------------------------------------------------ supervision

@pytest.mark.timeout(900)
def test_raising_rank_ends_launch_within_seconds_with_its_traceback(tmp_path):
    stamp = tmp_path / "failed_at"
    with pytest.raises(RuntimeError) as ei:
        launch(_raise_before_gather, world_size=2, args=(str(stamp),), **GLOO)
    latency = _latency(stamp, time.time())
    msg = str(ei.value)
    print(f"failure -> launcher error: {latency:.2f} s\n{msg}")
    assert latency < REACT_S, f"the launcher took {latency:.1f} s to notice the failed rank"
    assert msg.startswith("dp rank 1 failed: ValueError: rank 1 fails on purpose while rank 0 waits for it"), msg
    assert "Traceback (most recent call last)" in msg and "_raise_before_gather" in msg
    assert isinstance(ei.value, RankError) and ei.value.rank == 1 and ei.value.exitcode is None
    assert "ValueError: rank 1 fails on purpose" in ei.value.remote_traceback
    # rank 0 was blocked in its all_gather: stopped by the launcher, or failed on the lost peer first
    assert re.search(r"rank 0: (still running; stopped by the launcher|failed too: RuntimeError)", msg), msg


DEATHS = [pytest.param("exit3", "rank 1 exited with code 3 (no traceback: the process died)", id="exit3",
                       marks=pytest.mark.slow),
          pytest.param("SIGKILL", "rank 1 was killed by signal SIGKILL", id="SIGKILL"),
          pytest.param("SIGSEGV", "rank 1 was killed by signal SIGSEGV", id="SIGSEGV", marks=pytest.mark.slow)]


@pytest.mark.timeout(900)
@pytest.mark.parametrize("how, expect", DEATHS)
def test_dying_rank_is_reported_not_its_peers_connection_reset(tmp_path, how, expect):
    stamp = tmp_path / "failed_at"
    with pytest.raises(RuntimeError) as ei:
        launch(_die_before_gather, world_size=2, args=(str(stamp), how), **GLOO)
    latency = _latency(stamp, time.time())
    msg = str(ei.value)
    print(f"failure -> launcher error: {latency:.2f} s\n{msg}")
    assert latency < REACT_S, f"the launcher took {latency:.1f} s to notice the dead rank"
    assert msg.splitlines()[0].startswith(f"dp {expect}"), msg
    assert ei.value.rank == 1 and ei.value.remote_traceback is None
    assert ei.value.exitcode == (3 if how == "exit3" else -getattr(signal, how))
    if how == "SIGSEGV":
        # faulthandler in the rank writes its Python stack to its stderr, whose tail the error keeps
        assert "_die_before_gather" in msg


@pytest.mark.timeout(900)
@pytest.mark.parametrize("world", [1, pytest.param(3, marks=pytest.mark.slow)])
def test_results_come_back_in_rank_order_and_no_rank_is_left_behind(world):
    results = launch(_rank_and_pid, world_size=world, **GLOO)
    assert [r["rank"] for r in results] == list(range(world)) and all(r["torch"] for r in results)
    assert {r["world_size"] for r in results} == {world}
    if sys.platform.startswith("linux"):
        assert not [r["pid"] for r in results if _alive(r["pid"])]


@pytest.mark.timeout(900)
def test_ranks_given_different_batches_name_the_ranks_and_the_cause(seed):
    with pytest.raises(RuntimeError) as ei:
        launch(_encode_rank_dependent_batch, world_size=2, args=(seed,), **GLOO)
    msg = str(ei.value)
    print(msg)
    assert "different batches" in msg
    assert re.search(r"rank 0: 3 items", msg) and re.search(r"rank 1: 2 items", msg), msg


@pytest.mark.timeout(900)
def test_mismatched_collective_in_user_code_names_a_rank_and_the_cause():
    t0 = time.monotonic()
    with pytest.raises(RuntimeError) as ei:
        launch(_gather_mismatched_sizes, world_size=2, **GLOO)
    msg = str(ei.value)
    print(f"{time.monotonic() - t0:.1f} s\n{msg}")
    assert re.match(r"dp rank [01] ", msg)
    # gloo aborts the rank that received the wrong size; its last stderr lines say why
    assert "doesn't match expected size" in msg or "size mismatch" in msg.lower(), msg


@pytest.mark.parametrize("bad", [0, -1])
def test_bad_world_size_is_refused(bad):
    with pytest.raises(ValueError, match=f"world_size.*{bad}"):
        launch(_gather_small, world_size=bad, backend="gloo")


@pytest.mark.parametrize("bad", [0, -5.0, float("inf"), float("nan")])
@pytest.mark.parametrize("which", ["timeout_s", "start_timeout_s"])
def test_bad_timeout_is_refused(bad, which):
    with pytest.raises(ValueError, match=f"{which} must be .* got {bad!r}"):
        launch(_gather_small, world_size=1, backend="gloo", **{which: bad})


def test_an_unknown_backend_is_refused_with_the_choices():
    with pytest.raises(ValueError, match=r"backend must be 'gloo' or 'nccl', got 'mpi'"):
        launch(_gather_small, world_size=1, backend="mpi")


@pytest.mark.timeout(300)
def test_ranks_that_never_start_are_named_after_start_timeout_s():
    """Each rank's function takes 60 s to unpickle, which spawn does before the rank's code runs (the
    arguments are read from a file after the start, so a slow argument would not do: on a fast host the
    ranks started within 1 s and the test hung), so no rank can start within 1 s on any machine; the
    launcher gives up after start_timeout_s, not timeout_s, and stops them."""
    t0 = time.monotonic()
    with pytest.raises(TimeoutError) as ei:
        launch(SlowStart(60), world_size=2, backend="gloo", start_timeout_s=1, timeout_s=600)
    msg = str(ei.value)
    assert time.monotonic() - t0 < 50, msg      # the arguments' 60 s were not waited for
    assert re.search(r"ranks \[0, 1\] had not started 1 s after", msg) and "start_timeout_s" in msg, msg


@pytest.mark.timeout(900)
def test_timeout_bounds_wall_time_and_names_unfinished_ranks(tmp_path):
    """timeout_s counts from the ranks' start: on a loaded machine the start alone (spawn, torch's
    import) can take longer than timeout_s, so the bound is timed from inside the hung rank. It
    allows timeout_s, then the stack dump and the group's stop, with room for a loaded machine."""
    stamp, timeout_s = tmp_path / "hung_at", 6
    with pytest.raises(TimeoutError) as ei:
        launch(_sleep_forever_on_rank_1, world_size=2, args=(str(stamp),), backend="gloo", timeout_s=timeout_s,
               start_timeout_s=START_S)
    wall = _latency(stamp, time.time())
    msg = str(ei.value)
    print(f"{wall:.1f} s after rank 1 hung\n{msg}")
    assert wall < timeout_s + REACT_S, f"launch(timeout_s={timeout_s}) took {wall:.1f} s after the hang"
    assert f"timed out after {timeout_s:g} s" in msg
    assert re.search(r"rank 1\b", msg) and "had not finished" in msg and "ranks [0] had returned" in msg
    # where the hung rank was: its Python stack, dumped by faulthandler just before the teardown
    assert "_sleep_forever_on_rank_1" in msg


def _alive(pid):
    """True while pid runs; a zombie (dead, waiting for a reaper that may never come) counts as dead."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _children(pid):
    kids = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if int((d / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                    kids.append(int(d.name))
            except (OSError, IndexError, ValueError):
                pass
    return kids


_GLOO_LAUNCHER = ("import sys; sys.path.insert(0, {tests!r})\n"
                  "import test_dp_faults\n"
                  "from workbench.launch import launch\n"
                  "if __name__ == '__main__':\n"
                  "    launch(test_dp_faults._print_pid_then_block, world_size=2, backend='gloo', timeout_s=600)\n")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG and /proc are Linux")
@pytest.mark.timeout(900)
@pytest.mark.parametrize("launcher, kill", [
    pytest.param(_GLOO_LAUNCHER, "launcher", id="gloo-launcher"),
    pytest.param(_GLOO_LAUNCHER, "process-group", id="gloo-process-group", marks=pytest.mark.slow)])
def test_ranks_do_not_outlive_a_sigkilled_launcher(launcher, kill):
    """kill -9 of the launcher alone (the ranks must notice: PR_SET_PDEATHSIG), or of its whole group."""
    proc = subprocess.Popen([sys.executable, "-c", launcher.format(tests=str(TESTS))], cwd=REPO,
                            stdout=subprocess.PIPE, start_new_session=True)
    ranks, helpers = {}, []
    try:
        sel = selectors.DefaultSelector()
        sel.register(proc.stdout, selectors.EVENT_READ)
        # the start allowance: a Python start (and, for gloo, torch's import) on a loaded machine
        deadline, out = time.monotonic() + START_S, b""
        while len(ranks) < 2 and time.monotonic() < deadline and proc.poll() is None:
            if sel.select(timeout=0.5):
                out += os.read(proc.stdout.fileno(), 4096)  # raw reads: a buffered readline could sit on a line
                for rank, pid in re.findall(rb"rank-pid (\d+) (\d+)\n", out):
                    ranks[int(rank)] = int(pid)
        assert len(ranks) == 2, f"the ranks did not start (launcher rc={proc.poll()})"
        helpers = [p for p in _children(proc.pid) if p not in ranks.values()]  # e.g. the resource tracker
        time.sleep(0.5)  # the ranks are in their function (gloo: rank 0 in its all_gather, rank 1 asleep)
        if kill == "launcher":
            os.kill(proc.pid, signal.SIGKILL)
        else:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        t0 = time.monotonic()
        left = list(ranks.values()) + helpers
        while left and time.monotonic() - t0 < REACT_S:
            left = [p for p in left if _alive(p)]
            time.sleep(0.05)
        print(f"ranks {ranks}, helpers {helpers}: gone {time.monotonic() - t0:.2f} s after the kill")
        assert not [p for p in ranks.values() if p in left], f"ranks outlived their launcher: {left}"
        assert not left, f"helper processes outlived their launcher: {left}"
    finally:
        # clean up whatever this test started, by pid, whatever happened above
        for pid in [proc.pid, *ranks.values(), *helpers]:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        proc.stdout.close()
        proc.wait()


def _sum_rows(x):
    return x.sum()


@pytest.mark.timeout(600)
def test_a_script_without_a_main_guard_and_large_arguments_fails_in_seconds(tmp_path):
    """Spawned ranks re-run such a script and die before reading what the launcher sends them: with
    arguments past a pipe's buffer (a 2 MB array, pickled by value; a tensor would travel as a
    shared-memory handle) the launcher used to block in that write for ever."""
    script = tmp_path / "no_guard.py"
    script.write_text(f"import sys, time, numpy\nsys.path.insert(0, {str(TESTS)!r})\n"
                      "import test_dp_faults\nfrom workbench.launch import launch\n"
                      "t = time.monotonic()\n"
                      "try:\n"
                      "    launch(test_dp_faults._sum_rows, 2, backend='gloo', args=(numpy.ones((512, 512)),),"
                      f" timeout_s={WORK_TIMEOUT_S}, start_timeout_s={START_S})\n"
                      "except Exception as e:\n"
                      "    if __name__ != '__main__':\n"
                      "        raise                      # a rank re-running the script dies here\n"
                      "    print(__name__, 'raised', type(e).__name__, round(time.monotonic() - t, 1))\n"
                      "    print(e)\n")
    p = subprocess.run([sys.executable, str(script)], cwd=REPO, capture_output=True, text=True, timeout=500)
    mine = [line for line in p.stdout.splitlines() if line.startswith("__main__ raised")]
    assert mine and mine[0].startswith("__main__ raised RankError"), (p.stdout[-2000:], p.stderr[-2000:])
    assert float(mine[0].split()[-1]) < START_S and "main__':` guard" in p.stdout
