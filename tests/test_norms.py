"""Tests of workbench.norms: every implementation against the float64 reference, on the CPU.

The Triton kernels run in Triton's interpreter. `workbench.norms` hands its kernels to
`triton.jit` on the first Triton norm call, and `triton.jit` reads TRITON_INTERPRET at that
moment, so setting it here, at collection time, is early enough (nothing runs a Triton norm
during collection). The interpreter costs ~0.1-1 s per call, so shapes are small: 37 rows is a
partial tile for every block height (4..32) and 5 rows is less than one tile.
"""
import os

os.environ["TRITON_INTERPRET"] = "1"

import pytest  # noqa: E402
import torch  # noqa: E402

from workbench.config import VisionConfig  # noqa: E402
from workbench.norms import (NORMS, ROWS_CONFIGS, InputNorm, make_norm,  # noqa: E402
                             normalize_reference)
from workbench.ulps import bf16_ulps  # noqa: E402

pytestmark = pytest.mark.triton


@pytest.fixture(autouse=True)
def gpu_geometry(monkeypatch):
    """The kernels on the GPU's grids, interpreted: these tests exercise its program boundaries
    (the studies' interpreted runs take coarser grids, `norm_kernels.INTERPRETER_GEOMETRY`)."""
    from workbench import norm_kernels
    monkeypatch.setattr(norm_kernels, "INTERPRETER_GEOMETRY", "gpu")


def test_the_interpreters_coarse_grids_give_the_same_values(monkeypatch, gen):
    from workbench import norm_kernels
    x = _pixels(gen, rows=600)
    for name in ("triton_channel", "triton_flat", "triton_rows"):
        fine = make_norm(name, CFG)(x, torch.bfloat16)
        monkeypatch.setattr(norm_kernels, "INTERPRETER_GEOMETRY", "coarse")
        coarse = make_norm(name, CFG)(x, torch.bfloat16)
        monkeypatch.setattr(norm_kernels, "INTERPRETER_GEOMETRY", "gpu")
        assert torch.equal(fine, coarse)
        _assert_correct(coarse, x, name)
        # padding rows past n_valid stay untouched on the coarse grid too
        monkeypatch.setattr(norm_kernels, "INTERPRETER_GEOMETRY", "coarse")
        out = _poison(600, torch.bfloat16)
        make_norm(name, CFG)(x, torch.bfloat16, out=out, n_valid=torch.tensor(450, dtype=torch.int32))
        monkeypatch.setattr(norm_kernels, "INTERPRETER_GEOMETRY", "gpu")
        assert torch.equal(out[:450], fine[:450]) and torch.isnan(out[450:].float()).all()

CFG = VisionConfig.preset("qwen2-vl-7b")
D = CFG.patch_dim
ROWS = 37
OUT_DTYPES = (torch.bfloat16, torch.float32)
# fp32: scale/shift are rounded to fp32 (rel 2**-24 each), then one product and one sum are
# rounded. With |x*scale| < 3.83 (255/255/0.2613) and |y| < 2.2, the worst case is about
# 2.3e-7 + 1.2e-7 + 0.6e-7 + 1.2e-7 = 5.3e-7 absolute, so 1e-6 absolute is a safe bound that still
# catches any wrong channel (channel constants differ by > 1e-2). Relative tolerance is useless
# here: y crosses zero (|y| can be ~1e-3), where the relative error of an exact fp32 kernel is large.
FP32_ATOL = 1e-6


@pytest.fixture
def gen(seed) -> torch.Generator:
    """Per-test generator from the shared `seed` fixture (tests/conftest.py: fresh each run,
    printed, replayable with WB_TEST_SEED)."""
    return torch.Generator().manual_seed(seed)


def _pixels(gen, rows=ROWS, dtype=torch.uint8) -> torch.Tensor:
    return torch.randint(0, 256, (rows, D), dtype=torch.uint8, generator=gen).to(dtype)


def _poison(rows, dtype) -> torch.Tensor:
    return torch.full((rows, D), float("nan"), dtype=dtype)


