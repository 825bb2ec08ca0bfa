"""Faults in the local dp launcher: a failing, dying or hanging rank must end `launch` within seconds
with the failing rank's own story, and no rank may outlive its launcher.

The rank functions below are module-level so spawned ranks can import them (as `test_dp_faults`,
from the tests folder that pytest puts on sys.path and spawn hands to its children).
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


def _stamp(path):
    """Record when this rank is about to fail, so a test can time the launcher's reaction."""
    with open(path, "w") as f:
        f.write(repr(time.time()))


def _gather_small():
    t = torch.full((3,), float(dist.get_rank()))
    out = [torch.empty(3) for _ in range(dist.get_world_size())]
    dist.all_gather(out, t)
    return torch.stack(out)


def _raise_before_gather(stamp):
    if dist.get_rank() == 1:
        _stamp(stamp)
        raise ValueError("rank 1 fails on purpose before the all_gather")
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


def _peer_error_first_then_real_cause():
    if dist.get_rank() == 0:  # what a peer of a crashed rank reports, but before the cause is known
        raise RuntimeError("[pair.cc:537] Read error: Connection reset by peer (simulated)")
    time.sleep(0.3)
    raise ValueError("the real cause, reported second")


def _rank_and_pid():
    return {"rank": dist.get_rank(), "pid": os.getpid()}


def _latency(stamp, t_error):
    return t_error - float(Path(stamp).read_text())


@pytest.mark.timeout(900)   # the ranks' start may take minutes on a loaded machine
def test_raising_rank_ends_launch_within_seconds_with_its_traceback(tmp_path):
    stamp = tmp_path / "failed_at"
    with pytest.raises(RuntimeError) as ei:
        launch(_raise_before_gather, world_size=2, backend="gloo", args=(str(stamp),), timeout_s=60)
    latency = _latency(stamp, time.time())
    msg = str(ei.value)
    print(f"failure -> launcher error: {latency:.2f} s\n{msg}")
    assert latency < 5, f"the launcher took {latency:.1f} s to notice the failed rank"
    assert "rank 1" in msg
    assert "ValueError: rank 1 fails on purpose before the all_gather" in msg
    assert "Traceback (most recent call last)" in msg and "_raise_before_gather" in msg
    assert isinstance(ei.value, RankError) and ei.value.rank == 1 and ei.value.exitcode is None


@pytest.mark.timeout(900)   # the ranks' start may take minutes on a loaded machine
@pytest.mark.parametrize("how, expect", [("exit3", "rank 1 exited with code 3 (no traceback: the process died)"),
                                         ("SIGKILL", "rank 1 was killed by signal SIGKILL"),
                                         ("SIGSEGV", "rank 1 was killed by signal SIGSEGV")])
def test_dying_rank_is_reported_not_its_peers_connection_reset(tmp_path, how, expect):
    stamp = tmp_path / "failed_at"
    with pytest.raises(RuntimeError) as ei:
        launch(_die_before_gather, world_size=2, backend="gloo", args=(str(stamp), how), timeout_s=60)
    latency = _latency(stamp, time.time())
    msg = str(ei.value)
    print(f"failure -> launcher error: {latency:.2f} s\n{msg}")
    assert latency < 5, f"the launcher took {latency:.1f} s to notice the dead rank"
    assert msg.splitlines()[0].startswith(f"dp {expect}"), msg
    if how == "SIGSEGV":
        # faulthandler in the rank writes its Python stack to stderr, which the launcher keeps the tail of
        assert "_die_before_gather" in msg


@pytest.mark.timeout(900)   # the ranks' start may take minutes on a loaded machine
def test_first_cause_wins_over_a_peer_that_only_lost_its_connection():
    with pytest.raises(RuntimeError) as ei:
        launch(_peer_error_first_then_real_cause, world_size=2, backend="gloo", timeout_s=60)
    msg = str(ei.value)
    print(msg)
    assert msg.startswith("dp rank 1 failed: ValueError: the real cause, reported second"), msg
    assert re.search(r"rank 0 failed: RuntimeError: .*Connection reset by peer.*likely a consequence", msg), msg
    assert ei.value.rank == 1 and "ValueError: the real cause" in ei.value.remote_traceback


@pytest.mark.timeout(900)   # the ranks' start may take minutes on a loaded machine
def test_results_come_back_in_rank_order_and_no_rank_is_left_behind():
    results = launch(_rank_and_pid, world_size=2, backend="gloo", timeout_s=60)
    assert [r["rank"] for r in results] == [0, 1]
    if sys.platform.startswith("linux"):
        assert not [r["pid"] for r in results if _alive(r["pid"])]


