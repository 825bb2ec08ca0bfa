"""``python -m workbench advise --preset P --mix M``: a configuration a serving engine can take.

For one tower and one traffic mix (a named mix, or ``folder:PATH`` of the user's images) it puts
together what the runs measured and what the planner computes:

- **where to normalize**: the placements the newest correctness run of the family found right on
  every path it ran (eager, each graph buffer, dp), and among them the cheapest staging design of
  the newest cast_cost run of the preset at the budget nearest the mix's typical replay (design,
  norm kernel and graph buffer dtype, with its us per replay and the run);
- **which graphs**: the engine release's own default grid (`engines`, ``--engine``, default the
  newest vLLM) against the planner's budgets fitted on one draw of a traffic around the mix and
  judged on other draws and on the other mixes (`budget_judge`): a planned set is recommended only
  where it beats the engine's grid out of sample, and the advice says by how much;
- **the engine's own options**: that release's names (vLLM's ``--compilation-config`` JSON, SGLang's
  environment), checked against its config source where ``--engine-source`` gives it, and the
  processor options device normalization implies. The recommended placement is one the release can
  apply (`EnginePolicy.placements`); the cheapest right design the runs found is shown beside it.

Measured numbers come only from run folders (``results/`` and the committed ``results/reference/``),
GPU runs first, a CPU run only where no GPU run has the family, marked so. What no run measured is
said, with the command that would measure it: never an invented number.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

from .budgets import Budgets
from .provenance import is_cpu, results_folder
from . import engines, limits

# cast_cost's staging designs as what an engine configures: (placement, graph input buffer dtype)
DESIGNS = {"runner": ("runner", "bfloat16"), "uint8_valid": ("tower", "uint8"), "uint8_buffer": ("tower", "uint8"),
           "bf16_buffer": ("tower", "bfloat16"), "fold": ("fold", "uint8"), "device": ("device", "bfloat16"),
           "fp32_buffer": ("processor", "float32")}
ENGINE_MAX_BUDGET = 16384           # the model's largest budget (vLLM: the scheduler's token budget), before the cap


@dataclass
class Evidence:
    """One measured answer: its value in words, the run folder and device it came from."""
    text: str
    run: str = ""
    device: str = ""

    def line(self) -> str:
        where = f" [{self.run}, {self.device}]" if self.run else ""
        return f"{self.text}{where}"


@dataclass
class Advice:
    preset: str
    family: str
    mix: str
    sizes: str
    budgets: list[int]
    max_items: int
    max_frames: int | None
    padding: dict[str, float]
    engine_budgets: list[int]
    placement: Evidence
    staging: Evidence
    missing: list[str] = field(default_factory=list)
    choice: tuple[str, str, str] | None = None          # (placement, norm, buffer dtype)
    latency: Evidence | None = None                     # time to embedding per image on this mix
    engine: str = engines.NEWEST
    planned: bool = False                # True: `budgets` are the planner's, beating the engine's grid out of sample
    judged: list[dict] = field(default_factory=list)    # budget_judge.out_of_sample's rows
    verdict: str = ""
    best: Evidence | None = None         # the cheapest right design, where the engine cannot apply it
    source_check: str = ""               # the option names checked against the release's source
    tail: Evidence | None = None         # eager against a replay for one large image (the eager tail's cost)
    graphs: bool = True                  # False: the release captures no encoder graphs for this family

    def compilation_config(self) -> dict:
        """The release's own options (vLLM: --compilation-config; SGLang: its environment variables)."""
        o = engines.get(self.engine).options
        out = {o.enable: True}
        if self.planned and o.budgets:
            out.update({o.budgets: self.budgets, o.max_items: self.max_items})
        elif o.cap:
            out[o.cap] = self.engine_budgets[-1]
        if self.max_frames and o.passed_as == "compilation-config":
            out["encoder_cudagraph_max_frames_per_batch"] = self.max_frames
        return out

    def options_line(self, compact: bool = False) -> str:
        """The release's options as one line; ``compact``: a long budget list shortened (a table's cell)."""
        p = engines.get(self.engine)
        if not self.graphs:
            from .config import families
            outer = families()[self.family].vllm_placement == "outer"
            return (f"{p.engine} {p.version}: none to set: no encoder CUDA graphs for this model"
                    + (" (its norm is in the outer model: graphs turned on would skip it)" if outer else ""))
        cc = self.compilation_config()
        if compact and p.options.budgets in cc and len(cc[p.options.budgets]) > 8:
            cc[p.options.budgets] = f"{len(self.budgets)} budgets {short_list(self.budgets)}"
        if p.options.passed_as == "env":
            return f"{p.engine} {p.version}: " + " ".join(f"{k}={int(v) if isinstance(v, bool) else v}"
                                                          for k, v in cc.items())
        return f"{p.engine} {p.version}: --compilation-config '{json.dumps(cc)}'"

    def text(self) -> str:
        pad = self.padding
        lines = [f"advise: {self.preset} ({self.family}), mix {self.mix}: {self.sizes}",
                 f"where to normalize: {self.placement.line()}",
                 f"staging: {self.staging.line()}"]
        policy = engines.get(self.engine)
        if self.choice:
            placement, norm, buffer = self.choice
            lines.append(f"recommended for {self.engine}: placement {placement}, norm {norm}, graph buffer {buffer}")
        if self.best is not None:
            lines.append(f"what a patch to {policy.engine} would gain: {self.best.line()}")
        which = "planner, out of sample" if self.planned else f"{self.engine}'s default grid"
        graphs = (f"a graph per exact length up to {self.budgets[-1]}" if not self.planned and policy.packing ==
                  "per_length" else f"{len(self.budgets)} graphs: {short_list(self.budgets)}")
        lines += [f"budgets ({which}, {graphs}); items per graph "
                  f"{self.max_items}" + (f"; frames per batch {self.max_frames}" if self.max_frames else ""),
                  f"out of sample: {self.verdict}",
                  f"padding of replayed rows on held-out draws: {self.engine}'s grid {pct(pad['engines'])} "
                  f"({pad['engine_eager']:.1%} of batches eager above {self.engine_budgets[-1]}), planner "
                  f"{pct(pad['planner'])} ({pad['miss']:.1%} eager)",
                  self.options_line()]
        if self.tail is not None and pad["engine_eager"] > 0:
            lines.append(self.tail.line())
        if self.source_check:
            lines.append(self.source_check)
        if self.latency is not None:
            lines.insert(3, f"time to embedding: {self.latency.line()}")
        if self.choice and self.choice[0] not in ("processor",) and policy.engine == "vLLM":
            lines.append(f"{policy.engine} {policy.version} processor: do_rescale=False, do_normalize=False (uint8 "
                         f"pixels to the GPU; the model normalizes: MultiModalConfig.mm_device_do_normalize)")
        lines += [f"not measured: {m}" for m in self.missing]
        return "\n".join(lines)


