"""Nothing outlives a killed command (issue 64): the report's summary workers, the sweep's worker processes and
the dp ranks die with the process that started them, however it dies, kill -9 included.

Each test starts the real code in a subprocess (the command line's `main`, or `launch`, from a small script) with
a unique token in its environment, which every process it starts inherits; it waits for a moment (the workers
forked, the studies running, the ranks spawning), SIGKILLs that process alone, and then asserts that no process
holding the token is left and that its output pipe ends (a survivor holding it would keep a reader waiting for
ever, as a killed report's workers did). The studies used sleep for minutes, so a survivor cannot be one that
merely had not finished yet. The deadlines are generous (a loaded 2-core machine); nothing is timed.
"""
from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import pandas as pd
import pytest

from workbench import procs
from workbench.results.meta import RunMeta
from workbench.results.folder import RunFolder
from workbench.results.tables import write_study_table

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="finds the processes through /proc")

REPO = Path(__file__).resolve().parents[1]
TOKEN_ENV = "WB_NO_SURVIVORS"
START_S = 240          # for the command to reach the moment (Python, pandas and torch imports, under load)
GONE_S = 90            # for every process it started to be gone once it is killed (a spawned rank may first
                       # finish importing torch before it can see that its launcher is gone)

STUDIES = '''
"""Two studies that sleep (sleepy_b in its summary too) and mark where they are; a function for dp ranks."""
import os
import time
from pathlib import Path

import pandas as pd

from workbench.studies import ParamSpec, Study, Summary, register

MARKS = Path(os.environ["WB_SLEEPY_MARKS"])


def _mark(what):
    (MARKS / f"{what}.{os.getpid()}").write_text("")


def run_a(device="auto", progress=True, **params):
    _mark("run-sleepy_a")
    time.sleep(600)


def run_b(device="auto", progress=True, **params):
    _mark("run-sleepy_b")
    time.sleep(600)


def summarize_a(table, out_dir):
    _mark("summary-sleepy_a")
    return Summary(text="sleepy_a")


def summarize_b(table, out_dir):
    _mark("summary-sleepy_b")
    time.sleep(600)
    return Summary(text="sleepy_b")


def rank():
    import signal
    signal.signal(signal.SIGINT, signal.SIG_IGN)      # as a rank blocked in C++ would: torch's own SIGINT is lost
    _mark("rank")
    time.sleep(600)


for name, run, summarize in (("sleepy_a", run_a, summarize_a), ("sleepy_b", run_b, summarize_b)):
    register(Study(name=name, notebook=f"notebooks/{name}.ipynb", params=ParamSpec(), run=run,
                   summarize=summarize, question=f"does {name} die with its command?"))
'''

REPORT = '''
import sys
sys.path.insert(0, sys.argv[1])
import sleepy_studies
import workbench.report as rep
from workbench import procs
from workbench.cli import main

rep.cpu_count = lambda: 2          # forked workers even where this process may use one core
procs.use_prctl = sys.argv[3] == "prctl"
sys.exit(main(["report", "--no-sweep", "--results", sys.argv[2]]))
'''

SWEEP = '''
import sys
sys.path.insert(0, sys.argv[1])
import sleepy_studies
from workbench.cli import main

sys.exit(main(["sweep", "--results", sys.argv[2], "--direct", "--profile", "cpu", "--studies", "sleepy_a,sleepy_b",
               "--workers", "2"]))
'''

LAUNCH = '''
import sys
sys.path.insert(0, sys.argv[1])
import sleepy_studies
from workbench.launch import launch

if __name__ == "__main__":
    launch(sleepy_studies.rank, world_size=2, backend="gloo", timeout_s=600, start_timeout_s=600)
'''


# --------------------------------------------------------------------------- processes by token


