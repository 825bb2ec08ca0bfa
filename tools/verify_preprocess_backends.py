"""Check wb.preprocess's backends against transformers' own processors, on a host that has
torchvision (the GPU host): uint8 rows and grids equal, normalized pixels' largest difference,
and host time per image at several thread counts.

    python tools/verify_preprocess_backends.py OUT_DIR [--timing-only]

Writes OUT_DIR/backends.json (every comparison) and OUT_DIR/torchvision_rows.json: the SHA-256
of transformers' torchvision rows for each (family, input), which tests/test_backends.py checks
the ``torchvision`` backend against on machines without torchvision.
"""
from __future__ import annotations

import hashlib
import json
import sys
import time

import numpy as np
import torch
from PIL import Image

import workbench as wb
from workbench.photos import sample_images

FAMILIES = {"qwen2-vl": "qwen2-vl-7b", "qwen2.5-vl": "qwen2.5-vl-7b", "qwen3-vl": "qwen3-vl-8b",
            "qwen3.5": "tiny-qwen3.5", "glm4v": "glm-4.1v-9b", "pixtral": "mistral-small-3.1-24b",
            "gemma3": "gemma-3-27b"}


def hf_processor(family: str, cfg, raw: bool):
    import transformers
    if family == "pixtral":       # PixtralImageProcessor; its resize unit is given per call (run_hf)
        kw = dict(patch_size=cfg.patch_size, size={"longest_edge": cfg.longest_edge},
                  image_mean=list(cfg.image_mean), image_std=list(cfg.image_std))
        return transformers.PixtralImageProcessor(**kw, **(dict(do_rescale=False, do_normalize=False) if raw else {}))
    if family == "gemma3":        # Gemma3ImageProcessor: every image to the tower's fixed size, bilinear
        from workbench.families.gemma3 import image_side
        side = image_side(cfg)
        kw = dict(size={"height": side, "width": side}, image_mean=list(cfg.image_mean), image_std=list(cfg.image_std))
        # the torchvision class: Gemma3ImageProcessorFast before transformers renamed it Gemma3ImageProcessor
        cls = getattr(transformers, "Gemma3ImageProcessorFast", None) or transformers.Gemma3ImageProcessor
        return cls(**kw, **(dict(do_rescale=False, do_normalize=False) if raw else {}))
    names = ["Glm4vImageProcessor", "Glm4vImageProcessorFast"] if family == "glm4v" else \
        ["Qwen2VLImageProcessor", "Qwen2VLImageProcessorFast"]
    cls = next(getattr(transformers, n) for n in names if hasattr(transformers, n))
    mult = cfg.temporal_patch_size if family == "glm4v" else 1   # GLM bounds both temporal copies
    kw = dict(size={"shortest_edge": cfg.min_pixels * mult, "longest_edge": cfg.max_pixels * mult},
              patch_size=cfg.patch_size, temporal_patch_size=cfg.temporal_patch_size,
              merge_size=cfg.merge_size, image_mean=list(cfg.image_mean), image_std=list(cfg.image_std))
    if raw:
        kw.update(do_rescale=False, do_normalize=False)
    return cls(**kw)


def sha(rows: torch.Tensor) -> str:
    return hashlib.sha256(rows.detach().to("cpu", torch.uint8).contiguous().numpy().tobytes()).hexdigest()


def run_hf(proc, x, device=None, cfg=None):
    """(rows, grid) of transformers' processor for one input, in our row layout: a Pixtral
    processor (cfg with longest_edge) is called as PixtralProcessor calls it (patch size times the
    spatial merge) and its image cut into our rows; a Gemma-3 one's image is cut likewise."""
    kw = dict(return_tensors="pt")
    if not isinstance(x, Image.Image):
        kw["input_data_format"] = "channels_last"
    if device is not None:
        kw["device"] = device
    if cfg is not None and cfg.longest_edge:
        from workbench.families.pixtral import image_rows
        out = proc(images=[x], patch_size=cfg.patch_size * cfg.merge_size, **kw)
        return image_rows(out["pixel_values"][0], cfg.patch_size, cfg.merge_size)
    if cfg is not None and cfg.family == "gemma3":    # one fixed-size image, cut into our rows
        from workbench.families.pixtral import image_rows
        out = proc(images=[x], **kw)
        return image_rows(out["pixel_values"][0], cfg.patch_size, cfg.merge_size)
    out = proc(images=[x], **kw)
    return out["pixel_values"], out["image_grid_thw"]


