"""Model folders from anyone (issue 28): a fault planted in a folder saved by transformers is
refused by `check_model_folder` (and so by `resolve_config`, `build_encoder` and the
sweep's parameter check) with one CheckpointError naming the file and the field or tensor,
before any tower is allocated and without reading tensor data; nothing blocks, nothing escapes
the folder. A clean folder of every family still checks and loads."""
import dataclasses
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import workbench as wb
from workbench.checkpoints import (CheckpointError, check_model_folder, load_vision_weights, read_vision_config,
                                   resolve_config)
from workbench.towers import TOWERS, build_tower

from test_checkpoints import MODELS, save_model

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    """A function (family, sharded) -> a folder saved once per module; tests copy it."""
    made = {}

    def folder(family, sharded=False):
        if (family, sharded) not in made:
            path = tmp_path_factory.mktemp(f"{family}-{'sharded' if sharded else 'one'}") / "m"
            save_model(family, path, seed=3, **(dict(max_shard_size="100KB") if sharded else {}))
            made[family, sharded] = path
        return made[family, sharded]
    return folder


@pytest.fixture
def folder(pristine, tmp_path):
    """A function (family="glm4v", sharded=False) -> this test's own copy of a saved folder."""
    def copy(family="glm4v", sharded=False):
        return Path(shutil.copytree(pristine(family, sharded), tmp_path / "m"))
    return copy


def _split(path):
    """(header dict, data bytes) of a safetensors file."""
    raw = path.read_bytes()
    n = int.from_bytes(raw[:8], "little")
    return json.loads(raw[8:8 + n]), raw[8 + n:]


def _join(path, header, data):
    text = json.dumps(header).encode()
    path.write_bytes(len(text).to_bytes(8, "little") + text + data)


def _set(path, dotted, value=None, raw=None):
    """Set the JSON value at ``dotted`` (e.g. 'vision_config.depth') in the file, or write ``raw``
    text there (what json.dumps cannot write)."""
    data = json.loads(path.read_text())
    *parents, last = dotted.split(".")
    node = data
    for p in parents:
        node = node[p]
    node[last] = "@RAW@" if raw is not None else value
    text = json.dumps(data)
    path.write_text(text.replace('"@RAW@"', raw) if raw is not None else text)


def _refused(path, match):
    """check_model_folder refuses ``path`` with one line matching ``match``; returns the message."""
    with pytest.raises(CheckpointError, match=match) as e:
        check_model_folder(path)
    assert "\n" not in str(e.value)
    return str(e.value)


# ---- safetensors headers ------------------------------------------------------------------------

PROJ = "model.visual.merger.proj.weight"       # a glm4v tensor, F32 [32, 32]


def _truncated(h, d):
    return h, d[:-100]


def _offsets_outside(h, d):
    n = h[PROJ]["data_offsets"][1] - h[PROJ]["data_offsets"][0]
    h[PROJ]["data_offsets"] = [len(d), len(d) + n]
    return h, d


def _overlapping(h, d):
    begin, end = h[PROJ]["data_offsets"]
    h[PROJ]["data_offsets"] = [begin - 4, end - 4]
    return h, d


def _shape_lie(h, d):
    h[PROJ]["shape"] = [32, 16]
    return h, d


def _dtype_unknown(h, d):
    h[PROJ]["dtype"] = "F12"
    return h, d


def _trailing_bytes(h, d):
    return h, d + b"\0" * 16


@pytest.mark.parametrize("plant, match", [
    (_truncated, r"model\.safetensors: tensor model\.visual\.\S+: data_offsets \[\d+, \d+\] lie outside the "
                 r"[\d,]+ bytes of data"),
    (_offsets_outside, rf"model\.safetensors: tensor {PROJ}: data_offsets .* lie outside"),
    (_overlapping, rf"model\.safetensors: tensor {PROJ}: data_offsets \[\d+, \d+\] overlap tensor \S+'s bytes"),
    (_shape_lie, rf"model\.safetensors: tensor {PROJ}: data_offsets \[\d+, \d+\] hold 4096 bytes, but F32 "
                 r"\(32, 16\) needs 2048"),
    (_dtype_unknown, rf"model\.safetensors: tensor {PROJ}: dtype \"F12\" is not one of BOOL, U8"),
    (_trailing_bytes, r"model\.safetensors: the tensors cover [\d,]+ of the [\d,]+ bytes of data"),
])
def test_a_header_that_does_not_fit_its_file_is_refused_naming_file_and_tensor(folder, plant, match):
    path = folder()
    _join(path / "model.safetensors", *plant(*_split(path / "model.safetensors")))
    _refused(path, match)


