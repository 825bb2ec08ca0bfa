"""Provenance of a run: what code, which packages, which machine, when (`collect_meta`: the facts a
run's meta.json starts from). A missing git, repository, package or NVML is recorded, never raised."""
from __future__ import annotations

import datetime as _dt
import os
import platform
import socket
import subprocess
import sys
from contextlib import suppress
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent     # holds pyproject.toml and the workbench package
# Distribution names whose versions every run records (those installed).
# FlashAttention-4 and its CuTe libraries, where installed: a tower's attention on CUDA depends on them
PACKAGES = ("torch", "triton", "transformers", "numpy", "pandas", "pyarrow", "matplotlib", "papermill",
            "nvidia-ml-py", "flash-attn-4", "nvidia-cutlass-dsl", "quack-kernels", "workbench")
RESULTS_ENV = "WORKBENCH_RESULTS"
REFERENCE_DIRNAME = "reference"       # <results>/reference/: the committed reference runs
_GIT_TIMEOUT_S = 10


def results_root() -> Path:
    """Where run folders and the report live: ``$WORKBENCH_RESULTS``, else the project's ``results/``
    whatever the working directory (a notebook runs in notebooks/)."""
    env = os.environ.get(RESULTS_ENV)
    if not env:
        return REPO_ROOT / "results"
    try:
        return Path(env).expanduser()
    except RuntimeError:        # "~user/..." of a user this machine does not know
        raise ValueError(f"{RESULTS_ENV}={env!r}: its '~' names no home folder here; give an absolute path "
                         f"or ~/...") from None


def results_folder(results=None, what: str = "results") -> Path:
    """``results`` as the folder of run folders, `results_root()` where None. An empty or blank string is
    refused (ValueError naming ``what``): Path("") is the current folder, which a caller who passed "" never meant."""
    if results is None:
        return results_root()
    if isinstance(results, str) and not results.strip():
        raise ValueError(f"{what}={results!r} is empty; give the folder that holds the run folders, or None for "
                         f"{results_root()}")
    return Path(results)


def utc_now() -> _dt.datetime:
    return _dt.datetime.now(_dt.timezone.utc)


def iso_utc(t: _dt.datetime | None = None, timespec: str = "milliseconds") -> str:
    """``t`` (default: now) as the ISO text every record here uses: UTC with a ``Z``."""
    return (t or utc_now()).isoformat(timespec=timespec).replace("+00:00", "Z")


def _git(*args: str, cwd: Path) -> str:
    return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, timeout=_GIT_TIMEOUT_S,
                          check=True).stdout.strip()


def git_info(root: Path | str | None = None) -> dict[str, Any]:
    """Commit and dirty flag of the tree at ``root`` (default: the project's); ``sha`` None and an
    ``error`` where git is missing or ``root`` is in no repository. Ignored files (results/) are not dirt."""
    root = Path(root) if root is not None else REPO_ROOT
    try:
        top, sha = _git("rev-parse", "--show-toplevel", cwd=root), _git("rev-parse", "HEAD", cwd=root)
        changed = [line for line in _git("status", "--porcelain", cwd=root).splitlines() if line.strip()]
    except FileNotFoundError:
        return {"sha": None, "short": None, "dirty": None, "error": "git not installed"}
    except subprocess.CalledProcessError as e:
        reason = (e.stderr or "").strip().splitlines() or [f"git exited {e.returncode}"]
        return {"sha": None, "short": None, "dirty": None, "error": reason[0]}
    except (subprocess.TimeoutExpired, OSError) as e:
        return {"sha": None, "short": None, "dirty": None, "error": f"git failed: {e}"}
    info: dict[str, Any] = {"sha": sha, "short": sha[:7], "dirty": bool(changed), "root": top}
    if changed:
        info["changes"] = changed[:50]
    if len(changed) > 50:
        info["changes_truncated"] = len(changed) - 50
    with suppress(subprocess.SubprocessError, OSError):
        info["branch"] = _git("rev-parse", "--abbrev-ref", "HEAD", cwd=root)
    return info


