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
from workbench.planner import expected_padding
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
    # the planner's budgets cover the mix and pad no more than the engines' powers of two
    assert a.budgets == sorted(a.budgets) and a.padding["miss"] == 0
    assert a.padding["planner"] <= a.padding["engines"]
    assert a.padding["engines"] == pytest.approx(expected_padding("documents", a.engine_budgets, "qwen3-vl-8b")
                                                 ["padded_frac"])
    cc = a.compilation_config()
    assert cc["cudagraph_mm_encoder"] is True and cc["encoder_cudagraph_token_budgets"] == a.budgets
    assert cc["encoder_cudagraph_max_vision_items_per_batch"] == a.max_items >= 1
    assert "encoder_cudagraph_max_frames_per_batch" not in cc          # no video in the mix
    assert not a.missing


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
    assert out["vllm_compilation_config"]["encoder_cudagraph_token_budgets"] == out["budgets"]


@pytest.mark.parametrize("argv, says", [
    (["--preset", "nope"], "unknown preset 'nope'; valid presets: qwen2-vl-2b"),
    (["--preset", "qwen3-vl-8b", "--mix", "nope"], "unknown image mix 'nope'; valid: phone_photos"),
    (["--preset", "qwen3-vl-8b", "--set", "image_folder=/no/such/folder"], "does not exist"),
    (["--preset", "qwen3-vl-8b", "--set", "depth=2"], "the one key advise takes is image_folder=PATH"),
    (["--preset", "qwen3-vl-8b", "--mix", "photos", "--set", "image_folder=/x"], "name two mixes"),
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
    from workbench.advise import ANSWER_PLACEMENTS, NOT_MEASURED, placement_table
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
