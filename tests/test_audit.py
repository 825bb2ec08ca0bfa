"""`workbench.audit`: the static reading of an engine's model files, on small model files written
here in the shape vLLM's use (an opt-in class attribute, a norm module built by make_input_norm and
called in the outer model, the tower or the patch embedding, the encoder CUDA-graph interface)."""
from __future__ import annotations

import json
import os
import textwrap
import zipfile
from pathlib import Path

import pytest

from workbench.audit import ATTENTION, VERDICTS, AuditError, audit, load_newest, save

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


def test_the_report_names_the_file_of_a_class_defined_twice(tmp_path):
    import json

    from workbench import report as rep
    results = tmp_path / "results"
    (results / "audits").mkdir(parents=True)
    row = dict(device_norm=True, norm_in=["tower"], encoder_graphs=True, verdict=VERDICTS["tower"], verdict_key="tower")
    models = [dict(row, model="TwinVL", file=f"vllm/models/twin/{v}/model.py") for v in ("amd", "nvidia")]
    (results / "audits" / "vllm-9.9.9.json").write_text(json.dumps(dict(
        source="x", engine="vllm", version="9.9.9", files=2, models=models + [dict(row, model="OneVL", file="one.py")],
        unreadable=[])))
    page = rep.build_report(results, studies={}).index.read_text(encoding="utf-8")
    assert "TwinVL (vllm/models/twin/amd/model.py)" in page and "TwinVL (vllm/models/twin/nvidia/model.py)" in page
    assert "OneVL (" not in page


# --- the calls followed from the engine's entry points (vllm #55370, 0.34's Gemma 3 and Gemma 4) ---

MODELS_PREFIX = "vllm/model_executor/models/"


def write_files(root: Path, files: dict[str, str], version: str = "0.34.0") -> Path:
    """A vLLM tree of exactly ``files`` (paths relative to ``root``; bare names go under the models folder)."""
    for name, text in {**{f"{MODELS_PREFIX}{k}": v for k, v in COMMON.items()}, **files}.items():
        path = root / (name if "/" in name else MODELS_PREFIX + name)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    (root / "vllm" / "version.py").write_text(f'__version__ = "{version}"\n')
    return root


def zipped(tree: Path, wheel: Path) -> Path:
    with zipfile.ZipFile(wheel, "w") as z:
        for p in sorted(tree.rglob("*.py")):
            z.write(p, p.relative_to(tree).as_posix())
    return wheel


SIGLIP = {
    # the tower in a file of its own: the norm handed in by the model, applied in the inner transformer
    "siglip.py": """
        class IdentityInputNorm(nn.Module):
            def forward(self, x, dtype):
                return x.to(dtype)

        class SiglipVisionTransformer(nn.Module):
            def __init__(self, config, input_norm=None):
                self.input_norm = input_norm if input_norm is not None else IdentityInputNorm()
            def forward(self, pixel_values):
                pixel_values = self.input_norm(pixel_values, self.dtype)
                return self.encoder(self.embeddings(pixel_values))

        class SiglipVisionModel(nn.Module):
            def __init__(self, config, input_norm=None):
                self.vision_model = SiglipVisionTransformer(config, input_norm=input_norm)
            def forward(self, pixel_values):
                return self.vision_model(pixel_values)
    """,
    # a same-named class in a file read before siglip.py, which normalizes nothing
    "paddle_vl.py": """
        class SiglipVisionModel(nn.Module):
            def forward(self, pixel_values):
                return self.blocks(pixel_values)
    """,
}
GEMMA3 = """
    {imports}

    class Gemma3ForConditionalGeneration(nn.Module, SupportsEncoderCudaGraph):
        supports_mm_device_do_normalize = True
        def __init__(self, config):
            self.vision_tower = {tower}(config, input_norm=build_mm_input_norm(config, layout="bchw"))
        def _image_pixels_to_features(self, vision_tower, pixel_values):
            return vision_tower(pixel_values)
        def _process_image_input(self, image_input):
            return self._image_pixels_to_features(self.vision_tower, image_input["pixel_values"])
        def embed_multimodal(self, **kwargs):
            return self._process_image_input(kwargs)
        def encoder_cudagraph_forward(self, values, path="default"):
            return self.multi_modal_projector(self.vision_tower(values["pixel_values"]))
"""