def package_versions() -> dict[str, str]:
    """Installed versions of PACKAGES; packages that are not installed are left out."""
    from importlib import metadata
    versions: dict[str, str] = {}
    for name in PACKAGES:
        with suppress(metadata.PackageNotFoundError):
            versions[name] = metadata.version(name)
    return versions


def cpu_model() -> str:
    """The processor's marketing name where the OS tells it, else the architecture."""
    with suppress(OSError), open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
        for line in f:
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine() or "unknown"


def is_cpu(device: str) -> bool:
    """Whether a device name is a CPU's (torch_info's 'cpu: <model>'): a smoke test, not a measurement."""
    return str(device).strip().lower().startswith("cpu")


def torch_info() -> dict[str, Any]:
    """torch's own view: version, CUDA build, visible devices, and the device name runs use."""
    try:
        import torch
    except Exception as e:  # noqa: BLE001 - an unusable torch is a fact to record
        return {"available": False, "error": f"{type(e).__name__}: {e}", "device": f"cpu: {cpu_model()}"}
    info: dict[str, Any] = {"available": True, "version": torch.__version__, "cuda": torch.version.cuda,
                            "hip": getattr(torch.version, "hip", None), "num_threads": torch.get_num_threads(),
                            "cuda_available": _probe(lambda: bool(torch.cuda.is_available()), False)}
    if not info["cuda_available"]:
        info["device"] = f"cpu: {cpu_model()}"
        return info
    names = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    info.update(device_count=len(names), device_names=names,
                device=names[0] if len(names) == 1 else f"{len(names)}x {names[0]}")
    with suppress(Exception):
        info["cudnn"] = torch.backends.cudnn.version()
    return info


def _text(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def _probe(read, default=None):
    """``read()``, or ``default`` where it raises: not every field exists on every machine."""
    try:
        return read()
    except Exception:  # noqa: BLE001
        return default


def nvml_info() -> dict[str, Any] | str:
    """Driver version and per-GPU clocks via NVML; ``"unavailable (<reason>)"`` where it fails."""
    try:
        import pynvml
    except ImportError:
        return "unavailable (nvidia-ml-py is not installed)"
    try:
        pynvml.nvmlInit()           # NVMLError_LibraryNotFound, DriverNotLoaded, ... where there is none
        info: dict[str, Any] = {}
        try:
            info["driver"] = _text(pynvml.nvmlSystemGetDriverVersion())
        except Exception as e:  # noqa: BLE001
            info["driver"] = f"unavailable ({e})"
        with suppress(Exception):
            info["cuda_driver"] = pynvml.nvmlSystemGetCudaDriverVersion_v2()
        info["gpus"] = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
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
            info["gpus"].append({"index": i, **{key: _probe(read) for key, read in probes.items()}})
        return info
    except Exception as e:  # noqa: BLE001
        return f"unavailable ({_text(e) or type(e).__name__})"
    finally:
        with suppress(Exception):
            pynvml.nvmlShutdown()


def collect_meta(params: dict | None = None) -> dict[str, Any]:
    """Everything a run records about itself at its start, as the JSON data of a meta.json."""
    started = utc_now()
    tinfo = torch_info()
    return {
        "schema": 1, "started_at": iso_utc(started), "finished_at": None, "duration_s": None,
        "git": git_info(), "device": tinfo.get("device"), "packages": package_versions(),
        "python": platform.python_version(), "python_implementation": platform.python_implementation(),
        "executable": sys.executable, "platform": platform.platform(), "machine": platform.machine(),
        "cpu": cpu_model(), "cpu_count": os.cpu_count(), "hostname": socket.gethostname(),
        "torch": tinfo, "nvml": nvml_info(),
        "env": {k: os.environ[k] for k in ("CUDA_VISIBLE_DEVICES", "TRITON_INTERPRET", "CI") if k in os.environ},
        # a loaded host inflates every CPU timing: what else ran is part of the record
        "load_avg": {"start": load_average()},
        "params": dict(params or {}),
    }


def load_average() -> list[float] | None:
    """The host's 1, 5 and 15 minute load averages, or None where the OS has none."""
    with suppress(AttributeError, OSError):
        return [round(x, 2) for x in os.getloadavg()]
    return None
