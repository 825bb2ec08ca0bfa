"""A catalogue of bad inputs on the newer surfaces (issue 64, item 9): advise, audit, compare, the engine policies, the
budget planner, the sweep's options and the studies' parameters at their edges, the preprocessing backends, image
folders, the results store and the environment variables the package reads.

Each case runs for real (the command line through `workbench.cli.main`, the library through its own call) and asserts
its class:

- **clear error**: refused at the door where the value enters, the message naming the value and what is valid, no
  traceback (a SystemExit with text, argparse's usage error, or the library's ValueError);
- **correct handling**: the value is one the code must take, and the case states what taking it correctly means.

Where a run folder is involved it is hashed before and after: nothing a finished run wrote changes. Special files are
never opened here either (a FIFO is hashed by its kind), and every results folder is under tmp_path.
"""
from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
import math
import multiprocessing
import os
import re
import stat
import struct
import subprocess
import sys
import warnings
import zipfile
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from PIL import Image

import workbench as wb
from workbench import cli, engines, limits
from workbench.audit import AuditError, audit
from workbench.compare import BadArgument, compare_runs
from workbench.engine_source import EngineSourceError, check_options
from workbench.limits import LIMITS_ENV, LimitError
from workbench.preprocess import preprocess
from workbench.results import META_NAME, MetaError, RunFolder, RunMeta, RunLock
from workbench.results import save_table
from workbench.results.tables import write_study_table
from workbench.runner import EncoderGraphRunner
from workbench.samples import folder_mix_name, get_mix
from workbench.studies import discover

REPO = Path(__file__).resolve().parents[1]
CFG = "tiny-qwen2-vl"
MODELS = "vllm/model_executor/models/"
# a model class in vLLM's shape: device normalization, encoder graphs, the norm in the outer model (needs attention)
MODEL_SOURCE = ("class M(SupportsEncoderCudaGraph):\n    supports_mm_device_do_normalize = True\n"
                "    def __init__(self):\n        self.input_norm = make_input_norm(1)\n"
                "    def embed_multimodal(self, x):\n        return self.input_norm(x)\n")
COMPILATION = "cudagraph_mm_encoder: bool = True\n" + "".join(
    f"{n}: int = 0\n" for n in ("encoder_cudagraph_token_budgets", "encoder_cudagraph_max_vision_items_per_batch",
                                "encoder_cudagraph_max_token_budget"))


# --------------------------------------------------------------------------- helpers


def tree_state(root: Path) -> dict[str, str]:
    """{relative path: what it is and holds} of everything under ``root``: a file by its bytes' hash, a link by its
    target, a FIFO or socket by its kind (never opened). Equal before and after: nothing there changed."""
    out = {}
    for folder, dirs, files in os.walk(root):
        for name in dirs + files:
            p = Path(folder) / name
            rel = p.relative_to(root).as_posix()
            st = os.lstat(p)
            if stat.S_ISLNK(st.st_mode):
                out[rel] = "link:" + os.readlink(p)
            elif stat.S_ISREG(st.st_mode):
                out[rel] = "file:" + hashlib.sha256(p.read_bytes()).hexdigest()
            elif stat.S_ISDIR(st.st_mode):
                out[rel] = "dir"
            else:
                out[rel] = f"special:{stat.S_IFMT(st.st_mode)}"
    return out


def refusal(argv: list[str], capsys) -> str:
    """The message of a command that must refuse ``argv``: SystemExit's text, or (a usage error, exit 2) stderr's
    last line; never a traceback, nothing left running."""
    with pytest.raises(SystemExit) as e:
        cli.main(argv)
    err = capsys.readouterr().err
    code = e.value.code
    msg = code if isinstance(code, str) else err.strip().splitlines()[-1]
    assert code != 0 and "Traceback" not in msg + err, (msg, err)
    assert multiprocessing.active_children() == []
    return msg


def usage_error(argv: list[str], capsys) -> str:
    """argparse's error line for ``argv`` (exit 2), which names the option and the value."""
    with pytest.raises(SystemExit) as e:
        cli.main(argv)
    assert e.value.code == 2
    return capsys.readouterr().err.strip().splitlines()[-1]


def wheel(path: Path, files: dict[str, str]) -> Path:
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        for name, text in files.items():
            z.writestr(name, text)
    return path


def damaged(good: Path, how: str) -> Path:
    """A copy of the one-member zip ``good`` whose member is damaged: ``deflate`` (its compressed bytes flipped),
    ``encrypted`` (the flag set, no password), ``method`` (a compression method zipfile lacks) or ``crc`` (the
    sizes in both headers understated: the member inflates past what it says, a small zip bomb)."""
    data = bytearray(good.read_bytes())
    local, central = 0, data.find(b"PK\x01\x02")
    name_len = struct.unpack_from("<H", data, local + 26)[0]
    if how == "deflate":
        start = local + 30 + name_len
        for k in range(start, start + 40):
            data[k] ^= 0xFF
    elif how == "encrypted":
        data[local + 6] |= 1
        data[central + 8] |= 1
    elif how == "method":
        data[local + 8] = data[central + 10] = 99
    elif how == "crc":
        struct.pack_into("<I", data, local + 22, 10)
        struct.pack_into("<I", data, central + 24, 10)
    out = good.with_name(f"{how}-{good.name}")
    out.write_bytes(bytes(data))
    return out


def model_tree(root: Path, files: dict[str, str | bytes] | None = None, version: str = "0.34.0") -> Path:
    models = root / MODELS
    models.mkdir(parents=True)
    for name, text in {"m.py": MODEL_SOURCE, **(files or {})}.items():
        (models / name).write_bytes(text if isinstance(text, bytes) else text.encode())
    (root / "vllm" / "version.py").write_text(f'__version__ = "{version}"\n')
    return root


def finished_run(results: Path, mode: str = "direct", name: str = "x") -> Path:
    """A finished run folder of study 'lat' (one table, a finished record)."""
    run = RunFolder.create(results, name=name)
    RunMeta.collect({"mode": mode, "profile": "cpu", "studies": {"lat": {}}}).write(run.path)
    run.write_table("lat", table())
    RunMeta.from_json(run.path).finish().write(run.path, overwrite=True)
    return run.path


def table(value: float = 1.0) -> pd.DataFrame:
    return pd.DataFrame({"tokens": [1], "device": ["cpu"], "metric": ["p50_ms"], "value": [value], "unit": ["ms"]})


def compare_run(root: Path, name: str, rows: list[tuple], started: str) -> Path:
    d = root / name
    d.mkdir(parents=True)
    (d / META_NAME).write_text(json.dumps({"started_at": started}))
    t = pd.DataFrame(rows, columns=["tokens", "metric", "value", "unit"])
    t.insert(1, "device", "GPU")
    write_study_table(t, d / "lat.parquet")
    return d


def png(path: Path, h: int = 64, w: int = 64) -> Path:
    Image.fromarray(np.random.default_rng(0).integers(0, 256, (h, w, 3), dtype=np.uint8)).save(path)
    return path


def huge(*shape):
    """A uint8 array of any shape that takes no memory."""
    return np.broadcast_to(np.zeros((1,) * len(shape), np.uint8), shape)


@pytest.fixture(scope="module")
def encoder():
    return wb.build_encoder(CFG, placement="tower", norm="eager", dtype=torch.float32, device="cpu")


# =========================================================================== advise
# the values refused before any work (torch-free refusals of the parser, then the policy and the engine source)


@pytest.mark.parametrize("option, value, says", [
    ("--preset", "", "argument --preset: '' is empty; give a preset name or a transformers model folder"),
    ("--engine-source", " ", "argument --engine-source: ' ' is empty; give the engine's source tree"),
    ("--results", "", "argument --results: '' is empty; give a folder"),
])
def test_advise_refuses_an_empty_value_that_once_meant_the_current_folder(tmp_path, capsys, option, value, says):
    """``--preset ''`` read the current folder as a model folder; ``--engine-source ''`` checked it as the engine."""
    given = {"--preset": CFG, "--results": str(tmp_path), option: value}
    assert says in usage_error(["advise", *(a for kv in given.items() for a in kv)], capsys)
    assert not any(tmp_path.iterdir())


CAP_RANGE = "valid caps: whole numbers 64..65,536 (merged tokens, from the smallest budget to the limit 'budget_tokens')"


