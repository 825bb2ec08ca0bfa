"""A tower's seeded random weights are drawn once per process and copied into the next tower of the same
parameters (`towers.weights.host_draws`), and torch's default initialization, which those weights replace, is
skipped (`towers.weights.skipped_default_init`): the same weights, bit for bit, in a fraction of the time."""
import pytest
import torch

import workbench as wb
from workbench.checkpoints import resolve_config
from workbench.towers import weights

PRESETS = ["tiny-qwen2.5-vl", "tiny-glm4v", "tiny-kimi-k2.5"]
RANDN = torch.randn      # the helper's own draws, apart from the ones a test counts


def drawn_by_hand(enc, seed: int, std: float = 0.02) -> dict[str, torch.Tensor]:
    """The weights the seed gives, drawn here as the workbench documents them: one fp32 generator, the
    parameters in order, norm scales around 1 and the rest around 0, rounded into the tower's dtype."""
    gen = torch.Generator().manual_seed(seed)
    out = {}
    for name, p in enc.visual.named_parameters():
        if name.startswith("input_norm."):
            continue
        r = RANDN(p.shape, generator=gen, dtype=torch.float32)
        out[name] = (1.0 + 0.1 * r if name.endswith(weights._UNIT_WEIGHTS) else std * r).to(p.dtype)
    return out


def assert_seeded(enc, seed: int) -> None:
    want = drawn_by_hand(enc, seed)
    got = {n: p.detach() for n, p in enc.visual.named_parameters() if not n.startswith("input_norm.")}
    assert got.keys() == want.keys()
    for name in want:
        assert torch.equal(got[name], want[name]), name


@pytest.fixture(autouse=True)
def fresh_draws():
    weights._DRAWS.clear()
    yield
    weights._DRAWS.clear()


@pytest.mark.parametrize("preset", PRESETS)
def test_every_build_holds_the_seed_weights_in_every_dtype_and_placement(preset):
    for dtype in (torch.float32, torch.bfloat16, torch.float64):
        for placement in ("tower", "fold", "runner", "processor"):
            for seed in (0, 3):
                enc = wb.build_encoder(preset, placement=placement, norm="eager", dtype=dtype, device="cpu",
                                       seed=seed, check_inputs=False)
                assert_seeded(enc, seed)


def test_a_repeated_build_copies_the_draws_and_a_changed_tower_keeps_none_of_them(monkeypatch):
    calls = []
    monkeypatch.setattr(torch, "randn", lambda *a, **k: calls.append(1) or RANDN(*a, **k))
    first = wb.build_encoder("tiny-qwen2.5-vl", placement="tower", norm="eager", device="cpu", seed=1)
    drawn = len(calls)
    assert drawn == sum(1 for n, _ in first.visual.named_parameters() if not n.startswith("input_norm."))
    with torch.no_grad():             # a user's in-place change to one tower reaches no other
        for p in first.visual.parameters():
            p.add_(1.0)
    again = wb.build_encoder("tiny-qwen2.5-vl", placement="fold", norm="eager", dtype=torch.float64,
                             device="cpu", seed=1)
    assert len(calls) == drawn
    assert_seeded(again, 1)
    wb.build_encoder("tiny-qwen2.5-vl", placement="tower", norm="eager", device="cpu", seed=2)
    assert len(calls) == 2 * drawn                       # another seed: drawn
    wb.build_encoder(resolve_config("tiny-qwen2.5-vl", 1), placement="tower", norm="eager", device="cpu", seed=1)
    assert len(calls) > 2 * drawn                        # other parameters: drawn


def test_the_draws_kept_are_bounded_in_entries_and_bytes(monkeypatch):
    monkeypatch.setattr(weights, "DRAW_CACHE_ENTRIES", 1)
    for preset in PRESETS:
        wb.build_encoder(preset, norm="eager", device="cpu", seed=0)
        assert len(weights._DRAWS) == 1
    monkeypatch.setattr(weights, "DRAW_CACHE_BYTES", 1024)
    enc = wb.build_encoder("tiny-qwen2-vl", norm="eager", device="cpu", seed=0)
    assert len(weights._DRAWS) == 0                       # over the bound: nothing kept
    assert_seeded(enc, 0)


def test_an_unseeded_build_keeps_torch_default_initialization():
    enc = wb.build_encoder("tiny-glm4v", norm="eager", device="cpu", seed=None)
    scales = [p for n, p in enc.visual.named_parameters() if n.endswith("norm1.weight")]
    assert scales and all(torch.equal(p, torch.ones_like(p)) for p in scales)   # LayerNorm's own init
    w = dict(enc.visual.named_parameters())["blocks.0.attn.qkv.weight"].float()
    bound = 1 / w.shape[1] ** 0.5                        # nn.Linear's kaiming-uniform bound
    assert w.abs().max() <= bound and w.std() > bound / 4