def test_an_empty_or_short_file_is_refused(folder):
    path = folder()
    (path / "model.safetensors").write_bytes(b"")
    _refused(path, r"model\.safetensors: 0 bytes, shorter than the 8-byte header length")
    (path / "model.safetensors").write_bytes((10 ** 9).to_bytes(8, "little") + b"{}")
    _refused(path, r"model\.safetensors: 10 bytes, but its header length says 1,000,000,000 bytes of JSON follow")


def test_a_header_that_is_not_json_is_refused(folder):
    path = folder()
    (path / "model.safetensors").write_bytes((4).to_bytes(8, "little") + b"[1, ")
    _refused(path, r"model\.safetensors: the safetensors header is not a JSON object")


@pytest.mark.parametrize("declared, label, match", [
    (None, "I32", rf"model\.safetensors: tensor {PROJ} is stored as I32, but config\.json declares float32 \(F32\)"),
    ("bfloat16", None, r"model\.safetensors: tensor model\.visual\.\S+ is stored as F32, but config\.json declares "
                       r"bfloat16 \(BF16\)"),
])
def test_a_dtype_label_that_disagrees_with_the_declared_dtype_is_refused(folder, declared, label, match):
    """I32 bytes relabelled F32 (or F32 relabelled I32: the same number of bytes, a consistent
    header) would load and be cast silently; so would F32 tensors in a folder declaring bf16."""
    path = folder()
    if label:
        h, d = _split(path / "model.safetensors")
        h[PROJ]["dtype"] = label
        _join(path / "model.safetensors", h, d)
    if declared:
        _set(path / "config.json", "dtype", declared)
    _refused(path, match)


def test_a_declared_dtype_must_be_a_float_name(folder):
    path = folder()
    _set(path / "config.json", "dtype", ["bfloat16"])
    _refused(path, r"config\.json: dtype = \[\"bfloat16\"\] must be one of float32, float16, bfloat16, float64")


def test_a_config_wider_than_its_tensors_fails_before_any_tower_is_allocated(folder, monkeypatch):
    """hidden_size 4096 over 32-wide tensors: the tower the config implies is built on the meta
    device only, and the mismatch is refused before build_encoder allocates anything."""
    path = folder()
    _set(path / "config.json", "vision_config.hidden_size", 4096)
    tower_class, built = TOWERS["glm4v"], []
    init = tower_class.__init__

    def recording(self, *a, **kw):
        init(self, *a, **kw)
        built.append(self.patch_embed.proj.weight.device.type)
    monkeypatch.setattr(tower_class, "__init__", recording)
    with pytest.raises(CheckpointError, match=r"m: shape mismatch: model\.visual\.\S+ \(in model\.safetensors\): "
                                              r"checkpoint \(32,?.*\) vs tower \(4096"):
        wb.build_encoder(str(path), placement="tower", norm="eager", dtype=torch.float32, device="cpu")
    assert built == ["meta"]


# ---- the shard index ----------------------------------------------------------------------------

def _index(path):
    return json.loads((path / "model.safetensors.index.json").read_text())


def _vision_key(path):
    """A vision tensor's key and the shard the index places it in."""
    return next((k, f) for k, f in _index(path)["weight_map"].items() if k.startswith("model.visual."))


def _point(path, key, entry):
    index = _index(path)
    index["weight_map"][key] = entry
    (path / "model.safetensors.index.json").write_text(json.dumps(index))


def test_a_key_missing_from_the_shard_the_index_names_is_refused(folder):
    path = folder("qwen3-vl", sharded=True)
    key, shard = _vision_key(path)
    other = next(f for f in sorted(set(_index(path)["weight_map"].values())) if f != shard)
    _point(path, key, other)
    _refused(path, rf"{other}: no tensor {key}, which model\.safetensors\.index\.json places in this file")


@pytest.mark.parametrize("where", ["parent", "absolute", "symlink"])
def test_an_index_entry_outside_the_folder_is_refused_naming_it(folder, tmp_path, where):
    path = folder("qwen3-vl", sharded=True)
    key, shard = _vision_key(path)
    outside = tmp_path / "x.safetensors"
    shutil.copy(path / shard, outside)               # a real file: refused for where it is, not for being absent
    if where == "symlink":
        (path / shard).unlink()
        (path / shard).symlink_to(outside)
        _refused(path, rf"index\.json: weight_map\[\"\S+\"\]: {shard} resolves to {outside}, outside the folder")
        return
    entry = "../x.safetensors" if where == "parent" else str(outside)
    _point(path, key, entry)
    _refused(path, rf"index\.json: weight_map\[\"{key}\"\]: \"{entry}\" must name a file inside the folder")


