"""`workbench.audit`: the static reading of an engine's model files, on small model files written
here in the shape vLLM's use (an opt-in class attribute, a norm module built by make_input_norm and
called in the outer model, the tower or the patch embedding, the encoder CUDA-graph interface)."""
from __future__ import annotations

import os
import textwrap
import zipfile
from pathlib import Path

import pytest

from workbench.audit import AuditError, audit, load_newest, save

COMMON = {
    "vision.py": """
        class FusedInputNorm(nn.Module):
            def forward(self, x, dtype):
                return (x * self.weight + self.bias).to(dtype)

        def make_input_norm(config):
            return FusedInputNorm(config)
    """,
    "interfaces.py": """
        class SupportsEncoderCudaGraph(Protocol):
            def capture(self): ...
    """,
}
MODELS = {
    # the norm inside the tower's forward, the tower built by the model: right on every path
    "good_vl.py": """
        from .vision import make_input_norm
        from .interfaces import SupportsEncoderCudaGraph

        class GoodVisionTransformer(nn.Module):
            def __init__(self, config, input_norm=None):
                self.input_norm = input_norm
            def forward(self, x, grid):
                x = self.input_norm(x, self.dtype)
                return self.blocks(x)

        class GoodVLForConditionalGeneration(nn.Module, SupportsEncoderCudaGraph):
            supports_mm_device_do_normalize = True
            def __init__(self, config):
                self.visual = GoodVisionTransformer(config, input_norm=make_input_norm(config))
    """,
    # the seed bug: the outer model normalizes, its encoder graphs call the tower directly
    "bad_vl.py": """
        from .vision import make_input_norm

        class BadTower(nn.Module):
            def forward(self, x):
                return self.blocks(x)

        class BadVLForConditionalGeneration(nn.Module, SupportsEncoderCudaGraph):
            supports_mm_device_do_normalize = True
            def __init__(self, config):
                self.pixel_norm = make_input_norm(config)
                self.visual = BadTower()
            def _process_image_input(self, x):
                x = self.pixel_norm(x, self.visual.dtype)
                return self.visual(x)

        class BadVLChild(BadVLForConditionalGeneration):
            pass
    """,
    "outer_vl.py": """
        class PlainTower(nn.Module):
            pass

        class OuterVLModel(nn.Module):
            supports_mm_device_do_normalize: bool = True
            def __init__(self, config):
                self.input_norm = make_input_norm(config)
                self.visual = PlainTower()
            def embed(self, x):
                return self.visual(self.input_norm(x, self.dtype))
    """,
    "patch_vl.py": """
        class PixPatchEmbed(nn.Module):
            def __init__(self, input_norm):
                self.input_norm = input_norm
            def forward(self, x):
                return self.proj(self.input_norm(x, self.proj.weight.dtype))

        class PixTower(nn.Module):
            def __init__(self, input_norm):
                self.patch_embed = PixPatchEmbed(input_norm)

        class PixModel(nn.Module):
            supports_mm_device_do_normalize = True
            def __init__(self, config):
                self.vision = PixTower(make_input_norm(config))
    """,
    "double_vl.py": """
        class TwiceTower(nn.Module):
            def forward(self, x):
                return self.input_norm(x, self.dtype)

        class TwiceModel(nn.Module, SupportsEncoderCudaGraph):
            supports_mm_device_do_normalize = True
            def __init__(self, config):
                self.input_norm = make_input_norm(config)
                self.visual = TwiceTower()
            def run(self, x):
                return self.visual(self.input_norm(x, self.dtype))
    """,
    "cpu_vl.py": """
        class CpuModel(nn.Module, SupportsEncoderCudaGraph):
            def __init__(self, config):
                self.visual = BadTower()
    """,
    "declared_vl.py": """
        class DeclaredModel(nn.Module):
            supports_mm_device_do_normalize = True
    """,
    "off_vl.py": """
        class OffModel(GoodVLForConditionalGeneration):
            supports_mm_device_do_normalize = False
    """,
    # the norm built by another builder, the tower made by a factory function, and handed by the
    # tower to a patch-embedding function that applies it (Pixtral's shape)
    "pix2_vl.py": """
        def pix_patch_embed(x, input_norm, weight):
            return F.linear(input_norm(x, weight.dtype), weight)

        class Pix2Tower(nn.Module):
            def __init__(self, input_norm=None):
                self.input_norm = input_norm
            def forward(self, x):
                return pix_patch_embed(x, self.input_norm, self.weight)

        def init_pix2_tower(config, input_norm=None):
            return Pix2Tower(input_norm=input_norm)

        class Pix2Model(nn.Module):
            supports_mm_device_do_normalize = True
            def __init__(self, config):
                self.vision = init_pix2_tower(config, input_norm=build_mm_input_norm(config))
    """,
    "text_only.py": """
        class LlamaForCausalLM(nn.Module):
            def forward(self, x):
                return self.input_norm(x)
    """,
}


