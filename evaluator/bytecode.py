"""Whether the sandbox's packages are compiled to bytecode, and compiling them when they are not.

Why: the sandbox runs the evaluator's own environment read-only, with
``PYTHONDONTWRITEBYTECODE=1`` (see :func:`evaluator.host.environment`), and it never writes
bytecode. A package installed without its ``__pycache__/*.pyc`` is therefore compiled from source
again in every run: ``import numpy`` takes 0.28 s instead of 0.135 s, and
``import numpy, pandas, matplotlib.pyplot`` some three times the CPU time it takes compiled, in
each run, on the CPUs the runs share.

uv does not compile by default. The project's ``pyproject.toml`` says ``compile-bytecode = true``
(honoured by ``uv sync``, ``uv run`` and ``uv pip install`` run in the project) and the Docker
images set ``UV_COMPILE_BYTECODE=1``, but an environment made another way (``uv pip install``
elsewhere, a wheel installed by a tool told not to compile, a copy that changed the sources'
modification times) may still lack it. So the evaluator checks once at start
(:func:`uncompiled`: a child interpreter finds each module without importing it and reads the
headers of its cached ``.pyc`` files) and, when this process can write the environment, compiles
it in place (:func:`compile_in_place`: ``python -m compileall``, which skips what is fresh and
writes each file atomically, so runs started meanwhile read either no ``.pyc`` or a whole one).

The cost is not hidden: numpy, pandas and matplotlib are some 2,200 source files, and compiling
them all takes every CPU (``-j0``) for seconds to tens of seconds (22 s on two busy CPUs), once;
checking them takes a fraction of a second. The caller runs both in a background thread at start
and logs what it found and did. A read-only environment (an image's, a system's) is left as it
is, and only reported.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["DEFAULT_MODULES", "Uncompiled", "compile_in_place", "missing_bytecode", "uncompiled"]

log = logging.getLogger(__name__)

#: What the sandboxed code imports most, and what costs most to compile.
DEFAULT_MODULES = ("numpy", "pandas", "matplotlib")

#: Environment variables that would make the child write no bytecode, or write it where the
#: sandbox does not look (``-I`` ignores them all too; removed anyway, to say so).
_BYTECODE_VARIABLES = ("PYTHONDONTWRITEBYTECODE", "PYTHONPYCACHEPREFIX", "PYTHONOPTIMIZE")

#: Run by the environment's own interpreter (its magic number, its cache tag), with ``-I`` (no
#: PYTHON* variable of this process moves the cache, as none is set in the sandbox): finds each
#: top-level module (importing nothing) and counts the source files the import system would
#: compile again. One JSON object per module found.
_CHECK = r"""
import importlib.util, json, os, sys

def fresh(source, stat):
    try:
        cached = importlib.util.cache_from_source(source)
    except NotImplementedError:  # no cache tag: this interpreter never uses .pyc files
        return True
    try:
        with open(cached, "rb") as f:
            head = f.read(16)
    except OSError:
        return False
    if len(head) < 16 or head[:4] != importlib.util.MAGIC_NUMBER:
        return False
    flags = int.from_bytes(head[4:8], "little")
    if flags & 0b1:  # hash-based (PEP 552): unchecked ones are always used
        if not flags & 0b10:
            return True
        try:
            with open(source, "rb") as f:
                return head[8:16] == importlib.util.source_hash(f.read())
        except OSError:
            return False
    return (
        int.from_bytes(head[8:12], "little") == int(stat.st_mtime) & 0xFFFFFFFF
        and int.from_bytes(head[12:16], "little") == stat.st_size & 0xFFFFFFFF
    )

def sources(roots):
    for root in roots:  # like compileall: no __pycache__, no symlinked directories
        for directory, subdirectories, files in os.walk(root):
            subdirectories[:] = [d for d in subdirectories if d != "__pycache__"]
            for name in files:
                if name.endswith(".py"):
                    yield os.path.join(directory, name)

for name in sys.argv[1:]:
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        spec = None
    if spec is None:
        continue
    roots = list(spec.submodule_search_locations or ())
    if roots:
        files = list(sources(roots))
    elif spec.has_location and spec.origin and spec.origin.endswith(".py"):
        roots, files = [spec.origin], [spec.origin]
    else:  # an extension or built-in module: nothing to compile
        continue
    stale = []
    for source in files:
        try:
            stat = os.stat(source)
        except OSError:
            continue
        if not fresh(source, stat):
            stale.append(source)
    print(json.dumps(
        {"module": name, "paths": roots, "sources": len(files), "stale": len(stale),
         "example": stale[0] if stale else None}
    ))
