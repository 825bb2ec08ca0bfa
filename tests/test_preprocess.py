"""workbench.preprocess against transformers' Qwen2-VL PIL image processor, plus videos, bad inputs
and PatchBatch; and workbench.samples."""
from __future__ import annotations

import dataclasses
import math
import secrets

import numpy as np
import pytest
import torch
from PIL import Image

from workbench.config import VisionConfig
from workbench.preprocess import PatchBatch, Video, preprocess, smart_resize
from workbench.samples import SAMPLE_NAMES, image_mix, random_images, sample_images, sample_video

from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize as hf_smart_resize

# Processor settings of the tiny presets are the real ones (patch 14, merge 2, T 2, CLIP stats).
CFG = VisionConfig.preset("tiny-qwen2-vl")
CFG25 = VisionConfig.preset("tiny-qwen2.5-vl")
PHOTOS = sample_images()


def _hf(cfg: VisionConfig, raw: bool) -> Qwen2VLImageProcessorPil:
    kw = dict(size={"shortest_edge": cfg.min_pixels, "longest_edge": cfg.max_pixels},
              patch_size=cfg.patch_size, temporal_patch_size=cfg.temporal_patch_size,
              merge_size=cfg.merge_size)
    if raw:
        kw.update(do_rescale=False, do_normalize=False)
    return Qwen2VLImageProcessorPil(**kw)


def hf_reference(images, cfg=CFG, raw=True):
    """transformers' (pixel_values, image_grid_thw); arrays are declared channels-last so tiny
    images are not mistaken for channels-first."""
    out = _hf(cfg, raw)(images=images, return_tensors="pt", input_data_format="channels_last")
    return out["pixel_values"], out["image_grid_thw"]


def assert_matches_hf(ours_inputs, cfg=CFG, hf_inputs=None):
    batch = preprocess(ours_inputs, cfg)
    ref_pixels, ref_grid = hf_reference(ours_inputs if hf_inputs is None else hf_inputs, cfg)
    assert batch.pixels.dtype == torch.uint8
    assert torch.equal(ref_pixels, ref_pixels.round()), "reference should hold raw integers"
    assert torch.equal(batch.grid_thw, ref_grid), (batch.grid_thw.tolist(), ref_grid.tolist())
    assert batch.pixels.shape == ref_pixels.shape
    assert torch.equal(batch.pixels.float(), ref_pixels)
    return batch


# ---------------------------------------------------------------------------------------------
# smart_resize
# ---------------------------------------------------------------------------------------------
def test_smart_resize_matches_transformers_on_random_sizes():
    seed = secrets.randbits(32)
    print(f"smart_resize seed={seed}")
    rng = np.random.default_rng(seed)
    checked = 0
    for _ in range(20000):
        h, w = (int(v) for v in rng.integers(1, 6000, size=2))
        if max(h, w) / min(h, w) > 200:
            continue
        lo = int(rng.integers(1, 50000))
        hi = lo + int(rng.integers(0, 4_000_000))
        factor = int(rng.choice([14, 28, 32, 56]))
        assert smart_resize(h, w, factor, lo, hi) == hf_smart_resize(h, w, factor, lo, hi), (h, w, factor, lo, hi)
        checked += 1
    # the real settings over every small size, where rounding and the min branch matter most
    for h in range(1, 120):
        for w in range(1, 120):
            if max(h, w) / min(h, w) <= 200:
                assert smart_resize(h, w, 28, CFG.min_pixels, CFG.max_pixels) == \
                    hf_smart_resize(h, w, 28, CFG.min_pixels, CFG.max_pixels)
    assert checked > 10000


def test_smart_resize_rule_examples():
    assert smart_resize(512, 512) == (504, 504)
    assert smart_resize(10, 10) == (56, 56)                     # upscaled to min_pixels
    h, w = smart_resize(4000, 3000)                             # scaled down under max_pixels
    assert h % 28 == 0 and w % 28 == 0 and h * w <= 28 * 28 * 1280
    assert smart_resize(1, 200) == hf_smart_resize(1, 200)     # aspect exactly 200 is allowed


@pytest.mark.parametrize("args, match", [
    ((1, 201), "aspect ratio"),
    ((0, 10), "height=0"),
    ((10, -1), "width=-1"),
    ((10, 10, 0), "factor=0"),
    ((10, 10, 28, 100, 10), "min_pixels=100 exceeds max_pixels=10"),
])
def test_smart_resize_errors(args, match):
    with pytest.raises(ValueError, match=match):
        smart_resize(*args)