def test_a_hub_cache_snapshot_whose_files_link_to_its_blobs_loads(folder, tmp_path):
    """The hub's cache keeps a revision as snapshots/<rev>/<name> -> ../../blobs/<hash>: links out
    of the folder, into the blobs folder beside it, are the layout of every hub download."""
    saved = folder()
    repo = tmp_path / "models--org--tiny"
    snapshot, blobs = repo / "snapshots" / "abc123", repo / "blobs"
    snapshot.mkdir(parents=True)
    blobs.mkdir()
    for i, f in enumerate(sorted(saved.iterdir())):
        shutil.copy(f, blobs / f"blob{i}")
        (snapshot / f.name).symlink_to(Path("..") / ".." / "blobs" / f"blob{i}")
    cfg = check_model_folder(snapshot, name="m")
    assert dataclasses.replace(cfg, checkpoint=None) == dataclasses.replace(read_vision_config(saved), checkpoint=None)
    load_vision_weights(build_tower(cfg), snapshot)


# ---- special files ------------------------------------------------------------------------------

@pytest.mark.timeout(20)
@pytest.mark.parametrize("name", ["model.safetensors", "config.json", "preprocessor_config.json"])
def test_a_fifo_in_the_folder_is_refused_unopened(folder, name):
    """Opening a FIFO for reading blocks until a writer comes: none will, so it must never be
    opened; the timeout proves nothing blocks."""
    path = folder()
    (path / name).unlink()
    os.mkfifo(path / name)
    match = rf"{name}: a FIFO, not a regular file"
    _refused(path, match)
    with pytest.raises(CheckpointError, match=match):
        resolve_config(str(path))       # a folder with a FIFO config.json is still a folder, refused


def test_a_folder_as_weights_is_refused(folder):
    path = folder()
    (path / "model.safetensors").unlink()
    (path / "model.safetensors").mkdir()
    _refused(path, r"model\.safetensors: a folder, not a regular file")


# ---- config.json and preprocessor_config.json values -------------------------------------------

@pytest.mark.parametrize("family, file, key, value, match", [
    ("glm4v", "config.json", "model_type", ["glm4v"], r"config\.json: model_type \[\"glm4v\"\] is not a known family"),
    ("glm4v", "config.json", "vision_config.depth", "32",
     r"config\.json: vision_config\.depth = \"32\" must be a positive integer"),
    ("glm4v", "config.json", "vision_config.depth", True, r"vision_config\.depth = true must be a positive integer"),
    ("glm4v", "config.json", "vision_config.rope_parameters", "axial",
     r"config\.json: vision_config\.rope_parameters = \"axial\" must be an object or null"),
    ("glm4v", "config.json", "vision_config.rope_parameters.rope_theta", "1e4",
     r"config\.json: vision_config\.rope_parameters\.rope_theta = \"1e4\" must be a finite number > 0"),
    ("glm4v", "config.json", "vision_config.rms_norm_eps", [1e-5],
     r"config\.json: vision_config\.rms_norm_eps = \[1e-05\] must be a finite number > 0"),
    ("glm4v", "config.json", "vision_config.attention_bias", "false",
     r"config\.json: vision_config\.attention_bias = \"false\" must be true or false"),
    ("qwen3-vl", "config.json", "vision_config.deepstack_visual_indexes", 5,
     r"config\.json: vision_config\.deepstack_visual_indexes = 5 must be a list of block indices"),
    ("qwen2.5-vl", "config.json", "vision_config.fullatt_block_indexes", ["1"],
     r"config\.json: vision_config\.fullatt_block_indexes = \[\"1\"\] must be a list of block indices"),
    ("qwen2-vl", "config.json", "vision_config.mlp_ratio", "2",
     r"config\.json: vision_config\.mlp_ratio = \"2\" must be a positive integer"),
    ("glm4v", "preprocessor_config.json", "image_mean", ["0.5", "0.5", "0.5"],
     r"preprocessor_config\.json: image_mean = \[\"0\.5\", \"0\.5\", \"0\.5\"\] must be a list of finite numbers"),
    ("glm4v", "preprocessor_config.json", "rescale_factor", "1/255",
     r"preprocessor_config\.json: rescale_factor = \"1/255\" must be a finite number > 0"),
    ("glm4v", "preprocessor_config.json", "rescale_factor", None,
     r"preprocessor_config\.json: rescale_factor = null must be a finite number > 0"),
    ("glm4v", "preprocessor_config.json", "size", "big",
     r"preprocessor_config\.json: size = \"big\" must be an object or null"),
    ("glm4v", "preprocessor_config.json", "size.longest_edge", "2097152",
     r"preprocessor_config\.json: size\.longest_edge = \"2097152\" must be a positive integer"),
    ("glm4v", "preprocessor_config.json", "do_rescale", "yes",
     r"preprocessor_config\.json: do_rescale = \"yes\" must be true or false"),
    ("glm4v", "preprocessor_config.json", "max_pixels", [1 << 20],
     r"preprocessor_config\.json: max_pixels = \[1048576\] must be a positive integer"),
])
def test_a_value_of_the_wrong_kind_is_refused_naming_file_and_field(folder, family, file, key, value, match):
    path = folder(family)
    _set(path / file, key, value)
    _refused(path, match)