def pct(x: float) -> str:
    return f"{x:.1%}" if x == x else "none replayed"


def short_list(budgets: list[int]) -> str:
    return str(budgets) if len(budgets) <= 12 else f"{budgets[:4]} ... {budgets[-4:]}".replace("] ... [", ", ..., ")


def study_rows(results: Path, study: str, column: str, value: str, where=None):
    """`workbench.results.newest_rows` of ``study``, passing over tables that lack a column its readers need
    (`Study.columns`)."""
    from .results import newest_rows
    from .studies import discover
    return newest_rows(results, study, column, value, where, required=discover()[study].columns)


def device_names(rows) -> str:
    names = sorted(set(rows["device"].astype(str)))
    return ", ".join(names) + (" (CPU: host numbers, no graph pool)" if all(map(is_cpu, names)) else "")


def _right_placements(results: Path, cfg, missing: list[str]) -> tuple[list[str], Evidence]:
    from .studies.correctness.summary import matrix
    rows, run = study_rows(results, "correctness", "family", cfg.family)
    if rows is None:
        missing.append(f"correctness of {cfg.family}: python -m workbench sweep --studies correctness "
                       f"--set families={cfg.name}")
        return [], Evidence("no correctness run of this family")
    m = matrix(rows)
    right = [p for p in m.index.get_level_values(-1).unique()
             if m.xs(p, level=-1).stack().dropna().astype(str).str.startswith("ok").all()]
    paths = ", ".join(str(c) for c in m.columns)
    return right, Evidence(f"right on every path measured ({paths}): {', '.join(right) or 'none'}", run.name,
                           device_names(rows))


