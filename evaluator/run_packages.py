"""The package wiring of one evaluator: which layers a run gets, and how they reach its sandbox.

The layers themselves are installed and cached by :class:`.packages.PackageCache`. Here: the
cache opened (or why there is none), the preinstalled set of each interpreter but the default,
the layers a request gets (its own set, then its interpreter's preinstalled one), whether a warm
agent may run with them, and each sandbox's own directory of layers in the cache (a session
links more into it between cells), removed with the sandbox or, for a dead evaluator, at the
next start.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import logging
import os
import secrets
import stat
import subprocess
from collections.abc import Iterator, Sequence
from pathlib import Path

from .config import EvaluatorConfig, MiB
from .packages import (
    IN_SANDBOX,
    MARKER,
    Layer,
    PackageCache,
    PackageRefused,
    Policy,
    default_root,
    link_layer,
    remove_tree,
)
from .pythons import Interpreter
from .sandbox import Sandbox
from .users import RunUsers
from .workdir import Workdir

__all__ = ["RunPackages"]

log = logging.getLogger(__name__)

# In the package cache: each evaluator's directory of its sandboxes' layer directories.
_SANDBOXES = ".sandboxes"


class RunPackages:
    """The packages of one evaluator's runs (see the module); none until :meth:`open`."""

    def __init__(self, config: EvaluatorConfig) -> None:
        self._config = config
        #: The cache of package layers, or ``None`` (and why, in :attr:`why_off`).
        self.cache: PackageCache | None = None
        self.why_off = "turned off by configuration (EVALUATOR_PACKAGES=off)"
        self._pythons: tuple[Interpreter, ...] = ()
        # The preinstalled set of each interpreter but the default (python_packages).
        self._preinstalls: list[asyncio.Task[Layer | None]] = []
        self._preinstalling: dict[str, asyncio.Task[Layer | None]] = {}
        self._sandbox_layers = Path("/nonexistent")  # this evaluator's, in the package cache
        self._sandbox_layers_lock: int | None = None  # held while it lives (see _sweep)
        # Top-level names the default interpreter can import (see fits_warm), and the names
        # each layer provides.
        self._importable: frozenset[str] | None = None  # None: not known
        self._provided: dict[str, frozenset[str]] = {}

    async def open(self, uv: str | None, users: RunUsers, pythons: tuple[Interpreter, ...]) -> None:
        """Open the cache (unless packages are off, or it cannot be used: then say why)."""
        self._pythons = pythons
        self.cache = self._open_cache(uv, users)
        if self.cache is not None:
            self._importable = await asyncio.to_thread(_importable, self._config.executable)

    def _open_cache(self, uv: str | None, users: RunUsers) -> PackageCache | None:
        config = self._config
        policy = Policy.parse(config.packages)
        if not policy.enabled:
            return None
        if config.unsandboxed:
            self.why_off = "the evaluator runs unsandboxed"
            return None
        if uv is None:
            self.why_off = "uv is not found on the evaluator's host (set EVALUATOR_UV)"
            log.warning("no package can be installed: %s", self.why_off)
            return None
        root = Path(config.package_cache) if config.package_cache else default_root()
        try:
            self._sandbox_layers = self._own_directory(root, users)
        except OSError as exc:
            self.why_off = f"the package cache {root} cannot be used: {exc}"
            log.warning("no package can be installed: %s", self.why_off)
            return None
        return PackageCache(
            root,
            uv=uv,
            policy=policy,
            index_args=_index_args(config.package_index),
            max_layer_bytes=config.package_set_size * MiB,
            max_total_bytes=config.package_cache_size * MiB,
            timeout=config.package_timeout,
        )

    def _own_directory(self, root: Path, users: RunUsers) -> Path:
        """This evaluator's directory of its sandboxes' layers, locked while it lives; those
        of evaluators that are gone removed.

        Raises:
            OSError: the cache cannot be made, reached by the runs' users, or written.
        """
        sandboxes = root / _SANDBOXES
        # The operator's directory is left as it is (it may be /var/cache, or shared); the
        # runs' users must be able to traverse it to their own layers.
        if not root.exists():
            root.mkdir(parents=True)
            root.chmod(0o755)
        if users.dropping and not root.stat().st_mode & stat.S_IXOTH:
            raise OSError(f"{root} is not searchable by others (the runs' users)")
        if not sandboxes.exists():
            sandboxes.mkdir()
        sandboxes.chmod(0o755)
        _sweep(sandboxes)
        own = sandboxes / f"{os.getpid()}-{secrets.token_hex(4)}"
        own.mkdir()
        own.chmod(0o755)
        self._sandbox_layers_lock = os.open(own, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        fcntl.flock(self._sandbox_layers_lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return own

    def preinstall(self) -> None:
        """Install ``python_packages`` for each interpreter but the default, in the background,
        ahead of the first run on each, which would otherwise wait for it."""
        if self.cache is None or not self._config.python_packages:
            return
        for python in self._pythons[1:]:
            task = asyncio.ensure_future(self._base_layer(python))
            self._preinstalls.append(task)
            self._preinstalling[python.path] = task

    async def preinstalled(self) -> None:
        """Return once every preinstalled set was installed, or refused."""
        await asyncio.gather(*self._preinstalls, return_exceptions=True)

    async def _base_layer(self, python: Interpreter) -> Layer | None:
        """``python_packages`` for ``python``, so that it offers what the default one does:
        asked for at every run on it (a few ms once installed; installed again if evicted)."""
        wanted, cache = self._config.python_packages, self.cache
        if cache is None or not wanted:
            return None
        try:
            layer = await cache.layer(wanted, python.path, tag=_tag(python), trusted=True)
        except PackageRefused as exc:
            log.warning(
                "Python %s is offered without %s: %s", python.version, ", ".join(wanted), exc
            )
            return None
        if not layer.cached:
            log.info(
                "Python %s has %s (%.1f s)", python.version, " ".join(layer.pins), layer.seconds
            )
        return layer

    async def layers(
        self, packages: Sequence[str], executable: str, session: Sandbox | None
    ) -> tuple[Layer | None, list[Layer]]:
        """The set a run of ``executable`` asks for (``None``: none), and the layers it gets:
        that set, then its interpreter's preinstalled set if it is not the default one (only
        those with packages: a set that resolves to nothing has nothing to bind). In a live
        session (its sandbox: ``session``), the set keeps the versions its interpreter has
        already (they may be imported).

        Raises:
            PackageRefused: the asked-for set cannot be installed.
        """
        python = next((p for p in self._pythons if p.path == executable), None)
        asked = None
        layers = []
        if packages:
            if self.cache is None:
                raise PackageRefused(", ".join(packages), "not allowed", self.why_off)
            if python is None:
                # uv would run that program on the host to learn what it is.
                offered = ", ".join(p.path for p in self._pythons)
                raise PackageRefused(
                    None, "not allowed", f"packages are installed only for {offered}"
                )
            had = self._session_pins(session)
            asked = await self.cache.layer(packages, executable, tag=_tag(python), constraints=had)
            layers.append(asked)
        first = self._preinstalling.get(executable)
        if python is not None and not python.default and (first is None or first.done()):
            # Not before its first install ends (numpy, pandas and matplotlib take a minute
            # from an index): until then a run on it gets the standard library and its own.
            base = await self._base_layer(python)
            if base is not None:
                layers.append(base)
        return asked, [layer for layer in layers if layer.pins]

    def _session_pins(self, sandbox: Sandbox | None) -> tuple[str, ...]:
        """The pins of the layers linked into a live session's directory."""
        if sandbox is None or self.cache is None:
            return ()
        pins: set[str] = set()
        directory = self._directory(sandbox.workdir)
        for marker in directory.glob(f"*/{MARKER}") if directory.exists() else ():
            with contextlib.suppress(OSError):
                pins.update(marker.read_text().split())
        return tuple(sorted(pins))

    @contextlib.contextmanager
    def holding(self, layers: Sequence[Layer]) -> Iterator[None]:
        """Keep ``layers`` from eviction for the block (see :meth:`.PackageCache.holding`)."""
        with self.cache.holding(layers) if self.cache is not None else contextlib.nullcontext():
            yield

    def fits_warm(self, layers: Sequence[Layer]) -> bool:
        """Whether a warm agent can run with ``layers``: none provides a module the default
        interpreter can import already (the agent may have imported it, as another version)."""
        if layers and self._importable is None:
            return False
        for layer in layers:
            provided = self._provided.get(layer.key)
            if provided is None:
                try:
                    entries = os.listdir(layer.path)
                except OSError:
                    return False
                provided = frozenset(
                    entry.split(".")[0]
                    for entry in entries
                    if not entry.startswith(".") and not entry.endswith(".dist-info")
                )
                self._provided[layer.key] = provided
            if provided & (self._importable or frozenset()):
                return False
        return True

    def sandbox_bind(self, workdir: Workdir) -> tuple[str, str] | None:
        """The sandbox's own directory of layers (made here, empty) and where it is bound;
        ``None``: no package cache."""
        if self.cache is None:
            return None
        directory = self._directory(workdir)
        directory.mkdir(exist_ok=True)
        directory.chmod(0o755)  # not left to the umask: the runs' user must reach it
        return str(directory), IN_SANDBOX

    def _directory(self, workdir: Workdir) -> Path:
        return self._sandbox_layers / workdir.path.name

    async def add_layers(self, sandbox: Sandbox, layers: Sequence[Layer]) -> None:
        """Link ``layers`` into a session's directory, where its next cell finds them.

        Raises:
            PackageRefused: the session's sandbox has no such directory (no package cache).
        """
        if not layers:
            return
        if self.cache is None or self._config.unsandboxed:
            raise PackageRefused(None, "failed", "this evaluator installs no packages")
        directory = self._directory(sandbox.workdir)
        order = len(list(directory.iterdir())) if directory.exists() else 0
        for offset, layer in enumerate(reversed(layers)):  # the asked-for set last: it wins
            try:
                await asyncio.to_thread(link_layer, layer, directory, order + offset)
            except OSError as exc:
                log.warning("could not link a package layer into a session: %s", exc)
                raise PackageRefused(None, "failed", "the layer could not be added") from exc

    def remove_directory(self, sandbox: Sandbox) -> None:
        """Remove a disposed-of sandbox's directory of layers."""
        if self.cache is not None:
            directory = self._directory(sandbox.workdir)
            if directory.exists():
                remove_tree(directory)

    async def aclose(self) -> None:
        """Cancel the preinstalls, remove this evaluator's layer directories, release them."""
        for task in self._preinstalls:
            task.cancel()
        await asyncio.gather(*self._preinstalls, return_exceptions=True)
        self._preinstalls.clear()
        if self.cache is not None and self._sandbox_layers.exists():
            await asyncio.to_thread(remove_tree, self._sandbox_layers)
        if self._sandbox_layers_lock is not None:
            os.close(self._sandbox_layers_lock)
            self._sandbox_layers_lock = None


def _index_args(index: str | None) -> list[str]:
    """uv's arguments naming the package index: a URL, or a directory of wheels."""
    if index is None:
        return []
    if os.path.isdir(index):
        return ["--no-index", "--find-links", os.path.abspath(index)]
    return ["--index-url", index]


#: Lists the top-level names on an interpreter's sys.path (the standard library included).
_IMPORTABLE = (
    "import os, sys, json\n"
    "names = set(sys.builtin_module_names)\n"
    "for d in sys.path:\n"
    "    try:\n"
    "        names.update(e.split('.')[0] for e in os.listdir(d or '.'))\n"
    "    except OSError:\n"
    "        pass\n"
    "print(json.dumps(sorted(names)))"
)


def _importable(executable: str) -> frozenset[str] | None:
    """The top-level names ``executable`` finds on its ``sys.path`` (``None`` if it cannot
    say: then no run with packages takes a warm sandbox)."""
    try:
        out = subprocess.run(
            [executable, "-I", "-c", _IMPORTABLE],
            capture_output=True, text=True, timeout=30, check=True,
        ).stdout  # fmt: skip
        names = json.loads(out)
    except (OSError, subprocess.SubprocessError, ValueError):
        return None
    return frozenset(str(name) for name in names) if isinstance(names, list) else None


def _sweep(sandboxes: Path) -> None:
    """Remove the layer directories of evaluators that are gone: each holds a lock on its own
    while it lives (whatever its pid namespace)."""
    for directory in sandboxes.iterdir():
        try:
            fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            continue  # its evaluator lives
        finally:
            os.close(fd)
        remove_tree(directory)


def _tag(python: Interpreter) -> str:
    """What names an interpreter in a layer's key: its real binary and its version."""
    return f"{os.path.realpath(python.path)} {python.version}"