def _assert_correct(y: torch.Tensor, x: torch.Tensor, name: str) -> None:
    assert not torch.isnan(y).any(), f"{int(torch.isnan(y).sum())} elements left unwritten"
    if y.numel() == 0:
        return
    if name == "identity":
        assert torch.equal(y, x.to(y.dtype))
        return
    ref = normalize_reference(x, CFG)
    if y.dtype == torch.bfloat16:
        ulps = bf16_ulps(y, ref.to(torch.bfloat16))
        assert int(ulps.max()) <= 1, f"max {int(ulps.max())} bf16 ulp from the rounded reference"
    else:
        err = (y.double() - ref).abs().max().item()
        assert err <= FP32_ATOL, f"max abs error {err:.3g} > {FP32_ATOL}"


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.uint8)


# ---- values -------------------------------------------------------------------------------

@pytest.mark.parametrize("in_dtype", [torch.uint8, torch.float32, torch.bfloat16],
                         ids=["u8", "f32in", "bf16in"])
@pytest.mark.parametrize("out_dtype", OUT_DTYPES, ids=["bf16", "f32"])
@pytest.mark.parametrize("name", NORMS)
def test_matches_reference(name, out_dtype, in_dtype, gen):
    x = _pixels(gen, dtype=in_dtype)
    out = _poison(ROWS, out_dtype)
    y = make_norm(name, CFG)(x, out_dtype, out=out)
    assert y is out
    _assert_correct(out, x, name)


@pytest.mark.parametrize("name", NORMS)
def test_without_out_allocates(name, gen):
    x = _pixels(gen, rows=5)   # fewer rows than any tile
    y = make_norm(name, CFG)(x, torch.bfloat16)
    assert y.shape == (5, D) and y.dtype == torch.bfloat16 and y.is_contiguous()
    _assert_correct(y, x, name)


@pytest.mark.parametrize("rows_cfg", list(ROWS_CONFIGS) + [dict(block_rows=4, block_cols=256, num_warps=2)],
                         ids=lambda c: f"{c['block_rows']}x{c['block_cols']}w{c['num_warps']}")
def test_triton_rows_configs(rows_cfg, gen):
    norm = make_norm("triton_rows", CFG, **rows_cfg)
    assert (norm.block_rows, norm.block_cols, norm.num_warps) == tuple(rows_cfg.values())
    x = _pixels(gen)
    out = _poison(ROWS, torch.bfloat16)
    norm(x, torch.bfloat16, out=out)
    _assert_correct(out, x, "triton_rows")


@pytest.mark.parametrize("in_dtype", [torch.float16, torch.float64], ids=["f16in", "f64in"])
@pytest.mark.parametrize("name", ["triton_channel", "triton_flat", "triton_rows"])
def test_more_float_inputs(name, in_dtype, gen):
    x = _pixels(gen, rows=9, dtype=in_dtype)
    out = _poison(9, torch.float32)
    make_norm(name, CFG)(x, torch.float32, out=out)
    _assert_correct(out, x, name)


@pytest.mark.parametrize("name", ["eager", "identity"])
def test_float64_output(name, gen):
    x = _pixels(gen, rows=6)
    y = make_norm(name, CFG)(x, torch.float64)
    assert y.dtype == torch.float64
    if name == "identity":
        assert torch.equal(y, x.double())
    else:   # fp32 math, widened: the fp32 bound applies
        assert (y - normalize_reference(x, CFG)).abs().max().item() <= FP32_ATOL


@pytest.mark.parametrize("name", ["triton_flat", "triton_rows"])
def test_float16_output(name, gen):
    x = _pixels(gen, rows=9)
    y = make_norm(name, CFG)(x, torch.float16)
    # fp16 has 11 significant bits: half an ulp at |y| < 4 is 2**-10, plus the fp32 error
    assert (y.double() - normalize_reference(x, CFG)).abs().max().item() <= 2 ** -10 + FP32_ATOL


def test_reference_formula():
    x = torch.zeros(2, D, dtype=torch.uint8)
    x[1] = 255
    ref = normalize_reference(x, CFG)
    per_channel = D // CFG.in_channels
    for c in range(CFG.in_channels):
        cols = slice(c * per_channel, (c + 1) * per_channel)
        lo = -CFG.image_mean[c] / CFG.image_std[c]
        hi = (1 - CFG.image_mean[c]) / CFG.image_std[c]
        assert torch.allclose(ref[0, cols], torch.full_like(ref[0, cols], lo), rtol=1e-15, atol=0)
        assert torch.allclose(ref[1, cols], torch.full_like(ref[1, cols], hi), rtol=1e-15, atol=0)