@pytest.mark.parametrize("imports, tower", [
    ("from .siglip import SiglipVisionModel", "SiglipVisionModel"),
    ("from vllm.model_executor.models.siglip import SiglipVisionModel", "SiglipVisionModel"),
    ("from .siglip import SiglipVisionModel as Tower", "Tower"),
    ("from . import siglip as sg", "sg.SiglipVisionModel"),
    ("import vllm.model_executor.models.siglip as sg", "sg.SiglipVisionModel"),
])
def test_gemma3_norm_handed_to_a_tower_in_another_file(tmp_path, imports, tower):
    files = {**SIGLIP, "gemma3_mm.py": GEMMA3.format(imports=imports, tower=tower)}
    m = by_model(audit(write_files(tmp_path, files)))["Gemma3ForConditionalGeneration"]
    assert (m.verdict_key, m.norm_in, m.found_by) == ("tower", ["tower"], "calls")
    assert m.where == ["SiglipVisionTransformer siglip.py:10"]             # not the decoy of paddle_vl.py
    assert m.graph_path == ["Gemma3ForConditionalGeneration.encoder_cudagraph_forward",
                            "SiglipVisionModel.forward", "SiglipVisionTransformer.forward"]
    assert m.eager_path[-1] == "SiglipVisionTransformer.forward"            # through the module handed to a helper


GEMMA4 = """
    from vllm.model_executor.layers.fusion.mm_input_norm import build_mm_input_norm
    from .interfaces import SupportsEncoderCudaGraph

    class Gemma4ForConditionalGeneration(nn.Module, SupportsEncoderCudaGraph):
        supports_mm_device_do_normalize = True
        def __init__(self, config):
            self.vision_tower = Gemma4VisionModel(config)
            self.vision_input_norm = build_mm_input_norm(config)
        def _embed_patches(self, pixel_values):
            pixel_values = self.vision_input_norm(pixel_values, self.model_dtype)
            return self.vision_tower.patch_embedder.input_proj(pixel_values)
        def _process_image_input(self, image_input):
            return self._dp_execute_and_gather(image_input, lambda kw: self._process_image_input_local(kw))
        def _process_image_input_local(self, image_input):
            return [self.vision_tower.encoder(self._embed_patches(image_input["pixel_values"]))]
        def embed_multimodal(self, **kwargs):
            return self._process_image_input(kwargs)
        def encoder_cudagraph_forward(self, inputs, path="default"):
            vt = self.vision_tower
            return vt.encoder(self._embed_patches(inputs["pixel_values"]))
    """


def test_gemma4_outer_norm_in_a_helper_the_graph_forward_calls_is_right(tmp_path):
    m = by_model(audit(write_files(tmp_path, {"gemma4_mm.py": GEMMA4})))["Gemma4ForConditionalGeneration"]
    assert (m.norm_in, m.encoder_graphs, m.verdict_key) == (["outer"], True, "outer (in graph path)")
    assert m.verdict.startswith("right on every path") and m.verdict_key not in ATTENTION
    assert m.graph_path == ["Gemma4ForConditionalGeneration.encoder_cudagraph_forward",
                            "Gemma4ForConditionalGeneration._embed_patches"]
    # every _process_*_input helper is an eager entry: the shortest path starts at the local one
    assert m.eager_path == ["Gemma4ForConditionalGeneration._process_image_input_local",
                            "Gemma4ForConditionalGeneration._embed_patches"]


