"""The real towers on a GPU: bf16 at full depth against transformers' own vision model (same random
checkpoint-like weights, per item), and the CUDA-graph runner (policy always, NaN-poisoned pool, NaN
padding) against eager; one line per preset. ``python tools/families_gpu.py`` from the repository root on a
CUDA host (edit the preset list below to check another family). What it read on the reference host:
results/reference/README.md, Correctness."""
import dataclasses, time
import torch
import workbench as wb
from workbench.reference import hf_vision_model, hf_embeddings, rel_err, cos_min
from workbench.runner import EncoderGraphRunner
from workbench.preprocess import normalize_rows
from workbench.towers.weights import init_checkpoint_like

photos = list(wb.sample_images().values())[:3]
for preset in ["qwen3-vl-8b", "qwen3.5-9b", "glm-4.1v-9b", "mistral-small-3.1-24b"]:
    t0 = time.time()
    try:
        cfg = wb.VisionConfig.preset(preset)
        if cfg.min_pixels <= 448 * 448 < cfg.max_pixels:      # a fixed-size family (Gemma-3) keeps its size
            cfg = dataclasses.replace(cfg, max_pixels=448 * 448)
        items = photos + [wb.Video(wb.sample_video(4, size=(224, 336)))]
        batch = wb.preprocess(items, cfg)
        with torch.device("cuda"):
            enc = wb.build_encoder(cfg, placement="tower", norm="triton_rows", dtype=torch.bfloat16, device="cuda", seed=None)
            hf = hf_vision_model(cfg, dtype=torch.bfloat16)
        init_checkpoint_like(hf, 0, on_device=True)
        enc.visual.load_hf_state_dict(hf.state_dict())
        with torch.inference_mode():
            eager = enc.encode(batch)
            # transformers item by item (GLM's video grids one frame each, as its model passes them)
            ref = []
            for i in range(batch.n_items):
                sub = batch.select([i])
                px = normalize_rows(sub.pixels, cfg).to("cuda")
                ref.append(hf_embeddings(hf, px, sub.grid_thw.to("cuda")) if not (cfg.family == "glm4v" and int(sub.grid_thw[0, 0]) > 1)
                           else None)
            runner = EncoderGraphRunner(enc, budgets=[256, 1024, 4096], buffer_dtype=torch.bfloat16, max_items=8,
                                        policy="always")
            runner.poison_pool()
            graph = runner.encode(batch, pad_value=float("nan"))
        st = runner.stats_frame()
        errs = []
        for i in range(batch.n_items):
            if ref[i] is None:
                continue
            sl = slice(batch.item_slices[i].start // cfg.merge_unit, batch.item_slices[i].stop // cfg.merge_unit)
            errs.append((rel_err(eager[sl], ref[i]), cos_min(eager[sl], ref[i])))
        print(preset, f"depth {cfg.depth} embed_width {cfg.embed_width} kernels {enc.visual.kernels}",
              f"items {batch.n_items} rows {batch.n_rows}",
              "vs transformers (rel_err, cos_min) per item:", [(f"{a:.3g}", f"{b:.5f}") for a, b in errs],
              f"| graph vs eager rel_err {rel_err(graph, eager):.3g} finite {bool(torch.isfinite(graph).all())}"
              f" replays {int((~st.miss).sum())} padded {int(st.padded_rows.sum())} exact {int(st.exact.sum())}",
              f"| {time.time() - t0:.1f} s", flush=True)
        del enc, hf, runner
        torch.cuda.empty_cache()
    except Exception as e:  # noqa
        import traceback; traceback.print_exc()
        print(preset, "FAILED", type(e).__name__, str(e)[:300], flush=True)