# ---------------------------------------------------------------------------------------------
# exact equality with transformers
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", list(PHOTOS))
def test_each_photo_matches_transformers(name):
    batch = assert_matches_hf(PHOTOS[name])
    assert batch.n_items == 1 and batch.pixels.shape[1] == CFG.patch_dim


def test_photo_as_numpy_and_torch_match_transformers():
    arr = np.asarray(PHOTOS["chelsea"])
    a = assert_matches_hf(arr)
    b = preprocess(torch.from_numpy(arr.copy()), CFG)
    c = preprocess(PHOTOS["chelsea"], CFG)
    assert torch.equal(a.pixels, b.pixels) and torch.equal(a.pixels, c.pixels)
    # a non-contiguous view is fine too
    big = np.zeros((arr.shape[0], arr.shape[1] * 2, 3), np.uint8)
    big[:, ::2] = arr
    assert torch.equal(preprocess(big[:, ::2], CFG).pixels, a.pixels)


def _varied_sizes(seed: int = 0) -> list:
    """Real photos at sizes from below min_pixels (upscaled) to above max_pixels (scaled down):
    the shipped photos, mix entries drawn at full size (thumbnails, charts, a screenshot) and two
    photos shrunk well below min_pixels (56*56)."""
    small = [p.resize((40, 30), Image.Resampling.BICUBIC) for p in image_mix("photos")[:2]]
    return (image_mix("photos") + image_mix("thumbnails", 3, seed) + image_mix("charts", 2, seed)
            + image_mix("screenshots", 2, seed) + small)


def test_mixed_size_photo_batch_matches_transformers():
    images = _varied_sizes(0)
    batch = assert_matches_hf(images)
    assert batch.n_items == len(images)
    areas = [int(t * h * w) for t, h, w in batch.grid_thw.tolist()]
    assert min(areas) * 196 <= 2 * CFG.min_pixels and max(areas) * 196 <= CFG.max_pixels
    # per-item slices of the batch equal the items processed alone
    for sl, img in zip(batch.item_slices, images[:3]):
        assert torch.equal(batch.pixels[sl], preprocess(img, CFG).pixels)


def test_random_noise_images_match_transformers():
    seed = secrets.randbits(32)
    print(f"random_images seed={seed}")
    images = random_images(6, seed=seed, min_side=5, max_side=700)
    mixed_types = [torch.from_numpy(x) if i % 3 == 1 else Image.fromarray(x) if i % 3 == 2 else x
                   for i, x in enumerate(images)]
    assert_matches_hf(mixed_types)


@pytest.mark.parametrize("make", ["2d", "hw1", "pil_L", "torch_hw1"])
def test_grey_matches_transformers(make):
    rng = np.random.default_rng(1)
    g = rng.integers(0, 256, size=(97, 131), dtype=np.uint8)
    ours = {"2d": g, "hw1": g[..., None], "pil_L": Image.fromarray(g, mode="L"),
            "torch_hw1": torch.from_numpy(g[..., None].copy())}[make]
    hf = Image.fromarray(g, mode="L") if make == "pil_L" else g[..., None]  # transformers has no 2-D path
    batch = assert_matches_hf(ours, hf_inputs=hf)
    rgb = preprocess(np.repeat(g[..., None], 3, axis=2), CFG)
    assert torch.equal(batch.pixels, rgb.pixels), "grey must equal the channel repeated 3 times"


def _rgba(seed=2, shape=(83, 120)):
    rng = np.random.default_rng(seed)
    x = rng.integers(0, 256, size=(*shape, 4), dtype=np.uint8)
    x[:10, :, 3] = 0      # fully transparent band -> white
    x[10:20, :, 3] = 255  # opaque band -> unchanged
    return x


@pytest.mark.parametrize("make", ["np_rgba", "torch_rgba", "pil_RGBA", "pil_LA", "pil_P_transparency",
                                  "pil_P", "pil_PA"])
