"""Provenance of a run: what code, which packages, which machine, when, and with which parameters.

Every run folder under ``results/`` holds a ``meta.json`` made here:

    meta = collect_meta(params)          # at the start of a run
    run_dir = new_run_dir("results", name="smoke")
    write_meta(run_dir, meta)            # unfinished: may be rewritten
    ...                                  # the run writes its <study>.parquet tables
                                         # (workbench.studies.tables.write_study_table)
    write_meta(run_dir, finish_meta(meta))   # finished: protected from being overwritten

Everything here is robust to a missing git, a tree that is not a repository, a missing package,
and a machine without NVIDIA's management library: such facts are recorded as unavailable, never
raised. Files are written atomically (temporary file in the same folder, then ``os.replace``), so
a reader never sees half a table or half a meta.json.
"""
from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import re
import socket
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

from .files import read_regular

# The project root: the folder that holds pyproject.toml and the workbench package.
REPO_ROOT = Path(__file__).resolve().parent.parent

# Distribution names whose versions every run records (those installed).
PACKAGES = (
    "torch",
    "triton",
    "transformers",
    "numpy",
    "pandas",
    "pyarrow",
    "matplotlib",
    "papermill",
    "nvidia-ml-py",
    "workbench",
)

META_NAME = "meta.json"
RESULTS_ENV = "WORKBENCH_RESULTS"


def results_root() -> Path:
    """Where run folders and the report live: ``$WORKBENCH_RESULTS`` when set (moving them on
    purpose), else the project's ``results/``, whatever the working directory (a notebook opened
    in JupyterLab runs in notebooks/, a papermill run from anywhere)."""
    env = os.environ.get(RESULTS_ENV)
    return Path(env).expanduser() if env else REPO_ROOT / "results"
_GIT_TIMEOUT_S = 10


# --------------------------------------------------------------------------- time


def utc_now() -> _dt.datetime:
    return _dt.datetime.now(_dt.timezone.utc)


def iso_utc(t: _dt.datetime | None = None, timespec: str = "milliseconds") -> str:
    """``t`` (default: now) as the ISO text every record here uses: UTC with a ``Z``."""
    return (t or utc_now()).isoformat(timespec=timespec).replace("+00:00", "Z")


def _parse_iso(s: str) -> _dt.datetime:
    return _dt.datetime.fromisoformat(s.replace("Z", "+00:00"))


# --------------------------------------------------------------------------- git