# ---- n_valid -------------------------------------------------------------------------------

@pytest.mark.parametrize("n_valid", [-3, 0, 13, ROWS, ROWS + 5], ids=["-3", "0", "13", "N", "N+5"])
@pytest.mark.parametrize("out_dtype", OUT_DTYPES, ids=["bf16", "f32"])
@pytest.mark.parametrize("name", NORMS)
def test_n_valid_keeps_padding_rows(name, out_dtype, n_valid, gen):
    x = _pixels(gen)
    poison = _poison(ROWS, out_dtype)
    out = poison.clone()
    y = make_norm(name, CFG)(x, out_dtype, out=out, n_valid=torch.tensor(n_valid, dtype=torch.int32))
    assert y is out
    written = max(0, min(n_valid, ROWS))
    assert torch.equal(_bits(out[written:]), _bits(poison[written:])), "rows past n_valid were written"
    _assert_correct(out[:written], x[:written], name)


@pytest.mark.parametrize("name", NORMS)
def test_n_valid_without_out(name, gen):
    x = _pixels(gen)
    y = make_norm(name, CFG)(x, torch.bfloat16, n_valid=torch.tensor(10, dtype=torch.int32))
    assert y.shape == (ROWS, D)
    _assert_correct(y[:10], x[:10], name)     # the other rows are unspecified


@pytest.mark.parametrize("name", ["eager", "triton_rows", "triton_flat"])
def test_n_valid_int64_and_float_input(name, gen):
    x = _pixels(gen, dtype=torch.float32)
    out = _poison(ROWS, torch.bfloat16)
    make_norm(name, CFG)(x, torch.bfloat16, out=out, n_valid=torch.tensor(21, dtype=torch.int64))
    assert torch.isnan(out[21:]).all()
    _assert_correct(out[:21], x[:21], name)


@pytest.mark.parametrize("name", NORMS)
def test_empty_input(name):
    norm = make_norm(name, CFG)
    x = torch.empty(0, D, dtype=torch.uint8)
    y = norm(x, torch.bfloat16)
    assert y.shape == (0, D) and y.dtype == torch.bfloat16
    out = torch.empty(0, D, dtype=torch.float32)
    assert norm(x, torch.float32, out=out, n_valid=torch.tensor(0, dtype=torch.int32)) is out


# ---- the module ----------------------------------------------------------------------------

def test_module_buffers():
    norm = make_norm("triton_rows", CFG)
    assert isinstance(norm, InputNorm) and isinstance(norm, torch.nn.Module)
    assert norm.name == "triton_rows" and norm.cfg is CFG
    assert norm.state_dict() == {}
    names = dict(norm.named_buffers())
    assert set(names) == {"scale_ch", "shift_ch", "scale_col", "shift_col"}
    assert names["scale_col"].shape == (D,) and names["scale_ch"].shape == (CFG.in_channels,)
    per_channel = D // CFG.in_channels
    for c in range(CFG.in_channels):
        assert names["scale_col"][c * per_channel] == names["scale_ch"][c]
        assert names["shift_col"][(c + 1) * per_channel - 1] == names["shift_ch"][c]
    # a tower cast to bf16 must not drag the constants down with it
    tower = torch.nn.Sequential(norm, torch.nn.Linear(4, 4)).to(torch.bfloat16).to("cpu")
    assert tower[0].scale_col.dtype == torch.float32
    assert torch.equal(tower[0].scale_col, make_norm("eager", CFG).scale_col)
    assert "triton_rows" in repr(norm) and "block_rows=4" in repr(norm)


def test_value_check_skipped_while_capturing(monkeypatch, gen):
    # the check syncs (bool of a device reduction), which a CUDA graph capture forbids
    import workbench.norms as norms
    x = _pixels(gen, rows=3, dtype=torch.float32) + 0.5
    monkeypatch.setattr(norms, "in_graph", lambda: True)
    make_norm("eager", CFG)(x, torch.float32)
    monkeypatch.setattr(norms, "in_graph", lambda: False)
    with pytest.raises(ValueError, match="integers"):
        make_norm("eager", CFG)(x, torch.float32)


