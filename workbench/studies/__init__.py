"""The registry of studies. A study is a folder, ``studies/<name>/``:

- ``params.py``: its parameter declaration ``PARAMS = ParamSpec(Param(...), ...)``
  (workbench.studies.params) and the names it takes, torch-free: the notebook's ``parameters``
  cell is generated from it, the sweep checks every ``--set`` against it before a run folder
  exists, ``--help`` lists it, and its resolved values are what meta.json records;
- ``measure.py``: ``run(device="auto", progress=True, **params) -> DataFrame``, which resolves
  ``params`` against the declaration (`begin_run`: the device's profile supplies the defaults),
  measures and returns one tidy long table (workbench.results.tables); it never plots nor writes;
- ``summary.py``: the figures, key numbers and findings, declared as ``summarize =
  Summarizer(...)`` (`Summarizer`); ``summarize(table, out_dir) -> Summary`` turns the tables of
  every run found into the report's section, and never runs a model;
- ``__init__.py``: the question it answers (its docstring explains the study once) and
  ``register(Study(...))``, whose ``run`` and ``summarize`` import ``measure`` and ``summary``
  only when called.

Its notebook ``notebooks/<name>.ipynb`` is thin: the generated parameters cell,
`notebook_params`, `run_and_save` (the run function, then `save_table`) and the summary's plots.
``discover()`` imports every study folder (each registers itself), so a new study is picked up
by the sweep, the report and the command line without touching them. ``STUDIES`` maps name ->
Study.
"""
from __future__ import annotations

import importlib
import pkgutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

from ..registry import register_once

from .params import GPU_PROFILES, PROFILES, Param, ParamError, ParamSpec

__all__ = ["GPU_PROFILES", "PROFILES", "Param", "ParamError", "ParamSpec", "Study", "Summarizer", "Summary", "STUDIES", "register",
           "discover", "preset_parts", "default_profile", "profile_of", "RunSetup", "begin_run", "notebook_params", "run_and_save", "save_table", "TableError",
           "check_table", "load_table", "tidy", "wide", "write_study_table"]


@dataclass
class Summary:
    """What a study's summarize function gives the report: the finding in a few sentences
    (plain text, paragraphs separated by blank lines), the figure files (PNG/SVG) it saved, as
    absolute paths or paths relative to the ``out_dir`` it was given (an absolute folder), and
    small tables of the key numbers (columns named with their units)."""

    text: str
    figures: list[Path] = field(default_factory=list)
    tables: list[tuple[str, Any]] = field(default_factory=list)   # (caption, pandas DataFrame) to show
    captions: dict[str, str] = field(default_factory=dict)         # figure file name -> what it shows
    # figure file name -> the group it belongs to (a run, a tower of a run): the report shows the
    # first group's figures and folds the others'
    groups: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Summarizer:
    """A study's summary declaration (in its ``summary.py``), called as ``summarize(table,
    out_dir) -> Summary``: the figures per run (``(stem, plot, caption)``: ``plot(rows of one run)
    -> Figure | None``, saved as PNG and SVG), key-number tables per device with their caption
    (formatted with device=...), the finding, and ``prepare(table) -> table`` where the study
    reshapes its table first. A study with one tower per preset (``per_preset``) draws each
    preset's figures on their own."""

    findings: Callable[[Any], str]
    figures: tuple[tuple, ...] = ()
    key_numbers: Callable[[Any], Mapping[str, Any]] | None = None
    key_caption: str = ""
    prepare: Callable[[Any], Any] | None = None
    per_preset: bool = False

    def __call__(self, table: Any, out_dir: Path) -> Summary:
        from .plotting import figures_by_run

        if self.prepare is not None:
            table = self.prepare(table)
        tables = ([(self.key_caption.format(device=dev), t) for dev, t in self.key_numbers(table).items()]
                  if self.key_numbers is not None else [])
        out = Summary(text=self.findings(table), tables=tables)
        for preset, heading, rows in preset_parts(table) if self.per_preset else [("", "", table)]:
            figures, captions, runs = figures_by_run(rows, out_dir, self.figures, suffix=preset)
            out.figures += figures
            out.captions.update({f: heading + c for f, c in captions.items()})
            out.groups.update({f: f"{heading}run {run}" for f, run in runs.items()})
        return out


class _Part:
    """A function of a study's folder, imported when first called (``measure.run`` imports torch;
    the registry must not). Its ``__module__`` is the study's package, where the study was defined."""

    def __init__(self, package: str, module: str, name: str):
        self.__module__, self._module, self._name = package, f"{package}.{module}", name

    def __call__(self, *args, **kw):
        return getattr(importlib.import_module(self._module), self._name)(*args, **kw)

    def __repr__(self) -> str:
        return f"<{self._module}.{self._name}>"