SEED_BUG = {
    # vllm #55370: the outer model normalizes on the eager path; the graph forward, inherited from a
    # mixin in another file, calls the tower directly
    "seed_mixin.py": """
        from .interfaces import SupportsEncoderCudaGraph

        class SeedGraphMixin(SupportsEncoderCudaGraph):
            def encoder_cudagraph_forward(self, values, path="default"):
                return self.visual(values.pop("pixel_values"), encoder_metadata=values)
    """,
    "seed_vl.py": """
        from .seed_mixin import SeedGraphMixin
        from .vision import make_input_norm

        class SeedTower(nn.Module):
            def forward(self, x, encoder_metadata=None):
                return self.blocks(self.patch_embed(x))

        class SeedVLForConditionalGeneration(nn.Module, SeedGraphMixin):
            supports_mm_device_do_normalize = True
            def __init__(self, config):
                self.visual = SeedTower(config)
                self.pixel_norm = make_input_norm(config)
            def _process_image_input(self, image_input):
                return self.visual(self.pixel_norm(image_input["pixel_values"], self.visual.dtype))
            def embed_multimodal(self, **kwargs):
                return self._process_image_input(kwargs)
    """,
}


def test_seed_bug_outer_norm_only_on_the_eager_path_is_wrong(tmp_path):
    result = audit(write_files(tmp_path, SEED_BUG))
    m = by_model(result)["SeedVLForConditionalGeneration"]
    assert (m.norm_in, m.encoder_graphs, m.verdict_key) == (["outer"], True, "outer+graphs")
    assert m.graph_entry == "SeedGraphMixin.encoder_cudagraph_forward" and m.graph_path == []
    assert m.eager_path == ["SeedVLForConditionalGeneration._process_image_input"]
    assert "SeedGraphMixin" not in by_model(result)                 # a base, not a model of its own
    # the same model with the norm moved into a helper the graph forward calls is right
    fixed = SEED_BUG["seed_mixin.py"].replace("self.visual(values.pop", "self._normalized(values.pop")
    fixed_vl = SEED_BUG["seed_vl.py"] + """
            def _normalized(self, x, encoder_metadata=None):
                return self.visual(self.pixel_norm(x, self.visual.dtype), encoder_metadata)
    """
    m = by_model(audit(write_files(tmp_path / "fixed", {"seed_mixin.py": fixed, "seed_vl.py": fixed_vl})))
    assert m["SeedVLForConditionalGeneration"].verdict_key == "outer (in graph path)"


NEW_LAYOUT = {
    # 0.34's vllm/models/<name>/<vendor>/: same class name per vendor, a shared tower, relative imports two up
    "vllm/models/newvl/__init__.py": "",
    "vllm/models/newvl/common/vision.py": """
        class NewTower(nn.Module):
            def __init__(self, config, input_norm=None):
                self.input_norm = input_norm
            def forward(self, x):
                return self.blocks(self.input_norm(x, self.dtype))

        class PlainNewTower(nn.Module):
            def forward(self, x):
                return self.blocks(x)
    """,
    "vllm/models/newvl/nvidia/model.py": """
        from vllm.model_executor.models.interfaces import SupportsEncoderCudaGraph
        from vllm.models.newvl.common.vision import NewTower

        class NewVLForConditionalGeneration(nn.Module, SupportsEncoderCudaGraph):
            supports_mm_device_do_normalize = True
            def __init__(self, config):
                self.visual = NewTower(config, input_norm=build_mm_input_norm(config))
            def embed_multimodal(self, **kwargs):
                return self.visual(kwargs["pixel_values"])
            def encoder_cudagraph_forward(self, values, path="default"):
                return self.visual(values["pixel_values"])
    """,
    "vllm/models/newvl/amd/model.py": """
        from ..common.vision import PlainNewTower
        from vllm.model_executor.models import interfaces

        class NewVLForConditionalGeneration(nn.Module, interfaces.SupportsEncoderCudaGraph):
            supports_mm_device_do_normalize = True
            def __init__(self, config):
                self.visual = PlainNewTower(config)
                self.input_norm = build_mm_input_norm(config)
            def embed_multimodal(self, **kwargs):
                return self.visual(self.input_norm(kwargs["pixel_values"], self.dtype))
            def encoder_cudagraph_forward(self, values, path="default"):
                return self.visual(values["pixel_values"])
    """,
}