@pytest.mark.timeout(900)   # the ranks' start may take minutes on a loaded machine
def test_ranks_given_different_batches_name_the_ranks_and_the_cause(seed):
    with pytest.raises(RuntimeError) as ei:
        launch(_encode_rank_dependent_batch, world_size=2, backend="gloo", args=(seed,), timeout_s=60)
    msg = str(ei.value)
    print(msg)
    assert "different batches" in msg
    assert re.search(r"rank 0: 3 items", msg) and re.search(r"rank 1: 2 items", msg), msg


@pytest.mark.timeout(900)   # the ranks' start may take minutes on a loaded machine
def test_mismatched_collective_in_user_code_names_a_rank_and_the_cause():
    t0 = time.monotonic()
    with pytest.raises(RuntimeError) as ei:
        launch(_gather_mismatched_sizes, world_size=2, backend="gloo", timeout_s=60)
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


@pytest.mark.timeout(120)
def test_ranks_that_never_start_are_named_after_start_timeout_s():
    t0 = time.monotonic()
    with pytest.raises(TimeoutError) as ei:     # no machine spawns and imports torch in 10 ms
        launch(_gather_small, world_size=2, backend="gloo", start_timeout_s=0.01, timeout_s=600)
    msg = str(ei.value)
    assert time.monotonic() - t0 < 30, msg
    assert re.search(r"ranks \[0, 1\] had not started 0.01 s after", msg) and "start_timeout_s" in msg, msg


@pytest.mark.timeout(900)
def test_timeout_bounds_wall_time_and_names_unfinished_ranks(tmp_path):
    """timeout_s counts from the ranks' start: on a loaded machine the start alone (spawn, torch's
    import) can take longer than timeout_s, so the bound is timed from inside the hung rank."""
    timeout_s = 15
    stamp = tmp_path / "hung_at"
    with pytest.raises(TimeoutError) as ei:
        launch(_sleep_forever_on_rank_1, world_size=2, backend="gloo", args=(str(stamp),), timeout_s=timeout_s)
    wall = _latency(stamp, time.time())
    msg = str(ei.value)
    print(f"{wall:.1f} s after rank 1 hung\n{msg}")
    assert wall < timeout_s + 6, f"launch(timeout_s={timeout_s}) took {wall:.1f} s after the hang"
    assert re.search(r"rank 1\b", msg) and "had not finished" in msg
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


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG and /proc are Linux")
@pytest.mark.timeout(60)
@pytest.mark.parametrize("kill", ["launcher", "process-group"])
def test_ranks_do_not_outlive_a_sigkilled_launcher(kill):
    """kill -9 of the launcher alone (the ranks must notice: PR_SET_PDEATHSIG), or of its whole group."""
    code = (f"import sys; sys.path.insert(0, {str(TESTS)!r})\n"
            "import test_dp_faults\n"
            "from workbench.launch import launch\n"
            "if __name__ == '__main__':\n"
            "    launch(test_dp_faults._print_pid_then_block, world_size=2, backend='gloo', timeout_s=600)\n")
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=REPO, stdout=subprocess.PIPE,
                            start_new_session=True)
    ranks, helpers = {}, []
    try:
        sel = selectors.DefaultSelector()
        sel.register(proc.stdout, selectors.EVENT_READ)
        deadline, out = time.monotonic() + 45, b""
        while len(ranks) < 2 and time.monotonic() < deadline and proc.poll() is None:
            if sel.select(timeout=0.5):
                out += os.read(proc.stdout.fileno(), 4096)  # raw reads: a buffered readline could sit on a line
                for rank, pid in re.findall(rb"rank-pid (\d+) (\d+)\n", out):
                    ranks[int(rank)] = int(pid)
        assert len(ranks) == 2, f"the ranks did not start (launcher rc={proc.poll()})"
        helpers = [p for p in _children(proc.pid) if p not in ranks.values()]  # e.g. the resource tracker
        time.sleep(0.5)  # rank 0 is in its all_gather, rank 1 asleep
        if kill == "launcher":
            os.kill(proc.pid, signal.SIGKILL)
        else:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=5)
        t0 = time.monotonic()
        left = list(ranks.values()) + helpers
        while left and time.monotonic() - t0 < 5:
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