@pytest.mark.parametrize("cap, says", [
    # defect fixed: 0 and -5 were told "a positive integer (at most 65,536)", a range whose low end (1) is wrong
    ("0", f"advise: engine_cap=0 is below the smallest budget 64; {CAP_RANGE}"),
    ("-5", f"advise: engine_cap=-5 is below the smallest budget 64; {CAP_RANGE}"),
    ("63", f"advise: engine_cap=63 is below the smallest budget 64; {CAP_RANGE}"),
    ("99999999999", "advise: engine_cap=99999999999: 99,999,999,999 exceeds the cap of 65,536 (limit 'budget_tokens'); "
                    "raise it on purpose with WORKBENCH_LIMITS=budget_tokens=N or `with workbench.limits.raised("
                    f"budget_tokens=N):`; {CAP_RANGE}"),
])
def test_advise_names_a_bad_engine_cap_and_its_valid_range(tmp_path, capsys, cap, says):
    msg = refusal(["advise", "--preset", CFG, "--engine-cap", cap, "--results", str(tmp_path)], capsys)
    assert msg == says, msg
    assert not any(tmp_path.iterdir())


def test_advise_refuses_a_cap_for_a_release_without_one(tmp_path, capsys):
    msg = refusal(["advise", "--preset", CFG, "--engine", "sglang-0.5.23", "--engine-cap", "4096",
                   "--results", str(tmp_path)], capsys)
    assert "sglang-0.5.23 has no budget cap option" in msg and "releases with one: vllm-0.34" in msg


@pytest.mark.parametrize("how, says", [
    ("deflate", "the wheel cannot be read (error: Error -3 while decompressing data"),
    ("encrypted", "the wheel cannot be read (RuntimeError: File 'vllm/config/compilation.py' is encrypted"),
    ("method", "the wheel cannot be read (NotImplementedError: That compression method is not supported)"),
    ("crc", "the wheel cannot be read (BadZipFile: Bad CRC-32"),
])
def test_a_damaged_engine_source_wheel_is_named_without_a_traceback(tmp_path, capsys, how, says):
    """Defect fixed: a corrupt, encrypted or oddly compressed member, or one whose CRC fails, gave a raw
    zlib.error, RuntimeError, NotImplementedError or BadZipFile traceback (advise catches ValueError and OSError;
    none of these is one)."""
    good = wheel(tmp_path / "vllm-0.34.0-py3-none-any.whl", {"vllm/config/compilation.py": COMPILATION * 40})
    assert "option names checked" in check_options("vllm-0.34", good)          # the undamaged wheel reads
    bad = damaged(good, how)
    msg = refusal(["advise", "--preset", CFG, "--engine-source", str(bad), "--results", str(tmp_path / "r")], capsys)
    assert msg.startswith(f"advise: --engine-source {bad}: ") and says in msg, msg
    assert "download it again" in msg and not (tmp_path / "r").exists()
    with pytest.raises(EngineSourceError):
        check_options("vllm-0.34", bad)


@pytest.mark.timeout(30)
def test_advise_engine_source_that_is_a_fifo_is_refused_unopened(tmp_path, capsys):
    fifo = tmp_path / "vllm-0.34.0-py3-none-any.whl"
    os.mkfifo(fifo)
    msg = refusal(["advise", "--preset", CFG, "--engine-source", str(fifo), "--results", str(tmp_path)], capsys)
    assert "not a folder or a wheel" in msg and str(fifo) in msg


@pytest.mark.parametrize("mix, says", [
    ("folder:", "image mix 'folder:' names no folder; valid: folder:PATH"),
    ("PHOTOS", "unknown image mix 'PHOTOS'; valid: phone_photos, screenshots"),     # names are exact
    ("folder:/no/such/folder/of/images", "image folder '/no/such/folder/of/images' does not exist; valid: a folder"),
])
def test_advise_names_a_bad_mix_and_the_valid_ones(tmp_path, capsys, mix, says):
    assert says in refusal(["advise", "--preset", CFG, "--mix", mix, "--results", str(tmp_path)], capsys)