def _git(*args: str, cwd: Path) -> str:
    out = subprocess.run(
        ["git", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=_GIT_TIMEOUT_S,
        check=True,
    )
    return out.stdout.strip()


def git_info(root: Path | str | None = None) -> dict[str, Any]:
    """Commit and dirty flag of the source tree at ``root`` (default: the project root).

    Returns ``{"sha": None, "dirty": None, "error": ...}`` when git is missing or ``root`` is not
    inside a repository. ``dirty`` counts modified tracked files and untracked files that are not
    ignored (run outputs under results/ are ignored, so they do not make a tree dirty).
    """
    root = Path(root) if root is not None else REPO_ROOT
    try:
        top = _git("rev-parse", "--show-toplevel", cwd=root)
        sha = _git("rev-parse", "HEAD", cwd=root)
        status = _git("status", "--porcelain", cwd=root)
    except FileNotFoundError:
        return {"sha": None, "short": None, "dirty": None, "error": "git not installed"}
    except subprocess.CalledProcessError as e:
        reason = (e.stderr or "").strip().splitlines()
        return {"sha": None, "short": None, "dirty": None,
                "error": reason[0] if reason else f"git exited {e.returncode}"}
    except (subprocess.TimeoutExpired, OSError) as e:
        return {"sha": None, "short": None, "dirty": None, "error": f"git failed: {e}"}
    changed = [line for line in status.splitlines() if line.strip()]
    info: dict[str, Any] = {
        "sha": sha,
        "short": sha[:7],
        "dirty": bool(changed),
        "root": top,
    }
    if changed:
        info["changes"] = changed[:50]
        if len(changed) > 50:
            info["changes_truncated"] = len(changed) - 50
    try:
        info["branch"] = _git("rev-parse", "--abbrev-ref", "HEAD", cwd=root)
    except (subprocess.SubprocessError, OSError):
        pass
    return info


# --------------------------------------------------------------------------- packages / device


def package_versions(names: tuple[str, ...] = PACKAGES) -> dict[str, str]:
    """Installed versions of ``names``; packages that are not installed are left out."""
    from importlib import metadata

    versions: dict[str, str] = {}
    for name in names:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    return versions


def cpu_model() -> str:
    """The processor's marketing name where the OS tells it, else the architecture."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def torch_info() -> dict[str, Any]:
    """torch's own view: version, CUDA build, visible devices, and the device name runs use."""
    try:
        import torch
    except Exception as e:  # noqa: BLE001 - an unusable torch is a fact to record
        return {"available": False, "error": f"{type(e).__name__}: {e}",
                "device": f"cpu: {cpu_model()}"}
    info: dict[str, Any] = {
        "available": True,
        "version": torch.__version__,
        "cuda": torch.version.cuda,
        "hip": getattr(torch.version, "hip", None),
        "num_threads": torch.get_num_threads(),
    }
    try:
        cuda_ok = bool(torch.cuda.is_available())
    except Exception:  # noqa: BLE001
        cuda_ok = False
    info["cuda_available"] = cuda_ok
    if cuda_ok:
        count = torch.cuda.device_count()
        names = [torch.cuda.get_device_name(i) for i in range(count)]
        info["device_count"] = count
        info["device_names"] = names
        info["device"] = names[0] if count == 1 else f"{count}x {names[0]}"
        try:
            info["cudnn"] = torch.backends.cudnn.version()
        except Exception:  # noqa: BLE001
            pass
    else:
        info["device"] = f"cpu: {cpu_model()}"
    return info


def _text(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def nvml_info() -> dict[str, Any] | str:
    """Driver version and per-GPU clocks via NVML; ``"unavailable (<reason>)"`` where it fails."""
    try:
        import pynvml
    except ImportError:
        return "unavailable (nvidia-ml-py is not installed)"
    try:
        pynvml.nvmlInit()
    except Exception as e:  # noqa: BLE001 - NVMLError_LibraryNotFound, DriverNotLoaded, ...
        return f"unavailable ({_text(e) or type(e).__name__})"
    try:
        info: dict[str, Any] = {}
        try:
            info["driver"] = _text(pynvml.nvmlSystemGetDriverVersion())
        except Exception as e:  # noqa: BLE001
            info["driver"] = f"unavailable ({e})"
        try:
            info["cuda_driver"] = pynvml.nvmlSystemGetCudaDriverVersion_v2()
        except Exception:  # noqa: BLE001
            pass
        gpus = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            gpu: dict[str, Any] = {"index": i}
            probes = {
                "name": lambda: _text(pynvml.nvmlDeviceGetName(h)),
                "sm_clock_mhz": lambda: pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM),
                "sm_clock_max_mhz": lambda: pynvml.nvmlDeviceGetMaxClockInfo(h, pynvml.NVML_CLOCK_SM),
                "mem_clock_mhz": lambda: pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_MEM),
                "mem_clock_max_mhz": lambda: pynvml.nvmlDeviceGetMaxClockInfo(h, pynvml.NVML_CLOCK_MEM),
                "memory_total_bytes": lambda: int(pynvml.nvmlDeviceGetMemoryInfo(h).total),
                "temperature_c": lambda: pynvml.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU),
                "power_limit_w": lambda: pynvml.nvmlDeviceGetPowerManagementLimit(h) / 1000.0,
            }
            for key, probe in probes.items():
                try:
                    gpu[key] = probe()
                except Exception:  # noqa: BLE001 - not every field exists on every GPU
                    gpu[key] = None
            gpus.append(gpu)
        info["gpus"] = gpus
        return info
    except Exception as e:  # noqa: BLE001
        return f"unavailable ({_text(e) or type(e).__name__})"
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:  # noqa: BLE001
            pass


# --------------------------------------------------------------------------- meta


def collect_meta(params: dict | None = None) -> dict[str, Any]:
    """Everything a run records about itself at its start. Safe on any machine."""
    started = utc_now()
    tinfo = torch_info()
    return {
        "schema": 1,
        "started_at": iso_utc(started),
        "finished_at": None,
        "duration_s": None,
        "git": git_info(),
        "device": tinfo.get("device"),
        "packages": package_versions(),
        "python": platform.python_version(),
        "python_implementation": platform.python_implementation(),
        "executable": sys.executable,
        "platform": platform.platform(),
        "machine": platform.machine(),
        "cpu": cpu_model(),
        "cpu_count": os.cpu_count(),
        "hostname": socket.gethostname(),
        "torch": tinfo,
        "nvml": nvml_info(),
        "env": {k: os.environ[k] for k in ("CUDA_VISIBLE_DEVICES", "TRITON_INTERPRET", "CI")
                if k in os.environ},
        # a loaded host inflates every CPU timing: what else ran is part of the record
        "load_avg": {"start": load_average()},
        "params": dict(params or {}),
    }


