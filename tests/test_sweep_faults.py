"""A sweep killed mid-run (SIGKILL to its process group, dp ranks running) leaves no process
behind and no damaged table, and `sweep --resume` finishes it with the tables a clean run gives.

That test is the suite's one real end-to-end sweep: real studies, through the console entry point
in subprocesses, killed and resumed. The sweep's logic (stages, resume, shards, workers) is tested
on stub studies in tests/test_resume.py and tests/test_sweep_shards.py."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from workbench import cli
from workbench import provenance as prov
from workbench.results.meta import RunMeta
from workbench.results.folder import RunFolder, RunLock, run_in_use
from workbench.studies import load_table

REPO = Path(__file__).resolve().parent.parent
SETS = ["--studies", "fp32_memory,correctness",
        "--set", "fp32_memory.budgets=[1024]", "--set", 'fp32_memory.norms=["eager","triton_rows"]',
        "--set", 'correctness.families=["tiny-qwen2-vl"]', "--set", 'correctness.norms=["eager"]',
        "--set", 'correctness.paths=["eager","cudagraph","dp"]', "--set", 'correctness.buffer_dtypes=["uint8"]',
        "--set", 'correctness.placements=["tower","outer"]']


def _sweep(results: Path, *extra: str, **kw) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "workbench", "sweep", "--direct", "--results", str(results),
                             *extra], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **kw)


def _descendants(pid: int) -> set[int]:
    """Every live process whose parent chain leads to ``pid`` (read from /proc)."""
    parents = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                stat = (d / "stat").read_text()
                parents[int(d.name)] = int(stat.rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                pass
    out, frontier = set(), {pid}
    while frontier:
        frontier = {c for c, p in parents.items() if p in frontier} - out
        out |= frontier
    return out


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"                      # a zombie has exited; only its exit status is left


@pytest.mark.slow
def test_killed_sweep_leaves_nothing_running_and_resumes_to_the_clean_tables(tmp_path):
    results = tmp_path / "killed"
    proc = _sweep(results, *SETS, start_new_session=True)
    seen: set[int] = set()
    deadline = time.time() + 600         # the start allowance: imports and the first study, on a loaded machine
    ranks_running = False
    while time.time() < deadline and proc.poll() is None:
        seen |= _descendants(proc.pid)
        tables = list(results.glob("*/fp32_memory.parquet"))
        # dp ranks are spawned processes running under the sweep: kill while they work
        ranks_running = tables and len(_descendants(proc.pid)) >= 2
        if ranks_running:
            time.sleep(0.5)
            seen |= _descendants(proc.pid)
            break
        time.sleep(0.05)
    assert ranks_running, f"the sweep never reached the dp ranks: {proc.communicate()[0][-2000:]}"
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    deadline = time.time() + 15
    while time.time() < deadline and any(_alive(p) for p in seen):
        time.sleep(0.1)
    assert not [p for p in seen if _alive(p)], "processes outlived the killed sweep"

    (run_dir,) = [p for p in results.iterdir() if p.is_dir()]
    before = (run_dir / "fp32_memory.parquet").read_bytes()
    load_table(run_dir / "fp32_memory.parquet")                  # the finished table is intact
    assert not (run_dir / "correctness.parquet").exists()
    assert RunMeta.from_json(run_dir).finished_at is None and not run_in_use(run_dir)

    resumed = subprocess.run([sys.executable, "-m", "workbench", "sweep", "--results", str(results),
                              "--resume", run_dir.name], cwd=REPO, capture_output=True, text=True, timeout=900)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert "resuming" in resumed.stdout and "correctness" in resumed.stdout
    assert (run_dir / "fp32_memory.parquet").read_bytes() == before       # never rewritten
    meta = RunMeta.from_json(run_dir)
    assert meta.finished_at and meta.failures == []
    assert [r["studies"] for r in meta.resumed] == [["correctness"]]

    clean_root = tmp_path / "clean"
    clean = _sweep(clean_root, *SETS)
    out = clean.communicate(timeout=900)[0]
    assert clean.returncode == 0, out
    (clean_dir,) = [p for p in clean_root.iterdir() if p.is_dir()]
    for study in ("fp32_memory", "correctness"):
        pd.testing.assert_frame_equal(load_table(run_dir / f"{study}.parquet"),
                                      load_table(clean_dir / f"{study}.parquet"))

    again = subprocess.run([sys.executable, "-m", "workbench", "sweep", "--results", str(results),
                            "--resume", run_dir.name], cwd=REPO, capture_output=True, text=True, timeout=900)
    assert again.returncode == 0 and "nothing to resume" in again.stdout


def test_resume_refuses_a_folder_in_use_and_an_unknown_one(tmp_path):
    """A SystemExit with a message is what the console entry point prints without a traceback and
    exits 1 on (tests/test_sweep_inputs.py runs one through it)."""
    run = RunFolder.create(tmp_path, name="cpu").path
    RunMeta.collect({"profile": "cpu", "device": "cpu", "mode": "direct", "studies": {"fp32_memory": {}}}).write(run)
    before = (run / "meta.json").read_bytes()
    lock = RunLock(run)             # another holder: flock locks conflict between open files
    assert lock.acquire()
    with pytest.raises(SystemExit) as e:
        cli.main(["sweep", "--results", str(tmp_path), "--resume", run.name])
    lock.release()
    assert isinstance(e.value.code, str) and "in use by another process" in e.value.code, e.value.code
    assert (run / "meta.json").read_bytes() == before
    with pytest.raises(SystemExit) as e:
        cli.main(["sweep", "--results", str(tmp_path), "--resume", "no-such-run"])
    assert isinstance(e.value.code, str) and "--resume 'no-such-run': no run folder" in e.value.code, e.value.code


def test_make_report_resumes_an_interrupted_run_of_the_same_code(tmp_path, monkeypatch):
    """An unfinished run of this commit (clean tree) that nobody works in is what `report` picks up."""
    from workbench.sweep import interrupted_run
    g = prov.git_info()
    if not g.get("sha") or g.get("dirty"):
        pytest.skip("needs a clean git checkout (CI has one): interrupted runs resume only with the same code")
    run = RunFolder.create(tmp_path, name="cpu").path
    RunMeta.collect({"profile": "cpu", "device": "cpu", "mode": "direct", "studies": {}}).write(run)
    assert interrupted_run(tmp_path, "cpu") == run
    lock = RunLock(run)
    assert lock.acquire()
    assert interrupted_run(tmp_path, "cpu") is None           # in use: not interrupted
    lock.release()
    RunMeta.from_json(run).finish().write(run)
    assert interrupted_run(tmp_path, "cpu") is None                # finished