"""


@dataclass(frozen=True)
class Uncompiled:
    """A module whose source files are not all compiled: the import system compiles them."""

    module: str
    #: Its package's directories (one, but for a namespace package), or its ``.py`` file.
    paths: tuple[str, ...]
    #: How many of its ``sources`` source files have no fresh ``.pyc``.
    stale: int
    sources: int
    #: One of them, to show.
    example: str

    def __str__(self) -> str:
        return f"{self.module}: {self.stale} of {self.sources} source files (e.g. {self.example})"


def uncompiled(
    executable: str, modules: Sequence[str] = DEFAULT_MODULES, *, timeout: float = 60.0
) -> list[Uncompiled]:
    """The top-level ``modules`` importable by ``executable`` that have stale or no bytecode.

    Nothing is imported: each module is found with :func:`importlib.util.find_spec` by
    ``executable -I`` itself, and each of its source files is checked as the import system would
    (the ``.pyc`` that :func:`importlib.util.cache_from_source` names, its magic number and its
    source modification time and size, or source hash). A module ``executable`` cannot import is
    not listed. A source file that does not compile has no ``.pyc``, and keeps its module listed.

    Raises:
        ValueError: a module name is not a top-level one (finding ``a.b`` would import ``a``).
        RuntimeError: ``executable`` did not run the check; the message says why.
    """
    dotted = [m for m in modules if not m.isidentifier()]
    if dotted:
        raise ValueError(f"not top-level module names: {dotted}")
    command = [executable, "-I", "-c", _CHECK, *modules]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=False)
    except (OSError, subprocess.SubprocessError) as exc:
        raise RuntimeError(f"{executable} did not check its bytecode: {exc}") from exc
    if done.returncode != 0:
        raise RuntimeError(
            f"{executable} did not check its bytecode (exit {done.returncode}): "
            + done.stderr.strip()[-2000:]
        )
    found = []
    for line in done.stdout.splitlines():
        entry = json.loads(line)
        if entry["stale"]:
            found.append(
                Uncompiled(
                    module=entry["module"],
                    paths=tuple(entry["paths"]),
                    stale=entry["stale"],
                    sources=entry["sources"],
                    example=entry["example"],
                )
            )
    return found


def missing_bytecode(executable: str, modules: Sequence[str] = DEFAULT_MODULES) -> list[str]:
    """The names of the :func:`uncompiled` ones among ``modules``: ``[]`` when all are compiled.

    Raises:
        ValueError: a module name is not a top-level one.
        RuntimeError: ``executable`` did not run the check.
    """
    return [u.module for u in uncompiled(executable, modules)]


def _writable(path: str) -> bool:
    """Whether this process can write every ``__pycache__`` under ``path`` (or make it)."""
    roots = [os.path.dirname(path)] if os.path.isfile(path) else []
    if os.path.isdir(path):
        roots = [d for d, _, files in os.walk(path) if any(f.endswith(".py") for f in files)]
    if not roots:
        return False
    for directory in roots:
        cache = os.path.join(directory, "__pycache__")
        target = cache if os.path.isdir(cache) else directory
        # access(2) answers EROFS for a read-only mount, even to root; effective ids, not real.
        if not os.access(target, os.W_OK | os.X_OK, effective_ids=True):
            return False
    return True


def compile_in_place(
    executable: str, paths: Sequence[str], *, workers: int = 0, timeout: float = 600.0
) -> bool:
    """Compile ``paths`` (directories, recursively, or files) with ``executable``'s compileall.

    Only when this process can write all of them: a read-only environment is left alone (and
    ``False`` returned, never an exception). ``workers=0`` uses every CPU: some seconds for
    numpy, pandas and matplotlib, once (what is already fresh is skipped). The ``.pyc`` files go
    where the sandbox looks for them (``__pycache__`` beside each source, the interpreter's
    default optimisation level), whatever this process's environment says.

    Returns:
        Whether compileall ran and compiled every file (a failure is logged, with its output).
    """
    if not paths:
        return False
    try:
        unwritable = [p for p in paths if not _writable(p)]
    except OSError as exc:
        log.info("not compiling %s: %s", ", ".join(paths), exc)
        return False
    if unwritable:
        log.info("not compiling, this process cannot write it: %s", ", ".join(unwritable))
        return False
    env = {k: v for k, v in os.environ.items() if k not in _BYTECODE_VARIABLES}
    command = [executable, "-I", "-m", "compileall", "-q", f"-j{workers}", "--", *paths]
    try:
        done = subprocess.run(
            command,
            env=env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        log.warning("compiling %s failed: %s", ", ".join(paths), exc)
        return False
    if done.returncode != 0:
        output = (done.stdout + done.stderr).strip()
        log.warning(
            "compiling %s failed (exit %d): %s", ", ".join(paths), done.returncode, output[-2000:]
        )
        return False
    return True
