"""The data-parallel path over two gloo ranks equals single-process eager."""
import pytest
import torch

import workbench as wb
from workbench.dp import balance, encode_dp, encode_job
from workbench.launch import launch
from workbench.reference import rel_err


def test_balance_is_largest_first_to_least_loaded():
    # 50->r0, 40->r1, 30->r1 (40<50), 20->r0 (50<70), 10->r0 (tie 70=70: lowest rank)
    assert balance([10, 50, 20, 40, 30], 2) == [[0, 1, 2], [3, 4]]
    assert sorted(sum(balance([5, 1, 3, 2], 3), [])) == [0, 1, 2, 3]
    with pytest.raises(ValueError):
        balance([1], 0)


def test_encode_dp_without_process_group_says_how_to_start_one():
    enc = wb.build_encoder("tiny-qwen2-vl", placement="tower", norm="eager", dtype=torch.float32, device="cpu")
    batch = wb.preprocess(wb.random_images(2, seed=1, min_side=60, max_side=120), enc.cfg)
    with pytest.raises(RuntimeError, match="torchrun"):
        encode_dp(enc, batch)


def test_encoder_path_dp_names_the_dp_entry_point():
    enc = wb.build_encoder("tiny-qwen2-vl", placement="tower", norm="eager", dtype=torch.float32, device="cpu")
    batch = wb.preprocess(wb.random_images(1, seed=1, min_side=60, max_side=120), enc.cfg)
    with pytest.raises(ValueError, match=r"workbench\.dp\.encode_dp\(enc, batch\) on each rank"):
        enc.encode(batch, path="dp")


@pytest.mark.parametrize("preset, placement", [("tiny-qwen2-vl", "tower"), ("tiny-qwen2.5-vl", "runner")])
def test_dp_two_gloo_ranks_equal_single_process_eager(preset, placement):
    photos = wb.sample_images()
    images = [photos["chelsea"], photos["rocket"].resize((200, 150)), photos["coffee"].resize((90, 60)),
              photos["astronaut"].resize((120, 120)), wb.Video(wb.sample_video(4, size=(56, 84)))]
    spec = dict(preset=preset, placement=placement, norm="eager", dtype=torch.float32, seed=3, images=images)
    results = launch(encode_job, world_size=2, backend="gloo", args=(spec,))
    enc = wb.build_encoder(preset, placement=placement, norm="eager", dtype=torch.float32, device="cpu", seed=3)
    ref = enc.encode(wb.preprocess(images, enc.cfg))
    for r in results:
        assert r.shape == ref.shape
        assert rel_err(r, ref) < 1e-6
