"""The notebook path: what running a study as a papermill notebook alone needs. Its Jupyter kernel, the notebook
executed into the run folder (its parameters injected by papermill; the notebook itself calls
`workbench.studies.run_study`, as the sweep does, so both ways write the same table through the same code), its HTML
export, the ``parameters`` cells kept in step with the declarations (the ``notebooks`` command), and the sanitizer
that cleans an executed notebook's HTML before the report links a copy."""
from __future__ import annotations

import importlib.util
import json
import os
import re
import sys
import urllib.parse
from pathlib import Path
from typing import Any

from .files import atomic_write_text
from .provenance import REPO_ROOT

PROJECT_KERNEL = "workbench"          # "Python (workbench)": `make lab` registers it inside the venv
FALLBACK_KERNEL = "python3"           # what a fresh venv (CI, a GPU host's bundle) has


def run_notebook(study: Any, params: dict[str, Any], device: str, run_dir: Path, kernel: str) -> None:
    """Execute the study's notebook with ``params`` into ``<run_dir>/<study>.ipynb``."""
    nb = REPO_ROOT / study.notebook
    if not nb.is_file():
        raise FileNotFoundError(f"notebook {study.notebook} is missing (--direct skips notebooks)")
    try:
        import papermill as pm
    except ImportError as e:
        raise RuntimeError("papermill is not installed (make setup, or make wheels on a GPU "
                           "host; --direct runs studies without notebooks)") from e
    from .studies.plotting import PROGRESS_ENV
    os.environ[PROGRESS_ENV] = "0"      # the kernel inherits it: no progress bars in the executed notebook
    pm.execute_notebook(str(nb), str(run_dir / f"{study.name}.ipynb"),
                        parameters={**params, "device": device, "run_dir": str(run_dir.resolve())},
                        kernel_name=kernel, cwd=str(REPO_ROOT),
                        progress_bar=sys.stderr.isatty(),  # in a log file a bar's carriage returns are noise
                        # the kernel's own log (a transport warning, an interrupt at shutdown) is not the study's
                        extra_arguments=["--IPKernelApp.log_level=CRITICAL"])


def export_html(notebook: Path) -> str | None:
    """``<study>.html`` beside the executed notebook; the problem, for the run to record, where that fails."""
    try:
        import nbconvert
        import nbformat
        body, _ = nbconvert.HTMLExporter().from_notebook_node(nbformat.read(str(notebook), as_version=4))
        atomic_write_text(notebook.with_suffix(".html"), body)
    except Exception as e:  # noqa: BLE001 - the measurement is done; only its readable copy is missing
        return f"{notebook.stem}: no HTML export ({type(e).__name__}: {e})"
    return None


