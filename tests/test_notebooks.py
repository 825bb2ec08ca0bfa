"""The study notebooks run under papermill with their default (CPU) parameters."""
import json
from pathlib import Path

import pytest

from workbench.studies import load_table, wide

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))


@pytest.mark.parametrize("nb", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_is_committed_without_outputs_and_has_a_parameters_cell(nb):
    doc = json.loads(nb.read_text())
    code = [c for c in doc["cells"] if c["cell_type"] == "code"]
    assert all(not c.get("outputs") and c.get("execution_count") is None for c in code)
    tagged = [c for c in code if "parameters" in c.get("metadata", {}).get("tags", [])]
    assert len(tagged) == 1 and 'device = "auto"' in "".join(tagged[0]["source"])


@pytest.mark.slow
def test_correctness_notebook_runs_with_defaults_and_reproduces_the_matrix(tmp_path):
    papermill = pytest.importorskip("papermill")
    run_dir = tmp_path / "run"
    papermill.execute_notebook(str(ROOT / "notebooks" / "correctness.ipynb"), str(tmp_path / "out.ipynb"),
                               parameters={"run_dir": str(run_dir)}, cwd=str(ROOT), progress_bar=False,
                               kernel_name="python3")
    df = wide(load_table(run_dir / "correctness.parquet"))
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
    executed = json.loads((tmp_path / "out.ipynb").read_text())
    images = [o for c in executed["cells"] for o in c.get("outputs", []) if "image/png" in o.get("data", {})]
    assert len(images) >= 2


def _images(executed: Path) -> int:
    doc = json.loads(executed.read_text())
    return sum("image/png" in o.get("data", {}) for c in doc["cells"] for o in c.get("outputs", []))


@pytest.mark.slow
@pytest.mark.parametrize("study, metrics", [
    ("cast_cost", {"staging_us", "copy_us", "norm_us", "bytes", "floor_us", "share_of_replay"}),
    ("fp32_memory", {"model_bytes", "temp_bytes", "counted_peak_bytes", "trace_matches"}),
    ("padding_waste", {"padded_frac", "padded_frac_expected", "norm_us_padding", "matmul_flops_padding",
                       "replay_ms", "edge_replay_ms", "encode_ms_per_image"}),
    ("input_path", {"host_ms", "h2d_bytes", "h2d_ms", "device_ms", "encoder_ms", "total_ms", "p50_ms", "p99_ms",
                    "max_images_per_s"}),
])
def test_input_path_notebooks_run_with_defaults(tmp_path, study, metrics):
    papermill = pytest.importorskip("papermill")
    run_dir = tmp_path / "run"
    out = tmp_path / "out.ipynb"
    papermill.execute_notebook(str(ROOT / "notebooks" / f"{study}.ipynb"), str(out),
                               parameters={"run_dir": str(run_dir)}, cwd=str(ROOT), progress_bar=False,
                               kernel_name="python3")
    table = load_table(run_dir / f"{study}.parquet")
    assert metrics <= set(table.metric)
    assert table.device.str.startswith("cpu").all()
    assert _images(out) >= 1


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
    from workbench.runmeta import RunMeta
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


@pytest.mark.slow
def test_a_papermill_sweep_exports_readable_html_that_the_report_links(tmp_path):
    import subprocess
    import sys
    # encoder_latency imports transformers (its tqdm.auto warns in a kernel without ipywidgets)
    p = subprocess.run([sys.executable, "-m", "workbench", "sweep", "--results", str(tmp_path), "--studies",
                        "fp32_memory,encoder_latency", "--set", "budgets=[1024]", "--set",
                        'encoder_latency.presets=["tiny-qwen2-vl"]', "--set", "encoder_latency.tokens=[64]",
                        "--set", "encoder_latency.images=[1]", "--set", "encoder_latency.reps=1",
                        "--set", "encoder_latency.mixes=[]"], cwd=ROOT, capture_output=True, text=True,
                       timeout=600)
    assert p.returncode == 0, p.stdout + p.stderr
    (run,) = [d for d in tmp_path.iterdir() if d.is_dir()]
    html = (run / "fp32_memory.html").read_text()
    assert "<html" in html and "what normalization parks in the CUDA-graph pool" in html   # the notebook, rendered
    for study in ("fp32_memory", "encoder_latency"):
        html = (run / f"{study}.html").read_text()
        assert "IProgress" not in html and "TqdmWarning" not in html, study
    subprocess.run([sys.executable, "-m", "workbench", "report", "--no-sweep", "--results", str(tmp_path)],
                   cwd=ROOT, check=True, capture_output=True, timeout=600)
    page = (tmp_path / "report" / "index.html").read_text()
    # the page links copies inside the report folder (shareable on its own), never ../
    assert f'href="runs/{run.name}/fp32_memory.html"' in page and f'href="runs/{run.name}/meta.json"' in page
    assert 'href="../' not in page
    copied = (tmp_path / "report" / "runs" / run.name / "fp32_memory.html").read_text()
    assert "what normalization parks in the CUDA-graph pool" in copied and "<script" not in copied