def test_alpha_and_palette_match_transformers(make):
    x = _rgba()
    if make == "np_rgba":
        img = x
    elif make == "torch_rgba":
        img = torch.from_numpy(x)
    elif make == "pil_RGBA":
        img = Image.fromarray(x, mode="RGBA")
    elif make == "pil_LA":
        img = Image.fromarray(x[..., [0, 3]], mode="LA")
    elif make == "pil_PA":
        img = Image.fromarray(x, mode="RGBA").convert("PA")
    else:
        img = Image.fromarray(x[..., :3]).convert("P", palette=Image.Palette.ADAPTIVE, colors=32)
        if make == "pil_P_transparency":
            img.info["transparency"] = 0
    batch = assert_matches_hf(img)
    if make == "np_rgba":
        # fully transparent -> white, fully opaque -> the RGB channels unchanged
        clear = x.copy()
        clear[..., 3] = 0
        assert bool((preprocess(clear, CFG).pixels == 255).all())
        opaque = x.copy()
        opaque[..., 3] = 255
        assert torch.equal(preprocess(opaque, CFG).pixels, preprocess(opaque[..., :3], CFG).pixels)
    if make == "pil_P_transparency":
        plain = img.copy()
        plain.info.pop("transparency")
        assert not torch.equal(batch.pixels, preprocess(plain, CFG).pixels), "transparency was ignored"


def test_alpha_composite_array_and_pil_paths_agree_everywhere():
    v, a = np.meshgrid(np.arange(256), np.arange(256), indexing="ij")
    x = np.stack([v, 255 - v, v, a], axis=-1).astype(np.uint8)  # every (value, alpha) pair, 256x256
    from_array = preprocess(x, CFG).pixels
    from_pil = preprocess(Image.fromarray(x, mode="RGBA"), CFG).pixels
    assert torch.equal(from_array, from_pil)


def test_tiny_image_below_min_pixels_is_upscaled_like_transformers():
    rng = np.random.default_rng(3)
    tiny = rng.integers(0, 256, size=(9, 13, 3), dtype=np.uint8)
    batch = assert_matches_hf(tiny)
    t, h, w = batch.grid_thw[0].tolist()
    assert (h * 14) * (w * 14) >= CFG.min_pixels and batch.n_rows == h * w
    one = np.full((1, 1, 3), 7, np.uint8)
    assert_matches_hf(one)


@pytest.mark.parametrize("min_pixels, max_pixels", [(28 * 28 * 16, 28 * 28 * 64), (28 * 28 * 300, 28 * 28 * 400),
                                                    (4 * 28 * 28, 28 * 28 * 4096)])
def test_non_default_min_max_pixels_match_transformers(min_pixels, max_pixels):
    cfg = dataclasses.replace(CFG25, min_pixels=min_pixels, max_pixels=max_pixels)
    images = [PHOTOS["rocket"], PHOTOS["astronaut"], np.asarray(PHOTOS["chelsea"])[:40, :90]]
    batch = assert_matches_hf(images, cfg=cfg)
    for t, h, w in batch.grid_thw.tolist():
        assert h * w * 196 <= max(max_pixels, 4 * 196)


def test_normalize_true_equals_transformers_default_bitwise():
    images = [PHOTOS["coffee"], np.asarray(PHOTOS["grace_hopper"] if "grace_hopper" in PHOTOS
                                           else PHOTOS["rocket"]), random_images(1, seed=5)[0]]
    ours = preprocess(images, CFG, normalize=True)
    ref, grid = hf_reference(images, CFG, raw=False)
    assert ours.pixels.dtype == torch.float32 and torch.equal(ours.grid_thw, grid)
    # tolerance 0: same float64 rescale -> float32, same float32 (x - mean) / std, per element
    assert torch.equal(ours.pixels, ref), (ours.pixels - ref).abs().max()
    # and it is the normalized form of the uint8 rows, channel of column j = j // (T*P*P)
    raw = preprocess(images, CFG)
    col_ch = torch.arange(CFG.patch_dim) // (CFG.temporal_patch_size * CFG.patch_size ** 2)
    mean = torch.tensor(CFG.image_mean)[col_ch]
    std = torch.tensor(CFG.image_std)[col_ch]
    approx = (raw.pixels.float() / 255 - mean) / std
    assert torch.allclose(ours.pixels, approx, atol=1e-6, rtol=0)