def test_skipped_default_init_gives_torch_init_back_even_after_an_error():
    before = dict(vars(torch.nn.init))
    with pytest.raises(RuntimeError, match="inside"):
        with weights.skipped_default_init():
            t = torch.full((3,), 7.0)
            assert torch.nn.init.normal_(t) is t and torch.equal(t, torch.full((3,), 7.0))
            raise RuntimeError("inside")
    assert dict(vars(torch.nn.init)) == before
    t = torch.full((3,), 7.0)
    torch.nn.init.zeros_(t)
    assert torch.equal(t, torch.zeros(3))


@pytest.fixture
def fresh_loads():
    from workbench import checkpoints
    checkpoints._LOADED.clear()
    yield checkpoints
    checkpoints._LOADED.clear()


def test_a_folder_is_read_once_for_many_towers_and_again_when_it_changes(tmp_path, monkeypatch, fresh_loads, seed):
    from test_checkpoints import TensorReads, save_model
    folder = tmp_path / "m"
    save_model("qwen2.5-vl", folder, seed)
    reads = TensorReads(monkeypatch)
    first = wb.build_encoder(folder, placement="tower", norm="eager", dtype=torch.float32, device="cpu")
    n = len(reads.keys)
    assert n > 0
    again = wb.build_encoder(folder, placement="fold", norm="eager", dtype=torch.float64, device="cpu")
    assert len(reads.keys) == n
    for (name, p), q in zip(first.visual.named_parameters(), again.visual.parameters()):
        assert torch.equal(p.double(), q), name
    with torch.no_grad():             # an in-place change to one tower reaches no later one
        for p in first.visual.parameters():
            p.mul_(2.0)
    third = wb.build_encoder(folder, placement="tower", norm="eager", dtype=torch.float64, device="cpu")
    assert all(torch.equal(p, q) for p, q in zip(third.visual.parameters(), again.visual.parameters()))
    save_model("qwen2.5-vl", folder, seed + 1)          # other weights, the same names and shapes
    changed = wb.build_encoder(folder, placement="tower", norm="eager", dtype=torch.float64, device="cpu")
    assert len(reads.keys) == 2 * n
    assert not torch.equal(dict(changed.visual.named_parameters())["blocks.0.attn.qkv.weight"],
                           dict(third.visual.named_parameters())["blocks.0.attn.qkv.weight"])


def test_loaded_tensors_kept_are_bounded(tmp_path, monkeypatch, fresh_loads, seed):
    from test_checkpoints import TensorReads, save_model
    save_model("qwen2.5-vl", tmp_path / "m", seed)
    monkeypatch.setattr(fresh_loads, "LOAD_CACHE_BYTES", 1024)
    reads = TensorReads(monkeypatch)
    for _ in range(2):
        wb.build_encoder(tmp_path / "m", norm="eager", device="cpu")
    assert len(fresh_loads._LOADED) == 0 and len(set(reads.keys)) * 2 == len(reads.keys)


def load_tool(name: str):
    import importlib.util
    from pathlib import Path
    spec = importlib.util.spec_from_file_location(name, Path(__file__).resolve().parents[1] / "tools" / f"{name}.py")
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    return tool


def test_the_weights_digest_sees_one_changed_value_and_nothing_else():
    tool = load_tool("weights_digest")
    a, b = (wb.build_encoder("tiny-glm4v", placement="fold", norm="eager", device="cpu", seed=2) for _ in range(2))
    assert tool.digest(a) == tool.digest(b)
    with torch.no_grad():
        dict(b.visual.named_parameters())["blocks.0.norm1.weight"][3] += 2 ** -7
    assert tool.digest(a) != tool.digest(b)


def test_the_build_cost_model_builds_what_the_correctness_study_builds(monkeypatch):
    """tools/build_cost.py models a study's builds: for correctness, as many towers as a run of the study makes."""
    from workbench.studies.correctness import measure
    tool = load_tool("build_cost")
    built = []
    real = measure.build_encoder
    monkeypatch.setattr(measure, "build_encoder", lambda cfg, **kw: built.append(kw["placement"]) or real(cfg, **kw))
    placements, norms = ["processor", "tower", "fold", "runner"], ["eager", "identity"]
    measure.run("cpu", progress=False, families=["tiny-qwen2-vl"], placements=placements, norms=norms,
                paths=["eager"], buffer_dtypes=["bfloat16"])
    model = [placement for _, placement, _, _ in tool.correctness_builds("tiny-qwen2-vl", None, placements, norms)]
    assert sorted(built) == sorted(model)
