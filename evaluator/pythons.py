"""The interpreters a run may choose: the default one, and those the operator lists or uv finds.

``EVALUATOR_PYTHONS`` names them as paths or as versions uv can find (``3.12``); unset, they
are the interpreters uv would find on this host (those it manages, and ``python3.N`` on
``PATH``), one per minor version (the default interpreter keeps its own). Each is asked its
version once, at start; one that does not run is left out, and said so.
"""

from __future__ import annotations

import glob
import logging
import os
import re
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass

from .errors import SandboxUnavailable

__all__ = ["Interpreter", "find_uv", "interpreters", "version_of"]

log = logging.getLogger(__name__)

_VERSION = "import sys; print('%d.%d.%d' % sys.version_info[:3])"
_NAMED = re.compile(r"python(3\.[0-9]+)")
_PLAIN_VERSION = re.compile(r"[0-9]+(\.[0-9]+){0,2}")
#: The oldest Python a run may choose: the agent (:mod:`._agent`) runs on it.
OLDEST = (3, 10)


@dataclass(frozen=True)
class Interpreter:
    """``path`` runs CPython ``version`` (``3.13.0``); ``default``: the evaluator's own."""

    path: str
    version: str
    default: bool = False

    @property
    def minor(self) -> str:
        """``3.13``."""
        return ".".join(self.version.split(".")[:2])


def find_uv(configured: str | None) -> str | None:
    """The uv executable: ``configured``, else ``uv`` from PATH, else the ``uv`` wheel's."""
    if configured is not None:
        return shutil.which(configured)
    found = shutil.which("uv")
    if found is not None:
        return found
    try:
        import uv  # type: ignore[import-not-found,import-untyped,unused-ignore]

        path: str = uv.find_uv_bin()
        return path
    except (ImportError, FileNotFoundError):
        return None


def version_of(path: str) -> str:
    """The ``X.Y.Z`` version ``path`` runs.

    Raises:
        SandboxUnavailable: it does not run, or says no version.
    """
    try:
        out = subprocess.run(
            [path, "-I", "-S", "-c", _VERSION],
            capture_output=True, text=True, timeout=30, check=True,
        ).stdout.strip()  # fmt: skip
    except (OSError, subprocess.SubprocessError) as exc:
        raise SandboxUnavailable(f"the interpreter {path!r} does not run: {exc}") from exc
    if not _PLAIN_VERSION.fullmatch(out):
        raise SandboxUnavailable(f"the interpreter {path!r} says its version is {out[:80]!r}")
    return out


def interpreters(
    default: str, wanted: Sequence[str] | None, uv: str | None
) -> tuple[Interpreter, ...]:
    """The default interpreter, then each of ``wanted`` (``None``: those uv finds) not already
    offered for its minor version.

    An entry that is not found or does not run is left out, with a warning; an explicit
    entry that names the default interpreter's minor version is the default.
    """
    offered = [Interpreter(default, version_of(default), default=True)]
    if wanted is None:
        candidates = _found_on_host()
    else:
        candidates = [path for entry in wanted if (path := _located(entry, uv)) is not None]
    for path in candidates:
        named = _NAMED.fullmatch(os.path.basename(path))
        if named is not None and any(o.minor == named[1] for o in offered):
            continue  # one of that version is offered already: not even asked
        try:
            interpreter = Interpreter(path, version_of(path))
        except SandboxUnavailable as exc:
            log.warning("an interpreter of EVALUATOR_PYTHONS is left out: %s", exc)
            continue
        if tuple(map(int, interpreter.version.split(".")[:2])) < OLDEST:
            if wanted is not None:
                log.warning(
                    "%s runs Python %s, older than 3.10: left out", path, interpreter.version
                )
            continue
        if any(o.minor == interpreter.minor for o in offered):
            continue
        offered.append(interpreter)
    return tuple(offered)


def _located(entry: str, uv: str | None) -> str | None:
    """The interpreter ``entry`` names: a path, or a version uv finds."""
    if os.sep in entry:
        if os.path.isfile(entry) and os.access(entry, os.X_OK):
            return os.path.abspath(entry)
        log.warning("EVALUATOR_PYTHONS names %r, which is not an executable file", entry)
        return None
    if uv is None:
        log.warning("EVALUATOR_PYTHONS names the version %r, but uv is not found", entry)
        return None
    try:
        out = subprocess.run(
            [uv, "python", "find", "--no-project", entry],
            capture_output=True, text=True, timeout=30, check=True,
        ).stdout.strip()  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        log.warning("uv finds no interpreter for %r (EVALUATOR_PYTHONS)", entry)
        return None
    return out or None


def _found_on_host() -> list[str]:
    """The interpreters uv would find: those it manages, then ``python3.N`` on ``PATH``.

    Found by name rather than by ``uv python list``, which runs every candidate (pyenv's shims
    among them: seconds at every start); a script (a shim) is left out, only binaries count.
    """
    managed = os.environ.get("UV_PYTHON_INSTALL_DIR") or os.path.join(
        os.environ.get("XDG_DATA_HOME") or os.path.expanduser("~/.local/share"), "uv", "python"
    )
    candidates = sorted(glob.glob(os.path.join(managed, "cpython-*", "bin", "python3.*")))
    for directory in os.environ.get("PATH", "").split(os.pathsep):
        candidates += sorted(glob.glob(os.path.join(directory or ".", "python3.*")))
    found = []
    for path in candidates:
        if _NAMED.fullmatch(os.path.basename(path)) and _is_binary(path):
            found.append(os.path.realpath(path))
    return list(dict.fromkeys(found))


def _is_binary(path: str) -> bool:
    try:
        with open(path, "rb") as file:
            return file.read(4) == b"\x7fELF" and os.access(path, os.X_OK)
    except OSError:
        return False
