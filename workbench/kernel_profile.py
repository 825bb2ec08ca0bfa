"""Where the device time of one call goes: torch.profiler's kernels (CUDA) or ops (CPU), summed by
category (`KERNEL_CATEGORIES`): the encoder latency study's kernel breakdown."""
from __future__ import annotations

import re

import torch
from torch.profiler import ProfilerActivity, profile

# kernel (CUDA) or op (CPU) name patterns -> category, first match wins
KERNEL_CATEGORIES = (
    ("attention", r"flash|fmha|cudnn|attention|sdpa"),
    ("matmul", r"gemm|nvjet|cutlass|xmma|cublas|aten::(addmm|mm|bmm|matmul|linear)\b"),
    ("input_norm", r"_rows_kernel|_channel_kernel|_flat_kernel"),
    ("norm", r"layer_norm|add_norm|rms|aten::(native_layer_norm|layer_norm|rsqrt|mean|pow)\b|reduce_kernel"),
    ("rotary", r"rotary|CatArrayBatchedCopy|neg_kernel|aten::(cat|neg)\b"),
    ("activation", r"gelu|silu|sigmoid"),
    ("copy", r"copy|memcpy|memset|index|gather|scatter|aten::(index|to|_to_copy|copy_|clone|contiguous)\b"),
)


def kernel_category(name: str) -> str:
    """The category of a CUDA kernel or CPU op name (`KERNEL_CATEGORIES`; 'elementwise' otherwise)."""
    for cat, pat in KERNEL_CATEGORIES:
        if re.search(pat, name, flags=re.IGNORECASE):
            return cat
    return "elementwise"


def kernel_breakdown(fn, device) -> dict:
    """Device time of one call of ``fn`` by kernel category (torch.profiler): on CUDA the kernels'
    device time, on a CPU the ops' self time. Returns {category: ms, ..., 'kernels': count}."""
    dev = torch.device(device)
    cuda = dev.type == "cuda"
    fn()                                    # warm: compiles and first-call work stay out
    if cuda:
        torch.cuda.synchronize(dev)
    with profile(activities=[ProfilerActivity.CUDA if cuda else ProfilerActivity.CPU]) as prof:
        fn()
        if cuda:
            torch.cuda.synchronize(dev)
    out: dict = {"kernels": 0}
    for e in prof.key_averages():
        us = e.device_time_total if cuda else e.self_cpu_time_total if e.key.startswith("aten::") else 0
        if us <= 0:
            continue
        cat = kernel_category(e.key)
        out[cat] = out.get(cat, 0.0) + us / 1e3
        out["kernels"] += e.count
    return out