def part_module(fn) -> str | None:
    """The module a study's part (``summarize``, ``measure``...) is defined in, when it is one of a study's
    folder (imported lazily); None for any other callable."""
    return fn._module if isinstance(fn, _Part) else None


@dataclass(frozen=True)
class Study:
    """One study, as its folder registers it (``studies/<name>/__init__.py``): the declaration
    (torch-free), and ``run`` / ``summarize`` / ``footprint``, which import the folder's
    ``measure`` and ``summary`` modules only when called."""

    name: str
    notebook: str                               # path relative to the project root
    params: ParamSpec                           # the one declaration of its parameters
    # the study's folder (a package): run and summarize default to its measure.run and
    # summary.summarize, imported when first called
    package: str | None = None
    run: Callable[..., Any] | None = None       # run(device=..., **params) -> tidy DataFrame
    summarize: Callable[[Any, Path], Summary | str] | None = None
    question: str = ""
    # where its section goes in the report: correctness first, then what the right placements cost
    order: float = float("inf")
    # the list parameter whose elements are independent cells (each can run on its own, on another
    # host of a sharded sweep: workbench.sweep); None: the study is one cell
    cells: str | None = None
    # its table holds one tower per preset: the report gives each family its own view
    per_preset: bool = False
    # GPUs one run of the study uses with these resolved params on this device ("cuda" / "cpu");
    # None: one. `sweep --gpus` gives each study one GPU and warns about those that want more.
    gpus: Callable[[Mapping[str, Any], str], int] | None = None
    # estimated peak memory of its largest cell with these resolved params on "cuda" / "cpu"
    # (workbench.studies.footprint); the sweep refuses a plan whose cell cannot fit the device
    footprint: Callable[[Mapping[str, Any], str], Any] | None = None
    # seconds its defaults take per profile ("cpu": in a worker of `sweep --workers 2` on 2 idle cores, one thread),
    # for a sweep no earlier run has timed: the prediction it prints, and the order workers take the studies in
    guess_s: Mapping[str, float] | None = None
    # the parameter columns its summaries and the advice read: a table without one of them (someone else's run
    # folder, an older format) is listed with the reason and left out, and the rest of the runs still show
    columns: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        for field_name, module, attr in (("run", "measure", "run"), ("summarize", "summary", "summarize")):
            if getattr(self, field_name) is None:
                if self.package is None:
                    raise ValueError(f"study {self.name!r} gives neither {field_name} nor its package")
                object.__setattr__(self, field_name, _Part(self.package, module, attr))

    def gpus_wanted(self, params: Mapping[str, Any], device: str) -> int:
        return 1 if self.gpus is None else int(self.gpus(params, device))

    def cost(self, params: Mapping[str, Any]) -> dict[Any, float]:
        """{value of the cell parameter: relative cost of that cell} (`footprint.cell_costs`: tower FLOPs from the
        family specs); {} for a study of one cell. The sweep's prediction and sharding weigh cells by it."""
        from .footprint import cell_costs
        return cell_costs(self.cells, params)

    def check_fits(self, params: Mapping[str, Any], device: str) -> None:
        """ParamError when the largest cell of ``params`` cannot fit ``device``'s memory."""
        if self.footprint is not None:
            from .footprint import check_fits
            check_fits(self.name, self.footprint(params, device), device)

    def resolve(self, profile: str, overrides: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """The profile's defaults with ``overrides`` applied, every value checked (ParamError)."""
        return self.params.resolve(overrides, profile, study=self.name)


def preset_parts(table: Any) -> list[tuple[str, str, Any]]:
    """(preset, heading, rows) per preset of a table that holds several (heading: 'Family,
    preset: ' where there are several, else empty), in family then preset order."""
    from .plotting import preset_groups

    if "preset" not in table or table["preset"].nunique() < 2:
        return [("", "", table)]
    return [(preset, f"{fam + ', ' if fam else ''}{preset}: ", rows) for fam, preset, rows in preset_groups(table)]


STUDIES: dict[str, Study] = {}
_TABLES = ("TableError", "check_table", "load_table", "tidy", "wide", "write_study_table")


def __getattr__(name: str):
    """The table helpers (workbench.results.tables, which imports pandas) on first use."""
    if name in _TABLES:
        from ..results import tables
        return getattr(tables, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def register(study: Study) -> Study:
    """Add ``study`` to STUDIES. Registering the same name twice from different objects is an
    error (re-importing the same module is not)."""
    return register_once(STUDIES, study, "study", "run")


def discover() -> dict[str, Study]:
    """Import every study folder of this package (each registers itself) and return STUDIES."""
    for mod in pkgutil.iter_modules(__path__):
        if mod.ispkg and not mod.name.startswith("_"):
            importlib.import_module(f"{__name__}.{mod.name}")
    return STUDIES


def default_profile() -> str:
    """``gpu`` where torch sees a CUDA device, else ``cpu``."""
    try:
        import torch

        return "gpu" if torch.cuda.is_available() else "cpu"
    except Exception:  # noqa: BLE001
        return "cpu"


def profile_of(device: Any) -> str:
    """The parameter profile that suits a device: ``gpu`` for CUDA (or ``auto`` on a CUDA host)."""
    name = str(device)
    if name == "auto" or device is None:
        return default_profile()
    return "gpu" if name.startswith("cuda") else "cpu"


@dataclass(frozen=True)
class RunSetup:
    """What every run function starts from: the device, the resolved parameters (the device's
    profile supplies the defaults) and the device label its table rows carry."""

    device: Any                                 # torch.device
    params: dict[str, Any]
    label: str

    @property
    def dtype(self):
        """The tower dtype of the ``dtype`` parameter."""
        from ..encoder import resolve_dtype
        return resolve_dtype(self.params["dtype"])

    def config(self, preset: str | None = None):
        """The ``preset`` parameter's config (or ``preset``'s) at the ``depth`` parameter."""
        from ..checkpoints import resolve_config
        return resolve_config(preset or self.params["preset"], self.params["depth"])

    def per_preset(self, measure: Callable[["RunSetup"], Any]) -> Any:
        """``measure(setup)`` once per element of the ``presets`` parameter, each seeing that one
        as ``params["preset"]``; their tables concatenated in that order (a study whose presets
        are independent cells)."""
        import dataclasses

        import pandas as pd

        return pd.concat([measure(dataclasses.replace(self, params={**self.params, "preset": preset}))
                          for preset in self.params["presets"]], ignore_index=True)


def begin_run(spec: ParamSpec, study: str, device: Any, params: Mapping[str, Any]) -> RunSetup:
    """A run function's first step: ``device`` resolved ('auto' -> CUDA where present), then
    ``params`` checked against ``spec`` for that device's profile (ParamError)."""
    from ..encoder import resolve_device
    from ..formatting import device_label

    dev = resolve_device(device)
    return RunSetup(dev, spec.resolve(params, profile_of(dev), study=study), device_label(dev))


_NOTEBOOK_STARTED: dict[str, Any] = {}


def notebook_params(name: str, namespace: Mapping[str, Any]) -> dict[str, Any]:
    """The study's declared parameters from a notebook's globals, checked and coerced (the cell
    after ``parameters`` calls this, so a bad papermill value fails before any work). It also
    notes the time, which `save_table` records as the run's start."""
    import warnings

    from ..provenance import utc_now

    # a kernel without ipywidgets: tqdm.auto (which transformers imports) warns once per notebook
    # that it falls back to text bars; the studies' own bars already choose text there
    warnings.filterwarnings("ignore", message="IProgress not found")
    study = discover()[name]
    params = study.params.from_namespace(namespace, study=name)
    _NOTEBOOK_STARTED[name] = utc_now()
    return params


def save_table(study_name: str, table: Any, run_dir: str | Path | None = None,
               params: Mapping[str, Any] | None = None, results_root: str | Path | None = None) -> Path:
    """A study's table saved by the results store (`workbench.results.save_table`), the notebook's start
    time recorded as the run's where `notebook_params` noted one."""
    from ..results import save_table as store_save
    return store_save(study_name, table, run_dir, params=params, results_root=results_root,
                      started=_NOTEBOOK_STARTED.pop(study_name, None))


def run_study(study_name: str, params: Mapping[str, Any], device: Any = "auto",
              run_dir: str | Path | None = None, progress: bool = True) -> tuple[Any, Path]:
    """The one way a study runs, from the sweep and from a notebook alike: its largest cell checked against the
    device's memory, its measure (``study.run``, which checks ``params`` for the device's profile), its table
    written by the results store (`save_table`); returns (table, path).

    In a run folder that already holds this study's table (a resumed run whose notebook stopped after saving it:
    killed, or a later cell raised) the recorded table is loaded instead of measured again: a finished table is
    never replaced, and a resume must not measure twice."""
    from ..results import RunFolder
    if run_dir is not None:
        path = RunFolder(Path(run_dir)).table(study_name)
        if path.is_file():
            print(f"{path}: this run recorded the table already; it is loaded, not measured again")
            from ..results.tables import load_table
            return load_table(path), path
    studies = discover()
    if study_name not in studies:
        raise ParamError(f"no study {study_name!r}; registered: {', '.join(sorted(studies))}")
    study = studies[study_name]
    study.check_fits(params, "cuda" if profile_of(device) == "gpu" else "cpu")
    table = study.run(device=device, progress=progress, **params)
    return table, save_table(study_name, table, run_dir, params={**params, "device": device})
