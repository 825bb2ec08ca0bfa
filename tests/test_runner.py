"""The encoder graph runner (emulated backend on CPU) and the placement x path wiring."""
import dataclasses

import pytest
import torch

import workbench as wb
from workbench.reference import rel_err
from workbench.runner import EncoderGraphRunner, default_budgets

CORRECT = ("processor", "fold", "device", "tower", "runner")
FAMILIES = ("tiny-qwen2-vl", "tiny-qwen2.5-vl", "tiny-exaone4.5", "tiny-pixtral", "tiny-glm-ocr", "tiny-kimi-k2.5")
# the families whose resize packs `items` across several budgets (Pixtral's longest-edge rule puts
# them all in one: its own replay test, tests/test_family_pixtral.py, packs across several)
PACKING_FAMILIES = FAMILIES[:3]    # GLM-OCR and Kimi-K2.5: their own replay tests (test_family_*)
BUDGETS = [8, 16, 24, 32]


def small_cfg(preset):
    # cap image size so the mixed batch packs across several budgets and one photo misses them all
    return dataclasses.replace(wb.VisionConfig.preset(preset), max_pixels=200 * 200)


@pytest.fixture(scope="module")
def items():
    p = wb.sample_images()
    # merged tokens at max_pixels=200*200: 12, 20, 12 (a 4-frame video), 4, and 40 (larger than every budget)
    return [p["chelsea"].resize((120, 84)), p["coffee"].resize((150, 100)), wb.Video(wb.sample_video(4, size=(56, 84))),
            p["astronaut"].resize((64, 64)), p["rocket"]]


def batch_for(enc, items):
    return wb.preprocess(items, enc.cfg, normalize=enc.input_kind == "normalized")


def reference(cfg, items, seed):
    ref = wb.build_encoder(cfg, placement="processor", norm="eager", dtype=torch.float64, device="cpu", seed=seed)
    b = wb.preprocess(items, cfg, normalize=True)
    with torch.no_grad():
        return ref.visual(b.pixels.double(), b.grid_thw)


@pytest.mark.parametrize("preset", PACKING_FAMILIES)
@pytest.mark.parametrize("placement", CORRECT)
def test_emulated_runner_equals_eager_for_correct_placements(preset, placement, items, seed):
    cfg = small_cfg(preset)
    enc = wb.build_encoder(cfg, placement=placement, norm="eager", dtype=torch.float32, device="cpu", seed=seed)
    batch = batch_for(enc, items)
    runner = EncoderGraphRunner(enc, budgets=BUDGETS, buffer_dtype=torch.float32, max_items=4)
    assert runner.backend == "emulated"
    eager = enc.encode(batch)
    graph = enc.encode(batch, path="cudagraph", runner=runner)
    assert rel_err(graph, eager) < 1e-6
    assert rel_err(graph, reference(cfg, items, seed)) < 1e-5
    st = runner.stats_frame()
    assert st.miss.sum() >= 1, "the largest photo must miss every budget"
    assert len(set(st.budget[~st.miss])) >= 2, "packs must use several budgets"
    assert (st.valid_rows + st.padded_rows == 4 * st.budget)[~st.miss].all()
    assert st.valid_rows.sum() == batch.n_rows


@pytest.mark.parametrize("preset", FAMILIES)
def test_outer_placement_is_wrong_under_cudagraph_and_right_eager(preset, items, seed):
    cfg = small_cfg(preset)
    enc = wb.build_encoder(cfg, placement="outer", norm="eager", dtype=torch.float32, device="cpu", seed=seed)
    batch = batch_for(enc, items)
    ref = reference(cfg, items, seed)
    assert rel_err(enc.encode(batch), ref) < 1e-5
    runner = EncoderGraphRunner(enc, budgets=BUDGETS, buffer_dtype=torch.bfloat16, max_items=4)
    graph = enc.encode(batch, path="cudagraph", runner=runner)
    # packed items skip the outer model's normalization; the miss runs eagerly and stays right
    miss = [r for r in runner.stats if r.miss]
    assert len(miss) == 1
    tok = cfg.item_tokens(batch.grid_thw)        # Kimi-K2.5 pools a video chunk's frames into one
    starts = [sum(tok[:i]) for i in range(len(tok))]
    big = max(range(len(tok)), key=tok.__getitem__)
    for i in range(len(tok)):
        sl = slice(starts[i], starts[i] + tok[i])
        err = rel_err(graph[sl], ref[sl])
        assert (err < 1e-5) if i == big else (err > 0.1), (i, err)