@pytest.mark.parametrize("as_wheel", [False, True])
def test_models_under_vllm_models_are_read_and_kept_apart(tmp_path, as_wheel):
    tree = write_files(tmp_path / "src", NEW_LAYOUT)
    result = audit(zipped(tree, tmp_path / "vllm-0.34.0-py3-none-any.whl") if as_wheel else tree)
    found = {m.file: m for m in result.models if m.model == "NewVLForConditionalGeneration"}
    assert set(found) == {"vllm/models/newvl/nvidia/model.py", "vllm/models/newvl/amd/model.py"}
    nvidia, amd = found["vllm/models/newvl/nvidia/model.py"], found["vllm/models/newvl/amd/model.py"]
    assert (nvidia.verdict_key, nvidia.where) == ("tower", ["NewTower vllm/models/newvl/common/vision.py:6"])
    assert (amd.verdict_key, amd.graph_path) == ("outer+graphs", [])
    rows = [line for line in result.table().splitlines() if line.startswith("NewVLForConditionalGeneration")]
    assert len(rows) == 2 and all("(vllm/models/newvl/" in r for r in rows)


def test_a_byte_order_mark_parses(tmp_path):
    tree = write_files(tmp_path, {})
    (tree / MODELS_PREFIX / "bom_vl.py").write_bytes(textwrap.dedent(GEMMA4).encode("utf-8-sig"))
    result = audit(tree)
    assert result.unreadable == []
    assert by_model(result)["Gemma4ForConditionalGeneration"].verdict_key == "outer (in graph path)"


def test_cycles_end(tmp_path):
    """A base-class cycle, methods calling each other and a tower holding itself: the walk ends."""
    cycle = """
        class CycleA(CycleB):
            supports_mm_device_do_normalize = True
            def __init__(self, config):
                self.visual = LoopTower(config)
            def _process_image_input(self, x):
                return self._again(x)
            def _again(self, x):
                return self._process_image_input(self.visual(x))

        class CycleB(CycleA, SupportsEncoderCudaGraph):
            def encoder_cudagraph_forward(self, values, path="default"):
                return self.encoder_cudagraph_forward(self.visual(values))

        class LoopTower(nn.Module):
            def __init__(self, config):
                self.inner = LoopTower(config)
            def forward(self, x):
                return self.inner(self.input_norm(x, self.dtype))
    """
    m = by_model(audit(write_files(tmp_path, {"cycle_vl.py": cycle})))
    assert m["CycleA"].verdict_key == "tower" and m["CycleA"].encoder_graphs
    assert m["CycleA"].graph_path == ["CycleB.encoder_cudagraph_forward", "LoopTower.forward"]


