"""An engine policy's option names checked against that release's own source, read statically.

``advise --engine-source PATH`` hands a source tree, an installed package or a released wheel; the
file that declares the options (`engines.EngineOptions.declared_in`) is parsed with `ast` (nothing is
imported or run) and every option name the advice prints must be declared there: a field of a class
(vLLM's ``CompilationConfig``) or a module-level name (SGLang's environment variables).
"""
from __future__ import annotations

import ast
import re
import zipfile
import zlib
from pathlib import Path

from . import engines

MAX_CONFIG_BYTES = 8 << 20


class EngineSourceError(ValueError):
    """A PATH that is not the engine's tree or wheel, or that lacks the declaring file."""


def _declaring_file(path: Path, rel: str) -> tuple[bytes, str | None]:
    """(the bytes of ``rel`` under ``path``, the version a wheel's name says or None)."""
    if path.is_file() and zipfile.is_zipfile(path):
        try:
            return _from_wheel(path, rel)
        except ZIP_ERRORS as e:      # a corrupt, encrypted or oddly compressed member: named, no traceback
            raise EngineSourceError(f"--engine-source {path}: the wheel cannot be read ({type(e).__name__}: "
                                    f"{str(e)[:200]}); download it again (pip download PKG==VERSION --no-deps)"
                                    ) from None
    if not path.is_dir():
        raise EngineSourceError(f"--engine-source {path}: not a folder or a wheel; give the engine's source tree, "
                                f"its installed package folder or a released wheel")
    parts = Path(rel).parts
    for cand in (path.joinpath(*parts), path.joinpath(*parts[1:]), path.joinpath(*parts[2:])):
        if cand.is_file():
            if cand.stat().st_size > MAX_CONFIG_BYTES:
                raise EngineSourceError(f"--engine-source {path}: {cand} is over {MAX_CONFIG_BYTES} bytes")
            return cand.read_bytes(), None
    raise EngineSourceError(f"--engine-source {path}: no {rel} under it (nor its last parts); is it the engine's "
                            f"tree or package folder?")


# what reading a member of a damaged zip raises besides BadZipFile: a corrupt deflate stream (zlib.error), an
# encrypted member (RuntimeError), a compression method zipfile lacks (NotImplementedError), a cut stream (EOFError)
ZIP_ERRORS = (zipfile.BadZipFile, zlib.error, RuntimeError, NotImplementedError, EOFError, OSError)


def _from_wheel(path: Path, rel: str) -> tuple[bytes, str | None]:
    with zipfile.ZipFile(path) as z:
        names = {n for n in z.namelist() if n.endswith(rel)}
        if not names:
            raise EngineSourceError(f"--engine-source {path}: the wheel has no {rel}; give a wheel of the engine "
                                    f"the policy names (pip download PKG==VERSION --no-deps)")
        name = min(names, key=len)
        if z.getinfo(name).file_size > MAX_CONFIG_BYTES:
            raise EngineSourceError(f"--engine-source {path}: {name} is over {MAX_CONFIG_BYTES} bytes")
        m = re.match(r"[A-Za-z_]+-([0-9][^-]*)-", path.name)
        return z.read(name), m.group(1) if m else None


def declared_names(source: bytes) -> set[str]:
    """Class fields and module-level names a Python file declares."""
    try:
        tree = ast.parse(source.decode("utf-8-sig"))
    except (SyntaxError, ValueError, RecursionError) as e:
        raise EngineSourceError(f"the declaring file does not parse ({type(e).__name__})") from None
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            out.add(node.target.id)
        elif isinstance(node, ast.Assign):
            out |= {t.id for t in node.targets if isinstance(t, ast.Name)}
    return out


def check_options(engine, source) -> str:
    """Every option name of ``engine``'s policy declared in ``source``'s declaring file: a line saying so
    (with the wheel's version where it names one); EngineSourceError naming the missing names otherwise."""
    policy = engines.get(engine)
    path = Path(source).expanduser()
    if not path.exists():
        raise EngineSourceError(f"--engine-source {path}: no such file or folder")
    data, version = _declaring_file(path, policy.options.declared_in)
    missing = [n for n in policy.options.names() if n not in declared_names(data)]
    if missing:
        raise EngineSourceError(f"--engine-source {path}: {policy.options.declared_in} declares none of "
                                f"{missing}, which {policy.name} names; is it {policy.engine} {policy.version}? "
                                f"(valid engines: {', '.join(engines.ENGINES)})")
    if version is not None and version != policy.version:
        raise EngineSourceError(f"--engine-source {path} is {policy.engine} {version}, the policy {policy.name} is "
                                f"{policy.version}; give that release's wheel or pick the matching --engine")
    return (f"option names checked against {path.name} ({policy.options.declared_in}"
            f"{', ' + version if version else ''}): {', '.join(policy.options.names())}")