def _staging(results: Path, cfg, right: list[str], typical: int, missing: list[str]):
    from .studies.cast_cost.summary import table_at
    rows, run = study_rows(results, "cast_cost", "preset", cfg.name)
    if rows is None:
        missing.append(f"staging cost of {cfg.name}: python -m workbench sweep --studies cast_cost "
                       f"--set presets={cfg.name}")
        return None, Evidence("no cast_cost run of this preset")
    t = table_at(rows)
    if t.empty or "staging_us" not in t.columns:
        return None, Evidence("the cast_cost run has no staging times", run.name, device_names(rows))
    st, b = (t[c].astype(float) for c in ("staging_us", "budget"))     # NaN, inf or < 0: no design's cost
    bad = ~(st.between(0, math.inf, inclusive="left") & b.between(1, math.inf, inclusive="left"))
    if bad.all():
        return None, Evidence(f"all {len(t)} staging rows of the cast_cost run hold impossible numbers (negative or "
                              f"non-finite time, budget below 1 token): none used", run.name, device_names(rows))
    t = t[~bad]
    budgets = sorted(t["budget"].astype(int).unique())
    budget = min(budgets, key=lambda b: (abs(math.log(b / typical)), b))
    at = t[(t["budget"].astype(int) == budget) & t["design"].map(lambda d: DESIGNS.get(d, ("?",))[0] in right)]
    if at.empty:
        return None, Evidence(f"no staging design of a right placement measured at {budget} tokens", run.name,
                              device_names(rows))
    best = at.sort_values("staging_us").iloc[0]
    placement, buffer = DESIGNS[best["design"]]
    share = ""
    if "tower_us" in at.columns and best.get("tower_us", 0) > 0:
        share = f", {best['staging_us'] / best['tower_us']:.2%} of the tower's replay"
    return (placement, str(best["norm"]), buffer), Evidence(
        f"cheapest right design at {budget} tokens: {best['design']} / {best['norm']}, "
        f"{best['staging_us']:.1f} us per replay{share}" + (f"; {bad.sum()} impossible row(s) skipped" if bad.any()
                                                           else ""), run.name, device_names(rows))


def _latency(results: Path, cfg, label: str, missing: list[str]) -> Evidence:
    """Per-image time to embedding on the mix, from the newest encoder_latency run that timed it."""
    from .studies.encoder_latency.summary import mix_table
    rows, run = study_rows(results, "encoder_latency", "preset", cfg.name,
                        lambda r: r["mix"].astype(str) == label if "mix" in r.columns else r["preset"] != r["preset"])
    if rows is None:
        missing.append(f"time to embedding of {cfg.name} on {label}: python -m workbench sweep --studies "
                       f"encoder_latency --set presets={cfg.name} --set 'mixes=[\"{label}\"]'")
        return Evidence("no encoder_latency run timed this preset on this mix")
    t = mix_table(rows)
    names = {"eager": "eager", "graph_engine": "engines' budgets", "graph_planner": "planner's",
             "graph_auto": "auto", "transformers": "transformers"}
    parts = [f"{int(r['images'])} item{'s' * (int(r['images']) > 1)}: "
             + ", ".join(f"{names[c]} {r[c]:.1f}" for c in names if c in t.columns and r[c] == r[c])
             + " ms per image" for _, r in t.iterrows()]
    return Evidence("; ".join(parts), run.name, device_names(rows))


TAIL_TOKENS = 4096      # single-image cells at least this large say what an eager tail above a cap costs


def _tail(results: Path, cfg) -> Evidence | None:
    """Eager against graph replay for one large image, from the newest encoder_latency run with a single-image
    cell of at least TAIL_TOKENS merged tokens: what a request above the engine's largest budget, run eagerly,
    costs beside a replay. None where no run has such a cell."""
    def large(r):
        exact = r["case"] == "exact" if "case" in r.columns else True
        return exact & (r["tokens"] >= TAIL_TOKENS) & (r["images"] == 1) & (r["metric"] == "p50_ms")
    rows, run = study_rows(results, "encoder_latency", "preset", cfg.name, large)
    if rows is None:
        return None
    t = rows.groupby(["tokens", "path"])["value"].first().unstack()
    if not {"eager", "graph"} <= set(t.columns):
        return None
    tokens = int(t.dropna(subset=["eager", "graph"]).index.max())
    e, g = t.loc[tokens, "eager"], t.loc[tokens, "graph"]
    return Evidence(f"eager above the cap: one image of {tokens} tokens eager {e:.1f} ms vs replay {g:.1f} ms "
                    f"({e / g:.2f}x)", run.name, device_names(rows))