@pytest.mark.timeout(60)
def test_advise_on_a_folder_of_a_tiny_image_beside_special_files_plans_from_the_image_alone(tmp_path, capsys):
    """Correct handling: a 1x1 image is upscaled as the processor does (4 merged tokens), a FIFO and a broken link
    with image suffixes are skipped with a warning (never opened), and the advice plans budgets for that mix."""
    folder = tmp_path / "mine"
    folder.mkdir()
    png(folder / "dot.png", 1, 1)
    os.mkfifo(folder / "pipe.png")
    os.symlink(tmp_path / "gone.png", folder / "gone.png")
    with pytest.warns(UserWarning, match=r"skipping 2 entry\(ies\).*gone.png \(a broken symbolic link\); "
                                         r"pipe.png \(a FIFO\)"):
        assert cli.main(["advise", "--preset", CFG, "--set", f"image_folder={folder}", "--json",
                         "--results", str(tmp_path / "results")]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["mix"] == "folder:mine" and out["sizes"].startswith("1 sizes, 4-4 merged tokens")
    assert out["budgets"] and all(isinstance(b, int) and b >= 1 for b in out["budgets"])
    assert not (tmp_path / "results").exists()          # advise reads run folders, never writes one


# =========================================================================== audit


@pytest.mark.parametrize("how", ["deflate", "encrypted", "method", "crc"])
def test_a_damaged_wheel_is_refused_by_audit_naming_it(tmp_path, capsys, how):
    """Defect fixed: zlib.error, RuntimeError and NotImplementedError from a damaged member were raw tracebacks
    (a bad CRC, the small zip bomb whose headers understate the member, was already named)."""
    good = wheel(tmp_path / "vllm-0.34.0-py3-none-any.whl", {MODELS + "m.py": MODEL_SOURCE * 30,
                                                                 "vllm/version.py": '__version__ = "0.34.0"\n'})
    assert audit(good).version == "0.34.0"
    bad = damaged(good, how)
    msg = refusal(["audit", str(bad), "--results", str(tmp_path / "r")], capsys)
    assert msg.startswith(f"audit {bad}: cannot be read (") and not (tmp_path / "r").exists(), msg
    # as NEW beside a good PATH too: nothing saved
    tree = model_tree(tmp_path / "tree")
    assert refusal(["audit", str(tree), str(bad), "--results", str(tmp_path / "r")], capsys) == msg
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("argv, says", [
    (["audit", ""], "argument PATH: '' is empty; give a vLLM source tree"),     # once: the current folder audited
    (["audit", "/tmp", " "], "argument NEW: ' ' is empty; give a second vLLM source tree"),
])
def test_audit_refuses_an_empty_path(tmp_path, capsys, argv, says):
    assert says in usage_error(argv + ["--results", str(tmp_path)], capsys)
    assert not any(tmp_path.iterdir())


def test_audit_of_a_tree_that_is_not_vllm_is_not_saved_over_the_newest_audit(tmp_path, capsys):
    """Defect fixed: a folder of unrelated Python files was saved as audits/engine-unknown.json, an audit of no model
    class that then stood as the newest one, the one the report shows. It is printed, exit 0, and not saved."""
    results = tmp_path / "results"
    assert cli.main(["audit", str(model_tree(tmp_path / "vllm-tree")), "--results", str(results)]) == 1
    capsys.readouterr()
    saved = tree_state(results)
    other = tmp_path / "scripts"
    other.mkdir()
    (other / "tool.py").write_text("print('not an engine')\n")
    assert cli.main(["audit", str(other), "--results", str(results)]) == 0
    io_ = capsys.readouterr()
    assert "engine unknown" in io_.out and "audit: not saved: " in io_.err and str(other) in io_.err
    assert tree_state(results) == saved
    from workbench.audit import load_newest
    assert load_newest(results)["version"] == "0.34.0"


@pytest.mark.parametrize("files, unreadable, models", [
    ({"bom.py": "\ufeff" + MODEL_SOURCE.replace("class M", "class Bom")}, [], {"M", "Bom"}),
    ({"nul.py": MODEL_SOURCE + "\0"}, ["nul.py (SyntaxError)"], {"M"}),
    ({"latin1.py": MODEL_SOURCE.encode() + b"# caf\xe9\n"}, ["latin1.py (UnicodeDecodeError)"], {"M"}),
    ({"broken.py": "class X(:\n"}, ["broken.py (SyntaxError)"], {"M"}),
])
def test_audit_reads_a_byte_order_mark_and_names_the_files_it_cannot_parse(tmp_path, files, unreadable, models):
    """Correct handling: a BOM is valid Python; a NUL byte, non-UTF-8 bytes or a syntax error leave that file named
    as unreadable while every other file is still read."""
    result = audit(model_tree(tmp_path / "t", files))
    assert result.unreadable == unreadable and {m.model for m in result.models} == models


@pytest.mark.parametrize("version, saved_as", [
    ("9" * 5000, "vllm-unknown.json"),          # a file name too long to write, once: the audit was lost
    ("../../../outside", "vllm-..-..-..-outside.json"),
    ("0.35.0\nrm -rf /", "vllm-unknown.json"),
])
def test_a_strange_version_string_never_names_a_file_outside_audits(tmp_path, capsys, version, saved_as):
    """Correct handling: the version a tree declares names its saved audit only where it is one (a line, at most 64
    characters, made a file name by slug); the audit is saved inside <results>/audits, never beside it."""
    tree = model_tree(tmp_path / "t", version=version)
    assert cli.main(["audit", str(tree), "--results", str(tmp_path / "results")]) == 1
    assert [p.name for p in (tmp_path / "results" / "audits").iterdir()] == [saved_as]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["results", "t"]


def test_audit_caps_many_files_huge_files_and_the_total(tmp_path, monkeypatch):
    """Correct handling of a tree too large to read whole: files beyond MAX_FILES are omitted and named, a file
    beyond MAX_FILE_BYTES is named unreadable, and a total beyond MAX_TOTAL_BYTES is a clear error (the caps lowered
    here, the sizes small)."""
    from workbench import audit as audit_module
    tree = model_tree(tmp_path / "t", {f"z{i:02d}.py": "x = 1\n" for i in range(10)} | {"big.py": "#" * 5000})
    monkeypatch.setattr(audit_module, "MAX_FILES", 5)
    result = audit(tree)
    assert result.files == 5 and result.omitted == 7 and "omitted: 7 model files" in result.table()
    monkeypatch.setattr(audit_module, "MAX_FILES", 100)
    monkeypatch.setattr(audit_module, "MAX_FILE_BYTES", 4096)
    assert audit(tree).unreadable == ["big.py (not a regular file, unreadable or over 4096 bytes)"]
    monkeypatch.setattr(audit_module, "MAX_TOTAL_BYTES", 100)
    with pytest.raises(AuditError, match=r"the model files add up to more than MAX_TOTAL_BYTES"):
        audit(tree)


@pytest.mark.timeout(60)
def test_audit_of_a_tree_with_a_link_loop_and_a_fifo_ends(tmp_path):
    """Correct handling: links are not followed out of (or round) the tree, a FIFO is named, never opened."""
    tree = model_tree(tmp_path / "t")
    models = tree / MODELS
    os.symlink(models, models / "loop")
    os.mkfifo(models / "fifo.py")
    done = subprocess.run([sys.executable, "-m", "workbench", "audit", str(tree), "--no-save",
                           "--results", str(tmp_path / "r")], cwd=REPO, capture_output=True, text=True, timeout=50)
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert "unreadable: fifo.py (not a regular file" in done.stdout and "needs attention: M" in done.stdout
    assert f"skipped: {models / 'loop'} (a symbolic link; the audit never follows a link out of the tree" in done.stdout


# =========================================================================== compare


@pytest.fixture
def two_runs(tmp_path):
    a = compare_run(tmp_path, "a", [(1, "p50_ms", 1.0, "ms"), (2, "p50_ms", 0.0, "ms"), (3, "p50_ms", math.inf, "ms"),
                                    (4, "p50_ms", math.nan, "ms")], "2030-01-01")
    b = compare_run(tmp_path, "b", [(t, "p50_ms", 2.0, "ms") for t in (1, 2, 3, 4)], "2030-01-02")
    return tmp_path, a, b


@pytest.mark.parametrize("argv, says", [
    (["a", "b", "--studies", ""], "argument --studies: '' is empty; give comma-separated study names from "
                                  "cast_cost, contention, correctness"),      # once: every study, silently
    (["", "b"], "argument RUN_A: '' is empty; give a run folder, a run name under --results or its reference/, "
                "or 'latest'"),                                     # once: the current folder
    (["a", "b", "--csv", ""], "argument --csv: '' is empty; give a file name"),
])
def test_compare_refuses_an_empty_value(two_runs, capsys, argv, says):
    root = two_runs[0]
    before = tree_state(root)
    assert says in usage_error(["compare", *argv, "--results", str(root)], capsys)
    assert tree_state(root) == before


def test_compare_studies_naming_none_says_what_the_runs_hold(two_runs, capsys):
    """Defect fixed: ``--studies ,`` answered "the two runs have no study in common (a: none; b: none)", blaming two
    runs that both hold 'lat'."""
    root = two_runs[0]
    msg = refusal(["compare", "a", "b", "--studies", ",", "--results", str(root)], capsys)
    assert msg == "compare: the list of studies to compare names none; the studies they hold: lat", msg
    with pytest.raises(BadArgument, match="the studies they hold: lat"):
        compare_runs("a", "b", root, studies=[])


def test_compare_of_infinite_nan_and_zero_values_is_never_a_false_ratio(two_runs):
    """Correct handling: b/a where a is 0 or NaN is no ratio (NaN), not inf; a = inf gives 0 (2/inf); no flag
    without a spread; the run folders are not touched."""
    root, a, b = two_runs
    before = tree_state(root)
    df = compare_runs("a", "b", root).set_index("tokens")
    assert df.loc["1", "ratio"] == 2.0 and math.isnan(df.loc["2", "ratio"]) and df.loc["3", "ratio"] == 0.0
    assert math.isnan(df.loc["4", "ratio"]) and set(df["flag"]) == {""}
    assert tree_state(root) == before


def test_compare_of_a_run_with_itself_flags_nothing(two_runs, capsys):
    root = two_runs[0]
    assert cli.main(["compare", "a", "a", "--results", str(root)]) == 0
    assert "no flagged change" in capsys.readouterr().out


@pytest.mark.timeout(30)
@pytest.mark.parametrize("kind", ["fifo", "link"])
def test_compare_never_opens_a_special_table(two_runs, capsys, kind):
    root, a, b = two_runs
    os.unlink(b / "lat.parquet")
    (os.mkfifo if kind == "fifo" else lambda p: os.symlink(a / "lat.parquet", p))(b / "lat.parquet")
    before = tree_state(root)
    msg = refusal(["compare", "a", "b", "--results", str(root)], capsys)
    assert msg == (f"compare: {b / 'lat.parquet'}: it is {'a FIFO' if kind == 'fifo' else 'a symbolic link'}, not a "
                   "regular file, so it is not read"), msg
    assert tree_state(root) == before


# =========================================================================== engine policies


@pytest.mark.parametrize("name", ["VLLM-0.34", "vllm-0.34 ", "", 0, ["vllm-0.34"], "vllm-0.34.0"])
def test_an_unknown_engine_is_named_with_the_valid_ones(encoder, name):
    with pytest.raises(ValueError) as e:
        EncoderGraphRunner(encoder, engine=name)
    assert str(e.value) == (f"unknown engine {name!r}; valid: vllm-0.33, vllm-0.34, sglang-0.5.23 (engine-version, "
                            f"as in 'vllm-0.34', the newest vLLM)")


@pytest.mark.parametrize("cap, says", [
    ("4096", "engine_cap='4096' is not a whole number of merged tokens"),  # a raw TypeError ('>' between int and str)
    (math.nan, "engine_cap=nan is not a whole number of merged tokens"),   # named "largest=nan"
    (math.inf, "engine_cap=inf is not a whole number of merged tokens"),
    (65537, "engine_cap=65537: 65,537 exceeds the cap of 65,536 (limit 'budget_tokens')"),
    (True, "engine_cap=True is not a whole number of merged tokens"),
    (1.5, "engine_cap=1.5 is not a whole number of merged tokens"),
    (0, "engine_cap=0 is below the smallest budget 64"),
])
def test_with_cap_names_the_cap_whatever_is_wrong_with_it(cap, says):
    """Defect fixed: a string cap was a raw TypeError, and NaN, inf or a cap over the limit were named as
    'largest', a parameter the caller never gave; every message ends with the exact valid range."""
    with pytest.raises(ValueError) as e:
        engines.with_cap("vllm-0.34", cap)
    assert str(e.value).startswith(says) and str(e.value).endswith(CAP_RANGE), str(e.value)


def test_the_cap_at_its_edges_is_taken():
    """Correct handling: 64 (the smallest budget) gives one budget, 65,536 (the limit) keeps the model's largest."""
    assert engines.with_cap("vllm-0.34", 64).budgets(16384) == [64]
    assert engines.with_cap("vllm-0.34", np.int64(65536)).budgets(16384)[-1] == 16384


@pytest.mark.parametrize("change, says", [
    (dict(budget_rule="bogus"), "budget_rule='bogus' is not one the runner has; valid: pow2, dense, exact_length"),
    (dict(packing="largest_first"), "packing='largest_first' is not one the runner has; valid: greedy_smallest_first"),
    (dict(default_cap=0), "default_cap=0 must be a positive integer"),
    (dict(default_cap=2.5), "default_cap=2.5 must be a positive integer"),
])
def test_a_policy_made_by_hand_with_an_unknown_rule_is_refused(change, says):
    """Defect fixed: a policy whose rule or packing the code lacks ran silently as another rule (budget_rule='bogus':
    one budget, the largest; packing='bogus': one replay, largest first), and a zero cap failed only at use."""
    with pytest.raises(ValueError) as e:
        dataclasses.replace(engines.get("vllm-0.34"), **change)
    assert str(e.value).startswith("engine policy 'vllm-0.34': ") and says in str(e.value), str(e.value)


def test_a_valid_policy_made_by_hand_runs_in_the_runner(encoder):
    """Correct handling: an EnginePolicy object passes as it is (no name lookup), its cap applied."""
    runner = EncoderGraphRunner(encoder, engine=engines.with_cap("vllm-0.34", 256))
    assert runner.budgets[-1] == 256 and runner.engine.default_cap == 256


@pytest.mark.parametrize("call, says", [
    (lambda p: p.max_items([64], 64, 0), "smallest=0 must be a positive integer"),     # ZeroDivisionError
    (lambda p: p.max_items([64], None, -8), "smallest=-8 must be a positive integer"),
    (lambda p: p.budgets(64, 128), "smallest budget 128 is above the largest 64; give smallest <= largest"),
    (lambda p: p.budgets(5120, 64, 63), "a budget cap of 63 merged tokens is below the smallest budget 64"),
])
def test_policy_methods_name_their_bad_arguments(call, says):
    with pytest.raises(ValueError, match=says):
        call(engines.get("vllm-0.34"))


# =========================================================================== the budget planner


@pytest.mark.timeout(30)
def test_a_huge_mix_is_refused_before_a_list_of_it_exists():
    """Defect fixed: ``plan_budgets(range(1, 10**12), 4)`` listed every count first (terabytes) before any check;
    a sequence is counted from its length, an endless iterable stops at the cap."""
    with pytest.raises(LimitError, match=r"mix: 999,999,999,999 per-item merged-token counts: 999,999,999,999 "
                                         r"exceeds the cap of 4,194,304 \(limit 'draws'\)"):
        wb.plan_budgets(range(1, 10 ** 12), 4)
    with limits.raised(draws=1000):
        with pytest.raises(LimitError, match=r"an iterable of more than 1,000 per-item merged-token counts \(counting "
                                             r"stopped there\): 1,001 exceeds"):
            wb.plan_budgets(itertools.count(1), 4)
        with pytest.raises(LimitError, match=r"1,001 per-item"):
            wb.expected_padding(np.arange(1, 1002), [64])


@pytest.mark.parametrize("call, error, says", [
    (lambda: wb.plan_budgets(np.array([4.0, 16.0]), 2), ValueError, r"token counts must be positive integers.*4\.0"),
    (lambda: wb.plan_budgets([4, 16], 2 ** 70), LimitError, r"max_graphs=1180591620717411303424 budgets: .* exceeds "
                                                            r"the cap of 64"),
    (lambda: wb.plan_budgets([4, 16], 2, latency={"16": 1.0}), ValueError, r"keys must be positive integer budgets.*"
                                                                           r"\['16'\]"),
    (lambda: wb.plan_budgets([4, 16], 2, latency=[1.0, 2.0]), TypeError, r"latency must be a non-empty mapping"),
    (lambda: wb.plan_budgets([4, 16], 2, latency={}), TypeError, r"latency must be a non-empty mapping"),
    (lambda: wb.plan_budgets(b"\x04\x10", 2), TypeError, r"mix must be a sequence .* got bytes"),
    (lambda: wb.plan_budgets({4: 1.0, 16: True}, 2), ValueError, r"weights must be finite numbers > 0.*True"),
])
def test_the_planner_names_impossible_inputs(call, error, says):
    with pytest.raises(error, match=says):
        call()


@pytest.mark.parametrize("call, want", [
    (lambda: wb.plan_budgets([4, 16, 16], np.int64(1)), [16]),                     # numpy counts are counts
    (lambda: wb.plan_budgets({np.int64(4): 1, np.int32(16): 3}, 2), [4, 16]),
    (lambda: wb.plan_budgets((t for t in [4, 16]), 2), [4, 16]),                    # a generator within the cap
    (lambda: wb.expected_padding([4, 16], [16, 4])["padded_tokens"], 0.0),          # budgets sorted, not trusted
])
def test_the_planner_takes_what_it_should(call, want):
    """Correct handling: numpy integers, a generator within the cap, budgets in any order (sorted)."""
    assert call() == want


# =========================================================================== the sweep's options


@pytest.mark.parametrize("option, value, says", [
    ("--resume", "", "argument --resume: '' is empty; give a run folder, or a folder name under --results"),
    ("--studies", "", "argument --studies: '' is empty; give comma-separated study names from cast_cost"),
    ("--kernel", " ", "argument --kernel: ' ' is empty; give the name of an installed Jupyter kernel"),
    ("--group", "", "argument --group: '' is empty; give the name the shards of one run share"),
    ("--results", "", "argument --results: '' is empty; give a folder"),
])
@pytest.mark.parametrize("command", ["sweep", "report"])
def test_an_empty_sweep_option_is_refused_before_any_run_folder(tmp_path, capsys, command, option, value, says):
    """Defect fixed: ``--resume ''`` started a whole new default sweep (the empty name read as no resume), and
    ``--studies ''`` ran every study; ``--results ''`` wrote into the current folder."""
    argv = [command, "--direct", "--profile", "cpu", "--results", str(tmp_path), option, value]
    assert says in usage_error(argv, capsys)
    assert not any(tmp_path.iterdir())


def _resume_targets(results: Path) -> dict[str, Path]:
    """Folders --resume may be pointed at that are no run to finish, by what is wrong with them."""
    metas = {"no meta": None, "array meta": "[1, 2]", "linked meta": "link", "fifo meta": "fifo",
             "unknown study": {"params": {"profile": "cpu", "studies": {"nope": {}}}},
             "bad params": {"params": {"profile": "cpu", "studies": {"padding_waste": {"reps": -5}}}},
             "bad profile": {"params": {"profile": "tpu", "studies": {"padding_waste": {}}}},
             "bare meta": {}, "no plan": {"params": {"profile": "cpu", "device": "cpu", "studies": {}}}}
    out = {}
    for case, meta in metas.items():
        d = out[case] = results / case.replace(" ", "_")
        d.mkdir()
        if meta == "link":
            os.symlink(results / "array_meta" / META_NAME, d / META_NAME)
        elif meta == "fifo":
            os.mkfifo(d / META_NAME)
        elif meta is not None:
            (d / META_NAME).write_text(meta if isinstance(meta, str) else json.dumps(meta))
    out["finished"] = finished_run(results)
    return out


@pytest.mark.timeout(60)
@pytest.mark.parametrize("target, says", [
    ("no meta", "--resume '{name}': no run folder with a meta.json there or under"),
    ("array meta", "--resume: {path}/meta.json: it does not hold an object (a JSON array)"),
    ("linked meta", "--resume: {path}/meta.json: cannot be read (it is a symbolic link, not a regular file)"),
    ("fifo meta", "--resume '{name}': no run folder with a meta.json there or under"),
    ("unknown study", "--resume: {name} planned studies ['nope'] that are not registered now"),
    ("bad params", "--resume: study 'padding_waste': reps=-5 is below the minimum 1"),
    ("bad profile", "--resume: unknown profile 'tpu'; valid: cpu, gpu"),
    ("finished", "--resume: {name} finished at "),
    # defect fixed: a record that plans nothing was "resumed" (0 studies) and stamped finished
    ("bare meta", "--resume: {path}: its meta.json plans no study (params.studies is missing or empty), so it is no "
                  "sweep's run folder; nothing to resume, and the folder is left as it is"),
    ("no plan", "--resume: {path}: its meta.json plans no study"),
])
def test_resume_of_a_non_run_is_refused_and_changes_nothing(tmp_path, capsys, target, says):
    results = tmp_path / "results"
    results.mkdir()
    targets = _resume_targets(results)
    path = targets[target]
    before = tree_state(results)
    msg = refusal(["sweep", "--direct", "--resume", path.name, "--results", str(results)], capsys)
    assert msg.startswith(says.format(name=path.name, path=path)), msg
    assert tree_state(results) == before         # not even a .lock


@pytest.mark.parametrize("sets, says", [
    (["engine=vllm"], "engine='vllm' is not a valid choice; valid: vllm-0.33, vllm-0.34, sglang-0.5.23"),
    (["engine_cap=63"], "engine_cap=63 is below the minimum 64; valid: an integer >= 64 and <= 65,536 (limit "
                        "'budget_tokens') or null"),
    (["engine_cap=100000"], "engine_cap: 100,000 exceeds the cap of 65,536 (limit 'budget_tokens')"),
    (["engine_cap=true"], "engine_cap=True is not an integer; valid: an integer >= 64 and <= 65,536"),
    (["engine=vllm-0.33", "engine_cap=4096"], "vllm-0.33 has no budget cap option"),
    (["engine_max_budget=32", "engine_cap=64"], "engine_max_budget=32 is below the minimum 64"),
    (["reps=NaN"], "reps=nan is not an integer; valid: an integer >= 1 and <= 100,000 (limit 'reps')"),
    (["reps=1e400"], "reps=inf is not an integer"),
    (["image_folder=relative/dir"], "a relative path; give the whole path"),
])
def test_encoder_latency_refuses_values_beyond_its_edges_before_a_run_folder(tmp_path, capsys, sets, says):
    argv = ["sweep", "--direct", "--profile", "cpu", "--studies", "encoder_latency", "--results", str(tmp_path)]
    msg = refusal(argv + [a for s in sets for a in ("--set", s)], capsys)
    assert msg.startswith("--set: study 'encoder_latency': ") and says in msg, msg
    assert not any(tmp_path.iterdir())


@pytest.mark.parametrize("study, value, says", [
    ("cast_cost", "fills=[0]", "fills=[0.0]: [0.0] are not fractions in (0, 1]"),
    ("cast_cost", "fills=[1.5]", "fills=[1.5]: [1.5] are not fractions in (0, 1]"),
    ("cast_cost", "fills=[NaN]", "fills=nan is not a finite number"),
    ("input_path", "loads=[1.5]", "load 1.5 is not a fraction of the highest sustainable rate in (0, 1.5)"),
    ("input_path", "loads=[0]", "load 0.0 is not a fraction of the highest sustainable rate in (0, 1.5)"),
])
def test_fractions_beyond_their_open_edges_are_refused(tmp_path, capsys, study, value, says):
    argv = ["sweep", "--direct", "--profile", "cpu", "--studies", study, "--set", value, "--results", str(tmp_path)]
    assert says in refusal(argv, capsys)
    assert not any(tmp_path.iterdir())


@pytest.mark.parametrize("overrides, check", [
    (dict(engine_cap=64, engine_max_budget=64), lambda r: r["engine_cap"] == 64),
    (dict(engine_cap=65536), lambda r: r["engine_cap"] == 65536),
    (dict(engine="sglang-0.5.23", engine_cap=None), lambda r: r["engine_cap"] is None),
    (dict(engine="vllm-0.33"), lambda r: r["engine"] == "vllm-0.33"),
])
def test_encoder_latency_takes_its_engine_parameters_at_their_edges(overrides, check):
    """Correct handling: the declared minimum and the limit of engine_cap, and no cap for a release without one."""
    assert check(discover()["encoder_latency"].resolve("cpu", overrides))


@pytest.mark.parametrize("argv, says", [
    (["--fit"], "--fit trims the repetitions to fit --max-minutes N: give that too"),
    (["--shard", "a/b"], "--shard 'a/b': not two whole numbers I/N; --shard takes I/N with 0 <= I < N <= 4,096"),
    (["--workers", "0"], "--workers '0': give a number of worker processes >= 1, or auto"),
    (["--gpus", "0,0"], "--gpus '0,0': give distinct GPU indices separated by commas"),
])
def test_sweep_option_values_are_named(tmp_path, capsys, argv, says):
    assert says in refusal(["sweep", "--direct", "--profile", "cpu", "--results", str(tmp_path), *argv], capsys)
    assert not any(tmp_path.iterdir())


# =========================================================================== the preprocessing backends

BAD_IMAGES = {
    "zero size": (lambda: np.zeros((0, 0, 3), np.uint8), ValueError, r"image 0 has zero size: 0x0 \(HxW\)"),
    "zero height": (lambda: np.zeros((0, 10, 3), np.uint8), ValueError, r"image 0 has zero size: 0x10"),
    "float with NaN": (lambda: np.full((28, 28, 3), np.nan, np.float32), ValueError,
                       r"image 0 has dtype float32; pass uint8 0\.\.255"),
    "bool": (lambda: np.zeros((28, 28, 3), bool), ValueError, r"image 0 has dtype bool; images must be uint8"),
    "int16": (lambda: np.zeros((28, 28, 3), np.int16), ValueError, r"image 0 has dtype int16; pass uint8"),
    "two channels": (lambda: np.zeros((28, 28, 2), np.uint8), ValueError,
                     r"with 2 channels; valid channel counts \(last axis\) are 1 \(grey\), 3 \(RGB\), 4 \(RGBA\)"),
    "huge": (lambda: huge(30000, 30000, 3), LimitError, r"30000x30000"),
    "aspect": (lambda: huge(20000, 28, 3), ValueError, r"20000x28 \(HxW\) has aspect ratio 714\.3; Qwen2-VL accepts "
                                                       r"at most 200"),
    "16-bit PIL": (lambda: Image.new("I;16", (28, 28)), ValueError, r"PIL image mode 'I;16' is not supported.*valid "
                                                                     r"modes: 1, L, P, RGB"),
    "a path": (lambda: "photo.png", TypeError, r"image 0 has unsupported type builtins\.str; accepted: "),
}


@pytest.mark.parametrize("backend", ["pil", "torchvision", "cuda"])
@pytest.mark.parametrize("case", sorted(BAD_IMAGES))
def test_every_backend_refuses_a_bad_image_alike(backend, case):
    make, error, says = BAD_IMAGES[case]
    with pytest.raises(error, match=says):
        preprocess(make(), CFG, backend=backend)


GOOD_IMAGES = {
    "1x1": lambda: np.full((1, 1, 3), 200, np.uint8),
    "grey 2-D": lambda: np.full((28, 28), 128, np.uint8),
    "grey 1 channel": lambda: np.full((28, 28, 1), 128, np.uint8),
    "RGBA": lambda: np.dstack([np.full((28, 28, 3), 10, np.uint8), np.zeros((28, 28, 1), np.uint8)]),
    "channels view": lambda: torch.zeros(3, 28, 28, dtype=torch.uint8).permute(1, 2, 0),
}


@pytest.mark.parametrize("backend", ["pil", "torchvision", "cuda"])
@pytest.mark.parametrize("case", sorted(GOOD_IMAGES))
def test_every_backend_takes_the_odd_but_valid_images_with_the_same_grid(backend, case):
    """Correct handling: a 1x1 image is upscaled to one 2x2 merge block grid (4 merged tokens), grey is RGB, a fully
    transparent RGBA is white, a non-contiguous view reads as its values; every backend gives the same grid."""
    batch = preprocess(GOOD_IMAGES[case](), CFG, backend=backend)
    assert batch.grid_thw.tolist() == [[1, 4, 4]] and batch.pixels.dtype == torch.uint8
    if case == "RGBA":
        assert int(batch.pixels.min()) >= 250          # composited on white (each backend's own rounding)
    if case == "grey 2-D":
        assert int(batch.pixels.min()) == int(batch.pixels.max()) == 128


@pytest.mark.parametrize("kw, says", [
    (dict(backend="PIL"), r"unknown preprocessing backend 'PIL'; valid: pil, torchvision, cuda"),
    (dict(backend=None), r"unknown preprocessing backend None; valid"),
    (dict(backend="cuda", device="tpu"), r"invalid device 'tpu'; valid: 'auto', 'cpu', 'cuda', 'cuda:N'"),
    (dict(backend="pil", device="cpu"), r"device='cpu' is for backend 'cuda'"),
    (dict(threads="2"), r"threads='2' must be a positive integer"),
    (dict(threads=10 ** 6), r"threads=1000000 exceeds the \d+ cores this process may run on; valid: 1\.\.\d+"),
])
def test_backend_arguments_are_named(kw, says):
    with pytest.raises(ValueError, match=says):
        preprocess(np.zeros((28, 28, 3), np.uint8), CFG, **kw)


# =========================================================================== image folders


def _folder(tmp_path: Path, case: str) -> Path:
    d = tmp_path / case.replace(" ", "_")
    d.mkdir()
    if case == "non-images":
        (d / "notes.txt").write_text("x")
        (d / "data.npy").write_bytes(b"\x93NUMPY")
    elif case == "text named png":
        (d / "a.png").write_text("not an image")
    elif case == "zero-byte png":
        (d / "a.png").write_bytes(b"")
    elif case == "broken link":
        os.symlink(tmp_path / "gone.png", d / "a.png")
    elif case == "link loop":
        os.symlink(d / "b.png", d / "a.png")
        os.symlink(d / "a.png", d / "b.png")
    elif case == "device":
        os.symlink("/dev/zero", d / "z.png")
    elif case == "hidden only":
        png(d / ".a.png")
        (d / ".git").mkdir()
        png(d / ".git" / "b.png")
    elif case == "16-bit":
        Image.fromarray(np.zeros((32, 32), np.uint16)).save(d / "a.png")
    return d


@pytest.mark.timeout(30)
@pytest.mark.parametrize("case, says", [
    ("empty", r"holds no readable image \(0 file\(s\) with an image suffix\); valid: a folder of image files"),
    ("non-images", r"holds no readable image \(0 file\(s\) with an image suffix\)"),
    ("text named png", r"1 of 1 image file\(s\) cannot be read .*a\.png: not an image file PIL can open"),
    ("zero-byte png", r"1 of 1 image file\(s\) cannot be read .*a\.png: not an image file PIL can open"),
    ("broken link", r"holds no readable image .*skipped: a\.png \(a broken symbolic link\)"),
    ("link loop", r"skipped: a\.png \(a broken symbolic link\); b\.png \(a broken symbolic link\)"),
    ("device", r"skipped: z\.png \(a character device\)"),
    ("hidden only", r"holds no readable image \(0 file\(s\) with an image suffix\)"),
    ("16-bit", r"a\.png: PIL image mode 'I;16' is not supported"),
])
def test_a_folder_without_a_usable_image_is_refused_naming_it(tmp_path, case, says):
    folder = _folder(tmp_path, case)
    before = tree_state(tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(ValueError, match=says) as e:
            get_mix(folder_mix_name(folder))
    assert str(folder) in str(e.value)
    assert tree_state(tmp_path) == before


@pytest.mark.timeout(30)
def test_a_folder_path_that_is_a_fifo_is_refused_unopened(tmp_path):
    os.mkfifo(tmp_path / "pipe")
    with pytest.raises(ValueError, match=r"image folder '.*pipe' is a file, not a folder; valid: a folder of image"):
        get_mix(folder_mix_name(tmp_path / "pipe"))


# =========================================================================== the results store


@pytest.mark.parametrize("name", ["../escape", "/tmp/abs", "", "a/b", ".hidden", "-x", "x" * 101, 7])
def test_save_table_refuses_a_study_name_that_is_not_a_file_name(tmp_path, name):
    """Defect fixed (a path traversal): the study name made the file name unchecked, so '../escape' wrote a table
    beside the run folder, '/tmp/abs' anywhere, '' a hidden '.parquet'."""
    run = tmp_path / "results" / "run"
    run.mkdir(parents=True)
    with pytest.raises(ValueError, match=rf"study name {re.escape(repr(name))} cannot name a table in a run "
                                         r"folder: give letters, digits"):
        save_table(name, table(), run)
    with pytest.raises(ValueError, match="cannot name a table"):
        save_table(name, table(), results_root=tmp_path / "results")
    assert tree_state(tmp_path) == {"results": "dir", "results/run": "dir"}


@pytest.mark.parametrize("mode", ["direct", "papermill", "interactive"])
def test_save_table_into_a_finished_run_is_refused_and_changes_nothing(tmp_path, mode):
    """Defect fixed: a new table went into a finished sweep's folder, measured elsewhere and later, under the run's
    record (its commit, device and date): a silent wrong provenance."""
    run = finished_run(tmp_path / "results", mode)
    before = tree_state(run)
    with pytest.raises(FileExistsError, match=rf"is a finished run \(finished at .*, mode '{mode}'\); a finished "
                                              r"run's folder is a record and takes no new table"):
        save_table("other", table(), run)
    with pytest.raises(FileExistsError):
        save_table("lat", table(2.0), run)
    assert tree_state(run) == before


def test_save_table_into_a_finished_run_being_resumed_is_taken(tmp_path):
    """Correct handling: a resume of a finished run (--resume-finished) holds the folder's lock while its studies
    save their tables, so the run in use takes one; a notebook-mode run adds studies by design."""
    run = finished_run(tmp_path / "results")
    lock = RunLock(run)
    assert lock.acquire()
    try:
        assert save_table("other", table(), run) == run / "other.parquet"
    finally:
        lock.release()
    notebook = finished_run(tmp_path / "results", "notebook", name="nb")
    save_table("more", table(), notebook)
    assert set(RunMeta.from_json(notebook).plan) == {"lat", "more"}


def test_save_table_reads_the_record_before_it_writes(tmp_path):
    """Defect fixed alongside: into a folder whose meta.json is unusable, the table was written first and the
    MetaError came after, leaving a table no record describes."""
    run = tmp_path / "run"
    run.mkdir()
    (run / META_NAME).write_text("{not json")
    with pytest.raises(MetaError, match="not valid JSON"):
        save_table("lat", table(), run)
    assert sorted(p.name for p in run.iterdir()) == [META_NAME]


@pytest.mark.parametrize("meta, says", [
    ({"params": {"shard": {"index": 2, "count": 2, "group": "g"}}}, "params.shard is 2/2, not I/N with 0 <= I < N"),
    ({"params": {"shard": {"index": True, "count": 2, "group": "g"}}}, "params.shard.index is a boolean (True)"),
    ({"duration_s": "NaN"}, "duration_s is a string ('NaN'), not a finite number"),
    ({"study_seconds": {"a": 1e999}}, "study_seconds.a is a number (inf), not a finite number"),
    ({"git": {"sha": ["x"]}}, "git.sha is an array, not a string"),
    ({"resumed": [{"studies": "all"}]}, "resumed[0].studies is a string ('all'), not a list"),
])
def test_a_meta_json_of_the_wrong_types_is_named_field_by_field(tmp_path, meta, says):
    run = tmp_path / "run"
    run.mkdir()
    (run / META_NAME).write_text(json.dumps(meta))
    with pytest.raises(MetaError, match=re.escape(says)):
        RunMeta.from_json(run)


@pytest.mark.parametrize("text, says", [
    ('{"duration_s": ' + "9" * 5000 + "}", "not valid JSON"),            # beyond Python's int-from-text limit
    ('{"a": ' + "[" * 100 + "]" * 100 + "}", "nests more than 32 levels deep"),
    ("\xff\xfe{}", "not UTF-8 text"),
])
def test_a_meta_json_too_big_to_parse_or_too_deep_is_refused_not_a_crash(tmp_path, text, says):
    run = tmp_path / "run"
    run.mkdir()
    (run / META_NAME).write_bytes(text.encode("latin-1"))
    with pytest.raises(MetaError, match=says):
        RunFolder(run).meta()


# =========================================================================== environment variables


@pytest.mark.parametrize("argv", [["advise", "--preset", CFG], ["compare", "a", "b"], ["audit", "/nonexistent"]])
def test_a_malformed_limits_variable_is_named_by_every_newer_command(tmp_path, capsys, monkeypatch, argv):
    monkeypatch.setenv(LIMITS_ENV, "budgets=many")
    msg = refusal(argv + ["--results", str(tmp_path)], capsys)
    assert msg.startswith(f"{LIMITS_ENV}='budgets=many': budgets must be a positive integer"), msg
    assert not any(tmp_path.iterdir())


def test_results_variable_naming_a_file_or_nothing(tmp_path, capsys, monkeypatch):
    """A file: named without a traceback. Empty: the project's results/ (correct: an empty variable is unset)."""
    from workbench import provenance
    f = tmp_path / "results.txt"
    f.write_text("x")
    monkeypatch.setenv(provenance.RESULTS_ENV, str(f))
    assert refusal(["compare", "a", "b"], capsys) == (f"--results {f} is a file, not a folder; give the folder that "
                                                      "holds the run folders")
    assert f.read_text() == "x"
    monkeypatch.setenv(provenance.RESULTS_ENV, "")
    assert provenance.results_root() == provenance.REPO_ROOT / "results"


@pytest.mark.parametrize("where", ["folder", "missing parent"])
def test_a_progress_file_variable_that_cannot_be_written_never_stops_a_study(tmp_path, monkeypatch, where):
    """Correct handling: the count is a courtesy; a value naming a folder (os.replace fails) or a file under a
    missing folder counts nothing and the work goes on; the folder is not touched."""
    from workbench.studies.plotting import PROGRESS_FILE_ENV, progress
    (tmp_path / "sub").mkdir()
    target = tmp_path / "sub" if where == "folder" else tmp_path / "no" / "such" / "file.json"
    (tmp_path / "keep.txt").write_text("x")
    before = tree_state(tmp_path)
    monkeypatch.setenv(PROGRESS_FILE_ENV, str(target))
    assert [x for x in progress(range(3), enabled=False)] == [0, 1, 2]
    assert tree_state(tmp_path) == before     # defect fixed: a folder left a stray "<value>.tmp" beside it


def test_every_malformed_variable_at_once_lets_the_package_import_and_names_the_first_one_used(tmp_path):
    """Never at import: with every variable the package reads malformed, ``import workbench`` and the command line's
    parser work; the first command names the variable it used first."""
    env = {**os.environ, LIMITS_ENV: "frames=lots", "WORKBENCH_REUSE_LAUNCHES": "maybe", "WORKBENCH_PROGRESS": "x",
           "WORKBENCH_EMULATE_GPUS": "many", "WORKBENCH_CPU_WORKER": "first", "WORKBENCH_STUDY_MODULES": ",,",
           "WORKBENCH_PROGRESS_FILE": str(tmp_path), "WORKBENCH_RUN_GROUP": "../../x", "SLURM_ARRAY_TASK_ID": "x"}
    code = "import workbench, workbench.cli, workbench.advise, workbench.audit, workbench.compare; print('imported')"
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "imported", done.stderr[-2000:]
    done = subprocess.run([sys.executable, "-m", "workbench", "compare", "a", "b", "--results", str(tmp_path)],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode != 0 and "Traceback" not in done.stderr
    assert f"{LIMITS_ENV}='frames=lots': frames must be a positive integer" in done.stderr
    assert sorted(os.listdir(tmp_path)) == []


# =========================================================================== issue 64: the defects left open


@pytest.mark.timeout(30)
@pytest.mark.parametrize("pool", [False, True], ids=["plain", "pool limit"])
def test_a_mix_of_more_distinct_sizes_than_the_planner_weighs_is_refused_with_the_count_and_the_cap(pool):
    """Defect fixed: 65,536 distinct token counts ran the quadratic programme for hours (the pool-limited one for
    longer); now refused at once, naming the count and the cap."""
    cap, name = (256, "pool_plan_sizes") if pool else (4096, "plan_sizes")
    kw = dict(max_pool_bytes=1 << 40, cfg=CFG) if pool else {}
    with pytest.raises(LimitError, match=rf"plan_budgets: a mix of 65,536 distinct merged-token counts .*: 65,536 "
                                         rf"exceeds the cap of {cap:,} \(limit '{name}'\)"):
        wb.plan_budgets(range(1, 65537), 4, **kw)


def test_the_planner_at_its_size_cap_stays_exact():
    """Correct handling: as many distinct sizes as the cap are planned, exactly; one more is refused."""
    with limits.raised(plan_sizes=4):
        assert wb.plan_budgets({4: 1, 8: 1, 12: 1, 100: 1}, 2) == [12, 100]       # 8+4+0+0 padding beats 96+...
        with pytest.raises(LimitError, match=r"a mix of 5 distinct .*: 5 exceeds the cap of 4 \(limit 'plan_sizes'\)"):
            wb.plan_budgets([1, 2, 3, 4, 5], 2)


@pytest.mark.timeout(30)
def test_a_huge_budget_range_is_refused_by_its_count_before_a_list_of_it_exists():
    """Defect fixed: ``Budgets.of(range(1, 10**12))`` listed every budget before counting them; a range longer than
    len() can say (10**20) is counted too, and an endless iterable stops at the cap."""
    from workbench.budgets import Budgets
    with pytest.raises(LimitError, match=r"budgets: a list of 999,999,999,999 budgets: 999,999,999,999 exceeds the "
                                         r"cap of 64 \(limit 'budgets'\)"):
        Budgets.of(range(1, 10 ** 12))
    with pytest.raises(LimitError, match=r"a list of 99,999,999,999,999,999,999 budgets"):
        Budgets.of(range(1, 10 ** 20))
    with pytest.raises(LimitError, match=r"mix: 99,999,999,999,999,999,999 per-item merged-token counts"):
        wb.plan_budgets(range(1, 10 ** 20), 4)
    with pytest.raises(LimitError, match=r"an iterable of more than 64 budgets \(counting stopped there\): 65 "):
        Budgets.of(itertools.count(1))
    assert Budgets.of(range(64, 64 * 65, 64))[-1] == 4096 and Budgets.of(iter([128, 64])) == (64, 128)


@pytest.mark.parametrize("value, on", [("0", False), ("1", True), (" FALSE ", False), ("True", True), ("no", False),
                                       ("YES", True), ("Off", False), (" on", True), ("", True)])
def test_on_off_variables_take_the_usual_spellings(monkeypatch, value, on):
    """Defect fixed: only "0" turned WORKBENCH_PROGRESS or WORKBENCH_REUSE_LAUNCHES off; "false" or "off" left the
    bars on, silently. Empty is unset (the default, on)."""
    from workbench.studies.plotting import progress
    for name in limits.SWITCHES:
        monkeypatch.setenv(name, value)
        assert limits.switch(name, True) is on
    assert progress(range(2)).disable is not on


@pytest.mark.parametrize("name", ["WORKBENCH_PROGRESS", "WORKBENCH_REUSE_LAUNCHES"])
def test_an_on_off_variable_of_another_value_is_refused_naming_it(tmp_path, capsys, monkeypatch, name):
    """Defect fixed: "maybe" (or the typo "flase") silently meant on; now the command refuses it before any run
    folder, and the library where the value is read."""
    from workbench.norm_kernels import reusing_launches
    from workbench.studies.plotting import progress
    monkeypatch.setenv(name, "flase")
    says = (f"{name}='flase' is neither on nor off; accepted, in any case: 1, true, yes, on (on), 0, false, no, off "
            f"(off), or unset for the default (on)")
    assert refusal(["sweep", "--direct", "--profile", "cpu", "--results", str(tmp_path)], capsys) == says
    assert not any(tmp_path.iterdir())
    with pytest.raises(ValueError, match=re.escape(says)):
        if name == "WORKBENCH_PROGRESS":
            progress(range(2))
        else:
            with reusing_launches():
                pass


@pytest.mark.parametrize("kind", ["text", "json list", "other json object", "link", "fifo"])
def test_a_progress_file_variable_naming_a_file_not_its_own_is_refused_and_the_file_kept(tmp_path, monkeypatch, kind):
    """Defect fixed: the count replaced whatever file the variable named (a user's notes, a link, a FIFO)."""
    from workbench.studies.plotting import PROGRESS_FILE_ENV, progress
    target = tmp_path / "notes.txt"
    (tmp_path / "real.txt").write_text("mine\n")
    if kind == "link":
        os.symlink(tmp_path / "real.txt", target)
    elif kind == "fifo":
        os.mkfifo(target)
    else:
        target.write_text({"text": "my notes\n", "json list": "[1, 2]", "other json object": '{"done": 1}'}[kind])
    before = tree_state(tmp_path)
    monkeypatch.setenv(PROGRESS_FILE_ENV, str(target))
    with pytest.raises(ValueError, match=rf"{PROGRESS_FILE_ENV}='{re.escape(str(target))}': it exists and is (a file "
                                         r"that is not a progress file|not a regular file) .* never writes over"):
        for _ in progress(range(3), enabled=False):
            pass
    assert tree_state(tmp_path) == before


@pytest.mark.parametrize("start", ["", '{"done": 1, "total": 5, "desc": "old"}'], ids=["empty", "progress file"])
def test_a_progress_file_variable_naming_an_empty_or_progress_file_counts_there(tmp_path, monkeypatch, start):
    """Correct handling: an empty file, or a progress file an earlier study left, is the count's own: replaced."""
    from workbench.studies.plotting import PROGRESS_FILE_ENV, progress
    target = tmp_path / "count.json"
    target.write_text(start)
    monkeypatch.setenv(PROGRESS_FILE_ENV, str(target))
    assert list(progress(range(3), desc="d", enabled=False)) == [0, 1, 2]
    assert json.loads(target.read_text()) == {"done": 3, "total": 3, "desc": "d"}
    assert sorted(os.listdir(tmp_path)) == ["count.json"]        # no temporary file left beside it


def test_input_path_threads_beyond_the_cores_are_refused_before_a_run_folder(tmp_path, capsys):
    """Defect fixed: ``--set threads=[1,N]`` beyond the cores made a run folder and failed inside the measurement;
    now the declaration checks a given value against this machine where it is given."""
    cores = limits.cpu_count()
    argv = ["sweep", "--direct", "--profile", "cpu", "--studies", "input_path", "--set", f"threads=[1,{cores + 1}]",
            "--results", str(tmp_path)]
    assert refusal(argv, capsys) == (f"--set: study 'input_path': threads=[1, {cores + 1}]: threads={cores + 1} exceeds "
                                     f"the {cores} cores this process may run on; valid: 1..{cores}")
    assert not any(tmp_path.iterdir())


def test_input_path_defaults_of_a_bigger_host_still_resolve_here():
    """Correct handling: the GPU profile's defaults are read on any machine (predictions, --help); only values given
    are checked against the cores here (the defaults when the run starts)."""
    study = discover()["input_path"]
    assert study.resolve("gpu")["threads"] == [1, 4, 8]
    assert study.resolve("cpu", {"threads": "1"})["threads"] == [1]


def _linked_tree(tmp_path: Path) -> tuple[Path, Path]:
    """A vLLM tree whose models folder is a link to another tree's (with a model class that needs attention)."""
    outside = model_tree(tmp_path / "outside")
    tree = tmp_path / "t"
    (tree / "vllm" / "model_executor").mkdir(parents=True)
    (tree / "vllm" / "version.py").write_text('__version__ = "0.34.0"\n')
    os.symlink(outside / MODELS, tree / MODELS)
    return tree, tree / MODELS


def test_audit_never_follows_a_linked_models_folder_and_names_it(tmp_path, capsys):
    """Defect fixed: a models folder that was a link was walked wherever it pointed (out of the given tree)."""
    tree, link = _linked_tree(tmp_path)
    before = tree_state(tmp_path)
    msg = refusal(["audit", str(tree), "--no-save", "--results", str(tmp_path / "r")], capsys)
    assert msg == (f"audit {tree}: no Python model files there (looked for vllm/model_executor/models and vllm/models/"
                   f"*.py, else any *.py); skipped, as symbolic links: {link}"), msg
    assert tree_state(tmp_path) == before


def test_audit_skips_a_linked_folder_inside_the_tree_with_a_warning_naming_it(tmp_path, capsys):
    tree = model_tree(tmp_path / "t")
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "leak.py").write_text("class Leak(SupportsEncoderCudaGraph):\n    pass\n")
    link = tree / MODELS / "sub"
    os.symlink(tmp_path / "elsewhere", link)
    with pytest.warns(UserWarning, match=rf"audit {re.escape(str(tree))}: skipped {re.escape(str(link))}, a symbolic "
                                         r"link \(never followed out of the tree\)"):
        result = audit(tree)
    assert result.skipped == [str(link)] and "Leak" not in {m.model for m in result.models}
    assert result.table().splitlines()[-1] == (f"skipped: {link} (a symbolic link; the audit never follows a link out "
                                               f"of the tree it is given)")
    assert cli.main(["audit", str(tree), "--json", "--no-save", "--results", str(tmp_path / "r")]) == 1
    out, err = capsys.readouterr()
    assert json.loads(out)["skipped"] == [str(link)] and err.strip() == (f"audit: warning: audit {tree}: skipped "
                                                                         f"{link}, a symbolic link (never followed "
                                                                         f"out of the tree)")


SHARD_FORM = ("--shard takes I/N with 0 <= I < N <= 4,096 (shard I of N), e.g. --shard 0/2, or auto (a Slurm array "
              "task or a torchrun rank)")


@pytest.mark.parametrize("shard, why", [("-1/2", "I=-1 is negative"), ("2/2", "I=2 is not below N=2 (shards count "
                                                                                 "from 0)"),
                                        ("1/0", "N=0 is no count of shards"), ("-3/-1", "N=-1 is no count of shards"),
                                        ("a/b", "not two whole numbers I/N"), ("-1", "not two whole numbers I/N")])
@pytest.mark.parametrize("glued", [False, True], ids=["--shard V", "--shard=V"])
def test_a_bad_shard_says_what_is_wrong_and_what_is_valid(tmp_path, capsys, shard, why, glued):
    """Defect fixed: ``--shard -1/2`` was read as an unknown option ("expected one argument"), and the others were
    told the form without what was wrong or the largest N."""
    argv = ["sweep", "--direct", "--profile", "cpu", "--results", str(tmp_path)]
    argv += [f"--shard={shard}"] if glued else ["--shard", shard]
    assert refusal(argv, capsys) == f"--shard {shard!r}: {why}; {SHARD_FORM}"
    assert not any(tmp_path.iterdir())
    assert limits.Limits().shards == 4096


@pytest.mark.parametrize("call, says", [
    (lambda root: compare_runs("", "b", root), r"run '' is empty; give a run folder"),
    (lambda root: compare_runs("a", "b", ""), r"results='' is empty; give the folder that holds the run folders"),
    (lambda root: wb.results.resolve_run(" "), r"run ' ' is empty"),
    (lambda root: wb.results.find_runs(""), r"results_dir='' is empty"),
    (lambda root: save_table("lat", table(), run_dir=""), r"run_dir='' is empty; give a run folder, or None"),
    (lambda root: save_table("lat", table(), results_root=""), r"results_root='' is empty"),
], ids=["compare run", "compare results", "resolve_run", "find_runs", "save_table run_dir", "save_table results_root"])
def test_an_empty_path_in_the_library_is_refused_not_the_current_folder(two_runs, monkeypatch, call, says):
    """Defect fixed: "" (Path("") is ".") silently meant the current folder: run from inside run a, compare "" b
    compared a with b; save_table(run_dir="") wrote a table and a meta.json into the working folder."""
    root, a, b = two_runs
    monkeypatch.chdir(a)
    before = tree_state(root)
    with pytest.raises(ValueError, match=says):
        call(root)
    assert tree_state(root) == before


def test_advise_refuses_an_empty_results_before_any_work(tmp_path, monkeypatch):
    from workbench.advise import advise
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match=r"results='' is empty; give the folder that holds the run folders"):
        advise(CFG, "thumbnails", results="")
    assert not any(tmp_path.iterdir())


def _foreign_run(root: Path, name: str, started: str, tables: dict[str, pd.DataFrame]) -> Path:
    """A run folder whose tables another tool wrote (parquet as it is, not through the table writer)."""
    d = root / name
    d.mkdir(parents=True)
    (d / META_NAME).write_text(json.dumps({"started_at": started}))
    for study, t in tables.items():
        t.assign(device="GPU").to_parquet(d / f"{study}.parquet", index=False)
    return d


def test_compare_ratios_numbers_only_and_names_what_it_left_out(tmp_path, capsys):
    """Defect fixed: the table checker read text ("2.0") as a number and booleans as 0 and 1, so compare printed
    ratios of them, and a verdict (unit bool) got a ratio of its 0 and 1. Now a metric that is not numbers is left
    out, named with why; a verdict is compared as a verdict, never ratioed."""
    def run(name, started, p50, ok, text, hit):
        return _foreign_run(tmp_path, name, started, {
            "lat": pd.DataFrame({"tokens": [1, 1], "metric": ["p50_ms", "ok"], "value": [p50, ok],
                                 "unit": ["ms", "bool"]}),
            "txt": pd.DataFrame({"tokens": [1], "metric": ["p50_ms"], "value": [text], "unit": ["ms"]}),
            "flags": pd.DataFrame({"tokens": [1, 1], "metric": ["hit", "ok"], "value": [hit, hit],
                                   "unit": ["count", "bool"]})})
    run("a", "2030-01-01", 2.0, 1.0, "2.0", True)
    run("b", "2030-01-02", 4.0, 1.0, "4.0", False)
    before = tree_state(tmp_path)
    df = compare_runs("a", "b", tmp_path)
    got = {(r["study"], r["metric"]): (r["ratio"], r["flag"]) for r in df.to_dict("records")}
    assert got.keys() == {("lat", "p50_ms"), ("lat", "ok"), ("flags", "ok")}
    assert got[("lat", "p50_ms")] == (2.0, "") and math.isnan(got[("lat", "ok")][0])
    assert math.isnan(got[("flags", "ok")][0]) and got[("flags", "ok")][1] == "verdict changed: ok -> WRONG"
    assert df.attrs["left_out"] == {
        "flags": ["metric 'hit' of a: booleans under unit 'count' (first: True)",
                  "metric 'hit' of b: booleans under unit 'count' (first: False)"],
        "txt": ["metric 'p50_ms' of a: str values, not numbers (first: '2.0')",
                "metric 'p50_ms' of b: str values, not numbers (first: '4.0')"]}
    assert cli.main(["compare", "a", "b", "--results", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert ("  txt: left out metric 'p50_ms' of a: str values, not numbers (first: '2.0'): only numbers are "
            "compared") in out
    assert "  flags: left out metric 'hit' of b: booleans under unit 'count' (first: False)" in out
    assert tree_state(tmp_path) == before