def sync_notebook(study: Any, check: bool = False) -> bool:
    """Whether the declared parameters changed (``check``: would change) the notebook's ``parameters`` cell."""
    path = REPO_ROOT / study.notebook
    doc = json.loads(path.read_text(encoding="utf-8"))
    tagged = [c for c in doc["cells"]
              if c["cell_type"] == "code" and "parameters" in c.get("metadata", {}).get("tags", [])]
    if len(tagged) != 1:
        raise ValueError(f"expected one cell tagged 'parameters', found {len(tagged)}")
    text = study.params.parameters_cell()
    if "".join(tagged[0]["source"]) == text:
        return False
    if not check:
        tagged[0]["source"] = text.splitlines(keepends=True)
        path.write_text(json.dumps(doc, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    return True


def default_kernel() -> str:
    """The project's kernel where it is registered and starts this very interpreter, else python3."""
    try:   # no such kernel, or any other problem: the kernel choice must never stop a sweep
        from jupyter_client.kernelspec import KernelSpecManager
        exe = (KernelSpecManager().get_kernel_spec(PROJECT_KERNEL).argv or [""])[0]
        same = exe in ("python", "python3") or (os.path.exists(exe) and os.path.samefile(exe, sys.executable))
        return PROJECT_KERNEL if same else FALLBACK_KERNEL
    except Exception:  # noqa: BLE001
        return FALLBACK_KERNEL


def check_kernel(name: str) -> None:
    """SystemExit where papermill's Jupyter kernel ``name`` is not installed."""
    try:
        from jupyter_client.kernelspec import KernelSpecManager
    except ImportError:
        return          # no jupyter_client: the notebook stage records why it cannot run
    known = sorted(KernelSpecManager().find_kernel_specs())
    if name not in known:
        raise SystemExit(f"--kernel {name!r}: no Jupyter kernel of that name; installed: {known or 'none'} "
                         f"(make lab registers {PROJECT_KERNEL!r}; --direct runs without notebooks)")


# ---- the sanitizer of executed notebooks' HTML ------------------------------------------------------------

LOCALIZED_NOTE = ("<!-- copied into the workbench report and cleaned by an allow-list (nh3): no script, "
                  "event attribute, frame, plugin or form, no link that runs code, nothing loaded from "
                  "outside the report folder (math shows as TeX source) -->\n")
# the page's own rule, for a browser: nothing runs, nothing loads from elsewhere
_CSP = ("<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; style-src 'unsafe-inline'; "
        "img-src data: 'self'; font-src data:; form-action 'none'; base-uri 'none'\">\n")
NO_SANITIZER = ("executed notebooks' HTML is not copied into the report: the HTML sanitizer nh3 is not "
                "installed (pip install nh3), and a notebook's HTML is never copied unsanitized")

# what nbconvert's export of an executed notebook is made of: text, code, tables, images
_TAGS = {"a", "abbr", "b", "blockquote", "br", "caption", "code", "col", "colgroup", "dd", "del", "details",
         "div", "dl", "dt", "em", "figcaption", "figure", "h1", "h2", "h3", "h4", "h5", "h6", "hr", "i", "img",
         "kbd", "li", "main", "ol", "p", "pre", "s", "samp", "small", "span", "strong", "style", "sub",
         "summary", "sup", "table", "tbody", "td", "tfoot", "th", "thead", "title", "tr", "u", "ul", "var"}
_ATTRIBUTES = {"*": {"class", "id", "title"}, "a": {"href"}, "img": {"src", "alt", "width", "height"},
               "td": {"colspan", "rowspan"}, "th": {"colspan", "rowspan"}, "ol": {"start"}}
_DROPPED_WITH_CONTENT = {"script", "svg", "math", "iframe", "object", "noscript", "template"}
_IMAGE_DATA = tuple(f"data:image/{t}{sep}" for t in ("png", "jpeg", "gif", "svg+xml") for sep in ";,")
_CSS_ESCAPE = re.compile(r"\\([0-9a-fA-F]{1,6})\s?|\\(.)", re.S)
_CSS_COMMENT = re.compile(r"/\*.*?(?:\*/|$)", re.S)
_CSS_LOADS = re.compile(r"@import|(?:image-set|image|cross-fade|element|src|expression)\(|"
                        r"url\(\s*(?!['\"]?\s*data:)|-moz-binding|(?<![\w-])behavior\s*:", re.I)
# a <style> start tag as an HTML tokenizer reads it: any case, any attributes, a quoted value may hold '>'
_STYLE_NAME = re.compile(r"<style(?=[\s/>])", re.I)
_STYLE_TAG = re.compile(r"<style(?:\s++|/|[^\s/>][^\s/>=]*+(?:\s*+=\s*+(?:\"[^\"]*+\"|'[^']*+'|[^\s>]*+))?+)*+>",
                        re.I)
_STYLE_END = re.compile(r"</style(?=[\s/>])[^>]*+>?", re.I)


def _attribute(tag: str, name: str, value: str) -> str | None:
    """An image only embedded or in the folder, a link only to http(s) or the folder (not ``//host``); no
    attribute on ``<style>`` (`strip_loading_styles` reads every style element, but one form is simpler to check)."""
    if tag == "style":
        return None
    url = "".join(value.split()).lower()
    if name not in ("href", "src") or url.startswith(_IMAGE_DATA if name == "src" else ("http://", "https://")):
        return value
    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError:
        return None
    return None if parts.scheme or parts.netloc or url.startswith(("/", "\\")) else value


def css_loads(css: str) -> bool:
    """Whether CSS text may load something (``@import``, ``url(`` other than ``data:``, ``image-set(``...), read
    with its escapes undone (``\\75 rl(`` is ``url(``), with and without its comments."""
    plain = _CSS_ESCAPE.sub(lambda e: chr(min(int(e[1], 16), 0x10FFFF)) if e[1] else e[2], css)
    return any(_CSS_LOADS.search(t) for t in (css, plain, _CSS_COMMENT.sub("", plain)))


def strip_loading_styles(text: str) -> str:
    """``text`` (HTML) with every ``<style>`` element, whatever its case and attributes, kept as a bare
    ``<style>`` where its start tag and content load nothing (`css_loads`) and removed where they may. The
    element ends where a browser ends it (``</style`` or the end of the text); a start tag never closed is
    dropped with the rest of the text, as a browser drops it. Why: the copy claims nothing loads from
    elsewhere, and a regular expression for ``<style>`` alone missed ``<style media=...>`` and its kin."""
    out: list[str] = []
    pos = 0
    while (m := _STYLE_NAME.search(text, pos)) is not None:
        out.append(text[pos:m.start()])
        tag = _STYLE_TAG.match(text, m.start())
        if tag is None:
            return "".join(out)
        end = _STYLE_END.search(text, tag.end())
        stop, body_end = (end.end(), end.start()) if end else (len(text), len(text))
        if not css_loads(text[m.start():stop]):
            out.append(f"<style>{text[tag.end():body_end]}</style>")
        pos = stop
    out.append(text[pos:])
    return "".join(out)


def localize_html(text: str) -> str:
    """A notebook's HTML export cleaned by an allow-list (nh3), each ``<style>`` kept where it loads nothing
    (`strip_loading_styles`)."""
    import nh3

    clean = nh3.clean(text, tags=_TAGS, clean_content_tags=_DROPPED_WITH_CONTENT, attributes=_ATTRIBUTES,
                      attribute_filter=_attribute, url_schemes={"http", "https", "data"})
    clean = strip_loading_styles(clean)
    return '<!doctype html>\n<meta charset="utf-8">\n' + _CSP + LOCALIZED_NOTE + clean


def nh3_missing() -> bool:
    return importlib.util.find_spec("nh3") is None