def write_tree(root: Path, extra: dict[str, str] | None = None, version: str = "0.33.0") -> Path:
    models = root / "vllm" / "model_executor" / "models"
    models.mkdir(parents=True)
    for name, text in {**COMMON, **MODELS, **(extra or {})}.items():
        (models / name).write_text(textwrap.dedent(text))
    (root / "vllm" / "version.py").write_text(f'__version__ = "{version}"\n')
    return root


def by_model(result) -> dict:
    return {m.model: m for m in result.models}


def test_verdict_per_model_class(tmp_path):
    result = audit(write_tree(tmp_path / "src"))
    assert (result.engine, result.version) == ("vllm", "0.33.0")
    m = by_model(result)
    assert m["GoodVLForConditionalGeneration"].norm_in == ["tower"]
    assert m["GoodVLForConditionalGeneration"].verdict_key == "tower"
    assert m["GoodVLForConditionalGeneration"].encoder_graphs
    assert "GoodVisionTransformer good_vl.py:9" in m["GoodVLForConditionalGeneration"].where
    for name in ("BadVLForConditionalGeneration", "BadVLChild"):     # inherited opt-in, graphs and call
        assert (m[name].norm_in, m[name].encoder_graphs, m[name].verdict_key) == (["outer"], True, "outer+graphs")
        assert m[name].verdict.startswith("WRONG")
    assert m["OuterVLModel"].verdict_key == "outer" and not m["OuterVLModel"].encoder_graphs
    assert m["PixModel"].norm_in == ["patch embedding"]
    assert m["TwiceModel"].verdict_key == "double"
    assert (m["Pix2Model"].norm_in, m["Pix2Model"].where) == (["patch embedding"], ["Pix2Tower pix2_vl.py:9"])
    assert "init_pix2_tower" not in m and "pix_patch_embed" not in m          # functions are not models
    assert (m["CpuModel"].device_norm, m["CpuModel"].verdict_key) == (False, "processor")
    assert m["DeclaredModel"].verdict_key == "unfound"
    assert m["OffModel"].verdict_key == "processor"          # opted out, keeps the base's graphs
    assert "LlamaForCausalLM" not in m and "GoodVisionTransformer" not in m
    # the ones that need attention come first, and the table says so
    assert [x.verdict_key for x in result.models[:4]].count("outer+graphs") == 2
    table = result.table()
    assert "needs attention: " in table and "BadVLChild" in table.splitlines()[-1 - len(result.unreadable)]
    assert table.splitlines()[0].startswith("vllm 0.33.0")


def test_a_wheel_reads_the_same(tmp_path):
    tree = write_tree(tmp_path / "src")
    wheel = tmp_path / "vllm-0.33.0-cp38-abi3-manylinux1_x86_64.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        for p in tree.rglob("*.py"):
            z.write(p, p.relative_to(tree).as_posix())
    a, b = audit(tree), audit(wheel)
    assert b.version == "0.33.0" and b.files == a.files
    assert [(m.model, m.verdict_key, m.norm_in) for m in a.models] == [(m.model, m.verdict_key, m.norm_in)
                                                                        for m in b.models]