def _holders(token: str) -> dict[int, str]:
    """{pid: command line} of the live processes whose environment holds the token (a zombie is dead)."""
    needle, out = f"{TOKEN_ENV}={token}\0".encode(), {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit() or int(d.name) == os.getpid():
            continue
        try:
            if needle not in (d / "environ").read_bytes():
                continue
            if (d / "stat").read_text().rsplit(")", 1)[1].split()[0] in ("Z", "X"):
                continue
            out[int(d.name)] = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except (OSError, IndexError):       # gone while read
            continue
    return out


class Command:
    """A script run with the token, its output read as it comes (a full pipe would stall it)."""

    def __init__(self, script: str, args: list[str], tmp: Path):
        self.token, self.marks, self.out, self.seen = uuid.uuid4().hex, tmp / "marks", b"", {}
        self.marks.mkdir(exist_ok=True)
        env = {**os.environ, TOKEN_ENV: self.token, "WB_SLEEPY_MARKS": str(self.marks)}
        self.proc = subprocess.Popen([sys.executable, "-c", textwrap.dedent(script), *args], cwd=REPO, env=env,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)

    def _read(self, timeout: float) -> bool:
        """Read what is there (waiting up to ``timeout``); False at the end of the output."""
        if select.select([self.proc.stdout], [], [], timeout)[0]:
            chunk = os.read(self.proc.stdout.fileno(), 65536)
            self.out += chunk
            return bool(chunk)
        return True

    def forked(self) -> int:
        """How many processes run this command's own command line (forked from it, not yet anything else)."""
        held = _holders(self.token)
        self.seen.update(held)        # a fork that ends before the kill was still started by the command
        mine = held.pop(self.proc.pid, None)
        return sum(c == mine for c in held.values()) if mine is not None else 0

    def marked(self, *names: str) -> bool:
        return all(any(self.marks.glob(f"{n}.*")) for n in names)

    def wait_for(self, what: str, ready) -> None:
        deadline = time.monotonic() + START_S
        while not ready():
            assert self.proc.poll() is None, f"the command ended before {what}:\n{self.out.decode(errors='replace')}"
            assert time.monotonic() < deadline, f"no {what} after {START_S} s:\n{self.out.decode(errors='replace')}"
            self._read(0.02)

    def kill_and_find_no_survivor(self) -> None:
        """SIGKILL the command alone; then every process holding the token must go and the output must end."""
        started = {**self.seen, **_holders(self.token)}
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=60)
        deadline, ended = time.monotonic() + GONE_S, False
        while time.monotonic() < deadline and not ended:
            ended = not self._read(0.2)
        left = _holders(self.token)
        while left and time.monotonic() < deadline:
            time.sleep(0.1)
            left = _holders(self.token)
        assert len(started) > 1, f"the command had started no process by then: {started}"
        assert not left, f"outlived the killed command: {left} (it had started {started})"
        assert ended, "the killed command's output pipe is still held open"

    def cleanup(self) -> None:
        """Whatever this test started and is still there, by pid (the token makes them ours)."""
        for pid in [self.proc.pid, *_holders(self.token)]:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.proc.stdout.close()
        self.proc.wait()


@pytest.fixture
def studies_dir(tmp_path) -> Path:
    folder = tmp_path / "mods"
    folder.mkdir()
    (folder / "sleepy_studies.py").write_text(STUDIES)
    return folder


def _results_with_runs(tmp_path: Path) -> Path:
    """A results folder with a finished run holding a table of each sleepy study (the report summarizes them)."""
    results = tmp_path / "results"
    run_dir = RunFolder.create(results, name="sleepy").path
    meta = RunMeta.collect({"studies": {"sleepy_a": {}, "sleepy_b": {}}})
    meta.device = "cpu: test"
    meta.write(run_dir)
    for study in ("sleepy_a", "sleepy_b"):
        write_study_table(pd.DataFrame({"size": [1, 2], "device": "cpu: test", "metric": "seconds",
                                        "value": [1.5, 2.5], "unit": "s"}), run_dir / f"{study}.parquet")
    meta.finish().write(run_dir)
    return results


# --------------------------------------------------------------------------- the report's summary workers


@pytest.mark.timeout(600)
@pytest.mark.parametrize("moment, mechanism", [("forked", "prctl"), ("summarizing", "prctl"),
                                               ("summarizing", "watchdog")])
def test_a_killed_report_leaves_no_summary_worker(tmp_path, studies_dir, moment, mechanism):
    """kill -9 of the report alone: just as a study's process forked, or while one summarizes (sleepy_b) after the
    other (sleepy_a) has handed its section back; with the kernel's signal, or the watchdog thread where there is
    none (forced here)."""
    cmd = Command(REPORT, [str(studies_dir), str(_results_with_runs(tmp_path)), mechanism], tmp_path)
    try:
        if moment == "forked":
            cmd.wait_for("a forked summary process", lambda: cmd.forked() >= 1)
        else:
            cmd.wait_for("summary of both sleepy studies", lambda: cmd.marked("summary-sleepy_a", "summary-sleepy_b"))
        cmd.kill_and_find_no_survivor()
    finally:
        cmd.cleanup()


