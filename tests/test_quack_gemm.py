"""The SwiGLU MLPs on quack's gated GEMM (`gemm="quack"`, `workbench.quack_gemm`), checked on the CPU: the paired
weight layout it needs (gate and up rows alternating) is invisible from outside and exact, loads write into it,
the fused forward hands quack the operands its gated epilogue pairs, and a choice the device, dtype or tower
cannot run is refused at build time naming the value and the valid ones. The kernel itself runs only on a
Hopper GPU with quack installed (tests/test_cuda.py); here a float64 stand-in with quack's documented
semantics (silu of the even accumulator columns times the odd ones) takes its place."""
import dataclasses

import pytest
import torch
import torch.nn.functional as F

import workbench as wb
from workbench import quack_gemm
from workbench.towers import build_tower
from workbench.towers.common import GatedMLP
from workbench.towers.weights import init_checkpoint_like

from test_gemm_align import UNALIGNED, gated_mlps


def _fresh(t: torch.Tensor) -> torch.Tensor:
    g = torch.Generator().manual_seed(int(torch.randint(0, 2 ** 30, (1,))))   # fresh inputs each run
    return torch.randn(t.shape, generator=g, dtype=torch.float64).to(t.dtype)


def stand_in(calls: list):
    """quack's gemm_act, as the tower calls it, in float64 on the CPU: A [M, K] @ B [K, N] + bias, then
    silu(even columns) * odd columns; records what it was given."""
    def gemm_act(a, b, bias=None, activation=None, store_preact=True, config=None):
        calls.append(dict(b_shape=tuple(b.shape), activation=activation, store_preact=store_preact,
                          config=config, bias=bias is not None))
        acc = a.double() @ b.double() + (0 if bias is None else bias.double())
        return None, (F.silu(acc[:, 0::2]) * acc[:, 1::2]).to(a.dtype)
    return gemm_act


@pytest.fixture
def quack_here(monkeypatch):
    """quack 'available' on this CPU: the stand-in for its kernel, no device check, no compile."""
    calls = []
    monkeypatch.setattr(quack_gemm, "_gemm_act", lambda: stand_in(calls))
    monkeypatch.setattr(quack_gemm, "quack_problem", lambda device, dtype: None)
    monkeypatch.setattr(quack_gemm, "config", lambda: "pinned")
    return calls


