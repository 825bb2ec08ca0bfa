"""The held-out inputs the preprocessing backends are checked on, regenerable on any machine:
tests/test_backends.py checks the ``torchvision`` backend's rows against the hashes that
tools/verify_preprocess_backends.py recorded from transformers' torchvision processors on a
host that has torchvision (tests/data/torchvision_rows.json)."""
from __future__ import annotations

import numpy as np
from PIL import Image

from workbench.photos import random_images, sample_images


def backend_inputs() -> dict:
    photos = sample_images()
    out = {f"photo_{k}": v for k, v in photos.items()}
    out["array_rocket"] = np.asarray(photos["rocket"].convert("RGB")).copy()
    for i, a in enumerate(random_images(4, seed=11, min_side=16, max_side=700)):
        out[f"noise_{i}"] = a
    coffee = photos["coffee"].convert("RGB")
    out["grey_array"] = np.asarray(coffee.convert("L"))[..., None].copy()
    out["grey_pil"] = coffee.convert("L")
    rgb = np.asarray(coffee)
    alpha = np.linspace(0, 255, rgb.shape[1]).astype(np.uint8)[None, :, None].repeat(rgb.shape[0], 0)
    out["rgba_array"] = np.concatenate([rgb, alpha], axis=2)
    out["rgba_pil"] = Image.fromarray(out["rgba_array"], "RGBA")
    out["palette_pil"] = coffee.convert("P", palette=Image.Palette.ADAPTIVE, colors=64)
    astro = photos["astronaut"].convert("RGB")
    out["phone_4032x3024"] = astro.resize((4032, 3024), Image.Resampling.BICUBIC)
    out["square_1024"] = astro.resize((1024, 1024), Image.Resampling.BICUBIC)
    out["tiny_20x30"] = np.random.default_rng(3).integers(0, 256, (20, 30, 3), dtype=np.uint8)
    out["wide_40x1900"] = np.asarray(astro.resize((1900, 40), Image.Resampling.BICUBIC)).copy()
    return out
