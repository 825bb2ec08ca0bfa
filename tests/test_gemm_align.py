"""Aligned GEMMs by exact zero padding at load (`gemm_align`): a SwiGLU MLP whose hidden width is
not a multiple of 8 multiplies with zero-padded weights, which is invisible from outside (state
dicts, loading, checkpoint folders keep the checkpoint's shapes) and changes no output beyond
float32 rounding, on the eager path, the fused kernels and the emulated graph path."""
import dataclasses

import numpy as np
import pytest
import torch
from PIL import Image

import workbench as wb
from workbench import fused as fk
from workbench.checkpoints import check_model_folder, load_vision_weights
from workbench.reference import hf_embeddings, rel_err
from workbench.runner import EncoderGraphRunner
from workbench.families import FAMILIES
from workbench.towers import build_tower
from workbench.towers.common import GEMM_ALIGN, GEMM_ALIGN_CHOICES, GatedMLP, padded_width

from test_families import matched_towers

# tiny towers whose SwiGLU widths are not multiples of 8: Qwen2.5-VL's block MLP (90, like 3420),
# GLM-4.1V's block MLP (= out_hidden, 44) and merger (90); photos resized to at most 320 x 320 px
UNALIGNED = {
    "qwen2.5-vl": dataclasses.replace(wb.VisionConfig.preset("tiny-qwen2.5-vl"), mlp_hidden=90,
                                      max_pixels=320 * 320),
    "glm4v": dataclasses.replace(wb.VisionConfig.preset("tiny-glm4v"), mlp_hidden=44, out_hidden=44,
                                 merger_hidden=90, max_pixels=320 * 320),
}


def gated_mlps(tower) -> dict[str, GatedMLP]:
    return {n: m for n, m in tower.named_modules() if isinstance(m, GatedMLP)}


def assert_padded_with_zeros(tower, align: int):
    """Every SwiGLU MLP multiplies with widths that are multiples of ``align``, and every padded
    row, column and bias entry is exactly zero."""
    mlps = gated_mlps(tower)
    assert mlps
    for name, m in mlps.items():
        hid, hp = m.gate_proj.out_features, m.padded_hidden
        assert hp % align == 0 and hp > hid, name
        assert m.gate_up_weight.shape == (2 * hp, m.gate_proj.in_features)
        assert m.down_weight.shape == (m.down_proj.out_features, hp)
        pads = [m.gate_up_weight[hid:hp], m.gate_up_weight[hp + hid:], m.down_weight[:, hid:]]
        if m.gate_up_bias is not None:
            pads += [m.gate_up_bias[hid:hp], m.gate_up_bias[hp + hid:]]
        assert all(torch.count_nonzero(p) == 0 for p in pads), name
        # the real part is what the checkpoint-shaped parameters hold (they view it)
        assert torch.equal(m.gate_up_weight[hp:hp + hid], m.up_proj.weight), name


@pytest.fixture(scope="module")
def photos():
    return wb.sample_images()


def odd_images(seed: int) -> list[Image.Image]:
    """Random RGB noise at odd, non-square sizes."""
    rng = np.random.default_rng(seed)
    return [Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)) for h, w in ((61, 97), (211, 45))]


def padded_and_plain(cfg, seed):
    """transformers' tower with fresh random weights, ours padded (gemm_align=64) and unpadded
    (gemm_align=1), both loaded from its state dict."""
    hf, padded = matched_towers(cfg, seed, gemm_align=64)
    plain = build_tower(cfg, gemm_align=1).eval().load_hf_state_dict(hf.state_dict())
    return hf, padded, plain


@pytest.mark.parametrize("family", list(UNALIGNED))
def test_padded_tower_equals_unpadded_and_transformers_on_photos_and_odd_images(family, photos, seed):
    cfg = UNALIGNED[family]
    hf, padded, plain = padded_and_plain(cfg, seed)
    assert_padded_with_zeros(padded, 64)
    assert all(m.padded_hidden == m.gate_proj.out_features for m in gated_mlps(plain).values())
    for items in ([photos["chelsea"]], [photos["rocket"], *odd_images(seed)]):
        batch = wb.preprocess(items, cfg, normalize=True)
        with torch.no_grad():
            got, want = padded(batch.pixels, batch.grid_thw), plain(batch.pixels, batch.grid_thw)
        assert rel_err(got, want) < 1e-5
        assert rel_err(got, hf_embeddings(hf, batch.pixels, batch.grid_thw)) < 1e-5


