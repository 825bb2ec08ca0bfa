"""Progress a researcher sees on the console: a study's own cell count during a sweep (also when
the study runs in its notebook's kernel, another process), and the report build, study by study."""
from __future__ import annotations

import os
import time

from workbench import report as rep
from workbench.progress import time_left
from workbench.stages import console_progress
from workbench.studies.plotting import PROGRESS_FILE_ENV, progress

from test_report_safety import STUDIES, long_table, make_run   # the report tests' stubs


def test_a_studys_bars_reach_the_console_as_plain_lines(capsys):
    before = os.environ.get(PROGRESS_FILE_ENV)
    with console_progress("demo"):
        path = os.environ[PROGRESS_FILE_ENV]
        for _ in progress(range(4), desc="demo cells", enabled=False):    # shown or not, it counts
            pass
        bar = progress(total=3, desc="demo second", enabled=False)
        bar.update(3)
        bar.close()
        time.sleep(2.6)                       # the watcher reads every 2 s
    out = capsys.readouterr().out
    assert "sweep: demo second: 3/3" in out and "\x1b" not in out
    assert os.environ.get(PROGRESS_FILE_ENV) == before and not os.path.exists(path)


def test_a_progress_line_says_the_time_left_at_the_pace_kept_so_far():
    assert time_left(30, 100, t0=10.0, done0=10, now=30.0) == ", about 70 s left"       # 1 s a cell
    assert time_left(20, 100, t0=0.0, done0=0, now=60.0) == ", about 4 min left"        # 3 s a cell
    # nothing to say before the bar moves, without a total, or once it is done
    assert time_left(10, 100, 10.0, 10, 30.0) == time_left(5, None, 0.0, 0, 9.0) == time_left(9, 9, 0.0, 0, 9.0) == ""


def test_without_the_sweep_a_bar_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.delenv(PROGRESS_FILE_ENV, raising=False)
    bar = progress(range(3), desc="x", enabled=False)
    assert list(bar) == [0, 1, 2] and not hasattr(bar, "path")


def test_the_report_build_names_each_study_as_it_starts(tmp_path):
    from workbench.results.meta import RunMeta
    meta = RunMeta.collect({"profile": "cpu", "device": "cpu", "mode": "direct", "studies": {"demo": {}}}).finish()
    meta = meta.to_dict()
    results = tmp_path / "results"
    make_run(results, "20300101T000000Z-abc1234-cpu", meta, {"demo": long_table()})
    lines: list[str] = []
    rep.build_report(results, tmp_path / "out", studies=STUDIES, log=lines.append)
    assert lines == ["report: demo (1/1)"]
