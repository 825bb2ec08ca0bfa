"""`workbench advise`: the configuration an engine can take, from the committed reference runs and
the planner; nothing invented where no run measured it."""
from __future__ import annotations

import json
import re

import numpy as np
import pytest
from PIL import Image

from workbench.advise import advise
from workbench.cli import main
from workbench import engines
from workbench.provenance import REPO_ROOT

COMMITTED = REPO_ROOT / "results" / "reference"


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    """A results folder holding only the committed reference runs (a link to them): the user's own
    runs under results/ never reach these tests."""
    root = tmp_path_factory.mktemp("results")
    (root / "reference").symlink_to(COMMITTED, target_is_directory=True)
    return root


def test_advice_from_the_committed_h200_runs(results):
    a = advise("qwen3-vl-8b", "documents", results)
    assert a.placement.device == "NVIDIA H200" and a.placement.run.startswith("2026")
    assert (COMMITTED / a.placement.run / "correctness.parquet").is_file()
    assert a.choice is not None and a.choice[0] in ("runner", "tower", "fold", "device")
    assert "us per replay" in a.staging.text and (COMMITTED / a.staging.run / "cast_cost.parquet").is_file()
    # vLLM 0.34 by default: its own grid beside the planner's, both judged on held-out draws
    assert a.engine == "vllm-0.34" and a.engine_budgets == engines.get("vllm-0.34").budgets(16384)
    assert a.budgets == sorted(a.budgets)
    held = {r["set"]: r for r in a.judged if r["sample"] == "held-out draws"}
    assert a.padding["engines"] == pytest.approx(held["engine default"]["padded_frac"])
    fitted = {r["set"]: r for r in a.judged if r["sample"] == "fitted draw"}
    # out of sample the planner pads more than on the draw it was fitted to
    assert held["planner, equal graphs"]["padded_frac"] >= fitted["planner, equal graphs"]["padded_frac"]
    cc = a.compilation_config()
    assert cc["cudagraph_mm_encoder"] is True
    if a.planned:       # recommended only where it beats the grid out of sample
        assert held[next(s for s in held if s != "engine default" and a.verdict.startswith(s))]["rows_ratio"] < \
            held["engine default"]["rows_ratio"]
        assert cc["encoder_cudagraph_token_budgets"] == a.budgets
        assert cc["encoder_cudagraph_max_vision_items_per_batch"] == a.max_items >= 1
    else:
        assert cc == {"cudagraph_mm_encoder": True, "encoder_cudagraph_max_token_budget": 5120}
    assert "encoder_cudagraph_max_frames_per_batch" not in cc          # no video in the mix
    assert not a.missing


def test_advice_speaks_each_release_and_recommends_what_it_can_apply(results):
    old = advise("qwen3-vl-8b", "documents", results, engine="vllm-0.33")
    assert old.engine_budgets == [64 << k for k in range(9)]
    assert "encoder_cudagraph_max_token_budget" not in old.compilation_config()     # 0.33 has no such option
    new = advise("qwen3-vl-8b", "documents", results)
    # vLLM's runner has no norm hook: the recommended placement is one the release applies
    assert new.choice[0] in engines.get("vllm-0.34").placements
    assert new.best is None or "runner" in new.best.text or "fold" in new.best.text
    sg = advise("qwen3-vl-8b", "documents", results, engine="sglang-0.5.23")
    assert sg.options_line() == "SGLang 0.5.23: SGLANG_VIT_ENABLE_CUDA_GRAPH=1"


def test_engine_source_checks_the_option_names(tmp_path):
    from workbench.engine_source import EngineSourceError, check_options
    tree = tmp_path / "vllm" / "config"
    tree.mkdir(parents=True)
    (tree / "compilation.py").write_text("class CompilationConfig:\n    cudagraph_mm_encoder: bool = False\n"
                                         "    encoder_cudagraph_token_budgets: list = None\n"
                                         "    encoder_cudagraph_max_vision_items_per_batch: int = 0\n")
    assert "checked" in check_options("vllm-0.33", tmp_path)
    with pytest.raises(EngineSourceError, match=r"declares none of \['encoder_cudagraph_max_token_budget'\]"):
        check_options("vllm-0.34", tmp_path / "vllm")
    (tmp_path / "empty").mkdir()
    with pytest.raises(EngineSourceError, match="no vllm/config/compilation.py under it"):
        check_options("vllm-0.34", tmp_path / "empty")
    (tmp_path / "x.txt").write_text("x")
    with pytest.raises(EngineSourceError, match="not a folder or a wheel"):
        check_options("vllm-0.34", tmp_path / "x.txt")


def test_a_video_mix_sets_frames_per_batch(results):
    cc = advise("qwen2.5-vl-7b", "video_clips", results).compilation_config()
    assert cc["encoder_cudagraph_max_frames_per_batch"] >= cc["encoder_cudagraph_max_vision_items_per_batch"]


def test_without_runs_it_plans_and_names_what_to_measure(tmp_path):
    a = advise("qwen3-vl-8b", "screenshots", tmp_path)
    assert a.choice is None and a.budgets
    text = a.text()
    assert "us per replay" not in text and "recommended:" not in text
    assert "python -m workbench sweep --studies correctness --set families=qwen3-vl-8b" in text


