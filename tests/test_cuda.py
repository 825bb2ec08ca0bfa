"""CUDA-only checks (skipped without a GPU): towers, norms, real graph capture and replay.

Run on a GPU host with `python -m pytest tests/test_cuda.py -q`; CI machines have no GPU.
"""
import dataclasses

import pytest
import torch

import workbench as wb
from workbench.norms import normalize_reference
from workbench.reference import cos_min, hf_embeddings, hf_vision_model, rel_err
from workbench.runner import EncoderGraphRunner

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

REAL = ["qwen2-vl-7b", "qwen2.5-vl-7b"]


def items(max_pixels=448 * 448):
    p = wb.sample_images()
    return list(p.values()) + [wb.Video(wb.sample_video(4, size=(224, 308)))]


@pytest.mark.parametrize("preset", REAL)
@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-5), (torch.bfloat16, 5e-2)])
def test_cuda_tower_matches_transformers(preset, dtype, tol):
    cfg = dataclasses.replace(wb.VisionConfig.preset(preset).reduced(4), max_pixels=448 * 448)
    enc = wb.build_encoder(cfg, placement="processor", norm="eager", dtype=torch.float32, device="cuda", seed=1)
    hf = hf_vision_model(cfg, dtype=torch.float64)  # float64 reference on the CPU
    hf.load_state_dict(enc.visual.state_dict(), strict=False)
    batch = wb.preprocess(items()[-3:], cfg, normalize=True)
    ref = hf_embeddings(hf, batch.pixels.double(), batch.grid_thw)
    enc.visual.to(dtype)
    out = enc.encode(batch)
    print(preset, dtype, "rel_err", rel_err(out, ref), "backend", enc.visual.backend_for(out))
    assert rel_err(out.cpu(), ref) < tol and cos_min(out.cpu(), ref) > 0.99


@pytest.mark.parametrize("name", wb.NORMS)
@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float32])
def test_cuda_norms_match_float64(name, out_dtype):
    cfg = wb.VisionConfig.preset("qwen2.5-vl-7b")
    x = torch.randint(0, 256, (4133, cfg.patch_dim), dtype=torch.uint8, device="cuda")
    norm = wb.make_norm(name, cfg).cuda()
    out = torch.full(x.shape, float("nan"), dtype=out_dtype, device="cuda")
    n_valid = torch.tensor(3001, dtype=torch.int32, device="cuda")
    norm(x, out_dtype, out=out, n_valid=n_valid)
    want = normalize_reference(x, cfg) if name != "identity" else x.double()
    assert torch.isnan(out[3001:]).all()
    err = (out[:3001].double() - want[:3001]).abs().max().item()
    assert err <= (1e-6 if out_dtype == torch.float32 else 2 ** -7 * want.abs().max().item())


@pytest.mark.parametrize("preset", REAL)
@pytest.mark.parametrize("placement", ["tower", "runner", "outer"])
def test_cuda_graph_replay_matches_eager(preset, placement):
    cfg = dataclasses.replace(wb.VisionConfig.preset(preset).reduced(4), max_pixels=448 * 448)
    enc = wb.build_encoder(cfg, placement=placement, norm="triton_rows", dtype=torch.bfloat16, device="cuda", seed=2)
    batch = wb.preprocess(items(), cfg)
    runner = EncoderGraphRunner(enc, budgets=[64, 128, 256, 512, 1024], buffer_dtype=torch.bfloat16, max_items=8)
    assert runner.backend == "cuda"
    eager = enc.encode(batch)
    graph = enc.encode(batch, path="cudagraph", runner=runner)
    runner.poison_pool()
    again = runner.encode(batch, pad_value=float("nan"))
    err = rel_err(graph, eager)
    print(preset, placement, "graph vs eager", err, runner.stats_frame().to_dict("list"))
    if placement == "outer":
        assert err > 0.1
    else:
        assert err < 2e-2
        assert torch.isfinite(again).all() and torch.equal(again, graph)


@pytest.mark.parametrize("name", wb.NORMS)
@pytest.mark.parametrize("in_dtype", [torch.uint8, torch.bfloat16])
def test_cuda_graph_pool_of_a_norm_equals_the_allocator_model(name, in_dtype):
    """The bytes a captured norm reserves in its graph pool, and its peak, are what the analytic
    allocation trace replayed through the caching-allocator model predicts, exactly."""
    from workbench import measure
    cfg = wb.VisionConfig.preset("qwen2.5-vl-7b")
    rows = 4 * 1024
    norm = wb.make_norm(name, cfg, check_values=False).to("cuda")
    x = torch.randint(0, 256, (rows, cfg.patch_dim), device="cuda").to(in_dtype)
    nv = torch.tensor(rows, dtype=torch.int32, device="cuda")
    got = measure.captured_memory(lambda: norm(x, torch.bfloat16, n_valid=nv), "cuda")
    model = measure.pool_model(measure.norm_alloc_trace(name, rows, cfg.patch_dim, in_dtype, n_valid=True))
    assert got["pool_bytes"] == model["pool_bytes"] and got["peak_bytes"] == model["peak_bytes"]


def test_cuda_staging_designs_match_float64_and_time_as_graph_replays():
    from workbench.studies import cast_cost
    t = cast_cost.run(device="cuda", progress=False, budgets=[64], fills=[0.5], reps=3, depth=1)
    from workbench.studies import wide
    w = wide(t)
    assert (w.max_err_ulp <= 1).all() and (w.staging_us > 0).all() and (w.device == torch.cuda.get_device_name()).all()