@pytest.mark.parametrize("preset", FAMILIES)
@pytest.mark.parametrize("placement", ["none", "double"])
def test_none_and_double_are_wrong_on_every_path(preset, placement, items, seed):
    cfg = small_cfg(preset)
    enc = wb.build_encoder(cfg, placement=placement, norm="eager", dtype=torch.float32, device="cpu", seed=seed,
                           check_inputs=False)
    batch = batch_for(enc, items)
    ref = reference(cfg, items, seed)
    runner = EncoderGraphRunner(enc, budgets=BUDGETS, buffer_dtype=torch.float32, max_items=4)
    assert rel_err(enc.encode(batch), ref) > 0.1
    assert rel_err(enc.encode(batch, path="cudagraph", runner=runner), ref) > 0.1


def test_uint8_buffer_and_bf16_buffer_give_the_same_tower_result(items, seed):
    cfg = small_cfg("tiny-qwen2.5-vl")
    enc = wb.build_encoder(cfg, placement="tower", norm="eager", dtype=torch.float32, device="cpu", seed=seed)
    batch = batch_for(enc, items)
    outs = [EncoderGraphRunner(enc, budgets=BUDGETS, buffer_dtype=d, max_items=4).encode(batch)
            for d in (torch.uint8, torch.bfloat16, torch.float32)]
    # 0..255 integers are exact in bf16, so every buffer dtype feeds the same values
    assert torch.equal(outs[0], outs[1]) and torch.equal(outs[1], outs[2])


def test_nan_padding_does_not_reach_real_rows(items, seed):
    cfg = small_cfg("tiny-qwen2.5-vl")
    for backend in ("loop", "masked"):
        enc = wb.build_encoder(cfg, placement="tower", norm="eager", dtype=torch.float32, device="cpu", seed=seed,
                               attn_backend=backend)
        batch = batch_for(enc, items)
        runner = EncoderGraphRunner(enc, budgets=BUDGETS, buffer_dtype=torch.float32, max_items=4)
        clean = runner.encode(batch)
        runner.poison_pool()
        assert torch.isnan(runner.graphs[BUDGETS[-1]].out).all()
        poisoned = runner.encode(batch, pad_value=float("nan"))
        assert torch.isfinite(poisoned).all() and torch.equal(clean, poisoned), backend


@pytest.mark.parametrize("budgets, match", [
    ([], "empty"), ([64, 32], "sorted"), ([32, 32], "repeat"), ([0, 32], "positive integers"),
    ([16.5], "positive integers"), (64, "list"), ([4, 64], r"smaller than max_items=8"),
])
def test_bad_budgets_are_rejected(budgets, match):
    enc = wb.build_encoder("tiny-qwen2-vl", placement="tower", norm="eager", dtype=torch.float32, device="cpu")
    with pytest.raises(ValueError, match=match):
        EncoderGraphRunner(enc, budgets=budgets, max_items=8)


def test_bad_batches_are_rejected_and_the_runner_stays_usable(items):
    cfg = small_cfg("tiny-qwen2-vl")
    enc = wb.build_encoder(cfg, placement="tower", norm="eager", dtype=torch.float32, device="cpu")
    runner = EncoderGraphRunner(enc, budgets=BUDGETS, buffer_dtype=torch.bfloat16, max_items=4)
    good = batch_for(enc, items[:2])
    first = runner.encode(good)
    with pytest.raises(ValueError, match="adds up to"):
        bad = wb.PatchBatch(good.pixels, good.grid_thw.clone())
        bad.grid_thw[0, 1] += 2
        bad.__post_init__()
    with pytest.raises(ValueError, match="raw uint8"):
        runner.encode(wb.PatchBatch(good.pixels.float(), good.grid_thw))
    with pytest.raises(TypeError, match="PatchBatch"):
        runner.encode(good.pixels)
    with pytest.raises(ValueError, match="columns"):
        runner.encode(wb.PatchBatch(good.pixels[:, :100].contiguous(), good.grid_thw))
    assert torch.equal(runner.encode(good), first)


