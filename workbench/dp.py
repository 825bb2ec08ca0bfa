"""Data-parallel encoder path over torch.distributed (gloo on CPU, NCCL on GPUs).

Every rank holds the same encoder and the same batch metadata. Items are assigned largest first
(by patch rows) to the least-loaded rank; each rank encodes its own items (eagerly or through its
graph runner); the per-rank outputs are padded to the longest rank, all-gathered, unpadded and put
back into item order, so every rank returns the full [N/4, embed_width] embedding.

Under torchrun, call `encode_dp` directly; `workbench.launch.launch(fn, world_size)` starts the
ranks as local processes instead (no torchrun needed), which is what a notebook or a test uses
(`encode_job` is a self-contained job for it).
"""
from __future__ import annotations

import hashlib

import torch
import torch.distributed as dist

from .preprocess import PatchBatch


def balance(item_rows: list[int], world_size: int) -> list[list[int]]:
    """Largest-first greedy assignment of items to ranks by row count; items ascending per rank."""
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    load = [0] * world_size
    assign: list[list[int]] = [[] for _ in range(world_size)]
    for i in sorted(range(len(item_rows)), key=lambda i: (-item_rows[i], i)):
        r = min(range(world_size), key=lambda r: (load[r], r))
        assign[r].append(i)
        load[r] += item_rows[i]
    return [sorted(a) for a in assign]


def encode_dp(enc, batch: PatchBatch, local_path: str = "eager", runner=None, group=None) -> torch.Tensor:
    """This rank's share of `batch`, encoded and gathered: full [N/4, embed_width] in item order."""
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError("encode_dp (path 'dp') needs an initialized torch.distributed process group: run under torchrun "
                           "or use workbench.launch.launch(fn, world_size) to start local ranks")
    if local_path not in ("eager", "cudagraph"):
        raise ValueError(f"local_path must be 'eager' or 'cudagraph', got {local_path!r}")
    enc.check_batch(batch)
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    tokens = enc.cfg.item_tokens(batch.grid_thw)
    assign = balance(batch.item_rows, world)
    counts = [sum(tokens[i] for i in a) for a in assign]
    longest = max(counts)
    nccl = dist.get_backend(group) == "nccl"
    # gloo has no bf16 reductions/collectives on every build: ship float32 there
    wire = enc.dtype if nccl else torch.float32
    dev = enc.device if nccl else torch.device("cpu")
    _check_same_batch(enc, batch, dev, group, world)
    padded = torch.zeros(longest, enc.cfg.embed_width, dtype=wire, device=dev)
    if assign[rank]:
        local = enc.encode(batch.select(assign[rank]), path=local_path, runner=runner)
        padded[: counts[rank]] = local.to(device=dev, dtype=wire)
    gathered = [torch.empty_like(padded) for _ in range(world)]
    dist.all_gather(gathered, padded, group=group)
    out = torch.empty(sum(tokens), enc.cfg.embed_width, dtype=enc.dtype, device=enc.device)
    for r, items in enumerate(assign):
        batch.place_tokens(out, items, gathered[r][: counts[r]].to(device=enc.device, dtype=enc.dtype), tokens=tokens)
    return out


def _check_same_batch(enc, batch: PatchBatch, dev, group, world: int) -> None:
    """Raise ValueError on every rank when the ranks hold different batches or encoder shapes.

    Each rank derives the assignment and the gathered sizes from its own batch, so ranks with
    different batches disagree on the all_gather sizes: gloo then aborts the process that receives
    the wrong size ("Received data size doesn't match expected size", no Python traceback) and
    NCCL may hang. A fixed-size all_gather of a fingerprint first turns that into an error that
    names the ranks and what differs. It costs one small collective (and, on NCCL, a device sync)
    per call: the dp path is checked for correctness, not timed.
    """
    rows = batch.item_rows
    # 7 bytes: the digest fits an int64 without a sign flip
    digest = hashlib.blake2b(repr((rows, str(enc.dtype))).encode(), digest_size=7).digest()
    mine = torch.tensor([len(rows), batch.n_rows, enc.cfg.merge_unit, enc.cfg.embed_width,
                         int.from_bytes(digest, "little")], dtype=torch.int64, device=dev)
    every = [torch.empty_like(mine) for _ in range(world)]
    dist.all_gather(every, mine, group=group)
    metas = [t.tolist() for t in every]
    if all(m == metas[0] for m in metas):
        return
    odd = [r for r, m in enumerate(metas) if m != metas[0]]
    same_totals = all(m[:4] == metas[0][:4] for m in metas)
    what = ("the same totals, but different per-item sizes or encoder dtypes" if same_totals
            else "different items or encoder shapes")
    lines = "\n".join(f"  rank {r}: {m[0]} items, {m[1]} patch rows, merge_unit {m[2]}, embed_width {m[3]}"
                      for r, m in enumerate(metas))
    who = f"rank {odd[0]} differs" if len(odd) == 1 else f"ranks {', '.join(map(str, odd))} differ"
    raise ValueError(f"dp ranks were given different batches: {who} from rank 0 ({what}); every rank must "
                     f"get the same batch and encoder, encode_dp splits the items between the ranks itself:\n{lines}")


def encode_job(spec: dict) -> torch.Tensor:
    """A self-contained dp job for `workbench.launch.launch`: builds the encoder and batch from
    `spec` on every rank.

    spec keys: preset, placement, norm, dtype, seed, images (a list of HxWx3 uint8 arrays or
    PIL images), normalize (bool), local_path ('eager'|'cudagraph'), budgets, buffer_dtype.
    """
    from .encoder import build_encoder
    from .preprocess import preprocess
    from .runner import EncoderGraphRunner

    device = f"cuda:{dist.get_rank()}" if dist.get_backend() == "nccl" else "cpu"
    enc = build_encoder(spec["preset"], placement=spec["placement"], norm=spec["norm"], dtype=spec["dtype"],
                        device=device, seed=spec.get("seed", 0), check_inputs=spec.get("check_inputs", True))
    batch = preprocess(spec["images"], enc.cfg, normalize=spec.get("normalize", False))
    runner = None
    if spec.get("local_path", "eager") == "cudagraph":
        runner = EncoderGraphRunner(enc, budgets=spec.get("budgets", [64, 256, 1024]),
                                    buffer_dtype=spec.get("buffer_dtype", torch.bfloat16),
                                    max_items=spec.get("max_items", 16), policy=spec.get("policy", "always"))
    return encode_dp(enc, batch, local_path=spec.get("local_path", "eager"), runner=runner)
