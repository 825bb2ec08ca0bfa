"""A checkpoint folder through every study: a tiny model saved by transformers' save_pretrained
is given where a study takes a preset (``presets`` / ``families``); each study then measures the
folder's own tower (its family, its processor's constants, its vision tensors at its own depth)."""
import pytest
import torch

import workbench as wb
from workbench.checkpoints import resolve_config
from workbench.studies import ParamError, discover, wide

from test_checkpoints import save_model


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """A tiny Qwen3-VL checkpoint (mean/std 0.5, patch 16) and the vision tower that saved it."""
    path = tmp_path_factory.mktemp("qwen3-vl-ckpt")
    visual = save_model("qwen3-vl", path, seed=7)
    return path, visual


def test_a_model_folder_resolves_to_its_config_with_its_weights_at_its_own_depth(folder, tmp_path, monkeypatch):
    path, visual = folder
    cfg = resolve_config(str(path))
    assert cfg.family == "qwen3-vl" and cfg.image_mean == (0.5, 0.5, 0.5) and cfg.checkpoint == str(path.resolve())
    assert cfg.reduced(1).checkpoint is None                     # fewer blocks: random weights, said so
    enc = wb.build_encoder(cfg, placement="processor", norm="eager", dtype=torch.float32, device="cpu")
    sd = visual.state_dict()
    assert torch.equal(enc.visual.state_dict()["patch_embed.proj.weight"].reshape(sd["patch_embed.proj.weight"].shape),
                       sd["patch_embed.proj.weight"])
    # the parameter takes the folder (as its absolute path) besides the preset names, and names both
    spec = discover()["cast_cost"].params
    monkeypatch.chdir(path.parent)
    assert spec.resolve({"presets": [path.name]})["presets"] == [str(path.resolve())]
    (tmp_path / "empty").mkdir()
    with pytest.raises(ParamError, match=r"not a valid choice; valid: .*tiny-pixtral, tiny-kimi-k2.5, tiny-gemma3, tiny-gemma4, tiny-nemotron-vl "
                                         r"\(or a transformers model folder"):
        spec.resolve({"presets": [str(tmp_path / "empty")]})


def test_every_study_runs_on_a_model_folder(folder):
    path, _ = folder
    studies, name = discover(), str(path.resolve())
    runs = {
        "cast_cost": dict(presets=[name], budgets=[16], fills=[1.0], designs=["uint8_buffer", "runner"], reps=1),
        "fp32_memory": dict(presets=[name], budgets=[1024], buffer_dtypes=["uint8"]),
        "padding_waste": dict(presets=[name], budget_sets=["pow2"], max_items=[1], n_items=2, reps=1),
        "correctness": dict(families=[name], placements=["tower", "none"], norms=["eager"],
                            paths=["eager", "cudagraph"], buffer_dtypes=["uint8"], budgets=[64], hazard=False),
        "encoder_latency": dict(presets=[name], tokens=[64], images=[1], reps=1, warmup=0, mix_items=[1]),
    }
    for study, params in runs.items():
        w = wide(studies[study].run(device="cpu", progress=False, **params))
        assert set(w.family) == {"qwen3-vl"}, study
        assert set(w.preset.dropna()) == {name}, study
        if study == "cast_cost":            # normalized with the folder's constants, checked before timing
            assert (w.max_err_ulp <= 1).all()
        if study == "correctness":
            cells = w[w.case == "embedding"].set_index(["placement", "path"])
            assert cells.loc[("tower", "eager"), "ok"] and cells.loc[("tower", "cudagraph"), "ok"]
            assert not cells.loc[("none", "eager"), "ok"]
        if study == "encoder_latency" and "ok" in w:
            assert w.ok.dropna().astype(bool).all()