def test_uint8_buffer_cannot_hold_normalized_input():
    enc = wb.build_encoder("tiny-qwen2-vl", placement="runner", norm="eager", dtype=torch.float32, device="cpu")
    with pytest.raises(ValueError, match="uint8 buffer cannot hold"):
        EncoderGraphRunner(enc, budgets=[64], buffer_dtype=torch.uint8)
    with pytest.raises(ValueError, match="buffer_dtype"):
        EncoderGraphRunner(enc, budgets=[64], buffer_dtype=torch.float16)


def test_default_budgets_are_powers_of_two_from_64():
    assert default_budgets(300) == [64, 128, 256, 512]
    assert default_budgets(10) == [64]


def test_cuda_backend_needs_a_cuda_encoder():
    enc = wb.build_encoder("tiny-qwen2-vl", placement="tower", norm="eager", dtype=torch.float32, device="cpu")
    with pytest.raises(ValueError, match="emulated"):
        EncoderGraphRunner(enc, budgets=[64], backend="cuda")


# ---- policy 'auto': replay a pack only where its graph is predicted faster than eager ----------

def test_a_policy_outside_the_choices_is_refused_by_name(items):
    enc = wb.build_encoder(small_cfg("tiny-qwen2-vl"), placement="tower", norm="eager", dtype=torch.float32,
                           device="cpu", seed=0)
    with pytest.raises(ValueError, match=r"unknown policy 'sometimes'; valid: \('auto', 'always'\)"):
        EncoderGraphRunner(enc, budgets=BUDGETS, max_items=4, policy="sometimes")
    # the emulated backend replays eager work: its costs say nothing of a GPU graph, so auto acts as always
    runner = EncoderGraphRunner(enc, budgets=BUDGETS, max_items=4)
    assert runner.policy == "always" and runner.costs is None and "policy='always'" in repr(runner)


def test_pack_costs_interpolate_eager_time_and_compare_it_with_the_replay():
    from workbench.runner import PackCosts
    c = PackCosts(replay_ms={64: 1.0, 256: 3.0, 1024: 10.0}, eager_tokens=(64, 256, 1024),
                  eager_points_ms=(2.0, 4.0, 16.0))
    assert c.eager_ms(10) == 2.0                       # flat below the smallest measured size
    assert c.eager_ms(160) == pytest.approx(3.0)       # linear between 64 and 256
    assert c.eager_ms(2048) == pytest.approx(32.0)     # the last segment continued above 1024
    assert not c.prefer_eager(64, 64)                  # a full small budget: the graph wins
    assert c.prefer_eager(1024, 600)                   # 600 tokens padded into 1024: eager is cheaper
    assert not c.prefer_eager(1024, 1000)
    one = PackCosts(replay_ms={64: 1.0}, eager_tokens=(64,), eager_points_ms=(2.0,))
    assert one.eager_ms(32) == 2.0 and one.eager_ms(128) == pytest.approx(4.0)


def test_packs_the_costs_send_eagerly_equal_the_eager_path_and_are_recorded(items):
    from workbench.runner import PackCosts
    cfg = small_cfg("tiny-qwen2.5-vl")
    enc = wb.build_encoder(cfg, placement="tower", norm="eager", dtype=torch.float32, device="cpu", seed=3)
    batch = batch_for(enc, items)
    runner = EncoderGraphRunner(enc, budgets=BUDGETS, max_items=4)
    measured = PackCosts.measure(runner)            # measures on any backend; only the decision needs a GPU
    assert set(measured.replay_ms) == set(BUDGETS) and len(measured.eager_tokens) <= PackCosts.EAGER_SIZES
    assert measured.eager_tokens[0] == BUDGETS[0] and measured.eager_tokens[-1] == BUDGETS[-1]
    # a cost table in which the largest budget loses to eager and the others win
    runner.costs = PackCosts(replay_ms={8: 0.0, 16: 0.0, 24: 0.0, 32: 1e9}, eager_tokens=(8, 32),
                             eager_points_ms=(1.0, 1.0))
    phases: dict = {}
    out = runner.encode(batch, phases=phases)
    st = runner.stats_frame()
    assert {"eager", "graph_ms", "eager_ms"} <= set(st.columns)
    packs = st[~st.miss]
    assert (packs[packs.eager].budget == 32).all() and (packs[~packs.eager].budget < 32).all()
    assert packs.eager.any() and (~packs.eager).any() and (packs[packs.eager].padded_rows == 0).all()
    assert packs.eager_ms.notna().all() and packs.graph_ms.notna().all() and st[st.miss].eager_ms.isna().all()
    assert "eager" in phases
    with torch.no_grad():
        ref = enc.encode(batch, path="eager")
    assert rel_err(out, ref) < 1e-5