def main(out_dir: str) -> None:
    sys.path.insert(0, "tests")
    from backend_inputs import backend_inputs
    items = backend_inputs()
    report, hashes = {"torch": torch.__version__}, {}
    import torchvision
    import transformers
    report.update(torchvision=torchvision.__version__, transformers=transformers.__version__)
    for family, preset in FAMILIES.items():
        cfg = wb.VisionConfig.preset(preset)
        raw, full = hf_processor(family, cfg, True), hf_processor(family, cfg, False)
        report.setdefault("classes", {})[family] = type(raw).__name__
        fam = report.setdefault(family, {})
        for name, x in items.items():
            r = {}
            try:
                ref, grid = run_hf(raw, x, cfg=cfg)
            except ValueError as e:      # an input this processor refuses (e.g. Pixtral's channel guess
                fam[name] = dict(hf_error=f"{type(e).__name__}: {e}")   # on a tiny array): say so, go on
                continue
            ours = wb.preprocess(x, cfg, backend="torchvision")
            r["grid_equal"] = torch.equal(ours.grid_thw, grid)
            r["tv_rows_equal"] = ours.pixels.shape == ref.shape and torch.equal(ours.pixels.to(ref.dtype), ref)
            r["hf_dtype"] = str(ref.dtype)
            hashes[f"{family}/{name}"] = dict(sha256=sha(ref), grid=grid.tolist())
            if ours.pixels.shape != ref.shape:   # transformers made other rows of it: say so, compare no further
                r["shapes"] = [list(ours.pixels.shape), list(ref.shape)]
                fam[name] = r
                continue
            pil = wb.preprocess(x, cfg, backend="pil")
            d = (pil.pixels.int() - ref.to(torch.int32)).abs()
            r["pil_vs_tv_levels_max"], r["pil_vs_tv_frac"] = int(d.max()), float((d > 0).float().mean())
            nref, _ = run_hf(full, x, cfg=cfg)
            nours = wb.preprocess(x, cfg, backend="torchvision", normalize=True)
            r["tv_norm_maxabs"] = float((nours.pixels - nref).abs().max())
            npil = wb.preprocess(x, cfg, normalize=True)
            r["pil_vs_tv_norm_maxabs"] = float((npil.pixels - nref).abs().max())
            if torch.cuda.is_available():
                cref, _ = run_hf(raw, x, device="cuda", cfg=cfg)
                cours = wb.preprocess(x, cfg, backend="cuda")
                r["cuda_rows_equal"] = torch.equal(cours.pixels.to(cref.dtype), cref.to(cours.pixels.device))
                emu = wb.preprocess(x, cfg, backend="cuda", device="cpu")
                r["cuda_vs_cpu_emulation_equal"] = torch.equal(emu.pixels, cours.pixels.cpu())
                dc = (cours.pixels.cpu().int() - ref.to(torch.int32)).abs()
                r["cuda_vs_tv_levels_max"], r["cuda_vs_tv_frac"] = int(dc.max()), float((dc > 0).float().mean())
                dp = (cours.pixels.cpu().int() - pil.pixels.int()).abs()
                r["cuda_vs_pil_levels_max"], r["cuda_vs_pil_frac"] = int(dp.max()), float((dp > 0).float().mean())
                cnref, _ = run_hf(full, x, device="cuda", cfg=cfg)
                cnours = wb.preprocess(x, cfg, backend="cuda", normalize=True)
                r["cuda_norm_maxabs"] = float((cnours.pixels - cnref.to(cnours.pixels.device)).abs().max())
                r["cuda_vs_pil_norm_maxabs"] = float((cnours.pixels.cpu() - npil.pixels).abs().max())
                hashes[f"{family}/{name}"]["sha256_cuda"] = sha(cref)
            fam[name] = r
        print(family, "tv rows equal:", sum(v.get("tv_rows_equal", False) for v in fam.values()), "/", len(fam),
              "cuda rows equal:", sum(v.get("cuda_rows_equal", False) for v in fam.values()), flush=True)
    report["timing_ms"] = timing()
    with open(f"{out_dir}/backends.json", "w") as f:
        json.dump(report, f, indent=1)
    with open(f"{out_dir}/torchvision_rows.json", "w") as f:
        json.dump(dict(torch=torch.__version__, transformers=report["transformers"],
                       torchvision=report["torchvision"], rows=hashes), f, indent=1)


def timing() -> dict:
    """ms per image (median of 7) for Qwen2.5-VL's processor: transformers' torchvision processor
    with and without normalization, wb.preprocess's torchvision and pil backends, per thread count."""
    cfg = wb.VisionConfig.preset("qwen2.5-vl-7b")
    photo = sample_images(["astronaut"])["astronaut"]
    imgs = {"1024x1024": photo.resize((1024, 1024), Image.Resampling.BICUBIC),
            "4032x3024": photo.resize((4032, 3024), Image.Resampling.BICUBIC)}
    full, raw = hf_processor("qwen2.5-vl", cfg, False), hf_processor("qwen2.5-vl", cfg, True)
    out = {}
    for label, im in imgs.items():
        for n in (1, 4, 16):
            torch.set_num_threads(n)
            fns = {"hf_tv_norm": lambda: full(images=[im], return_tensors="pt"),
                   "hf_tv_raw": lambda: raw(images=[im], return_tensors="pt"),
                   "wb_tv": lambda: wb.preprocess(im, cfg, backend="torchvision", threads=n),
                   "wb_tv_norm": lambda: wb.preprocess(im, cfg, backend="torchvision", threads=n, normalize=True),
                   "wb_pil": lambda: wb.preprocess(im, cfg, backend="pil")}
            for k, fn in fns.items():
                fn()
                ts = []
                for _ in range(7):
                    t = time.perf_counter()
                    fn()
                    ts.append((time.perf_counter() - t) * 1e3)
                out[f"{label}/{n}/{k}"] = float(np.median(ts))
            print(label, n, {k: round(out[f"{label}/{n}/{k}"], 1) for k in fns}, flush=True)
    torch.set_num_threads(16)
    return out


if __name__ == "__main__":
    if "--timing-only" in sys.argv[2:]:   # host time per image alone, into OUT_DIR/timing.json
        with open(f"{sys.argv[1]}/timing.json", "w") as f:
            json.dump(dict(torch=torch.__version__, timing_ms=timing()), f, indent=1)
    else:
        main(sys.argv[1])