@pytest.mark.skipif(not fk.available("cpu"), reason="needs Triton's interpreter")
@pytest.mark.parametrize("family", list(UNALIGNED))
def test_padded_fused_kernels_equal_the_unpadded_plain_ops(family, photos, seed):
    """The fused path's one gate|up matmul over the padded buffer and its SiLU-mul kernel."""
    cfg = dataclasses.replace(UNALIGNED[family], max_pixels=112 * 112)     # the interpreter is slow
    hf, padded = matched_towers(cfg, seed, gemm_align=64, fused=True)
    plain = build_tower(cfg, gemm_align=1, fused=False).eval().load_hf_state_dict(hf.state_dict())
    assert padded.kernels.fused and not plain.kernels.fused
    batch = wb.preprocess([photos["coffee"]], cfg, normalize=True)
    with torch.no_grad():
        assert rel_err(padded(batch.pixels, batch.grid_thw), plain(batch.pixels, batch.grid_thw)) < 1e-5


def test_emulated_graph_path_of_a_padded_tower_equals_eager_unpadded_with_a_poisoned_pool(photos, seed):
    cfg = dataclasses.replace(UNALIGNED["qwen2.5-vl"], max_pixels=200 * 200)
    encs = {a: wb.build_encoder(cfg, placement="tower", norm="eager", dtype=torch.float32, device="cpu", seed=seed,
                                gemm_align=a) for a in (64, 1)}
    assert_padded_with_zeros(encs[64].visual, 64)
    items = [photos["chelsea"].resize((120, 84)), photos["coffee"].resize((150, 100)), *odd_images(seed)]
    batch = wb.preprocess(items, cfg)
    runner = EncoderGraphRunner(encs[64], budgets=[8, 16, 24, 32], buffer_dtype=torch.float32, max_items=4)
    assert runner.backend == "emulated"
    runner.poison_pool()
    graph = runner.encode(batch, pad_value=float("nan"))
    assert torch.isfinite(graph).all()
    assert not runner.stats_frame().miss.all()               # some packs really replayed
    assert rel_err(graph, encs[1].encode(batch)) < 1e-5


@pytest.mark.parametrize("family", list(UNALIGNED))
def test_state_dict_keeps_the_checkpoint_shapes_and_loads_keep_the_padding_zero(family, seed, tmp_path):
    cfg = UNALIGNED[family]
    hf, padded, plain = padded_and_plain(cfg, seed)
    theirs = {k: tuple(v.shape) for k, v in hf.state_dict().items() if not k.endswith("inv_freq")}
    assert {k: tuple(v.shape) for k, v in padded.state_dict().items()} == theirs
    assert padded.state_mismatch(theirs) is None
    # load_state_dict copies into the views; a cast and a round trip through torch.save keep both
    gen = torch.Generator().manual_seed(seed)
    new = {k: torch.randn(v.shape, generator=gen) for k, v in padded.state_dict().items()}
    padded.load_state_dict(new)
    assert_padded_with_zeros(padded, 64)
    padded.to(torch.float64)
    assert_padded_with_zeros(padded, 64)
    torch.save(padded.state_dict(), tmp_path / "sd.pt")
    saved = torch.load(tmp_path / "sd.pt")
    assert {k: tuple(v.shape) for k, v in saved.items()} == theirs
    plain.double().load_state_dict(saved)
    assert all(torch.equal(v, saved[k]) for k, v in plain.state_dict().items())


def test_an_assigning_load_into_a_meta_built_padded_tower_repacks(photos, seed):
    """load_state_dict(assign=True) replaces the parameters: the padded buffers follow them."""
    cfg = UNALIGNED["qwen2.5-vl"]
    hf, padded, plain = padded_and_plain(cfg, seed)
    with torch.device("meta"):
        lazy = build_tower(cfg, gemm_align=64).eval()
    lazy.load_state_dict(plain.state_dict(), assign=True)
    assert_padded_with_zeros(lazy, 64)
    batch = wb.preprocess([photos["astronaut"]], cfg, normalize=True)
    with torch.no_grad():
        assert rel_err(lazy(batch.pixels, batch.grid_thw), plain(batch.pixels, batch.grid_thw)) < 1e-5