def test_a_runner_takes_the_costs_of_another_over_the_same_budgets_only():
    from workbench.runner import PackCosts
    enc = wb.build_encoder(small_cfg("tiny-qwen2.5-vl"), placement="tower", norm="eager", dtype=torch.float32,
                           device="cpu", seed=3)
    costs = PackCosts(replay_ms={b: 1.0 for b in BUDGETS}, eager_tokens=(BUDGETS[0],), eager_points_ms=(1.0,))
    EncoderGraphRunner(enc, budgets=BUDGETS, max_items=4, costs=costs)      # accepted (emulated: policy always)
    with pytest.raises(ValueError, match=r"costs were measured over budgets \[8, 16\].*pass costs only"):
        EncoderGraphRunner(enc, budgets=BUDGETS, max_items=4,
                           costs=PackCosts(replay_ms={8: 1.0, 16: 1.0}, eager_tokens=(8,), eager_points_ms=(1.0,)))
    with pytest.raises(TypeError, match="costs must be the PackCosts"):
        EncoderGraphRunner(enc, budgets=BUDGETS, max_items=4, costs={8: 1.0})


def test_auto_races_its_plans_on_real_calls_one_plan_a_call_and_keeps_the_fastest(items, monkeypatch):
    import types

    from workbench import runner_policy
    from workbench.runner import PackCosts
    from workbench.runner_policy import Race, signature
    cfg = small_cfg("tiny-qwen2.5-vl")
    enc = wb.build_encoder(cfg, placement="tower", norm="eager", dtype=torch.float32, device="cpu", seed=3)
    batch = batch_for(enc, items)
    runner = EncoderGraphRunner(enc, budgets=BUDGETS, max_items=4)
    runner.costs = PackCosts(replay_ms={b: 1.0 for b in BUDGETS}, eager_tokens=(8,), eager_points_ms=(1e9,))
    runner.calibrate = True                        # as on CUDA (the emulated backend only predicts)
    packs, _ = runner.plan(enc.graph_input(batch))
    assert len(packs) > 1
    plain_run, seen, clock = runner._run, [], [0.0]
    # the race's clock: a plan that sends every pack eagerly or none takes 1.2 s, a mix 1 s (within Race.DROP:
    # every candidate runs its rounds)
    monkeypatch.setattr(runner_policy, "time", types.SimpleNamespace(perf_counter=lambda: clock[0]))

    def slow_unless_mixed(b, p, m, eager, *rest):
        seen.append(eager)
        clock[0] += 1.2 if len(eager) in (0, len(p)) else 1.0
        return plain_run(b, p, m, eager, *rest)

    runner._run = slow_unless_mixed
    # the costs predict a mix: the first pack eager, the rest replayed
    runner.costs.eager_packs = lambda b, p, unit: frozenset({0})
    with torch.no_grad():
        ref = enc.encode(batch, path="eager")
    rounds = 3 * Race.ROUNDS
    for k in range(rounds):                        # each call runs one candidate, right every time
        assert not runner.settled(batch)
        out = runner.encode(batch)
        assert len(seen) == k + 1 and rel_err(out, ref) < 1e-5
    # the prediction first, then every pack replayed, every pack eager, in rounds
    everything = frozenset(range(len(packs)))
    assert seen[:3] == [frozenset({0}), frozenset(), everything] and seen[3:6] == seen[:3]
    race = runner._races[signature(enc.graph_input(batch), packs, cfg.merge_unit)]
    assert race.chosen == "predicted" and runner.settled(batch)
    st = runner.stats_frame()
    assert len(st[~st.miss]) == rounds * len(packs)        # every call's packs recorded, as it ran them
    seen.clear()
    again = runner.encode(batch)                 # decided: the kept plan, nothing timed
    assert seen == [frozenset({0})] and rel_err(again, ref) < 1e-5


