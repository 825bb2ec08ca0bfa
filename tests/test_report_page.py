"""The page built from the committed reference runs alone, on any machine: the answer table first
(a row per family, its evidence linked to the study it came from, vLLM's options), the audit, and,
where headless Chromium is installed, the page's height at 1400 px and where the answer table
starts, measured by the browser."""
from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from workbench import report as rep
from workbench.config import VisionConfig, families

REPO = Path(__file__).resolve().parents[1]
MAX_HEIGHT_PX = 6600            # the page at 1400 px wide: the answers, the audit and seven study sections (6000 for six)
ANSWERS_WITHIN_PX = 1200        # the answer table starts within the first screen


def _page(tmp_path_factory, studies=None) -> Path:
    root = tmp_path_factory.mktemp("results")
    (root / "reference").symlink_to(REPO / "results" / "reference", target_is_directory=True)
    result = rep.build_report(root, studies=studies)
    assert not result.problems and not result.table_problems, (result.problems, result.table_problems)
    return result.index


@pytest.fixture(scope="module")
def answers_page(tmp_path_factory) -> Path:
    """The page with one study's section: the answers come from the run folders, not the sections (the
    whole page draws every reference run's figures, a minute on two cores)."""
    from workbench.studies import discover
    return _page(tmp_path_factory, {"correctness": discover()["correctness"]})


@pytest.fixture(scope="module")
def page(tmp_path_factory) -> Path:
    """The whole page, every study summarized."""
    return _page(tmp_path_factory)


pytestmark = pytest.mark.slow


def test_the_answer_table_opens_the_page_with_a_linked_row_per_family(answers_page):
    page = answers_page
    text = page.read_text(encoding="utf-8")
    answers = text[text.index('<h2 id="advice">'):text.index('<h2 id="audit">')]
    assert text.index('<h2 id="advice">') < text.index('id="key-findings"') < text.index('<h2 id="correctness">')
    advice = answers[:answers.index('id="placements"')]
    rows = re.findall(r"<tr><td>(.*?)</td>(.*?)</tr>", advice, flags=re.S)
    presets = [r[0] for r in rows]
    pending = re.search(r"No run measured yet: (.*?)\. The commands", advice)
    pending = re.findall(r"(?:^|; )([\w.-]+) \(not measured", pending[1]) if pending else []
    assert len(rows) + len(pending) == len(families()), (presets, pending)   # every family: a row, or said not measured
    assert len(rows) >= 5 and not set(presets) & set(pending)
    for preset, body in rows:
        graphs = families()[VisionConfig.preset(preset).family].vllm_encoder_graphs
        # vLLM's own options, always; a model it captures no encoder graphs for says there is none to set
        assert ("cudagraph_mm_encoder" in body) if graphs else ("no encoder CUDA graphs" in body), preset
        measured = "not measured" not in body.split("</td>")[0]
        if measured:                                                # evidence linked to its study, the run named
            assert re.search(r'href="#cast_cost" title="[^"]+, NVIDIA H200"', body), preset
    assert re.search(r'href="#encoder_latency" title="\d{8}T\d{6}Z-[^"]+"', answers)
    csv = re.search(r'<a href="([^"]+\.csv)">CSV</a>', answers)[1]
    assert (page.parent / csv).is_file()
    placements = answers[answers.index('id="placements"'):]
    shown = int(re.search(rf"(\d) of {len(families())} families measured", placements)[1])
    assert shown >= 4      # the references measure the Qwen and GLM-4.1V families per placement
    assert placements.count("<h4>") == shown
    for study in ("correctness", "input_path", "cast_cost", "fp32_memory"):       # each column's study and run
        assert re.search(rf'href="#{study}" title="\d{{8}}T\d{{6}}Z-[^"]+, NVIDIA H200"', placements), study
    assert "WRONG" in placements and "not measured" in placements
    audit = text[text.index('<h2 id="audit">'):text.index('id="key-findings"')]
    assert "0 in the silent-wrong cell" in audit and "KimiK25ForConditionalGeneration" in audit


@pytest.mark.skipif(shutil.which("chromium") is None, reason="needs headless Chromium (apt-get install chromium)")
def test_the_page_fits_its_height_in_a_real_browser(page, tmp_path):
    probe = tmp_path / "probe.html"
    # the page with a script that writes what the browser laid out into the DOM it dumps
    html = page.read_text(encoding="utf-8").replace(
        "</body>", "<script>document.body.dataset.height = document.documentElement.scrollHeight;"
        "document.body.dataset.advice = document.getElementById('advice').getBoundingClientRect().top;"
        "</script></body>")
    probe.write_text(html.replace('src="', f'src="{page.parent.as_uri()}/'), encoding="utf-8")
    dom = subprocess.run(["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--window-size=1400,900",
                          "--virtual-time-budget=5000", "--dump-dom", probe.as_uri()],
                         capture_output=True, text=True, timeout=120).stdout
    got = {k: float(v) for k, v in re.findall(r'data-(height|advice)="([\d.]+)"', dom)}
    assert set(got) == {"height", "advice"}, dom[:300]
    print(json.dumps(got))
    assert got["advice"] <= ANSWERS_WITHIN_PX
    assert got["height"] <= MAX_HEIGHT_PX, f"the page is {got['height']:.0f} px tall at 1400 px"