def load_average() -> list[float] | None:
    """The host's 1, 5 and 15 minute load averages (runnable processes), or None where the OS
    has none."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except (AttributeError, OSError):
        return None


def finish_meta(meta: dict[str, Any]) -> dict[str, Any]:
    """Stamp the end time and duration onto ``meta`` (in place) and return it."""
    finished = utc_now()
    meta["finished_at"] = iso_utc(finished)
    if isinstance(meta.get("load_avg"), dict):
        meta["load_avg"]["end"] = load_average()
    try:
        meta["duration_s"] = round((finished - _parse_iso(meta["started_at"])).total_seconds(), 3)
    except (KeyError, TypeError, ValueError):
        meta["duration_s"] = None
    return meta


def read_meta(run_dir: Path | str) -> dict[str, Any]:
    """``run_dir/meta.json`` as parsed, without the schema check (`load_meta` adds it): what
    ``write_meta`` uses to see whether a run finished, so a finished run whose meta.json breaks the
    schema is still protected. OSError where the file cannot be read; MetaError (a ValueError)
    where it is not JSON, is nested too deeply to parse, or does not hold an object."""
    path = Path(run_dir) / META_NAME
    with open(path, encoding="utf-8") as f:
        return _parse_meta(path, f.read())


def write_meta(run_dir: Path | str, meta: dict[str, Any], overwrite: bool = False) -> Path:
    """Write ``run_dir/meta.json`` atomically.

    A meta.json that already records a finished run (``finished_at`` set) is never replaced
    unless ``overwrite=True``: a finished run is evidence. An unfinished one (the copy written
    at the start of the run) may be replaced by the finished one.
    """
    path = Path(run_dir) / META_NAME
    if path.exists() and not overwrite:
        try:
            old = read_meta(run_dir)
        except (OSError, ValueError):
            old = {}
        if old.get("finished_at"):
            raise FileExistsError(
                f"{path} belongs to a finished run; pass overwrite=True to replace it")
    text = json.dumps(meta, indent=2, default=_json_default) + "\n"
    atomic_write_text(path, text)
    return path


def _json_default(o: Any) -> Any:
    if isinstance(o, (Path, _dt.datetime, _dt.date)):
        return str(o)
    if isinstance(o, (set, frozenset, tuple)):
        return list(o)
    item = getattr(o, "item", None)  # numpy / torch scalars
    if callable(item):
        try:
            return item()
        except Exception:  # noqa: BLE001
            pass
    return str(o)  # torch.dtype, enums, ... : readable beats failing


# --------------------------------------------------------------------------- run folders


_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


def slug(text, empty: str | None = None, what: str = "name") -> str:
    """The file-name-safe form of ``text`` (a run name, a figure stem, a device name): letters,
    digits, '.', '_' and '-' kept, every run of other characters one '-', no '-' or '.' at either
    end (no hidden files, no leading option dash). Where nothing is left: ``empty``, or without
    one a ValueError naming ``what`` and ``text``."""
    out = _UNSAFE.sub("-", str(text)).strip("-.")
    if out:
        return out
    if empty is None:
        raise ValueError(f"{what} {text!r} has no usable characters")
    return empty


def new_run_dir(root: Path | str = "results", name: str | None = None) -> Path:
    """Create a new run folder ``<root>/<UTC timestamp>-<short sha or 'nogit'>[-name][-k]`` and
    return it.

    The folder is made with a plain ``mkdir`` (no ``exist_ok``), which the file system grants to
    exactly one caller: two runs started in the same second with the same name get different
    folders (the second one ``-2``, and so on), and an existing folder is never reused.
    """
    stamp = utc_now().strftime("%Y%m%dT%H%M%SZ")
    sha = git_info().get("short") or "nogit"
    base = f"{stamp}-{sha}" + (f"-{slug(name, what='run name')}" if name else "")
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    for k in range(1, 1000):
        path = root / (base if k == 1 else f"{base}-{k}")
        try:
            path.mkdir()
        except FileExistsError:
            continue
        return path
    raise FileExistsError(f"no free run folder name {base}[-k] under {root} (999 taken)")


class RunLock:
    """An exclusive lock on a run folder while a process works in it (``<run>/.lock``, flock).

    The operating system releases it when the holder exits, however it exits (SIGKILL too), so a
    folder whose lock can be taken is not being worked on: a sweep may resume it. The lock file
    records the holder's pid and host for people reading the folder."""

    NAME = ".lock"

    def __init__(self, run_dir: Path | str):
        self.path = Path(run_dir) / self.NAME
        self._fd: int | None = None

    def acquire(self) -> bool:
        import fcntl

        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o666)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            return False
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()} {socket.gethostname()}\n".encode())
        self._fd = fd
        return True

    def release(self, remove: bool = False) -> None:
        """Drop the lock; ``remove`` also deletes the lock file (for a run that is complete, so
        its folder holds only results)."""
        if self._fd is not None:
            if remove:
                try:
                    self.path.unlink()
                except FileNotFoundError:
                    pass
            os.close(self._fd)          # closing drops the flock
            self._fd = None

    def __enter__(self) -> "RunLock":
        if not self.acquire():
            raise RuntimeError(f"run folder {self.path.parent} is in use by another process "
                               f"({self.holder() or 'unknown holder'})")
        return self

    def __exit__(self, *exc) -> bool:
        self.release()
        return False

    def holder(self) -> str:
        try:
            return self.path.read_text().strip()
        except OSError:
            return ""