def test_a_signature_carries_over_to_batches_of_other_exact_shapes():
    from workbench.runner_policy import Race, signature

    class B:            # what a signature reads: the items' rows and their frames
        def __init__(self, rows, frames=None):
            self.item_rows = rows
            self.grid_thw = torch.tensor([[f, 2, 2] for f in frames or [1] * len(rows)])
    # 1232 and 1300 tokens fall in one quarter octave, 1232 and 1600 do not; 1 sequence and 2 differ
    assert signature(B([1232 * 4]), [(2048, [0])], 4) == signature(B([1300 * 4]), [(2048, [0])], 4)
    assert signature(B([1232 * 4]), [(2048, [0])], 4) != signature(B([1600 * 4]), [(2048, [0])], 4)
    assert signature(B([1232 * 4]), [(2048, [0])], 4) != signature(B([616 * 4, 616 * 4]), [(2048, [0, 1])], 4)
    # a 4-frame clip is four sequences: not keyed like one image of its tokens
    assert signature(B([1232 * 4], [4]), [(2048, [0])], 4) != signature(B([1232 * 4]), [(2048, [0])], 4)
    # a prediction that is one of the plain plans is not raced twice
    assert Race.of(frozenset(), 2).names == ("replay", "eager")
    assert Race.of(frozenset({0, 1}), 2).names == ("eager", "replay")
    assert Race.of(frozenset({1}), 2).names == ("predicted", "replay", "eager")
    race = Race.of(frozenset(), 1)
    for name, s in (("replay", 1.2), ("eager", 1.1), ("replay", 1.0), ("eager", 1.3), ("replay", 1.4)):
        assert race.next() == name and race.chosen is None
        race.add(name, s)
    race.add("eager", 1.2)
    assert race.chosen == "replay"               # by each candidate's best call: 1.0 against 1.1
    # a candidate more than Race.DROP times the fastest's best is timed no more once each has run
    fast = Race.of(frozenset({1}), 2)
    for name, s in (("predicted", 1.0), ("replay", 1.3), ("eager", 1.1)):
        assert fast.next() == name and fast.chosen is None
        fast.add(name, s)
    assert fast.live() == ("predicted", "eager")
    for name, s in (("predicted", 1.0), ("eager", 1.1), ("predicted", 1.0), ("eager", 1.05)):
        assert fast.next() == name and fast.chosen is None
        fast.add(name, s)
    assert fast.chosen == "predicted" and fast.seconds["replay"] == [1.3]
    lone = Race.of(frozenset(), 1)               # one candidate left after the first round: kept at once
    lone.add("replay", 1.0)
    lone.add("eager", 2.0)
    assert lone.chosen == "replay" and lone.live() == ("replay",)


def test_replay_times_carry_over_to_a_new_signature_of_the_same_budgets():
    """Replaying runs the budgets' graphs whatever the tokens, so a signature met for the first time takes the
    "replay" calls of one with its budgets and times the other plans only: eager first, and where replay is more
    than Race.DROP from it, eager is kept after that one call (a stream of new shapes explores no slow plan)."""
    from workbench.runner_policy import Race
    races = {((2048, 40, 1),): Race.of(frozenset(), 1), ((1024, 40, 1),): Race.of(frozenset(), 1)}
    races[((2048, 40, 1),)].seconds.update(replay=[2.0, 2.1, 2.0], eager=[1.0, 1.1, 1.0])
    races[((1024, 40, 1),)].seconds.update(replay=[0.5])
    assert Race.sibling(races, ((2048, 43, 1),)) == [2.0, 2.1, 2.0]       # same budget, other tokens
    assert Race.sibling(races, ((4096, 40, 1),)) == []                    # no race of those budgets yet
    assert Race.sibling(races, ((2048, 40, 1), (64, 10, 1))) == []        # other packs: other graphs
    race = Race.of(frozenset(), 1, Race.sibling(races, ((2048, 43, 1),)))
    assert race.names == ("replay", "eager") and race.next() == "eager"   # replay's time is known: not rerun
    race.add("eager", 1.2)
    assert race.chosen == "eager" and race.seconds["replay"] == [2.0, 2.1, 2.0]
    races[((2048, 40, 1),)].seconds["replay"].append(9.0)                # a copy: the sibling's list is its own
    assert race.seconds["replay"] == [2.0, 2.1, 2.0]
    close = Race.of(frozenset(), 1, [1.0, 1.0, 1.0])                     # within DROP: eager runs its rounds
    for s in (1.1, 1.05, 1.2):
        assert close.next() == "eager" and close.chosen is None
        close.add("eager", s)
    assert close.chosen == "replay"


