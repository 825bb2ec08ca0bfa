"""What the page links, copied into the report folder so it can be zipped and shared: each run's
meta.json and its executed notebooks' HTML, cleaned by an allow-list (nh3): nothing runs, nothing
loads from outside the folder. Without nh3 no notebook HTML is copied, and the page says so.
"""
from __future__ import annotations

import re
import urllib.parse
from pathlib import Path

from ..files import atomic_write_text, read_regular
from ..runmeta import META_NAME
from .runs import Run, _why

RUNS_DIRNAME = "runs"                # <report>/runs/<run folder>/: copies of what the page links
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
_CSS_LOADS = re.compile(r"@import|(?:image-set|image|cross-fade|element|src)\(|url\(\s*(?!['\"]?\s*data:)", re.I)


def _relative(url: str) -> bool:
    """Whether ``url`` is a path inside the folder: no scheme, no host, not from the root (``//host``
    and ``\\\\host`` reach other machines)."""
    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError:
        return False
    return not (parts.scheme or parts.netloc or url.startswith(("/", "\\")))


def _attribute(tag: str, name: str, value: str) -> str | None:
    """nh3's last word on an allowed attribute: an image only embedded (PNG, JPEG, GIF, SVG) or in the
    folder, a link only to http(s) or the folder."""
    if name not in ("href", "src"):
        return value
    url = "".join(value.split()).lower()
    allowed = _IMAGE_DATA if name == "src" else ("http://", "https://")
    return value if url.startswith(allowed) or _relative(url) else None


def _loads_nothing(css: str) -> bool:
    """Whether a stylesheet loads nothing, read with its escapes undone (``\\75 rl(`` is ``url(``)."""
    plain = _CSS_ESCAPE.sub(lambda m: chr(min(int(m[1], 16), 0x10FFFF)) if m[1] else m[2], css)
    return not _CSS_LOADS.search(plain)


def localize_html(text: str) -> str:
    """An executed notebook's HTML export, cleaned by an allow-list (nh3) so that it runs nothing and
    loads nothing from outside the report folder: scripts (nbconvert's load require.js and MathJax from
    CDNs), inline SVG and MathML, frames and plugins dropped with their content; ``<style>`` kept where
    it loads nothing. ImportError where nh3 is not installed."""
    import nh3

    clean = nh3.clean(text, tags=_TAGS, clean_content_tags=_DROPPED_WITH_CONTENT, attributes=_ATTRIBUTES,
                      attribute_filter=_attribute, url_schemes={"http", "https", "data"})
    clean = re.sub(r"<style>(.*?)</style>", lambda m: m[0] if _loads_nothing(m[1]) else "", clean, flags=re.S)
    return '<!doctype html>\n<meta charset="utf-8">\n' + _CSP + LOCALIZED_NOTE + clean


def nh3_missing() -> bool:
    try:
        import nh3  # noqa: F401
    except ImportError:
        return True
    return False


def copy_linked(root: Path, runs: list[Run]) -> dict[tuple[str, str], str]:
    """Copies of each run's meta.json and executed notebooks' HTML (cleaned; none without nh3) under
    ``runs/<run folder>/``: {(run folder, "meta.json" | study): path relative to ``root``}. A file that
    cannot be read is added to its run's ``skipped``."""
    links: dict[tuple[str, str], str] = {}
    notebooks = not nh3_missing()
    for r in (r for r in runs if not r.path.is_symlink()):       # a link to a folder elsewhere: none of it
        names = [META_NAME] + ([f"{study}.html" for study in r.tables] if notebooks else [])
        for name in (n for n in names if n not in r.skipped):
            try:
                text = read_regular(r.path / name).decode("utf-8", errors="replace")
            except FileNotFoundError:
                continue
            except OSError as e:
                r.skipped[name] = _why(e)
                continue
            target = root / RUNS_DIRNAME / r.name / name
            atomic_write_text(target, text if name == META_NAME else localize_html(text))
            key = "meta.json" if name == META_NAME else name[:-len(".html")]
            links[(r.name, key)] = target.relative_to(root).as_posix()
    return links