def run_in_use(run_dir: Path | str) -> bool:
    """Whether another process holds the run folder's lock right now.

    Only reads: the lock file is opened read-only and never created, so this works on a
    read-only results folder. No lock file means no holder (`RunLock` creates it when a sweep
    takes the lock). A shared ``flock`` probe conflicts with the holder's exclusive one; it is
    dropped at once. A lock file that cannot be opened or probed counts as not in use: this
    only informs (the report's status, which run to resume), and `RunLock.acquire` is what
    actually keeps two processes out of one folder."""
    import errno
    import fcntl

    path = Path(run_dir) / RunLock.NAME
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NONBLOCK", 0))
    except OSError:                      # missing (nobody took it), unreadable, not a file
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError as e:
        return e.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES)
    else:
        fcntl.flock(fd, fcntl.LOCK_UN)
        return False
    finally:
        os.close(fd)


# --------------------------------------------------------------------------- atomic writes


def atomic_write_bytes(path: Path | str, data: bytes, exclusive: bool = False) -> Path:
    """Write ``data`` to ``path`` so that readers see the old file or the new one, never a part.

    The bytes go to a temporary file in the same folder, are flushed to disk, and then replace
    ``path`` in one ``os.replace``. With ``exclusive`` the temporary file is instead hard-linked
    to ``path``, which fails (FileExistsError) if ``path`` exists, even when another process
    creates it at the same moment: a finished file is never replaced. Parent folders are
    created. File mode follows the umask.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        if exclusive:
            try:
                os.link(tmp, path)
            except FileExistsError:
                raise FileExistsError(f"{path} exists; a finished file is never overwritten") from None
            os.unlink(tmp)
        else:
            os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    return path


def atomic_write_text(path: Path | str, text: str, encoding: str = "utf-8") -> Path:
    return atomic_write_bytes(path, text.encode(encoding))


# --------------------------------------------------------------------------- meta.json schema

META_MAX_BYTES = 16 * 2**20      # a meta.json is a few kB; far more is not one
META_MAX_DEPTH = 32              # collect_meta nests 4 levels deep


class MetaError(ValueError):
    """A meta.json that cannot be used: unreadable, not JSON, not an object, or a field of the
    wrong type (`meta_problems`). ``str(e)`` starts with the file's path; ``e.reason`` is the why
    alone, and ``e.line`` the one line the report shows beside the run."""

    def __init__(self, path: Path | str, reason: str, kind: str = "invalid"):
        self.path = Path(path)
        self.reason = reason
        self.kind = kind                 # "missing", "unreadable" (cannot parse it) or "invalid"
        super().__init__(f"{self.path}: {reason}")

    @property
    def line(self) -> str:
        return f"{self.kind} meta.json: {self.reason}"

    def __reduce__(self):
        return (type(self), (self.path, self.reason, self.kind))


def _parse_meta(path: Path, text: str) -> dict[str, Any]:
    try:
        meta = json.loads(text)
    except RecursionError:
        raise MetaError(path, "nested too deeply to parse", "unreadable") from None
    except ValueError as e:
        raise MetaError(path, f"not valid JSON ({e})", "unreadable") from None
    if not isinstance(meta, dict):
        raise MetaError(path, f"it does not hold an object (a JSON {_kind(meta)})", "unreadable")
    return meta


def _kind(v: Any) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "boolean"
    if isinstance(v, (int, float)):
        return "number"
    if isinstance(v, str):
        return "string"
    if isinstance(v, list):
        return "array"
    if isinstance(v, dict):
        return "object"
    return type(v).__name__


def _show(v: Any, limit: int = 40) -> str:
    """A short description of a bad value: its JSON kind and, for a scalar, a clipped repr."""
    kind = _kind(v)
    article = "an" if kind[0] in "aeiou" else "a"
    if isinstance(v, (dict, list)):
        return f"{article} {kind}"
    r = repr(v)
    return f"{article} {kind} ({r if len(r) <= limit else r[:limit - 3] + '...'})"


def _is_str(v: Any) -> bool:
    return isinstance(v, str)


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v: Any) -> bool:
    import math

    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _is_bool(v: Any) -> bool:
    return isinstance(v, bool)


_OPT = {          # checker, what it expects (for the message); every field may also be null/absent
    "str": (_is_str, "a string"),
    "int": (_is_int, "an integer"),
    "num": (_is_num, "a finite number"),
    "bool": (_is_bool, "true or false"),
    "id": (lambda v: _is_str(v) or _is_int(v), "a string or an integer"),
}


def _depth(v: Any, limit: int) -> int:
    """How deeply ``v`` nests (iterative, stops counting past ``limit``)."""
    deepest, stack = 0, [(v, 1)]
    while stack:
        x, d = stack.pop()
        if isinstance(x, (dict, list)):
            deepest = max(deepest, d)
            if deepest > limit:
                return deepest
            stack.extend((y, d + 1) for y in (x.values() if isinstance(x, dict) else x))
    return deepest


def meta_problems(meta: Any) -> list[str]:
    """What is wrong with a parsed meta.json, one line per problem; ``[]`` when it is usable.

    Every field the report and the command line read is checked for its type (each may be
    absent or null): ``started_at``, ``finished_at`` (strings), ``duration_s`` (a finite
    number), ``device`` (a string), ``git`` {``sha``, ``short``: strings, ``dirty``: boolean},
    ``params`` {``profile``, ``device``, ``mode``: strings, ``studies``: {name: object},
    ``shard``: {``index``, ``count``: integers with 0 <= index < count, ``group``: string,
    ``cells``: {study: [cell value] or null (the whole study)}},
    ``gpus``: [integer]}, ``failures`` and ``warnings`` ([string]), ``resumed`` ([{``at``:
    string, ``studies``: [string], ``git``: string, ``dirty``: boolean, ``note``: string,
    ``failures``/``warnings``: [string], ``finished_at``: string, ``study_seconds``,
    ``placement``}]), ``placement`` ({study: {``gpu``, ``threads``: string or integer,
    ``seconds``: number}}), ``study_seconds`` ({study: number}). Other fields are free, but
    nothing may nest deeper than META_MAX_DEPTH levels."""
    if not isinstance(meta, dict):
        return [f"it does not hold an object (a JSON {_kind(meta)})"]
    problems: list[str] = []

    def scalar(obj: dict, key: str, kind: str, where: str) -> None:
        v = obj.get(key)
        check, expected = _OPT[kind]
        if v is not None and not check(v):
            problems.append(f"{where}{key} is {_show(v)}, not {expected}")

    def at(obj: dict, key: str, where: str, kind: type):
        """obj[key] when it is a ``kind`` (dict or list); None when absent, or wrong (noted)."""
        v = obj.get(key)
        if v is None:
            return None
        if not isinstance(v, kind):
            problems.append(f"{where}{key} is {_show(v)}, not {'an object' if kind is dict else 'a list'}")
            return None
        return v

    def obj_at(obj: dict, key: str, where: str) -> dict | None:
        return at(obj, key, where, dict)

    def list_at(obj: dict, key: str, where: str) -> list | None:
        return at(obj, key, where, list)

    def strings(obj: dict, key: str, where: str) -> None:
        items = list_at(obj, key, where)
        for i, x in enumerate(items or []):
            if not isinstance(x, str):
                problems.append(f"{where}{key}[{i}] is {_show(x)}, not a string")
                break

    def seconds_map(obj: dict, key: str, where: str) -> None:
        for name, v in (obj_at(obj, key, where) or {}).items():
            if not _is_num(v):
                problems.append(f"{where}{key}.{name} is {_show(v)}, not a finite number")
                break

    def placement(obj: dict, key: str, where: str) -> None:
        for name, v in (obj_at(obj, key, where) or {}).items():
            if not isinstance(v, dict):
                problems.append(f"{where}{key}.{name} is {_show(v)}, not an object")
                continue
            scalar(v, "gpu", "id", f"{where}{key}.{name}.")
            scalar(v, "threads", "id", f"{where}{key}.{name}.")
            scalar(v, "seconds", "num", f"{where}{key}.{name}.")

    depth = _depth(meta, META_MAX_DEPTH)
    if depth > META_MAX_DEPTH:
        return [f"it nests more than {META_MAX_DEPTH} levels deep"]

    scalar(meta, "schema", "int", "")
    for key in ("started_at", "finished_at", "device"):
        scalar(meta, key, "str", "")
    scalar(meta, "duration_s", "num", "")
    git = obj_at(meta, "git", "")
    if git is not None:
        scalar(git, "sha", "str", "git.")
        scalar(git, "short", "str", "git.")
        scalar(git, "dirty", "bool", "git.")
    params = obj_at(meta, "params", "")
    if params is not None:
        for key in ("profile", "device", "mode"):
            scalar(params, key, "str", "params.")
        for name, v in (obj_at(params, "studies", "params.") or {}).items():
            if not isinstance(v, dict):
                problems.append(f"params.studies.{name} is {_show(v)}, not an object")
        shard = obj_at(params, "shard", "params.")
        if shard is not None:
            n = len(problems)
            for key, kind in (("index", "int"), ("count", "int"), ("group", "str")):
                if shard.get(key) is None:
                    problems.append(f"params.shard.{key} is missing")
                else:
                    scalar(shard, key, kind, "params.shard.")
            if len(problems) == n and not 0 <= shard["index"] < shard["count"]:
                problems.append(f"params.shard is {shard['index']}/{shard['count']}, "
                                "not I/N with 0 <= I < N")
            for name, v in (obj_at(shard, "cells", "params.shard.") or {}).items():
                if v is not None and not isinstance(v, list):
                    problems.append(f"params.shard.cells.{name} is {_show(v)}, not a list or null")
        for i, g in enumerate(list_at(params, "gpus", "params.") or []):
            if not _is_int(g):
                problems.append(f"params.gpus[{i}] is {_show(g)}, not an integer")
                break
    strings(meta, "failures", "")
    strings(meta, "warnings", "")
    for i, entry in enumerate(list_at(meta, "resumed", "") or []):
        where = f"resumed[{i}]."
        if not isinstance(entry, dict):
            problems.append(f"resumed[{i}] is {_show(entry)}, not an object")
            continue
        for key in ("at", "git", "note", "finished_at"):
            scalar(entry, key, "str", where)
        scalar(entry, "dirty", "bool", where)
        for key in ("studies", "failures", "warnings"):
            strings(entry, key, where)
        seconds_map(entry, "study_seconds", where)
        placement(entry, "placement", where)
    placement(meta, "placement", "")
    seconds_map(meta, "study_seconds", "")
    return problems


def load_meta(run_dir: Path | str) -> dict[str, Any]:
    """``run_dir/meta.json``, read and checked (`meta_problems`); MetaError otherwise, whose
    message starts with the file's path and says what is wrong: missing, not a regular file (a
    link, a folder, a FIFO: `read_regular`), unreadable, larger than a meta.json ever is,
    not JSON (a RecursionError from deep nesting included), not an object, or fields of the
    wrong type (all of them, ``; `` between)."""
    path = Path(run_dir) / META_NAME
    try:
        text = read_regular(path, META_MAX_BYTES).decode("utf-8")
    except FileNotFoundError:
        raise MetaError(path, "no such file", "missing") from None
    except UnicodeDecodeError as e:
        raise MetaError(path, f"not UTF-8 text ({e})", "unreadable") from None
    except OSError as e:
        raise MetaError(path, f"cannot be read ({e.strerror or e})", "unreadable") from None
    meta = _parse_meta(path, text)
    problems = meta_problems(meta)
    if problems:
        raise MetaError(path, "; ".join(problems))
    return meta
