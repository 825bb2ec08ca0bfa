"""One light vocabulary at the bottom (issue 29): the family specs are plain Python below the
config, so building a config imports neither torch nor the towers; "preset" means a name, and the
one function that also takes a model folder (`workbench.checkpoints.resolve_config`) sits above
the config, which never imports it."""
import json
import subprocess
import sys

import pytest

import workbench as wb
from workbench.checkpoints import CheckpointError, resolve_config
from workbench.families import FAMILIES

from test_imports import import_graph, reachable

# what lies above the config: the towers (torch) and the folder reader and the encoder built on them
ABOVE = ("workbench.towers", "workbench.checkpoints", "workbench.encoder")


def test_a_preset_is_built_without_torch_or_the_towers():
    code = ("import sys, json, workbench.config as c\n"
            "cfg = c.VisionConfig.preset('qwen2-vl-7b')\n"
            "assert cfg.n_params > 0 and c.TINY_PRESET_PER_FAMILY\n"
            f"print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'transformers')\n"
            f"                        or m.startswith({ABOVE!r}))))")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout) == [], f"importing the config loaded {run.stdout}"


def test_the_config_imports_only_the_specs_below_it():
    graph = {m: {n for n in deps if n != "workbench"} for m, deps in import_graph().items()}
    below = reachable(graph, "workbench.config")
    assert "workbench.families" in below
    assert not {m for m in below if m.startswith(ABOVE)}, sorted(below)
    assert not {m for m in reachable(graph, "workbench.families") if not m.startswith("workbench.families")}
    # the folder reader imports the config, and nothing the config imports leads back to it
    assert "workbench.config" in graph["workbench.checkpoints"]
    assert "workbench.checkpoints" not in below


def test_a_preset_is_a_name_and_a_folder_goes_through_resolve_config(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(ValueError, match=r"unknown preset .*valid presets: qwen2-vl-2b.*resolve_config\(folder\)"):
        wb.VisionConfig.preset(str(tmp_path))
    with pytest.raises(ValueError, match=r"resolve_config"):
        wb.VisionConfig.coerce(str(tmp_path))
    # the folder function reads it, and a bad folder names the file and the field
    with pytest.raises(CheckpointError, match=r"config\.json: model_type null is not a known family"):
        resolve_config(str(tmp_path))
    with pytest.raises(CheckpointError, match=r"config\.json: model_type null"):
        resolve_config(tmp_path)


def test_resolve_config_takes_names_and_configs_as_the_config_does():
    for fam in FAMILIES.values():
        for p in fam.presets:
            assert resolve_config(p["name"]) == wb.VisionConfig.preset(p["name"])
    assert resolve_config("qwen2.5-vl-7b", depth=2) == wb.VisionConfig.preset("qwen2.5-vl-7b", 2)
    cfg = wb.VisionConfig.preset("tiny-qwen3-vl")
    assert resolve_config(cfg) is cfg and resolve_config(cfg, 1) == cfg.reduced(1)
    with pytest.raises(ValueError, match=r"unknown preset 'qwen3'; valid presets: qwen2-vl-2b.*tiny-glm-ocr, "
                                         r"tiny-pixtral, tiny-kimi-k2.5, tiny-gemma3, tiny-gemma4, tiny-nemotron-vl, or a transformers model folder"):
        resolve_config("qwen3")
    with pytest.raises(TypeError, match=r"cfg must be a wb.VisionConfig or a preset name \(valid presets: qwen2-vl-2b"):
        resolve_config(3)
