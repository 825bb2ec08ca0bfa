"""Data-parallel encoder path over torch.distributed (gloo on CPU, NCCL on GPUs).

Every rank holds the same encoder and the same batch metadata. Items are assigned largest first
(by patch rows) to the least-loaded rank; each rank encodes its own items (eagerly or through its
graph runner); the per-rank outputs are padded to the longest rank, all-gathered, unpadded and put
back into item order, so every rank returns the full [N/4, out_hidden] embedding.

`launch(fn, world_size)` starts the ranks as local processes (no torchrun needed), which is what
a notebook or a test uses; under torchrun, call `encode_dp` directly.
"""
from __future__ import annotations

import io
import os
import socket
import time
import traceback

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
    """This rank's share of `batch`, encoded and gathered: full [N/4, out_hidden] in item order."""
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError("path 'dp' needs an initialized torch.distributed process group: run under torchrun "
                           "or use workbench.dp.launch(fn, world_size) to start local ranks")
    if local_path not in ("eager", "cudagraph"):
        raise ValueError(f"local_path must be 'eager' or 'cudagraph', got {local_path!r}")
    enc.check_batch(batch)
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    unit = enc.cfg.merge_unit
    assign = balance(batch.item_rows, world)
    counts = [sum(batch.item_rows[i] // unit for i in a) for a in assign]
    longest = max(counts)
    nccl = dist.get_backend(group) == "nccl"
    # gloo has no bf16 reductions/collectives on every build: ship float32 there
    wire = enc.dtype if nccl else torch.float32
    dev = enc.device if nccl else torch.device("cpu")
    padded = torch.zeros(longest, enc.cfg.out_hidden, dtype=wire, device=dev)
    if assign[rank]:
        local = enc.encode(batch.select(assign[rank]), path=local_path, runner=runner)
        padded[: counts[rank]] = local.to(device=dev, dtype=wire)
    gathered = [torch.empty_like(padded) for _ in range(world)]
    dist.all_gather(gathered, padded, group=group)
    out = torch.empty(batch.n_rows // unit, enc.cfg.out_hidden, dtype=enc.dtype, device=enc.device)
    for r, items in enumerate(assign):
        batch.place_tokens(out, items, gathered[r][: counts[r]].to(device=enc.device, dtype=enc.dtype), unit)
    return out


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank, world_size, backend, port, fn, args, queue):
    try:
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                          WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank))
        if backend == "nccl":
            torch.cuda.set_device(rank)
        else:
            torch.set_num_threads(max(1, (os.cpu_count() or 1) // world_size))
        dist.init_process_group(backend, rank=rank, world_size=world_size)
        try:
            result = fn(*args)
        finally:
            dist.barrier()
            dist.destroy_process_group()
        # ship bytes, not shared-memory tensor handles: the rank exits before the parent reads them
        buf = io.BytesIO()
        torch.save(result.cpu() if torch.is_tensor(result) else result, buf)
        queue.put((rank, "ok", buf.getvalue()))
    except BaseException:  # report every failure to the parent instead of hanging it
        queue.put((rank, "error", traceback.format_exc()))


def launch(fn, world_size: int = 2, backend: str | None = None, args: tuple = (), timeout_s: float = 600):
    """Run `fn(*args)` on `world_size` local ranks; returns the list of per-rank results.

    fn must be importable (a module-level function): ranks are spawned processes. backend:
    'gloo' (CPU) or 'nccl' (one GPU per rank); default nccl when enough GPUs are visible.
    """
    import queue as _queue

    import multiprocessing as mp

    if backend is None:
        backend = "nccl" if torch.cuda.is_available() and torch.cuda.device_count() >= world_size else "gloo"
    if backend not in ("gloo", "nccl"):
        raise ValueError(f"backend must be 'gloo' or 'nccl', got {backend!r}")
    if backend == "nccl" and torch.cuda.device_count() < world_size:
        raise ValueError(f"nccl with world_size={world_size} needs {world_size} GPUs, "
                         f"{torch.cuda.device_count()} visible")
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=_worker, args=(r, world_size, backend, port, fn, args, q), daemon=False)
             for r in range(world_size)]
    for p in procs:
        p.start()
    results, errors = [None] * world_size, []
    pending = set(range(world_size))
    deadline = time.monotonic() + timeout_s
    try:
        while pending and not errors:
            try:
                rank, status, payload = q.get(timeout=1.0)
            except _queue.Empty:
                # a rank that died without reporting (killed, crashed interpreter) must not hang us
                dead = [r for r in pending if procs[r].exitcode not in (None, 0)]
                if dead:
                    errors.append(f"rank {dead[0]} exited with code {procs[dead[0]].exitcode} without a result "
                                  "(if this is a script, guard its entry point with if __name__ == '__main__')")
                elif time.monotonic() > deadline:
                    raise TimeoutError(f"dp ranks did not finish within {timeout_s} s") from None
                continue
            pending.discard(rank)
            if status == "ok":
                results[rank] = torch.load(io.BytesIO(payload), weights_only=False)
            else:
                errors.append(f"rank {rank}:\n{payload}")
    finally:
        for p in procs:
            p.join(timeout=30 if not errors else 1)
            if p.is_alive():
                p.terminate()
    if errors:
        raise RuntimeError("a dp rank failed:\n" + "\n".join(errors))
    return results


def encode_job(spec: dict) -> torch.Tensor:
    """A self-contained dp job for `launch`: builds the encoder and batch from `spec` on every rank.

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
                                    max_items=spec.get("max_items", 16))
    return encode_dp(enc, batch, local_path=spec.get("local_path", "eager"), runner=runner)
