"""The study notebooks run under papermill with their default (CPU) parameters."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

from workbench.results.meta import RunMeta
from workbench.studies import discover, load_table, wide

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))


@pytest.mark.parametrize("nb", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_is_committed_without_outputs_and_has_a_parameters_cell(nb):
    doc = json.loads(nb.read_text())
    code = [c for c in doc["cells"] if c["cell_type"] == "code"]
    assert all(not c.get("outputs") and c.get("execution_count") is None for c in code)
    tagged = [c for c in code if "parameters" in c.get("metadata", {}).get("tags", [])]
    assert len(tagged) == 1 and 'device = "auto"' in "".join(tagged[0]["source"])


@pytest.fixture(scope="module")
def default_sweep(tmp_path_factory) -> Path:
    """``make report`` from nothing: the default CPU sweep (every study's notebook at its CPU defaults under
    papermill, in worker processes side by side), then the report; the run folder it made."""
    results = tmp_path_factory.mktemp("results")
    p = subprocess.run([sys.executable, "-m", "workbench", "report", "--profile", "cpu", "--results", str(results)],
                       cwd=ROOT, capture_output=True, text=True, timeout=1200)
    assert p.returncode == 0, p.stdout[-4000:] + p.stderr[-4000:]
    (run,) = [d for d in results.iterdir() if d.is_dir() and d.name not in ("report", "reference")
              and not d.name.startswith(".")]       # .cache: the report's drawings
    return run


def _images(executed: Path) -> int:
    doc = json.loads(executed.read_text())
    return sum("image/png" in o.get("data", {}) for c in doc["cells"] for o in c.get("outputs", []))


@pytest.mark.slow
@pytest.mark.parametrize("study, metrics", [
    ("correctness", {"rel_err", "cos_min", "ok"}),
    ("cast_cost", {"staging_us", "copy_us", "norm_us", "bytes", "floor_us", "share_of_replay"}),
    ("fp32_memory", {"model_bytes", "temp_bytes", "counted_peak_bytes", "trace_matches"}),
    ("padding_waste", {"padded_frac", "padded_frac_expected", "norm_us_padding", "matmul_flops_padding",
                       "replay_ms", "edge_replay_ms", "encode_ms_per_image"}),
    ("input_path", {"host_ms", "h2d_bytes", "h2d_ms", "device_ms", "encoder_ms", "total_ms", "p50_ms", "p99_ms",
                    "max_images_per_s"}),
    ("encoder_latency", {"p50_ms", "p90_ms", "speedup", "x_floor", "floor_ms", "replay_ms", "ok"}),
    ("contention", {"decode_ms", "encoder_ms_alone", "encoder_ms_contended", "preprocess_ms_alone",
                    "preprocess_ms_contended", "images_per_s_at_slo"}),
])
def test_every_notebook_runs_with_its_defaults_in_the_default_sweep(default_sweep, study, metrics):
    table = load_table(default_sweep / f"{study}.parquet")
    assert metrics <= set(table.metric)
    assert table.device.str.startswith("cpu").all()
    assert _images(default_sweep / f"{study}.ipynb") >= 1
    html = (default_sweep / f"{study}.html").read_text()       # the executed notebook, rendered, without bars
    assert "<html" in html and "IProgress" not in html and "TqdmWarning" not in html, study
    meta = RunMeta.from_json(default_sweep)
    assert meta.finished_at and meta.failures == [] and meta.params["mode"] == "papermill"
    defaults = json.loads(json.dumps(discover()[study].resolve("cpu"), default=list))
    assert meta.plan[study] == defaults                                   # its defaults, as recorded


@pytest.mark.slow
def test_the_default_correctness_notebook_reproduces_the_matrix(default_sweep):
    df = wide(load_table(default_sweep / "correctness.parquet"))
    for col in ("family", "placement", "path", "norm", "buffer_dtype", "rel_err", "cos_min", "ok"):
        assert col in df.columns
    emb = df[(df.case == "embedding") & (df.norm != "identity")]
    from workbench.config import TINY_PRESET_PER_FAMILY, VisionConfig
    families = {VisionConfig.preset(p).family for p in TINY_PRESET_PER_FAMILY}
    assert set(emb.family) == families == {"qwen2-vl", "qwen2.5-vl", "exaone4.5", "qwen3-vl", "qwen3.5", "glm4v", "glm-ocr",
                                          "pixtral", "kimi-k2.5"}
    assert set(emb.norm) == {"eager", "triton_channel", "triton_flat", "triton_rows", "(unused)"}

    def verdicts(placement, path):
        return set(emb[(emb.placement == placement) & (emb.path == path)].ok)

    for path in ("eager", "cudagraph", "dp"):
        assert verdicts("tower", path) == {True}
        assert verdicts("runner", path) == {True}
        assert verdicts("processor", path) == {True}
        assert verdicts("fold", path) == {True}
        assert verdicts("device", path) == {True}
        assert verdicts("none", path) == {False}
        assert verdicts("double", path) == {False}
    assert verdicts("outer", "eager") == {True} and verdicts("outer", "dp") == {True}
    assert verdicts("outer", "cudagraph") == {False}
    hazard = df[df.case == "nan_padding"]
    # every norm on every family for tower and device, once for fold (no norm)
    assert len(hazard) == (5 + 5 + 1) * len(families) and hazard.ok.all()
    assert _images(default_sweep / "correctness.ipynb") >= 2


@pytest.mark.slow
def test_the_default_latency_notebook_covers_every_family_and_the_realistic_batches(default_sweep):
    from workbench.studies.encoder_latency.params import TINY_PRESETS
    from workbench.studies.encoder_latency.summary import mix_cells
    table = load_table(default_sweep / "encoder_latency.parquet")
    w = wide(table)
    # the CPU profile: every family's tiny preset, exact-fit cells and the realistic-batch cells
    assert set(w.preset) == set(TINY_PRESETS) and w.ok.astype(bool).all() and len(mix_cells(table))
    assert _images(default_sweep / "encoder_latency.ipynb") >= 2


@pytest.mark.slow
def test_the_report_links_the_sweeps_notebooks_as_sanitized_copies(default_sweep):
    report = default_sweep.parent / "report"
    page = (report / "index.html").read_text()
    run = default_sweep.name
    # the page links copies inside the report folder (shareable on its own), never ../
    assert f'href="runs/{run}/fp32_memory.html"' in page and f'href="runs/{run}/meta.json"' in page
    assert 'href="../' not in page
    copied = (report / "runs" / run / "fp32_memory.html").read_text()
    assert "what normalization parks in the CUDA-graph pool" in copied and "<script" not in copied
    for study in discover():
        assert f'<h2 id="{study}">' in page, study


@pytest.mark.slow
def test_a_bad_papermill_value_fails_in_the_first_cell_naming_it(tmp_path):
    papermill = pytest.importorskip("papermill")
    with pytest.raises(papermill.PapermillExecutionError) as e:
        papermill.execute_notebook(str(ROOT / "notebooks" / "cast_cost.ipynb"), str(tmp_path / "out.ipynb"),
                                   parameters={"run_dir": str(tmp_path / "run"), "norms": "bogus"},
                                   cwd=str(ROOT), progress_bar=False, kernel_name="python3")
    assert "norms='bogus' is not a valid choice" in str(e.value)
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
def test_a_notebook_run_from_the_notebooks_folder_lands_in_the_results_folder(tmp_path, monkeypatch):
    """As in JupyterLab (working directory notebooks/, run_dir None): the run lands in the results
    folder with its own meta.json, not in notebooks/results/."""
    papermill = pytest.importorskip("papermill")
    from workbench import provenance as prov
    from workbench.results.meta import RunMeta
    results = tmp_path / "results"
    monkeypatch.setenv(prov.RESULTS_ENV, str(results))      # the project's results/ unless moved
    papermill.execute_notebook(str(ROOT / "notebooks" / "fp32_memory.ipynb"), str(tmp_path / "out.ipynb"),
                               parameters={"budgets": [1024]}, cwd=str(ROOT / "notebooks"), progress_bar=False,
                               kernel_name="python3")
    (run,) = results.iterdir()
    assert run.name.endswith("-fp32_memory-interactive")
    meta = RunMeta.from_json(run).to_dict()
    assert meta["params"]["mode"] == "interactive" and meta["params"]["studies"]["fp32_memory"]["budgets"] == [1024]
    assert not (ROOT / "notebooks" / "results").exists()
    load_table(run / "fp32_memory.parquet")