def test_compare_two_releases(tmp_path, capsys):
    from workbench.audit import compare
    from workbench.cli import main
    old_vl = SEED_BUG["seed_vl.py"].replace("(nn.Module, SeedGraphMixin)", "(nn.Module)")
    moved = MODELS["outer_vl.py"].replace("self.input_norm = make_input_norm(config)\n", "").replace(
        "PlainTower()", "GoodVisionTransformer(config, input_norm=make_input_norm(config))").replace(
        "self.visual(self.input_norm(x, self.dtype))", "self.visual(x, None)")
    old = write_files(tmp_path / "old", {"seed_mixin.py": SEED_BUG["seed_mixin.py"], "seed_vl.py": old_vl,
                                         "outer_vl.py": MODELS["outer_vl.py"], "cpu_vl.py": MODELS["cpu_vl.py"]},
                      version="0.33.0")
    new = write_files(tmp_path / "new", {**SEED_BUG, "outer_vl.py": MODELS["good_vl.py"] + moved,
                                         "gemma4_mm.py": GEMMA4})
    rows = compare(audit(old), audit(new))
    changes = {(r["model"], r["change"]): (r["old"], r["new"]) for r in rows}
    assert changes[("SeedVLForConditionalGeneration", "gained encoder graphs")] == ("no", "yes")
    assert changes[("SeedVLForConditionalGeneration", "verdict changed")] == ("outer", "outer+graphs")
    assert changes[("OuterVLModel", "norm moved")] == ("outer", "tower")
    assert changes[("Gemma4ForConditionalGeneration", "added")] == ("-", "outer (in graph path)")
    assert changes[("CpuModel", "removed")] == ("processor", "-")
    assert rows[0]["new"] == "outer+graphs"                          # what needs attention first
    results = tmp_path / "results"
    assert main(["audit", str(old), str(new), "--results", str(results)]) == 1
    out = capsys.readouterr()
    assert "gained encoder graphs" in out.out and "needs attention: SeedVLForConditionalGeneration" in out.out
    assert sorted(p.name for p in (results / "audits").iterdir()) == ["vllm-0.34.0.json"]    # NEW only
    assert main(["audit", str(new), str(new), "--no-save", "--json", "--results", str(results)]) == 1
    assert json.loads(capsys.readouterr().out)["changes"] == []


def test_nothing_dropped_silently(tmp_path, monkeypatch):
    from workbench import audit as audit_module
    tree = write_tree(tmp_path / "src")
    count = audit(tree).files
    monkeypatch.setattr(audit_module, "MAX_FILES", count - 2)
    for source in (tree, zipped(tree, tmp_path / "vllm-0.33.0-py3-none-any.whl")):
        result = audit(source)
        assert (result.files, result.omitted, len(result.omitted_files)) == (count - 2, 2, 2)
        assert f"omitted: 2 model files beyond the first {count - 2}" in result.table()
        assert json.loads(result.to_json())["omitted"] == 2
    monkeypatch.setattr(audit_module, "MAX_FILES", 20_000)
    monkeypatch.setattr(audit_module, "MAX_FILE_BYTES", 400)          # a member too large is named, not dropped
    wheel = audit(zipped(tree, tmp_path / "vllm-0.33.0-py3-none-any.whl"))
    assert any(u.startswith("good_vl.py (") for u in wheel.unreadable) and wheel.files == count
    monkeypatch.setattr(audit_module, "MAX_FILE_BYTES", 4 << 20)
    monkeypatch.setattr(audit_module, "MAX_TOTAL_BYTES", 1000)
    for source in (tree, tmp_path / "vllm-0.33.0-py3-none-any.whl"):
        with pytest.raises(AuditError, match="MAX_TOTAL_BYTES"):
            audit(source)


def test_verdict_keys_kept():
    assert set(VERDICTS) >= {"tower", "patch embedding", "outer+graphs", "outer", "double", "unfound", "processor"}
    assert "outer (in graph path)" in VERDICTS and "outer (in graph path)" not in ATTENTION


def test_the_newest_release_of_the_committed_audits_shows_whatever_the_file_times(tmp_path):
    import json
    import os
    ref = tmp_path / "reference" / "audits"
    ref.mkdir(parents=True)
    for version, when in (("0.34.0", 1000), ("0.33.0", 2000), ("0.9.1", 3000)):     # a clone's times say nothing
        (ref / f"vllm-{version}.json").write_text(json.dumps(dict(version=version, models=[])))
        os.utime(ref / f"vllm-{version}.json", (when, when))
    assert load_newest(tmp_path)["version"] == "0.34.0"
    mine = tmp_path / "audits"
    mine.mkdir()
    (mine / "vllm-0.30.0.json").write_text(json.dumps(dict(version="0.30.0", models=[])))   # the user's own first
    assert load_newest(tmp_path)["version"] == "0.30.0"