# ---------------------------------------------------------------------------------------------
# layout (checked independently of transformers)
# ---------------------------------------------------------------------------------------------
def test_layout_rows_are_merge_block_major_and_columns_c_t_p_p():
    rng = np.random.default_rng(4)
    img = rng.integers(0, 256, size=(56, 84, 3), dtype=np.uint8)  # already a multiple of 28: no resize
    batch = preprocess(img, CFG)
    assert batch.grid_thw.tolist() == [[1, 4, 6]]
    rows = batch.pixels.view(-1, 3, 2, 14, 14)
    r = 0
    for br in range(2):
        for bc in range(3):
            for ir in range(2):
                for ic in range(2):
                    y, x = (br * 2 + ir) * 14, (bc * 2 + ic) * 14
                    patch = torch.from_numpy(img[y:y + 14, x:x + 14].transpose(2, 0, 1).copy())
                    assert torch.equal(rows[r, :, 0], patch) and torch.equal(rows[r, :, 1], patch)
                    r += 1


# ---------------------------------------------------------------------------------------------
# videos (transformers' video processor needs torchvision: structural checks)
# ---------------------------------------------------------------------------------------------
def test_video_of_identical_frames_equals_image_patches():
    frame = np.asarray(PHOTOS["chelsea"])
    image = preprocess(frame, CFG)
    for t in (2, 4, 6):
        video = preprocess(np.stack([frame] * t), CFG)
        _, gh, gw = image.grid_thw[0].tolist()
        assert video.grid_thw.tolist() == [[t // 2, gh, gw]]
        assert torch.equal(video.pixels, image.pixels.repeat(t // 2, 1))


def test_two_frame_video_columns_are_frame_patches():
    v = sample_video(2, size=(150, 230))
    video = preprocess(v, CFG)
    cols = video.pixels.view(video.n_rows, 3, 2, 14, 14)
    for t in range(2):
        frame = preprocess(v[t], CFG).pixels.view(-1, 3, 2, 14, 14)[:, :, 0]
        assert torch.equal(cols[:, :, t], frame)
    assert video.grid_thw[0, 0].item() == 1


def test_multi_pair_video_layout_is_time_major():
    v = sample_video(6, size=(120, 200), step=5)
    video = preprocess(v, CFG)
    assert video.grid_thw[0, 0].item() == 3
    per_t = video.n_rows // 3
    for k in range(3):
        pair = preprocess(v[2 * k:2 * k + 2], CFG)
        assert torch.equal(video.pixels[k * per_t:(k + 1) * per_t], pair.pixels)
    assert torch.equal(preprocess(video.pixels.new_tensor(v), CFG).pixels, video.pixels)  # torch input


def test_video_wrapper_and_frame_lists():
    v = sample_video(4, size=(100, 140))
    ref = preprocess(v, CFG)
    assert torch.equal(preprocess(Video([Image.fromarray(f) for f in v]), CFG).pixels, ref.pixels)
    assert torch.equal(preprocess(Video(list(v)), CFG).pixels, ref.pixels)
    assert torch.equal(preprocess(Video(torch.from_numpy(v)), CFG).pixels, ref.pixels)
    # a plain list of frames is a batch of 4 images, not a video
    images = preprocess(list(v), CFG)
    assert images.n_items == 4 and images.grid_thw[:, 0].tolist() == [1, 1, 1, 1]
    # images and videos can share a batch
    mixed = preprocess([v[0], Video(list(v)), PHOTOS["astronaut"]], CFG)
    assert mixed.grid_thw[:, 0].tolist() == [1, 2, 1]
    assert torch.equal(mixed.pixels[mixed.item_slices[1]], ref.pixels)
    # normalized video rows are the lookup of the uint8 rows
    vn = preprocess(v, CFG, normalize=True)
    assert vn.pixels.dtype == torch.float32 and vn.pixels.shape == ref.pixels.shape


def test_odd_frame_count_is_an_error():
    v = sample_video(3, size=(56, 56))
    with pytest.raises(ValueError, match=r"3 frames.*odd.*drop the last frame or repeat it"):
        preprocess(v, CFG)
    with pytest.raises(ValueError, match="1 frames"):
        preprocess(Video([v[0]]), CFG)


# ---------------------------------------------------------------------------------------------
# bad inputs
# ---------------------------------------------------------------------------------------------
_U8 = np.zeros((30, 40, 3), np.uint8)


@pytest.mark.parametrize("bad, exc, match", [
    (_U8.astype(np.float32), ValueError, r"dtype float32; pass uint8 0\.\.255"),
    (torch.zeros(30, 40, 3), ValueError, r"torch\.float32; pass uint8 0\.\.255"),
    (_U8.astype(bool), ValueError, r"dtype bool; images must be uint8"),
    (torch.zeros(30, 40, 3, dtype=torch.bool), ValueError, r"dtype bool"),
    (_U8.astype(np.int16), ValueError, r"dtype int16; pass uint8"),
    (np.zeros((0, 40, 3), np.uint8), ValueError, r"zero size: 0x40"),
    (np.zeros((30, 0), np.uint8), ValueError, r"zero size: 30x0"),
    (Image.new("RGB", (0, 5)), ValueError, r"zero size: 5x0"),
    (np.zeros((1, 300, 3), np.uint8), ValueError, r"aspect ratio 300\.0"),
    ([], ValueError, r"empty list"),
    ((), ValueError, r"empty list"),
    ("photo.jpg", TypeError, r"unsupported type builtins\.str; accepted: PIL\.Image\.Image"),
    (12, TypeError, r"unsupported type builtins\.int"),
    ([_U8, {"a": 1}], TypeError, r"image 1 has unsupported type builtins\.dict"),
    ([[_U8, _U8]], TypeError, r"nested list; wrap the frames of a video in Video"),
    (np.zeros((3, 30, 40), np.uint8), ValueError, r"40 channels.*channels-first"),
    (np.zeros((30, 40, 2), np.uint8), ValueError, r"2 channels; valid channel counts"),
    (np.zeros((2, 2, 30, 40, 3), np.uint8), ValueError, r"shape \(2, 2, 30, 40, 3\)"),
    (Image.new("I;16", (40, 30)), ValueError, r"mode 'I;16' is not supported"),
    (Image.new("F", (40, 30)), ValueError, r"mode 'F' is not supported"),
    (Video([_U8, np.zeros((28, 40, 3), np.uint8)]), ValueError, r"frames differ in size"),
    (np.zeros((0, 30, 40, 3), np.uint8), ValueError, r"no frames"),
    (np.zeros((2, 30, 0, 3), np.uint8), ValueError, r"zero size"),
])
def test_bad_inputs_raise_clear_errors(bad, exc, match):
    with pytest.raises(exc, match=match):
        preprocess(bad, CFG)


def test_bad_video_wrapper_and_cfg():
    with pytest.raises(ValueError, match="Video has no frames"):
        Video([])
    with pytest.raises(TypeError, match="Video.frames. takes a list/tuple"):
        Video("clip.mp4")
    with pytest.raises(ValueError, match=r"\[T, H, W, C\], got shape \(30, 40, 3\)"):
        Video(_U8)
    grey_cfg = dataclasses.replace(CFG, in_channels=1, image_mean=(0.5,), image_std=(0.5,))
    with pytest.raises(ValueError, match="in_channels=1 is not supported"):
        preprocess(_U8, grey_cfg)


# ---------------------------------------------------------------------------------------------
# PatchBatch
# ---------------------------------------------------------------------------------------------
def test_patchbatch_validation():
    px = torch.zeros(10, 6, dtype=torch.uint8)
    with pytest.raises(ValueError, match=r"adds up to 8 rows.*pixels has 10 rows"):
        PatchBatch(px, torch.tensor([[1, 2, 4]]))
    with pytest.raises(ValueError, match="int64"):
        PatchBatch(px, torch.tensor([[1, 2, 5]], dtype=torch.int32))
    with pytest.raises(ValueError, match=r"\[k, 3\]"):
        PatchBatch(px, torch.tensor([1, 2, 5]))
    with pytest.raises(ValueError, match="positive"):
        PatchBatch(torch.zeros(0, 6), torch.tensor([[0, 2, 5]]))
    with pytest.raises(ValueError, match="2-D"):
        PatchBatch(torch.zeros(10), torch.tensor([[1, 2, 5]]))
    with pytest.raises(TypeError, match="torch tensors"):
        PatchBatch(np.zeros((10, 6)), torch.tensor([[1, 2, 5]]))
    ok = PatchBatch(px, torch.tensor([[1, 2, 3], [1, 2, 2]]))
    assert ok.item_rows == [6, 4] and ok.item_slices == [slice(0, 6), slice(6, 10)]
    with pytest.raises(ValueError, match="not a multiple of merge_unit=4"):
        ok.n_merged_tokens()


def test_patchbatch_select_split_cat_round_trip():
    images = [PHOTOS["chelsea"], np.asarray(PHOTOS["astronaut"])[:100, :150], sample_video(4, (60, 90))]
    batch = preprocess(images, CFG)
    assert batch.n_items == 3 and batch.n_rows == sum(batch.item_rows)
    assert batch.n_merged_tokens() == batch.n_rows // 4
    parts = batch.split()
    assert [p.n_items for p in parts] == [1, 1, 1]
    back = PatchBatch.cat(parts)
    assert torch.equal(back.pixels, batch.pixels) and torch.equal(back.grid_thw, batch.grid_thw)
    rev = batch.select([2, 0, -2])
    assert rev.grid_thw.tolist() == [batch.grid_thw[i].tolist() for i in (2, 0, 1)]
    assert torch.equal(rev.select([1, 2, 0]).pixels, batch.pixels)
    # rows are copies
    one = batch.select([0])
    one.pixels.zero_()
    assert batch.pixels[batch.item_slices[0]].any()
    assert torch.equal(batch.to("cpu").pixels, batch.pixels)
    with pytest.raises(ValueError, match=r"out of range for a batch of 3"):
        batch.select([3])
    with pytest.raises(ValueError, match="at least one"):
        batch.select([])
    with pytest.raises(ValueError, match="at least one batch"):
        PatchBatch.cat([])
    with pytest.raises(ValueError, match="dtypes"):
        PatchBatch.cat([one, preprocess(images[0], CFG, normalize=True)])


# ---------------------------------------------------------------------------------------------
# samples
# ---------------------------------------------------------------------------------------------
def test_samples_are_real_rgb_photos_and_deterministic():
    assert set(PHOTOS) <= set(SAMPLE_NAMES) and len(PHOTOS) >= 4
    sizes = {k: (v.height, v.width) for k, v in PHOTOS.items()}
    assert sizes["chelsea"] == (300, 451) and sizes["coffee"] == (400, 600) and sizes["rocket"] == (427, 640)
    assert all(v.mode == "RGB" for v in PHOTOS.values())
    with pytest.raises(ValueError, match="unknown sample image.*valid: astronaut"):
        sample_images(["lena"])
    with pytest.raises(ValueError, match="unknown image mix 'x'; valid: .*photos"):
        image_mix("x")
    a, b = _varied_sizes(7), _varied_sizes(7)
    assert [np.asarray(x).tobytes() == np.asarray(y).tobytes() for x, y in zip(a, b)] == [True] * len(a)
    assert any(x.width * x.height < 2 * CFG.min_pixels for x in a)
    assert sum(x.width * x.height > CFG.max_pixels for x in a) >= 2
    assert all(np.array_equal(x, y) for x, y in zip(random_images(3, 1), random_images(3, 1)))
    v = sample_video(5, size=(64, 96), step=4)
    assert v.shape == (5, 64, 96, 3) and v.dtype == np.uint8
    assert np.array_equal(v[1][:, :-4], v[0][:, 4:])  # a pan: each frame is the last one shifted
    assert math.prod(sample_video(2, size=(700, 900)).shape) == 2 * 700 * 900 * 3


# ---------------------------------------------------------------------------------------------
# traps: a preset name for cfg; grey videos as [T, H, W]; the channels-first hint
# ---------------------------------------------------------------------------------------------
def test_cfg_may_be_a_preset_name():
    img = PHOTOS["chelsea"]
    by_name = preprocess(img, "tiny-qwen2-vl")
    assert torch.equal(by_name.pixels, preprocess(img, CFG).pixels)
    with pytest.raises(ValueError, match=r"unknown preset 'tiny'; valid presets: qwen2-vl-2b"):
        preprocess(img, "tiny")
    with pytest.raises(TypeError, match=r"cfg must be a wb\.VisionConfig or a preset name .*got dict"):
        preprocess(img, {"in_channels": 3})


def _grey_video(t=4, h=60, w=80):
    return np.random.default_rng(t * h * w).integers(0, 256, (t, h, w), dtype=np.uint8)


@pytest.mark.parametrize("as_tensor", [False, True])
def test_grey_video_array_t_h_w_in_video_is_grey_frames(as_tensor):
    grey = _grey_video()
    rgb = np.repeat(grey[..., None], 3, -1)
    ref = preprocess([Video(rgb)], CFG)
    got = preprocess([Video(torch.from_numpy(grey) if as_tensor else grey)], CFG)
    assert got.grid_thw.tolist() == [[2, 4, 6]] == ref.grid_thw.tolist()
    assert torch.equal(got.pixels, ref.pixels)
    # same as the frame-list and the [T, H, W, 1] spellings
    assert torch.equal(preprocess(Video(list(grey)), CFG).pixels, ref.pixels)
    assert torch.equal(preprocess(Video(grey[..., None]), CFG).pixels, ref.pixels)


def test_grey_video_array_passed_as_an_image_gets_advice_that_works():
    grey = _grey_video()
    with pytest.raises(ValueError) as e:
        preprocess([grey], CFG)
    msg = str(e.value)
    # the advice names the grey-video reading (it must not only suggest a transpose to RGBA)
    assert "Video(x)" in msg and "[T, H, W]" in msg, msg
    # ...and the transpose is offered as channels-first RGBA, with what that does to alpha
    assert "transpose(1, 2, 0)" in msg and "RGBA" in msg and "white" in msg, msg
    # following the grey-video advice gives the grey video
    ref = preprocess([Video(np.repeat(grey[..., None], 3, -1))], CFG)
    assert torch.equal(preprocess([Video(grey)], CFG).pixels, ref.pixels)


@pytest.mark.parametrize("shape", [(2, 30, 40), (6, 30, 40), (5, 30, 40)])
def test_3d_array_without_a_channel_first_axis_gets_no_transpose_hint(shape):
    with pytest.raises(ValueError) as e:
        preprocess(np.zeros(shape, np.uint8), CFG)
    assert "transpose" not in str(e.value) and "Video(x)" in str(e.value)


def test_channels_first_hint_when_followed_gives_the_image():
    rgb = np.asarray(PHOTOS["chelsea"])[:60, :80]
    chw = np.ascontiguousarray(rgb.transpose(2, 0, 1))
    with pytest.raises(ValueError, match=r"channels-first.*x\.transpose\(1, 2, 0\)"):
        preprocess(chw, CFG)
    assert torch.equal(preprocess(chw.transpose(1, 2, 0), CFG).pixels, preprocess(rgb, CFG).pixels)
    # a one-channel CHW image: the transpose gives the grey image
    g = rgb[..., 0]
    with pytest.raises(ValueError, match=r"channels-first.*transpose"):
        preprocess(g[None], CFG)
    assert torch.equal(preprocess(g[None].transpose(1, 2, 0), CFG).pixels, preprocess(g, CFG).pixels)


def test_channels_first_video_array_gets_the_video_transpose():
    v = sample_video(4, size=(56, 84))
    tchw = np.ascontiguousarray(v.transpose(0, 3, 1, 2))
    with pytest.raises(ValueError, match=r"channels-first.*x\.transpose\(0, 2, 3, 1\)"):
        preprocess(tchw, CFG)
    assert torch.equal(preprocess(tchw.transpose(0, 2, 3, 1), CFG).pixels, preprocess(v, CFG).pixels)


def test_ambiguous_3d_array_in_video_gets_advice_that_works():
    # [30, 40, 3] in a Video reads as one RGB image; the advice for 30 grey frames is x[..., None]
    x = np.random.default_rng(0).integers(0, 256, (30, 40, 3), dtype=np.uint8)
    with pytest.raises(ValueError, match=r"one \[H, W, C\] image.*Video\(x\[\.\.\., None\]\)"):
        Video(x)
    followed = preprocess(Video(x[..., None]), CFG)
    assert followed.grid_thw[0, 0] == 15
    assert torch.equal(followed.pixels, preprocess(Video(np.repeat(x[..., None], 3, -1)), CFG).pixels)


def test_rgba_array_is_composited_on_white_like_pil_rgba():
    rgba = np.random.default_rng(1).integers(0, 256, (60, 80, 4), dtype=np.uint8)
    ours = preprocess(rgba, CFG).pixels
    assert torch.equal(ours, preprocess(Image.fromarray(rgba, "RGBA"), CFG).pixels)
    # a still image is two identical temporal copies: the same rows as a 2-frame video of it
    assert torch.equal(preprocess(Video(np.stack([rgba, rgba])), CFG).pixels, ours)