def test_replay_times_do_not_carry_over_to_or_from_an_exact_fit_pack():
    """An exact-fit graph (equal sequences filling the budget, dense attention) runs faster than the budget's
    general graph: a race whose batch replays one neither lends its "replay" calls nor borrows a sibling's."""
    from workbench.runner_policy import Race
    races = {((2048, 40, 1),): Race.of(frozenset(), 1, exact=True)}
    races[((2048, 40, 1),)].seconds["replay"] += [0.5, 0.5, 0.5]
    assert Race.sibling(races, ((2048, 43, 1),)) == []                    # an exact fit's times stay its own
    races[((2048, 41, 1),)] = Race.of(frozenset(), 1)
    races[((2048, 41, 1),)].seconds["replay"] += [2.0]
    assert Race.sibling(races, ((2048, 43, 1),)) == [2.0]
    with pytest.raises(ValueError, match="exact-fit graph times plan 'replay' itself"):
        Race.of(frozenset(), 1, [2.0], exact=True)


def test_fits_exactly_says_which_packs_replay_an_exact_fit_graph_without_capturing(monkeypatch):
    """Equal sequences filling the budget, where dense attention applies (monkeypatched here: on CUDA only the
    varlen backend has it) and the runner takes exact fits; nothing is captured by the question."""
    import workbench.runner as runner_module
    cfg = small_cfg("tiny-qwen2-vl")
    enc = wb.build_encoder(cfg, placement="tower", norm="eager", dtype=torch.float32, device="cpu", seed=3)
    runner = EncoderGraphRunner(enc, budgets=[16, 32], max_items=4)
    monkeypatch.setattr(runner_module, "use_dense", lambda backend, seqlen: True)
    unit, graphs = cfg.merge_unit, runner.n_graphs()
    assert runner.fits_exactly(32, 32 * unit, [16 * unit, 16 * unit])          # two equal images fill 32
    assert not runner.fits_exactly(32, 32 * unit, [24 * unit, 8 * unit])       # unequal sequences
    assert not runner.fits_exactly(32, 30 * unit, [15 * unit, 15 * unit])      # padded
    runner.exact_fit = False
    assert not runner.fits_exactly(32, 32 * unit, [16 * unit, 16 * unit])
    assert runner.n_graphs() == graphs


def test_a_batch_that_fits_its_budget_exactly_races_replay_itself(items, monkeypatch):
    """Through `race_call`: where a pack of the batch fits its budget exactly (`fits_exactly`), the new signature's
    race times plan "replay" itself, whatever a sibling timed."""
    from workbench.runner_policy import Race, signature
    runner, enc, batch = racing_runner(items, eager_predicted=False)
    packs, _ = runner.plan(enc.graph_input(batch))
    sig = signature(enc.graph_input(batch), packs, enc.cfg.merge_unit)
    other = tuple((b, t + 1, q) for b, t, q in sig)
    runner._races[other] = Race.of(frozenset(), len(packs))
    runner._races[other].seconds["replay"] += [5.0, 5.0, 5.0]
    asked = []
    monkeypatch.setattr(runner, "fits_exactly", lambda *a: asked.append(a) or True)
    with torch.no_grad():
        runner.encode(batch)
    race = runner._races[sig]
    assert asked and race.exact and len(race.seconds["replay"]) == 1      # timed here, not the sibling's 3