def test_a_conversion_that_changes_nothing_keeps_the_packed_buffers_and_a_real_one_repacks(seed):
    """A captured graph reads the packed buffers: a .to() of the tower's own device and dtype leaves them (and a
    load after it still reaches them); a cast replaces them, padding zero and values the cast ones."""
    tower = build_tower(UNALIGNED["glm4v"], gemm_align=64).eval()
    before = {n: (m.gate_up_weight, m.down_weight) for n, m in gated_mlps(tower).items()}
    tower.to(torch.float32).to("cpu").float()
    for n, m in gated_mlps(tower).items():
        assert m.gate_up_weight is before[n][0] and m.down_weight is before[n][1], n
    gen = torch.Generator().manual_seed(seed)
    new = {k: torch.randn(v.shape, generator=gen) for k, v in tower.state_dict().items()}
    tower.load_state_dict(new)
    for n, m in gated_mlps(tower).items():
        assert torch.equal(before[n][1][:, :m.gate_proj.out_features], new[f"{n}.down_proj.weight"]), n
    tower.to(torch.float64)
    assert_padded_with_zeros(tower, 64)
    for n, m in gated_mlps(tower).items():
        assert m.down_weight.dtype == torch.float64
        assert torch.equal(m.down_weight[:, :m.gate_proj.out_features], new[f"{n}.down_proj.weight"].double()), n


# checkpoint layouts of tests/test_checkpoints.py with unaligned SwiGLU widths
def _qwen2_5_vl_unaligned():
    from test_checkpoints import _qwen2_5_vl
    return _qwen2_5_vl(intermediate_size=90)


def _glm4v_unaligned():
    from transformers import Glm4vConfig, Glm4vForConditionalGeneration, Glm4vImageProcessor

    from test_checkpoints import GLM_VISION, TEXT
    cfg = Glm4vConfig(text_config=TEXT, vision_config=dict(GLM_VISION, out_hidden_size=44, intermediate_size=90))
    return Glm4vForConditionalGeneration(cfg), Glm4vImageProcessor(size={"shortest_edge": 12544,
                                                                         "longest_edge": 1 << 21})


@pytest.mark.parametrize("family, make", [("qwen2.5-vl", _qwen2_5_vl_unaligned), ("glm4v", _glm4v_unaligned)])
def test_a_checkpoint_saved_by_transformers_loads_into_a_padded_tower(family, make, photos, tmp_path, seed,
                                                                      monkeypatch):
    import test_checkpoints
    monkeypatch.setitem(test_checkpoints.MODELS, f"{family}-unaligned", make)
    visual = test_checkpoints.save_model(f"{family}-unaligned", tmp_path, seed)
    cfg = check_model_folder(tmp_path)                 # the headers against a (padded) meta tower
    tower = load_vision_weights(build_tower(cfg, gemm_align=64).eval(), tmp_path)
    assert_padded_with_zeros(tower, 64)
    enc = wb.build_encoder(tmp_path, placement="processor", norm="eager", dtype=torch.float32, device="cpu")
    assert enc.visual.gemm_align == GEMM_ALIGN
    assert_padded_with_zeros(enc.visual, 64)
    batch = wb.preprocess([photos["chelsea"], *odd_images(seed)], cfg, normalize=True)
    ref = hf_embeddings(visual, batch.pixels, batch.grid_thw)
    with torch.no_grad():
        assert rel_err(tower(batch.pixels, batch.grid_thw), ref) < 1e-5
        assert rel_err(enc.visual(batch.pixels, batch.grid_thw), ref) < 1e-5


def test_only_widths_that_are_not_multiples_of_8_are_padded():
    assert [padded_width(h, 64) for h in (3420, 4304, 4096, 13696, 10944, 90, 96)] == \
        [3456, 4304, 4096, 13696, 10944, 128, 96]
    assert padded_width(3420, 1) == 3420 and padded_width(90, 4) == 92 and padded_width(90, 256) == 256
    # the real presets, built on the meta device: only Qwen2.5-VL's 3420 is padded
    for name in ("qwen2.5-vl-7b", "glm-4.1v-9b"):
        cfg = wb.VisionConfig.preset(name)
        with torch.device("meta"):
            tower = build_tower(cfg)
        widths = {m.gate_proj.out_features: m.padded_hidden for m in gated_mlps(tower).values()}
        assert widths == ({3420: 3456} if name == "qwen2.5-vl-7b" else {4096: 4096, 13696: 13696}), name
        # the parameter and FLOP models count the checkpoint's (real) tensors
        assert FAMILIES[cfg.family].n_params(cfg) == sum(v.numel() for v in tower.state_dict().values())


@pytest.mark.parametrize("bad", [0, -64, 3, 48, 512, 64.0, True, "64", None])
def test_bad_gemm_align_is_refused_naming_the_value_and_the_choices(bad):
    cfg = UNALIGNED["qwen2.5-vl"]
    for build in (lambda: build_tower(cfg, gemm_align=bad),
                  lambda: wb.build_encoder(cfg, norm="eager", device="cpu", gemm_align=bad)):
        with pytest.raises(ValueError, match=rf"gemm_align must be a power of two from 1 to 256.*got {bad!r}$") as e:
            build()
        assert str(GEMM_ALIGN_CHOICES) in str(e.value)