def test_device_mismatch_and_compiled_triton_on_cpu(monkeypatch, gen):
    import workbench.norms as norms
    with pytest.raises(ValueError, match=r"norm.to\('cpu'\)"):
        make_norm("triton_rows", CFG).to("meta")(U8, torch.bfloat16)
    norm = make_norm("triton_rows", CFG)
    norm(U8, torch.bfloat16)                      # makes sure the kernels are jitted
    monkeypatch.setattr(norms, "kernels_interpreted", lambda: False)
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET=1"):
        norm(U8, torch.bfloat16)


def test_check_values_off_accepts_any_float(gen):
    x = _pixels(gen, rows=3, dtype=torch.float32) + 0.5
    y = make_norm("eager", CFG, check_values=False)(x, torch.float32)
    assert torch.allclose(y.double(), normalize_reference(x, CFG), atol=FP32_ATOL, rtol=0)


# ---- errors --------------------------------------------------------------------------------

def test_unknown_name_lists_valid_names():
    with pytest.raises(ValueError) as err:
        make_norm("triton_fast", CFG)
    for name in NORMS:
        assert name in str(err.value)
    with pytest.raises(ValueError, match="only apply to 'triton_rows'"):
        make_norm("triton_flat", CFG, block_rows=8)
    with pytest.raises(ValueError, match="power of two"):
        make_norm("triton_rows", CFG, block_cols=1000)
    with pytest.raises(TypeError, match="block_rows"):
        make_norm("triton_rows", CFG, block_size=8)


U8 = torch.zeros(4, D, dtype=torch.uint8)
NV = torch.tensor(2, dtype=torch.int32)
ERRORS = [
    # (description, call kwargs, exception, message pattern)
    ("wrong columns", dict(pixels=torch.zeros(4, D - 1, dtype=torch.uint8)), ValueError, r"\[N, 1176\].*\(4, 1175\)"),
    ("1-D pixels", dict(pixels=torch.zeros(D, dtype=torch.uint8)), ValueError, r"2-D"),
    ("int64 pixels", dict(pixels=torch.zeros(4, D, dtype=torch.int64)), TypeError, r"int64.*uint8, float16"),
    ("non-integer floats", dict(pixels=torch.full((4, D), 3.5)), ValueError, r"integers 0\.\.255.*3\.5"),
    ("out of range floats", dict(pixels=torch.full((4, D), 256.0)), ValueError, r"integers 0\.\.255.*256"),
    ("NaN floats", dict(pixels=torch.full((4, D), float("nan"))), ValueError, r"integers 0\.\.255"),
    ("non-contiguous", dict(pixels=torch.zeros(D, 4, dtype=torch.uint8).t()), ValueError, r"contiguous"),
    ("out shape", dict(out=torch.zeros(5, D, dtype=torch.bfloat16)), ValueError, r"out shape \(5, 1176\)"),
    ("out dtype", dict(out=torch.zeros(4, D, dtype=torch.float32)), ValueError, r"out dtype torch.float32.*bfloat16"),
    ("out_dtype int8", dict(out_dtype=torch.int8), ValueError, r"out_dtype torch.int8.*valid: float32"),
    ("out_dtype string", dict(out_dtype="bf16"), TypeError, r"torch.dtype"),
    ("python int n_valid", dict(n_valid=2), TypeError, r"0-d int32 tensor.*device tensor"),
    ("1-d n_valid", dict(n_valid=torch.tensor([2], dtype=torch.int32)), ValueError, r"0-d"),
    ("float n_valid", dict(n_valid=torch.tensor(2.0)), TypeError, r"n_valid dtype.*int32"),
]


@pytest.mark.parametrize("name", ["eager", "triton_rows"])
@pytest.mark.parametrize("desc,kwargs,exc,pattern", ERRORS, ids=[e[0] for e in ERRORS])
def test_errors(name, desc, kwargs, exc, pattern):
    call = dict(pixels=U8, out_dtype=torch.bfloat16, out=None, n_valid=None)
    call.update(kwargs)
    with pytest.raises(exc, match=pattern):
        make_norm(name, CFG)(call["pixels"], call["out_dtype"], out=call["out"], n_valid=call["n_valid"])


def test_triton_rejects_float64_output():
    with pytest.raises(ValueError, match=r"float64.*triton_rows.*float32, bfloat16, float16"):
        make_norm("triton_rows", CFG)(U8, torch.float64)