def advise(preset: str, mix: str, results: Path | str | None = None, max_graphs: int | None = None,
           engine_max_budget: int = ENGINE_MAX_BUDGET, engine: str = engines.NEWEST,
           engine_source: str | None = None, engine_cap: int | None = None) -> Advice:
    """The advice for tower ``preset`` (a preset name or a model folder) on ``mix``, for engine release
    ``engine`` (`engines.ENGINES`), its option names checked against ``engine_source`` where given."""
    from .budget_judge import out_of_sample, verdict
    from .checkpoints import resolve_config
    from .engine_source import check_options
    from .planner import expected_padding
    from .samples import get_mix, mix_distribution, mix_entries, mix_label

    results = results_folder(results)                   # "" is refused: never the current folder
    limits.integer(engine_max_budget, "engine_max_budget", cap="budget_tokens")     # 0, -1, NaN: refused, named
    if max_graphs is not None:
        limits.integer(max_graphs, "max_graphs", cap="budgets")
    policy = engines.with_cap(engine, engine_cap)      # unknown engines and impossible caps refused before any work
    checked = check_options(policy, engine_source) if engine_source is not None else ""
    cfg = resolve_config(preset)
    get_mix(mix)                                        # unknown names and bad folders refused here
    tokens = [t for t, _ in mix_distribution(mix, cfg)]
    judged = out_of_sample(mix, cfg, policy, max(engine_max_budget, 64))
    grid = judged.attrs["sets"]["engine default"]
    winner, said = verdict(judged)
    chosen = judged.attrs["sets"][winner] if winner else grid
    if max_graphs is not None and winner and len(chosen) > max_graphs:
        from .budget_judge import SPREAD
        from .planner import plan_budgets
        from .samples import traffic_tokens
        chosen = plan_budgets(traffic_tokens(mix, 512, 0, cfg, SPREAD), max_graphs, cfg=cfg)
    items = policy.max_items(chosen, max(engine_max_budget, 64))
    chosen = list(Budgets.of(chosen).holding(items))        # a pack of `items` needs a token each
    frames = [int(e.get("frames") or 1) for e in mix_entries(mix, cfg) if e.get("kind") == "video"]
    mean_budget = expected_padding(mix, chosen, cfg)["mean_budget"]
    typical = int(mean_budget) if mean_budget == mean_budget else max(tokens)
    missing: list[str] = []
    right, placement = _right_placements(results, cfg, missing)
    applicable = [p for p in right if p in policy.placements]
    choice, staging = _staging(results, cfg, applicable, typical, missing) if applicable else (None, Evidence(
        f"no placement {policy.name} can apply ({', '.join(policy.placements)}) is known to be right"))
    best = None
    if right:       # the cheapest right design overall: what a patch to the engine would gain, where it differs
        top, top_ev = _staging(results, cfg, right, typical, [])
        best = top_ev if top is not None and top[0] not in policy.placements else None
    latency = _latency(results, cfg, mix_label(mix), missing)
    held = judged[judged["sample"] == "held-out draws"].set_index("set")
    mine = winner or "planner, equal graphs"
    return Advice(cfg.name, cfg.family, mix_label(mix), f"{len(tokens)} sizes, {min(tokens)}-{max(tokens)} merged tokens",
                  chosen, items, max(frames) * items if frames else None,
                  {"planner": held.loc[mine, "padded_frac"], "engines": held.loc["engine default", "padded_frac"],
                   "miss": held.loc[mine, "eager_frac"], "engine_eager": held.loc["engine default", "eager_frac"]},
                  grid, placement, staging, missing, choice, latency, engine=policy.name, planned=winner is not None,
                  judged=judged.to_dict("records"), verdict=said, best=best, source_check=checked,
                  tail=_tail(results, cfg),
                  graphs=cfg.spec.vllm_encoder_graphs or policy.engine != "vLLM")