def test_a_folder_of_images_no_run_has_seen(tmp_path, capsys, results):
    folder = tmp_path / "mine"
    folder.mkdir()
    rng = np.random.default_rng(0)
    for i, (h, w) in enumerate([(300, 500), (900, 700), (1200, 1600)]):
        Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)).save(folder / f"{i}.png")
    assert main(["advise", "--preset", "glm-4.1v-9b", "--set", f"image_folder={folder}", "--json",
                 "--results", str(results)]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["mix"] == "folder:mine" and len(out["budgets"]) >= 1
    assert out["engine"] == "vllm-0.34" and out["engine_options"]["cudagraph_mm_encoder"] is True


@pytest.mark.parametrize("argv, says", [
    (["--preset", "nope"], "unknown preset 'nope'; valid presets: qwen2-vl-2b"),
    (["--preset", "qwen3-vl-8b", "--mix", "nope"], "unknown image mix 'nope'; valid: phone_photos"),
    (["--preset", "qwen3-vl-8b", "--set", "image_folder=/no/such/folder"], "does not exist"),
    (["--preset", "qwen3-vl-8b", "--set", "depth=2"], "the one key advise takes is image_folder=PATH"),
    (["--preset", "qwen3-vl-8b", "--mix", "photos", "--set", "image_folder=/x"], "name two mixes"),
    (["--preset", "qwen3-vl-8b", "--engine-source", "/no/such/tree"], "no such file or folder"),
])
def test_bad_input_is_named(argv, says):
    with pytest.raises(SystemExit) as e:
        main(["advise", *argv])
    assert says in str(e.value)


def test_time_to_embedding_comes_from_the_run_that_timed_the_mix(results):
    a = advise("glm-4.1v-9b", "documents", results)
    assert "ms per image" in a.latency.text and "planner's" in a.latency.text
    assert (COMMITTED / a.latency.run / "encoder_latency.parquet").is_file()
    b = advise("qwen2-vl-7b", "thumbnails", results)            # no run timed this pair
    assert b.latency.run == "" and "ms per image" not in b.text()
    assert any("--studies encoder_latency --set presets=qwen2-vl-7b" in m for m in b.missing)
    assert min(b.budgets) >= b.max_items                     # every budget holds a full pack


def test_a_newer_cpu_run_never_hides_the_gpu_one(tmp_path):
    """CPU tables name their device 'cpu: <model>': a newer CPU run of the family is passed over while
    a GPU run has it, and is used, marked as the CPU's, where it is the only one."""
    import shutil

    import pandas as pd
    ref = advise("qwen3-vl-8b", "documents", _linked(tmp_path / "a"))
    table = pd.read_parquet(COMMITTED / ref.placement.run / "correctness.parquet")
    cpu = tmp_path / "cpu-only"
    run = cpu / "20991231T000000Z-abc1234-cpu"
    run.mkdir(parents=True)
    shutil.copy(COMMITTED / ref.placement.run / "meta.json", run / "meta.json")
    table.assign(device="cpu: Some CPU").to_parquet(run / "correctness.parquet")
    assert advise("qwen3-vl-8b", "documents", cpu).placement.device.endswith("(CPU: host numbers, no graph pool)")
    both = _linked(tmp_path / "both")
    shutil.copytree(run, both / run.name)
    got = advise("qwen3-vl-8b", "documents", both).placement
    assert (got.run, got.device) == (ref.placement.run, "NVIDIA H200")


def _linked(root):
    root.mkdir(parents=True)
    (root / "reference").symlink_to(COMMITTED, target_is_directory=True)
    return root


def test_the_placement_table_joins_each_study_with_its_run(results, tmp_path):
    from workbench.advise_tables import ANSWER_PLACEMENTS, NOT_MEASURED, placement_table
    t = placement_table("qwen3-vl-8b", "phone_photos", results).set_index("placement")
    assert t.index.tolist() == list(ANSWER_PLACEMENTS)
    src = t.attrs["sources"]
    assert set(src) == {"correctness", "input_path", "cast_cost", "fp32_memory"}
    assert all(dev == "NVIDIA H200" and run.startswith("2026") for run, dev in src.values())
    # the seed's bug: the outer placement is right eagerly and wrong under the graph runner
    assert t.loc["outer", "eager"] == "right" and t.loc["outer", "cudagraph"].startswith("WRONG")
    assert t.loc["tower", "cudagraph"] == "right"
    assert t.loc["fold", "eager"] == NOT_MEASURED             # its correctness run predates the fold placement
    staging = [c for c in t.columns if c.startswith("staging")][0]
    assert re.fullmatch(r"\d+\.\d \(\d\.\d{3}%\) runner/triton_\w+", t.loc["runner", staging])   # us (share) design
    assert t.loc["outer", "host ms/image (saves)"] == NOT_MEASURED and "(+" in t.loc["device", "host ms/image (saves)"]
    assert t.loc["tower", "norm fp32 MiB: eager / fused"].endswith("/ 0")      # fused kernels park nothing
    # without runs every column is missing, never invented
    bare = placement_table("qwen3-vl-8b", "phone_photos", tmp_path)
    assert bare.columns.tolist() == ["placement"] and bare.attrs["sources"] == {}


def test_a_model_the_engine_captures_no_graphs_for_gets_no_graph_options(results):
    """Nemotron-H Nano VL V2: vLLM 0.34 has no encoder graphs for it and normalizes in its outer model, so the
    advice sets none (turning them on would skip its norm), and its budgets are judged on image mixes only."""
    a = advise("nemotron-nano-vl-v2", "phone_photos", results=results)
    line = a.options_line()
    assert "cudagraph_mm_encoder" not in line and "no encoder CUDA graphs" in line and "outer model" in line
    assert "cudagraph_mm_encoder" in advise("qwen3-vl-8b", "phone_photos", results=results).options_line()