def test_a_new_signature_on_the_same_runner_times_only_the_plans_it_does_not_know(items):
    """Through `race_call`: once one signature's race has timed plan "replay", a batch of another signature of
    the same budgets runs eager on its first call, not replay again."""
    from workbench.runner_policy import Race, signature
    runner, enc, batch = racing_runner(items, eager_predicted=False)      # replay predicted: raced first
    cfg = enc.cfg
    packs, _ = runner.plan(enc.graph_input(batch))
    sig = signature(enc.graph_input(batch), packs, cfg.merge_unit)
    other = tuple((b, t + 1, q) for b, t, q in sig)           # the same budgets, tokens a quarter octave up
    runner._races[other] = Race.of(frozenset(), len(packs))
    runner._races[other].seconds["replay"] += [5.0, 5.0, 5.0]  # replay timed there, far slower than anything here
    ran, plain = [], runner._run
    runner._run = lambda b, p, m, eager, *a: ran.append(eager) or plain(b, p, m, eager, *a)
    with torch.no_grad():
        ref = enc.encode(batch, path="eager")
        got = runner.encode(batch)
    assert ran == [frozenset(range(len(packs)))] and runner._races[sig].chosen == "eager"
    assert rel_err(got, ref) < 1e-5


def racing_runner(items, eager_predicted: bool):
    """A tiny tower's runner racing as on CUDA (calibrate on), its costs predicting every pack eager (the race's
    first candidate "eager", then "replay") or replayed; with its encoder and a batch."""
    from workbench.runner import PackCosts
    cfg = small_cfg("tiny-qwen2.5-vl")
    enc = wb.build_encoder(cfg, placement="tower", norm="eager", dtype=torch.float32, device="cpu", seed=3)
    runner = EncoderGraphRunner(enc, budgets=BUDGETS, max_items=4)
    slow, fast = (1e9, 1.0) if eager_predicted else (1e-9, 1e9)
    runner.costs = PackCosts(replay_ms={b: slow for b in BUDGETS}, eager_tokens=(8,), eager_points_ms=(fast,))
    runner.calibrate = True
    return runner, enc, batch_for(enc, items)


def test_a_racing_call_prepares_only_what_its_plan_runs(items):
    """A candidate that runs every pack eagerly prepares no replay metadata and captures no graph for the call;
    one that replays prepares its packs' metadata before it is timed."""
    runner, enc, batch = racing_runner(items, eager_predicted=True)
    asked = []
    plain = runner.host_metadata
    runner.host_metadata = lambda grid, budget: asked.append(budget) or plain(grid, budget)
    with torch.no_grad():
        ref = enc.encode(batch, path="eager")
        packs, _ = runner.plan(enc.graph_input(batch))
        enc.visual.forget_metadata()
        first = runner.encode(batch)
        items = sorted(i for _, idx in packs for i in idx)
        assert asked == [] and any(key[0] == tuple(map(tuple, batch.grid_thw[items].tolist()))
                                   for key in enc.visual._meta_cache)     # the eager items' metadata only
        second = runner.encode(batch)
    assert sorted(asked) == sorted(b for b, _ in packs * 2)          # prepared, then read by the replay
    assert rel_err(first, ref) < 1e-5 and rel_err(second, ref) < 1e-5


def test_a_racing_calls_timed_plan_runs_without_the_collector_and_gives_it_back(items):
    """Policy auto's race times one plan a call: a collector pass inside it (tens of ms over a loaded model's
    heap) would be charged to that plan and could drop the fastest candidate, so none runs there; after the
    call the collector is on again."""
    import gc
    runner, enc, batch = racing_runner(items, eager_predicted=True)
    seen, plain = [], runner._run
    runner._run = lambda *a, **k: seen.append(gc.isenabled()) or plain(*a, **k)
    with torch.no_grad():
        ref = enc.encode(batch, path="eager")
        got = [runner.encode(batch) for _ in range(2)]
    assert seen == [False, False] and gc.isenabled()
    assert all(rel_err(g, ref) < 1e-5 for g in got)