@pytest.mark.parametrize("file, key, raw, match", [
    ("preprocessor_config.json", "max_pixels", "Infinity",
     r"preprocessor_config\.json: max_pixels = Infinity must be a finite number \(JSON has no NaN or Infinity\)"),
    ("config.json", "vision_config.rope_parameters.rope_theta", "NaN",
     r"config\.json: vision_config\.rope_parameters\.rope_theta = NaN must be a finite number"),
    ("config.json", "text_config.rope_parameters.rope_theta", "1e999",
     r"config\.json: text_config\.rope_parameters\.rope_theta = Infinity must be a finite number"),
])
def test_non_finite_numbers_are_refused_naming_the_field(folder, file, key, raw, match):
    path = folder()
    _set(path / file, key, raw=raw)
    _refused(path, match)


def test_pathological_nesting_is_refused(folder):
    path = folder()
    (path / "config.json").write_text('{"a": ' + "[" * 100_000 + "]" * 100_000 + "}")
    _refused(path, r"config\.json: nested deeper than Python's JSON reader goes")
    (path / "config.json").write_text('{"a": ' + "[" * 40 + "]" * 40 + "}")
    _refused(path, r"config\.json: a(\[0\])+ nests deeper than 32 levels")


def test_an_oversized_json_file_is_refused_unread(folder):
    path = folder()
    with open(path / "preprocessor_config.json", "a") as f:
        f.truncate((16 << 20) + 1)
    _refused(path, r"preprocessor_config\.json: 16,777,217 bytes; a preprocessor_config\.json is at most "
                   r"16,777,216 bytes")


# ---- clean folders ------------------------------------------------------------------------------

@pytest.mark.parametrize("family", list(MODELS))
def test_a_clean_folder_of_every_family_checks_and_loads_its_tensors(pristine, family):
    path = pristine(family, sharded=family == "qwen3-vl")
    cfg = check_model_folder(path)
    assert cfg == read_vision_config(path) == resolve_config(path) == resolve_config(str(path))
    own = load_vision_weights(build_tower(cfg), path).state_dict()
    saved = {}
    for f in path.glob("model*.safetensors"):
        saved.update(load_file(str(f)))
    vision = {k.split("visual.", 1)[1]: v for k, v in saved.items() if "visual." in k}
    assert {k for k in own if not k.startswith("input_norm.")} <= set(vision)
    assert all(torch.equal(own[k], v) for k, v in vision.items() if k in own)


# ---- the sweep -----------------------------------------------------------------------------------

def test_a_bad_model_folder_is_refused_by_the_study_parameter_check(folder):
    from workbench.studies import ParamError, discover
    path = folder()
    _set(path / "preprocessor_config.json", "rescale_factor", "1/255")
    with pytest.raises(ParamError, match=rf"presets='{path}': not a usable model folder: {path}/preprocessor_config"
                                         r"\.json: rescale_factor = \"1/255\" must be"):
        discover()["cast_cost"].params.resolve({"presets": [str(path)]})


# one fault through the command line unmarked (a subprocess: seconds), the other with the slow tests
@pytest.mark.parametrize("fault", ["truncated", pytest.param("wrong-typed config", marks=pytest.mark.slow)])
def test_the_sweep_refuses_a_bad_model_folder_in_one_line_before_a_run_folder(folder, tmp_path, fault):
    path = folder()
    if fault == "truncated":
        os.truncate(path / "model.safetensors", os.path.getsize(path / "model.safetensors") - 100)
        named = r"m/model\.safetensors: tensor model\.visual\.\S+: data_offsets .* lie outside"
    else:
        _set(path / "config.json", "vision_config.depth", "2")
        named = r"m/config\.json: vision_config\.depth = \"2\" must be a positive integer"
    results = tmp_path / "results"
    run = subprocess.run([sys.executable, "-m", "workbench", "sweep", "--direct", "--profile", "cpu",
                          "--studies", "correctness", "--set", f'families=["{path}"]', "--results", str(results)],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert run.returncode != 0
    assert "Traceback" not in run.stderr
    lines = [line for line in run.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "not a usable model folder" in lines[0], run.stderr
    assert re.search(named, lines[0]), lines[0]
    assert not results.exists() or not any(results.iterdir())