# --------------------------------------------------------------------------- the sweep's workers


@pytest.mark.timeout(600)
@pytest.mark.parametrize("moment", ["starting", "running"])
def test_a_killed_sweep_leaves_no_worker(tmp_path, studies_dir, moment):
    """kill -9 of `sweep --workers 2` alone: while its workers start (importing), or while each runs a study."""
    cmd = Command(SWEEP, [str(studies_dir), str(tmp_path / "results")], tmp_path)
    try:
        if moment == "starting":
            cmd.wait_for("worker process", lambda: any("workbench.workers" in c for c in _holders(cmd.token).values()))
        else:
            cmd.wait_for("study running in each worker", lambda: cmd.marked("run-sleepy_a", "run-sleepy_b"))
        cmd.kill_and_find_no_survivor()
    finally:
        cmd.cleanup()


# --------------------------------------------------------------------------- the dp ranks


@pytest.mark.timeout(600)
@pytest.mark.parametrize("moment", ["spawning", "running"])
def test_a_killed_launcher_leaves_no_rank(tmp_path, studies_dir, moment):
    """kill -9 of `launch` alone: while its ranks are spawned (still importing torch: no signal is asked for yet,
    so each must find its launcher gone), or while both run their function (which ignores SIGINT, the signal
    torch's own spawn asks for at the parent's death)."""
    cmd = Command(LAUNCH, [str(studies_dir)], tmp_path)
    try:
        if moment == "spawning":
            cmd.wait_for("spawned rank", lambda: sum("spawn_main" in c for c in _holders(cmd.token).values()) >= 2)
        else:
            cmd.wait_for("both ranks in their function", lambda: len(list(cmd.marks.glob("rank.*"))) >= 2)
        cmd.kill_and_find_no_survivor()
    finally:
        cmd.cleanup()


# --------------------------------------------------------------------------- the helper itself


def _child(code: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], cwd=REPO, env={**os.environ, **(env or {})},
                          capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("use_prctl", [True, False])
def test_a_child_whose_parent_is_already_gone_leaves_at_once(use_prctl):
    """The parent id it was given is not its parent (its parent died before it asked): it exits, running nothing
    after, with the kernel's signal or the watchdog."""
    done = _child(f"from workbench import procs\nprocs.use_prctl = {use_prctl}\n"
                  f"procs.die_with_parent(1 if __import__('os').getppid() != 1 else 2)\nprint('still here')")
    assert done.returncode == procs.EXIT_ORPHANED and "still here" not in done.stdout


def _alive(pid: int) -> bool:
    """True while ``pid`` runs; a zombie counts as dead."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (OSError, IndexError):
        return False


def test_the_watchdog_ends_a_child_when_the_pipe_of_its_parent_ends():
    """Without prctl, a child started with `ParentWatch.child_env` leaves once its parent has ended (the pipe's
    write end closed), long before its own sleep would end."""
    middle = textwrap.dedent("""
        import os, subprocess, sys, time
        from workbench import procs
        procs.use_prctl = False
        watch = procs.ParentWatch()
        child = subprocess.Popen([sys.executable, "-c", "from workbench import procs; procs.use_prctl = False; "
                                  "procs.from_env(); import time; time.sleep(600)"],
                                 env={**os.environ, **watch.child_env()}, pass_fds=watch.pass_fds)
        print(child.pid, flush=True)
        time.sleep(3)
    """)
    pid = int(_child(middle).stdout.split()[0])
    deadline = time.monotonic() + GONE_S
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    survived = _alive(pid)
    if survived:
        os.kill(pid, signal.SIGKILL)
    assert not survived, "the watched child outlived its parent"


@pytest.mark.parametrize("value", ["x", "12:y", "-3", "1:2:3", "", "١٢"])
def test_a_malformed_parent_variable_is_named(value):
    done = _child("from workbench import procs; procs.from_env()", {procs.PARENT_ENV: value})
    assert done.returncode == 1 and f"{procs.PARENT_ENV}={value!r}" in done.stderr and "PID or PID:FD" in done.stderr
    assert "Traceback" not in done.stderr