def test_installed_package_folder(tmp_path):
    tree = write_tree(tmp_path / "site")
    result = audit(tree / "vllm")           # the folder `import vllm` comes from
    assert result.version == "0.33.0" and result.engine == "vllm"
    assert by_model(result)["BadVLChild"].verdict_key == "outer+graphs"


def test_bad_files_are_named_and_the_rest_still_read(tmp_path):
    tree = write_tree(tmp_path / "src", extra={"broken.py": "class X(:\n",
                                               "deep.py": "x = " + "(" * 5000 + "1" + ")" * 5000 + "\n"})
    models = tree / "vllm" / "model_executor" / "models"
    os.mkfifo(models / "fifo.py")                          # would block a plain open
    (models / "link.py").symlink_to(tmp_path / "elsewhere.py")
    (tmp_path / "elsewhere.py").write_text("class Leak(SupportsEncoderCudaGraph): pass\n")
    result = audit(tree)
    bad = " ".join(result.unreadable)
    for name in ("broken.py", "deep.py", "fifo.py", "link.py"):
        assert name in bad
    assert "Leak" not in by_model(result)
    assert by_model(result)["BadVLChild"].verdict_key == "outer+graphs"


@pytest.mark.parametrize("make, says", [
    (lambda p: p / "missing", "no such file or folder"),
    (lambda p: p, "no Python model files"),
    (lambda p: (p / "x.txt").write_text("hi") and p / "x.txt", "not a folder, a wheel or a zip"),
])
def test_refused_paths(tmp_path, make, says):
    with pytest.raises(AuditError, match=says):
        audit(make(tmp_path))


def test_saved_and_newest_loaded(tmp_path):
    results = tmp_path / "results"
    assert load_newest(results) is None
    old = save(audit(write_tree(tmp_path / "a", version="0.32.0")), results)
    new = save(audit(write_tree(tmp_path / "b")), results)
    os.utime(old, (1, 1))
    assert new.name == "vllm-0.33.0.json"
    data = load_newest(results)
    assert data["version"] == "0.33.0" and any(m["verdict_key"] == "outer+graphs" for m in data["models"])
    (results / "audits" / "zz.json").write_text("{not json")
    assert load_newest(results)["version"] == "0.33.0"      # a bad file is skipped, not fatal


def test_command_line(tmp_path, capsys):
    from workbench.cli import main
    tree, results = write_tree(tmp_path / "src"), tmp_path / "results"
    assert main(["audit", str(tree), "--results", str(results)]) == 1          # a class needs attention
    out = capsys.readouterr()
    assert "needs attention: BadVLChild" in out.out and "vllm-0.33.0.json" in out.err
    assert (results / "audits" / "vllm-0.33.0.json").is_file()
    good = tmp_path / "good"
    (good / "vllm").mkdir(parents=True)
    (good / "vllm" / "m.py").write_text(textwrap.dedent(COMMON["vision.py"] + MODELS["good_vl.py"]))
    assert main(["audit", str(good / "vllm"), "--json", "--no-save", "--results", str(results)]) == 0
    assert '"verdict_key": "tower"' in capsys.readouterr().out
    with pytest.raises(SystemExit, match="no such file or folder"):
        main(["audit", str(tmp_path / "nothing")])


def test_the_report_shows_the_newest_audit_with_its_csv(tmp_path):
    from workbench import report as rep
    results = tmp_path / "results"
    save(audit(write_tree(tmp_path / "src")), results)
    page = rep.build_report(results, studies={}).index.read_text(encoding="utf-8")
    assert 'id="audit">Engine audit: vllm 0.33.0' in page and 'href="#audit"' in page
    assert "WRONG under encoder CUDA graphs" in page and '<a href="audit.csv">CSV</a>' in page
    assert page.index("BadVLChild") < page.index("GoodVLForConditionalGeneration")
    assert (results / "report" / "audit.csv").is_file()
