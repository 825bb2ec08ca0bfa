"""Traps a user walks into with plausible arguments: each used to fail late with a raw error
(AttributeError, a conversion error) or, worse, silently (eager misses, NaN embeddings). Each test
reproduces the trap and checks for a clear error (bad value, what was expected, the valid choices)
or for the right behaviour. Config and preprocess traps live in test_config.py / test_preprocess.py."""
import warnings

import numpy as np
import pytest
import torch

import workbench as wb
from workbench.reference import rel_err
from workbench.runner import EncoderGraphRunner


def tiny_encoder(**kw):
    kw = dict(placement="tower", norm="eager", dtype=torch.float32, device="cpu") | kw
    return wb.build_encoder("tiny-qwen2-vl", **kw)


def image(side):
    return np.random.default_rng(side).integers(0, 256, (side, side, 3), dtype=np.uint8)


# ---- the default cudagraph runner follows the batches it is given ---------------------------
def test_default_runner_is_rebuilt_for_a_larger_batch_with_one_warning():
    enc = tiny_encoder()
    small = wb.preprocess([image(56)], enc.cfg)             # 4 merged tokens: budgets [64]
    large = wb.preprocess([image(56), image(420)], enc.cfg)  # 225 merged tokens: needs a 256 budget
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the first build is expected: no warning
        enc.encode(small, path="cudagraph")
    first = enc._default_runner
    assert first.budgets == [64]

    with pytest.warns(UserWarning, match=r"rebuilt.*225 merged tokens.*\[64\] -> \[64, 128, 256\]"):
        out = enc.encode(large, path="cudagraph")
    runner = enc._default_runner
    assert runner is not first and runner.budgets == [64, 128, 256]
    assert runner.stats and not any(r.miss for r in runner.stats), runner.stats
    assert rel_err(out, enc.encode(large)) < 1e-6

    # covered now: reused, no further warning, still no misses; a smaller batch does not shrink it
    runner.reset_stats()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        enc.encode(large, path="cudagraph")
        enc.encode(small, path="cudagraph")
    assert enc._default_runner is runner and not any(r.miss for r in runner.stats)


# ---- pad_value must fit the buffer dtype ----------------------------------------------------
@pytest.mark.parametrize("pad", [float("nan"), float("inf"), -1, 256, 0.5, "0", None])
def test_uint8_buffer_rejects_a_pad_value_it_cannot_hold(pad):
    enc = tiny_encoder()
    runner = EncoderGraphRunner(enc, budgets=[64], buffer_dtype=torch.uint8)
    batch = wb.preprocess([image(56)], enc.cfg)
    with pytest.raises(ValueError, match=rf"uint8 buffer can only be padded with an integer 0\.\.255, "
                                         rf"got {pad!r}".replace("(", r"\(").replace(")", r"\)")):
        runner.encode(batch, pad_value=pad)
    with pytest.raises(ValueError, match=r"uint8 buffer can only be padded"):
        runner.stage(runner.graphs[64], batch.pixels, pad_value=pad)
    assert not runner.stats, "nothing may run before the pad value is checked"
    # the default, and integral values in range, still work
    base = runner.encode(batch)
    assert torch.equal(runner.encode(batch, pad_value=255), base)
    assert torch.equal(runner.encode(batch, pad_value=7.0), base)


def test_float_buffer_pad_value_must_be_a_number():
    enc = tiny_encoder()
    runner = EncoderGraphRunner(enc, budgets=[64], buffer_dtype=torch.float32)
    batch = wb.preprocess([image(56)], enc.cfg)
    with pytest.raises(ValueError, match=r"pad_value must be a real number.*got '0'"):
        runner.encode(batch, pad_value="0")
    assert torch.isfinite(runner.encode(batch, pad_value=float("nan"))).all()


# ---- build_encoder: None for norm / placement -----------------------------------------------
def test_build_encoder_rejects_none_norm_and_placement_with_the_valid_choices():
    with pytest.raises(ValueError, match=r"unknown norm None; valid norms: eager, triton_channel"):
        wb.build_encoder("tiny-qwen2-vl", norm=None, device="cpu")
    with pytest.raises(ValueError, match=r"unknown norm 3; valid"):
        wb.build_encoder("tiny-qwen2-vl", norm=3, device="cpu")
    with pytest.raises(ValueError, match=r"unknown placement None; valid: \('processor', 'fold', 'device', 'outer'"):
        wb.build_encoder("tiny-qwen2-vl", placement=None, norm="eager", device="cpu")
    with pytest.raises(ValueError, match=r"unknown placement None; valid"):
        wb.build_encoder("tiny-qwen2-vl", placement=None, norm=None, device="cpu")
    with pytest.raises(TypeError, match=r"cfg must be a wb\.VisionConfig or a preset name.*got NoneType"):
        wb.build_encoder(None, device="cpu")


# ---- encode(path='cudagraph', runner=...) takes a runner ------------------------------------
@pytest.mark.parametrize("bad", ["x", 64, [64, 128]])
def test_cudagraph_runner_argument_must_be_a_runner(bad):
    enc = tiny_encoder()
    batch = wb.preprocess([image(56)], enc.cfg)
    with pytest.raises(TypeError, match=rf"runner must be a workbench EncoderGraphRunner \(or None for the "
                                        rf"default\), got {type(bad).__name__}"):
        enc.encode(batch, path="cudagraph", runner=bad)
    other = EncoderGraphRunner(tiny_encoder(), budgets=[64])
    with pytest.raises(ValueError, match="another encoder"):
        enc.encode(batch, path="cudagraph", runner=other)
