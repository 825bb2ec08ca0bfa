"""The newest vLLM's own cell per family (issue 34; vLLM 0.34 since issue 62): where it normalizes and whether it captures encoder graphs,
declared by each family spec; the correctness findings judge exactly those cells and the matrix frames them."""
import pandas as pd
import pytest

from workbench.families import FAMILIES
from workbench.studies.correctness import summary

COLUMNS = ["eager", "cudagraph[bfloat16]", "cudagraph[uint8]"]


def _cells(family: str, wrong: set[tuple[str, str]]) -> pd.DataFrame:
    rows = [dict(family=family, placement=p, column=c, ok=(p, c) not in wrong)
            for p in ("tower", "outer", "fold") for c in COLUMNS]
    return pd.DataFrame(rows)


def test_every_family_declares_a_placement_the_study_measures():
    for name, spec in FAMILIES.items():
        assert spec.vllm_placement in ("tower", "fold", "device", "outer", "outer_graph"), name
        assert isinstance(spec.vllm_encoder_graphs, bool), name
    # vLLM 0.34 captures every family's encoder (GLM-OCR and EXAONE-4.5 by inheritance, Mistral3 since 0.34) but
    # Nemotron-H Nano VL V2's, which normalizes in the outer model (issue 65: the #55370 hazard once it has graphs)
    assert [name for name, spec in FAMILIES.items() if not spec.vllm_encoder_graphs] == ["nemotron-vl"]
    assert (FAMILIES["nemotron-vl"].vllm_placement, FAMILIES["nemotron-vl"].vllm_encoder_graphs) == ("outer", False)
    # Kimi-K2.5 normalizes in its patch embedding (the tower) and captures its encoder: the seed bug's cell
    assert (FAMILIES["kimi-k2.5"].vllm_placement, FAMILIES["kimi-k2.5"].vllm_encoder_graphs) == ("tower", True)


def test_the_verdict_covers_the_graph_paths_only_where_the_engine_captures_them(monkeypatch):
    graphs_wrong = {("tower", "cudagraph[uint8]")}
    assert summary.engine_verdicts(_cells("qwen2-vl", graphs_wrong)) == \
        ["qwen2-vl (tower, eager and encoder graphs): WRONG on cudagraph[uint8]"]
    monkeypatch.setattr(FAMILIES["glm-ocr"], "vllm_encoder_graphs", False)   # a family without encoder graphs
    assert summary.engine_verdicts(_cells("glm-ocr", graphs_wrong)) == ["glm-ocr (tower, eager): right"]
    monkeypatch.setattr(FAMILIES["qwen2-vl"], "vllm_placement", "outer")    # the engine that forgot the norm
    got = summary.engine_verdicts(_cells("qwen2-vl", {("outer", "cudagraph[bfloat16]"), ("outer", "cudagraph[uint8]")}))
    assert got == ["qwen2-vl (outer, eager and encoder graphs): WRONG on cudagraph[bfloat16], cudagraph[uint8]"]
    assert summary.engine_verdicts(_cells("not-a-family", set())) == []
    outer_wrong_under_graphs = {("outer", "cudagraph[bfloat16]"), ("outer", "cudagraph[uint8]")}
    assert summary.engine_verdicts(_cells("nemotron-vl", outer_wrong_under_graphs)) == \
        ["nemotron-vl (outer, eager): right"]


@pytest.mark.parametrize("family, framed", [("qwen2-vl", 3), ("glm-ocr", 3), ("kimi-k2.5", 3)])
def test_the_matrix_frames_the_engines_cells(family, framed):
    import matplotlib
    matplotlib.use("Agg")
    from matplotlib.patches import Rectangle

    rows = [dict(family=family, placement=p, path=path, buffer_dtype=b, norm="eager", case="embedding", ok=True,
                 rel_err=1e-3, device="cpu", dtype="float32", metric=None)
            for p in ("tower", "outer") for path, b in (("eager", "-"), ("cudagraph", "bfloat16"), ("cudagraph", "uint8"))]
    fig = summary.plot_matrix(pd.DataFrame(rows).drop(columns="metric"))
    frames = [p for p in fig.axes[0].patches if isinstance(p, Rectangle) and not p.get_fill()]
    assert len(frames) == framed and "vllm-0.34: tower" in fig.axes[0].get_title()