@pytest.mark.parametrize("bias", [True, False])
def test_the_paired_layout_is_invisible_and_exact(bias):
    """use_pairs keeps the state dict (names, shapes, values), keeps the padding zero, and both forwards agree
    with the halves layout; a load after it writes into the paired buffer; a dtype cast keeps it paired."""
    torch.manual_seed(0)
    m = GatedMLP(24, 90, bias=bias).double()       # 90: padded to 128
    for p in m.parameters():
        p.data.copy_(_fresh(p))
    before = {k: v.clone() for k, v in m.state_dict().items()}
    h = _fresh(torch.empty(7, 24, dtype=torch.float64))
    want = m(h)
    m.use_pairs()
    assert m.pairs and m.gate_up_weight.shape == (2 * 128, 24)
    sd = m.state_dict()
    assert sd.keys() == before.keys() and all(torch.equal(sd[k], before[k]) for k in sd)
    w = m.gate_up_weight
    assert torch.equal(w[0:180:2], before["gate_proj.weight"]) and torch.equal(w[1:180:2], before["up_proj.weight"])
    assert torch.count_nonzero(w[180:]) == 0 and torch.count_nonzero(m.down_weight[:, 90:]) == 0
    if bias:
        b = m.gate_up_bias
        assert torch.equal(b[0:180:2], before["gate_proj.bias"]) and torch.count_nonzero(b[180:]) == 0
    torch.testing.assert_close(m(h), want, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(m.forward_fused(h), want, rtol=1e-12, atol=1e-12)   # torch's ops on the pairs
    new = {k: _fresh(v) for k, v in before.items()}
    buf = m.gate_up_weight
    m.load_state_dict(new)
    assert m.gate_up_weight is buf and torch.equal(buf[1:180:2], new["up_proj.weight"])
    assert torch.count_nonzero(buf[180:]) == 0
    m.float()
    assert m.pairs and torch.equal(m.gate_up_weight[0:180:2], new["gate_proj.weight"].float())


def test_the_fused_forward_hands_quack_paired_operands(quack_here):
    """gemm 'quack': one gated GEMM over the paired buffer (B as [width, 2 x Hp], the bias paired, no
    pre-activation stored, the pinned config), then the down projection; the output is the plain forward's."""
    m = GatedMLP(24, 90, bias=True).double()
    for p in m.parameters():
        p.data.copy_(_fresh(p))
    h = _fresh(torch.empty(9, 24, dtype=torch.float64))
    want = m(h)
    m.use_pairs()
    m.gemm = "quack"
    got = m.forward_fused(h)
    assert quack_here == [dict(b_shape=(24, 256), activation="swiglu", store_preact=False, config="pinned",
                               bias=True)]
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("family", sorted(UNALIGNED))
def test_a_tower_on_quack_matches_the_cublas_one(family, quack_here):
    """A whole tower built with gemm='quack' (the fused kernels on, padded SwiGLU widths) resolves to it,
    pairs every gated MLP (blocks and GLM's merger) and gives the output of the same weights on 'cublas'."""
    cfg = UNALIGNED[family]
    torch.manual_seed(0)
    plain = build_tower(cfg, fused=True).eval()          # float32: the fused kernels compute in it
    init_checkpoint_like(plain, int(torch.randint(0, 2 ** 30, (1,))))
    quack = build_tower(cfg, fused=True, gemm="quack").eval()
    quack.load_state_dict(plain.state_dict())
    assert quack.resolve_kernels().gemm == "quack" and plain.resolve_kernels().gemm == "cublas"
    mlps = gated_mlps(quack)
    assert mlps and all(m.pairs and m.gemm == "quack" for m in mlps.values())
    grid = torch.tensor([[1, 8, 12], [1, 4, 4]])
    pixels = torch.randn(int(grid.prod(-1).sum()), cfg.patch_dim)
    with torch.no_grad():       # the stand-in rounds the activation once, the Triton silu_mul after the GEMM
        got, want = quack(pixels, grid), plain(pixels, grid)
    assert wb.reference.rel_err(got, want) < 1e-5
    assert len(quack_here) >= len(mlps)


def test_a_gemm_the_build_cannot_run_is_refused_naming_the_choices(monkeypatch):
    with pytest.raises(ValueError, match=r"unknown MLP gemm 'cuBLAS'.*'cublas', 'quack'"):
        wb.build_encoder("tiny-glm4v", device="cpu", dtype="fp32", norm="eager", gemm="cuBLAS")
    with pytest.raises(ValueError, match=r"unknown MLP gemm None"):
        build_tower(wb.VisionConfig.preset("tiny-glm4v"), gemm=None)
    with pytest.raises(ValueError, match=r"MLP gemm 'quack' needs a CUDA device, got cpu; use 'cublas'"):
        wb.build_encoder("tiny-glm4v", device="cpu", dtype="fp32", norm="eager", gemm="quack")
    monkeypatch.setattr(quack_gemm, "quack_problem", lambda device, dtype: None)
    monkeypatch.setattr(quack_gemm, "warm", lambda *a: None)
    with pytest.raises(ValueError, match=r"'quack' runs in the fused forward; it needs fused=True or 'auto'"):
        build_tower(wb.VisionConfig.preset("tiny-glm4v"), fused=False, gemm="quack").resolve_kernels()
    with pytest.raises(ValueError, match=r"Qwen3VLVisionTower has none"):
        build_tower(wb.VisionConfig.preset("tiny-qwen3-vl"), fused=True, gemm="quack").resolve_kernels()


def test_quack_names_why_it_cannot_run_here():
    assert "CUDA" in quack_gemm.quack_problem("cpu", torch.bfloat16)
    if torch.cuda.is_available():       # on a GPU host: a dtype it has no kernel for
        assert "bf16 or fp16" in quack_gemm.quack_problem("cuda", torch.float32)


def test_auto_takes_quack_only_where_it_runs(monkeypatch):
    """gemm='auto': cublas where quack cannot run (this CPU, or the stand-in refusing), quack where it can and the
    tower has SwiGLU MLPs in the fused forward; a tower without them, or with the fused kernels off, stays on
    cublas rather than failing as an explicit 'quack' does."""
    glm = wb.VisionConfig.preset("tiny-glm4v")
    assert build_tower(glm, fused=True, gemm="auto").resolve_kernels().gemm == "cublas"     # no quack here
    monkeypatch.setattr(quack_gemm, "quack_problem", lambda device, dtype: None)
    monkeypatch.setattr(quack_gemm, "warm", lambda *a: None)
    tower = build_tower(glm, fused=True, gemm="auto")
    assert tower.resolve_kernels().gemm == "quack" and all(m.pairs for m in gated_mlps(tower).values())
    off = build_tower(glm, fused=False, gemm="auto")
    assert off.resolve_kernels().gemm == "cublas" and not any(m.pairs for m in gated_mlps(off).values())
    assert build_tower(wb.VisionConfig.preset("tiny-qwen3-vl"), fused=True, gemm="auto").resolve_kernels().gemm \
        == "cublas"
