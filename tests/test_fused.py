"""The fused block kernels (Triton, run here under TRITON_INTERPRET=1), the padded SwiGLU weights,
metadata caches and the runner's exact-fit graphs, on a CPU. CUDA checks: tests/test_cuda.py."""
import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import dataclasses  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402

import workbench as wb  # noqa: E402
from workbench import fused as fk  # noqa: E402
from workbench.reference import hf_embeddings, hf_vision_model, rel_err  # noqa: E402
from workbench.runner import EncoderGraphRunner  # noqa: E402
from workbench.ulps import spacing_ulps  # noqa: E402

pytestmark = pytest.mark.skipif(not fk.available("cpu"), reason="needs Triton's interpreter")


def _close(got, want, dtype):
    """Equal to fp32 rounding; in half precision within four units of the output's last place: the
    interpreter truncates each rounding to bf16 where a GPU rounds to nearest, and RMSNorm rounds
    twice with a weight between (a truncation-emulating reference matches it exactly; the GPU,
    tests/test_cuda.py, is held to one unit, two for RMSNorm)."""
    if dtype == torch.float32:
        got, want = got.float(), want.float()
        return (got - want).abs().max().item() <= 1e-5 * max(1.0, want.abs().max().item())
    return spacing_ulps(got, want, dtype).max().item() <= 4.0


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_each_fused_kernel_computes_its_torch_twin(dtype):
    g = torch.Generator().manual_seed(int(torch.randint(0, 2 ** 30, (1,))))   # fresh inputs each run
    n, h, d, w = 13, 3, 10, 40          # odd sizes: every mask matters
    qkv = torch.randn(n, 3, h, d, generator=g).to(dtype)
    ang = torch.rand(n, d // 2, generator=g) * 30
    cos, sin = torch.cat([ang, ang], 1).cos(), torch.cat([ang, ang], 1).sin()
    before = qkv.clone()
    out = fk.rotary_(qkv, cos, sin)
    assert out.data_ptr() == qkv.data_ptr()                      # in place
    assert torch.equal(out[:, 2], before[:, 2])                  # v untouched
    assert _close(out, fk.reference_rotary(before, cos, sin), dtype)
    x, dl = torch.randn(n, w, generator=g).to(dtype), torch.randn(n, w, generator=g).to(dtype)
    wt, bs = (1 + 0.1 * torch.randn(w, generator=g)).to(dtype), (0.1 * torch.randn(w, generator=g)).to(dtype)
    for kind, b in (("layer", bs), ("rms", None)):
        for delta in (dl, None):
            s, y = fk.add_norm(x, delta, wt, b, 1e-6, kind)
            rs, _ = fk.reference_add_norm(x, delta, wt, b, 1e-6, kind)
            _, ry = fk.reference_add_norm(s, None, wt, b, 1e-6, kind)    # the norm of the kernel's own sum
            assert _close(s, rs, dtype) and _close(y, ry, dtype), (kind, delta is None)
            assert (s is x) == (delta is None)
    a = 4 * torch.randn(n, 70, generator=g).to(dtype)
    assert _close(fk.quick_gelu(a), fk.reference_quick_gelu(a), dtype)
    gu = 4 * torch.randn(n, 2 * 70, generator=g).to(dtype)
    y = fk.silu_mul(gu)
    assert y.shape == (n, 70) and _close(y, fk.reference_silu_mul(gu), dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_both_rotary_kernels_give_the_same_bits(dtype, monkeypatch):
    """rotary_ switches to the row-tiled kernel from ROTARY_ROWS_MIN rows; both round alike."""
    g = torch.Generator().manual_seed(int(torch.randint(0, 2 ** 30, (1,))))
    n, h, d = 11, 3, 10                # heads and half-width below their power-of-two tiles, rows not a multiple of 4
    qkv = torch.randn(n, 3, h, d, generator=g).to(dtype)
    ang = torch.rand(n, d // 2, generator=g) * 30
    cos, sin = torch.cat([ang, ang], 1).cos(), torch.cat([ang, ang], 1).sin()
    monkeypatch.setattr(fk, "ROTARY_ROWS_MIN", n + 1)
    pairs = fk.rotary_(qkv.clone(), cos, sin)
    monkeypatch.setattr(fk, "ROTARY_ROWS_MIN", 1)
    buf = qkv.clone()
    tiled = fk.rotary_(buf, cos, sin)
    assert tiled.data_ptr() == buf.data_ptr() and torch.equal(tiled[:, 2], qkv[:, 2])
    assert torch.equal(tiled, pairs) and _close(tiled, fk.reference_rotary(qkv, cos, sin), dtype)


def test_fused_kernels_refuse_bad_shapes_and_allocate_on_meta():
    with pytest.raises(ValueError, match="contiguous \\[N, 3, H, D\\]"):
        fk.rotary_(torch.zeros(4, 2, 3, 8), torch.zeros(4, 8), torch.zeros(4, 8))
    with pytest.raises(ValueError, match="float32"):
        fk.rotary_(torch.zeros(4, 3, 2, 8), torch.zeros(4, 8, dtype=torch.float64), torch.zeros(4, 8))
    with pytest.raises(ValueError, match="unknown norm kind 'batch'"):
        fk.add_norm(torch.zeros(2, 4), None, torch.ones(4), None, 1e-6, "batch")
    m = torch.empty(8, 16, device="meta", dtype=torch.bfloat16)
    s, y = fk.add_norm(m, m, torch.empty(16, device="meta"), None, 1e-6, "rms")
    assert s.device.type == y.device.type == "meta" and y.shape == (8, 16)
    assert fk.silu_mul(torch.empty(8, 32, device="meta")).shape == (8, 16)


@pytest.mark.parametrize("preset", ["tiny-qwen2-vl", "tiny-qwen2.5-vl"])
def test_fused_tower_matches_transformers_in_fp32(preset):
    """The fused forward computes the same function: fp32 within 1e-5 of transformers in float64."""
    cfg = dataclasses.replace(wb.VisionConfig.preset(preset), max_pixels=56 * 84)
    enc = wb.build_encoder(cfg, placement="processor", norm="eager", dtype=torch.float32, device="cpu", seed=7,
                           fused=True)
    assert enc.visual.kernels.fused
    images = wb.random_images(2, seed=int(torch.randint(0, 1000, (1,))), min_side=28, max_side=84)
    batch = wb.preprocess(images, cfg, normalize=True)
    hf = hf_vision_model(cfg, dtype=torch.float64)
    hf.load_state_dict(enc.visual.state_dict(), strict=False)
    ref = hf_embeddings(hf, batch.pixels.double(), batch.grid_thw)
    out = enc.encode(batch)
    plain = wb.build_encoder(cfg, placement="processor", norm="eager", dtype=torch.float32, device="cpu", seed=7,
                             fused=False).encode(batch)
    assert rel_err(out, ref) < 1e-5 and rel_err(plain, ref) < 1e-5
    assert rel_err(out, plain) < 1e-5


def test_fused_choice_is_validated_and_auto_stays_plain_on_cpu():
    cfg = wb.VisionConfig.preset("tiny-qwen2-vl")
    with pytest.raises(ValueError, match="fused must be one of"):
        wb.build_encoder(cfg, placement="tower", norm="eager", device="cpu", fused="yes")
    enc = wb.build_encoder(cfg, placement="tower", norm="eager", dtype=torch.float32, device="cpu")
    assert enc.visual.fused == "auto" and not enc.visual.kernels.fused and enc.visual.kernels.backend == "loop"
    # resolved once, at the door: a choice the tower cannot run fails when it is built
    with pytest.raises(ValueError, match="float64 tower needs fused=False"):
        wb.build_encoder(cfg, placement="tower", norm="eager", dtype=torch.float64, device="cpu", fused=True)
    with pytest.raises(ValueError, match="attention backend 'varlen' needs CUDA"):
        wb.build_encoder(cfg, placement="tower", norm="eager", dtype=torch.float32, device="cpu", attn_backend="varlen")
    with pytest.raises(ValueError, match="attention backend 'fa4' needs CUDA and fp16/bf16.*valid|'fa4' needs CUDA"):
        wb.build_encoder(cfg, placement="tower", norm="eager", dtype=torch.float32, device="cpu", attn_backend="fa4")
    with pytest.raises(ValueError, match="unknown attention backend 'flash4'.*'fa4'"):
        wb.build_encoder(cfg, placement="tower", norm="eager", device="cpu", attn_backend="flash4")
    # resolved again after a move or a cast
    enc.visual.to(torch.float64)
    assert enc.visual.kernels.backend == "loop" and not enc.visual.kernels.fused


def test_swiglu_weights_are_padded_views_that_loads_write_through():
    """Qwen2.5-VL's gate|up|down live in one aligned buffer each; the checkpoint-shaped parameters
    are views into them, so loading, casting and moving keep the fused weights in step."""
    cfg = dataclasses.replace(wb.VisionConfig.preset("tiny-qwen2.5-vl"), mlp_hidden=70)   # 70: unaligned
    tower = wb.build_encoder(cfg, placement="processor", norm="eager", dtype=torch.float32, device="cpu",
                             seed=1).visual
    blk = tower.blocks[0]
    hp = blk.mlp.gate_up_weight.shape[0] // 2
    assert hp % 64 == 0 and hp >= 70
    sd = tower.state_dict()
    assert sd["blocks.0.mlp.gate_proj.weight"].shape == (70, cfg.width)
    assert sd["blocks.0.mlp.down_proj.weight"].shape == (cfg.width, 70)
    new = {k: torch.randn_like(v) for k, v in sd.items() if not k.endswith("inv_freq")}
    tower.load_hf_state_dict(new)
    assert torch.equal(blk.mlp.gate_up_weight[:70], new["blocks.0.mlp.gate_proj.weight"])
    assert torch.equal(blk.mlp.gate_up_weight[hp:hp + 70], new["blocks.0.mlp.up_proj.weight"])
    assert torch.equal(blk.mlp.down_weight[:, :70], new["blocks.0.mlp.down_proj.weight"])
    assert not blk.mlp.gate_up_weight[70:hp].any() and not blk.mlp.down_weight[:, 70:].any()
    tower.to(torch.float64)
    assert blk.mlp.gate_up_weight.dtype == torch.float64
    assert blk.mlp.gate_proj.weight.data_ptr() == blk.mlp.gate_up_weight.data_ptr()
    assert torch.equal(blk.mlp.gate_up_weight[hp:hp + 70], new["blocks.0.mlp.up_proj.weight"].double())


def test_metadata_caches_return_what_prepare_returns():
    cfg = wb.VisionConfig.preset("tiny-qwen2.5-vl")
    enc = wb.build_encoder(cfg, placement="tower", norm="eager", dtype=torch.float32, device="cpu")
    tower = enc.visual
    grid = torch.tensor([[1, 16, 24], [2, 8, 8]])
    a, b = tower.prepare_cached(grid), tower.prepare_cached(grid.clone())
    fresh = tower.prepare(grid)
    assert a is b
    for name, t in fresh.tensors().items():
        assert torch.equal(t, getattr(a, name)), name
    assert tower.prepare_cached(torch.tensor([[1, 16, 16]])) is not a
    for i in range(tower.META_CACHE_SIZE + 1):
        tower.prepare_cached(torch.tensor([[1, 8, 8 * (i + 1)]]))
    assert len(tower._meta_cache) == tower.META_CACHE_SIZE
    assert tower.prepare_cached(grid) is not a      # evicted, prepared again
    assert fresh.dense_seqlen is None and tower.prepare(torch.tensor([[3, 8, 8]])).dense_seqlen == 64
    assert tower.prepare(torch.tensor([[1, 8, 8]]), n_rows=80).dense_seqlen is None      # padding rows


def test_exact_fit_graphs_are_chosen_for_equal_sequences_filling_a_budget(monkeypatch):
    """On a CPU no backend has a dense kernel; with the dense choice forced on, the runner's
    selection and its shared buffers are checked: exact-fit replays only for packs of equal
    sequences that fill their budget, and they equal eager."""
    import workbench.runner as runner_mod
    monkeypatch.setattr(runner_mod, "use_dense", lambda backend, rows: rows >= 128)
    cfg = wb.VisionConfig.preset("tiny-qwen2-vl")
    enc = wb.build_encoder(cfg, placement="tower", norm="eager", dtype=torch.float32, device="cpu", seed=2)
    runner = EncoderGraphRunner(enc, budgets=[16, 64], max_items=4)
    assert set(runner.graphs[64].exact) == {1} and not runner.graphs[16].exact     # 64 rows: too short
    gen = torch.Generator().manual_seed(int(torch.randint(0, 1000, (1,))))

    def batch_of(grids):
        grid = torch.tensor(grids)
        px = torch.randint(0, 256, (int(grid.prod(1).sum()), cfg.patch_dim), dtype=torch.uint8, generator=gen)
        return wb.PatchBatch(px, grid)

    for grids, want in (([[1, 16, 16]], [True]), ([[1, 8, 8]] * 4, [False]), ([[1, 16, 8]] * 2, [True]),
                        ([[1, 12, 16]], [False]), ([[2, 8, 16]], [True])):
        runner.reset_stats()
        batch = batch_of(grids)
        got = runner.encode(batch)
        assert runner.stats_frame().exact.tolist() == want, grids
        assert rel_err(got, enc.encode(batch)) < 1e-5, grids
    assert {1, 2} <= set(runner.graphs[64].exact)
    assert all(v.pixels.data_ptr() == runner.graphs[64].pixels.data_ptr() for v in runner.graphs[64].exact.values())
    off = EncoderGraphRunner(enc, budgets=[64], max_items=4, exact_fit=False)
    off.encode(batch_of([[1, 16, 16]]))
    assert not off.graphs[64].exact and not off.stats_frame().exact.any()
    with pytest.raises(ValueError, match="exact_fit must be True or False"):
        EncoderGraphRunner(enc, budgets=[64], exact_fit="yes")
    # first use: no variant at construction; the first exact pack captures it, equal to eager
    lazy = EncoderGraphRunner(enc, budgets=[16, 64], max_items=4, exact_capture="first_use")
    assert not lazy.graphs[64].exact
    batch = batch_of([[1, 16, 8]])
    lazy.encode(batch)
    assert not lazy.graphs[64].exact and not lazy.stats_frame().exact.any()     # 32 merged tokens: not a fit
    batch = batch_of([[1, 16, 16]])
    got = lazy.encode(batch)
    assert set(lazy.graphs[64].exact) == {1} and lazy.stats_frame().exact.tolist() == [False, True]
    assert rel_err(got, enc.encode(batch)) < 1e-5
    # prepare: the host metadata and the exact-fit graph a batch needs, before its first encode
    lazy = EncoderGraphRunner(enc, budgets=[16, 64], max_items=4, exact_capture="first_use")
    batch = batch_of([[1, 16, 8]] * 2 + [[1, 16, 12]])       # two equal images fill 64; a third is padded
    lazy.prepare(batch)
    assert set(lazy.graphs[64].exact) == {2} and not lazy.graphs[16].exact and len(lazy._host_meta) == 2
    assert not lazy.stats                                     # nothing replayed
    captured = dict(lazy.graphs[64].exact)
    got = lazy.encode(batch)
    assert lazy.graphs[64].exact == captured                 # the encode captured nothing more
    assert sorted(lazy.stats_frame().exact.tolist()) == [False, True]
    assert rel_err(got, enc.encode(batch)) < 1e-5
    lazy.forget_metadata()                                    # a shape seen before is prepared again
    assert not lazy._host_meta and rel_err(lazy.encode(batch), got) == 0 and len(lazy._host_meta) == 2
    with pytest.raises(ValueError, match=r"unknown exact_capture 'later'; valid: \('construction', 'first_use'\)"):
        EncoderGraphRunner(enc, budgets=[64], exact_capture="later")


def test_select_without_copy_views_consecutive_items_only():
    cfg = wb.VisionConfig.preset("tiny-qwen2-vl")
    batch = wb.preprocess(wb.random_images(3, seed=3, min_side=28, max_side=84), cfg)
    view = batch.select([1, 2], copy=False)
    assert view.pixels.data_ptr() == batch.pixels[batch.item_slices[1]].data_ptr()
    assert torch.equal(view.pixels, batch.select([1, 2]).pixels)
    assert batch.select([2, 0], copy=False).pixels.data_ptr() != batch.pixels.data_ptr()
    assert batch.select([0]).pixels.data_ptr() != batch.pixels.data_ptr()      # copy is the default


def test_window_slots_bound_every_pack_of_frames():
    """`max_windows` bounds the windows of any frames (brute force over fresh random shapes, thin
    strips included), and a runner sized with it takes the worst packs."""
    from workbench.towers.common import max_windows
    from workbench.towers.qwen2_5_vl import window_order
    cfg = wb.VisionConfig.preset("qwen2.5-vl-7b")
    g = torch.Generator().manual_seed(int(torch.randint(0, 2 ** 30, (1,))))
    for _ in range(300):
        n = int(torch.randint(1, 6, (1,), generator=g))
        frames = [(1, int(torch.randint(1, 40, (1,), generator=g)), int(torch.randint(1, 40, (1,), generator=g)))
                  for _ in range(n)]
        frames[0] = (1, 1, frames[0][2])                       # a one-token-high strip: the worst case
        tokens = sum(h * w for _, h, w in frames)
        _, sizes = window_order(frames, cfg.window_merged)
        assert len(sizes) <= max_windows(cfg, tokens, n), frames
    tiny = wb.VisionConfig.preset("tiny-qwen2.5-vl")
    enc = wb.build_encoder(tiny, placement="tower", norm="eager", dtype=torch.float32, device="cpu", seed=1)
    runner = EncoderGraphRunner(enc, budgets=[64], max_items=8)
    m = tiny.merge_size
    grids = torch.tensor([[1, m, m * 8]] * 8)           # eight 1 x 8-token strips fill the budget
    px = torch.randint(0, 256, (int(grids.prod(1).sum()), tiny.patch_dim), dtype=torch.uint8, generator=g)
    batch = wb.PatchBatch(px, grids)
    assert rel_err(runner.encode(batch), enc.encode(batch)) < 1e-5


def test_qwen3_fused_mlp_keeps_one_fc1_output_on_meta_and_runs_the_plain_ops_on_a_cpu():
    """On CUDA the fused Qwen3-VL MLP folds GELU(tanh) into the fc1 GEMM (checked there by
    tests/test_cuda.py); the graph-pool model traces the tower on the meta device, so the trace
    must take the same path: one fc1-sized tensor, where the plain ops allocate two. On a CPU,
    where the same call would compute the erf GELU, the fused MLP is the plain one."""
    from workbench.memory_model import count_allocations
    cfg = wb.VisionConfig.preset("tiny-qwen3-vl")
    enc = wb.build_encoder(cfg, placement="tower", norm="eager", dtype=torch.float32, device="cpu", seed=2)
    block = enc.visual.blocks[0]
    h = torch.randn(37, cfg.width, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        assert torch.equal(block.mlp_fused(h), block.mlp_out(h))
    block.to("meta")
    hm = torch.empty(37, cfg.width, device="meta")
    with torch.inference_mode():
        fused, out = count_allocations(lambda: block.mlp_fused(hm))
        plain, _ = count_allocations(lambda: block.mlp_out(hm))
    big = 37 * cfg.mlp_hidden * 4
    assert [e[2] for e in fused if e[0] == "alloc"].count(big) == 1
    assert [e[2] for e in plain if e[0] == "alloc"].count(big) == 2
    assert out.shape == (37, cfg.width)


@pytest.mark.triton
@pytest.mark.parametrize("n, end", [(37, 20), (64, 64), (33, 0), (50, 49)])
def test_zero_tail_zeroes_only_the_rows_past_the_end(n, end):
    """FlashAttention-4's guard: keys and values of padding rows (views of one qkv) zeroed in place,
    every other row and the queries untouched; a layout the kernel does not take falls back."""
    from workbench.attention import zero_tail_
    qkv = torch.randn(n, 3, 4, 72, dtype=torch.bfloat16)
    qkv[end:] = float("nan")
    ref = qkv.clone()
    e = torch.tensor([end], dtype=torch.int32)
    zero_tail_(qkv[:, 1], e)
    zero_tail_(qkv[:, 2], e)
    assert torch.equal(qkv[:end], ref[:end]) and (qkv[end:, 1:] == 0).all() and qkv[end:, 0].isnan().all()
    x = torch.randn(n, 72, 4).transpose(1, 2)
    r = x.clone()
    zero_tail_(x, e)
    assert torch.equal(x[:end], r[:end]) and (x[end:] == 0).all()


def test_pool_model_traces_flash_attention_4_on_meta(monkeypatch):
    """Where FlashAttention-4 is what a CUDA tower runs, the planner's allocation trace (meta device)
    models its output and calls none of its kernels (the padding study crashed on the H200 there)."""
    from workbench import attention, planner

    def fa4_must_not_run(*a, **k):
        raise AssertionError("FA4 called on meta tensors")
    monkeypatch.setattr(attention, "fa4_problem", lambda device, head_dim: None)
    monkeypatch.setattr(attention, "_fa4_func", lambda: fa4_must_not_run)
    monkeypatch.setattr(attention, "zero_tail_", fa4_must_not_run)
    monkeypatch.setattr(attention, "warm_fa4", lambda *a, **k: None)
    import workbench.towers.common as common
    monkeypatch.setattr(common, "warm_fa4", lambda *a, **k: None)
    cfg = wb.VisionConfig.preset("tiny-qwen3-vl")
    trace = planner.capture_trace(cfg, 64, torch.bfloat16, "triton_rows", torch.uint8, 1)
    q_bytes = 64 * cfg.merge_unit * cfg.width * 2
    assert any(e[0] == "alloc" and e[2] == q_bytes for e in trace)
