"""Packages on demand, installed outside the sandbox: uv, wheels only, a content-addressed cache.

A run that asks for packages (PEP 508 requirements) gets a *layer*: a directory holding exactly
the resolved set, installed by uv from the operator's index with ``--only-binary :all:`` (a
source build would run someone's code here, on the host), which the run mounts read-only and
puts on ``sys.path``. The sandbox itself stays offline and never sees uv, the index or another
set. A layer is named by the hash of the interpreter's version and the resolved pins, so the
same set is installed once and shared; a set asked for again within :data:`MEMO_SECONDS` is
not even resolved again (a few milliseconds). Concurrent requests for one set wait for one
install (an ``asyncio`` lock in the process, ``flock`` between processes). The cache is bounded
on disk: the layers used least recently go first.

Every refusal is a :class:`PackageRefused` that names the requirement and why: not allowed by
the policy (``EVALUATOR_PACKAGES``), invalid, not found, no wheel for this Python, too large,
or timed out.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import hashlib
import os
import re
import secrets
import shutil
import stat
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

__all__ = [
    "IN_SANDBOX",
    "MEMO_SECONDS",
    "Layer",
    "PackageCache",
    "PackageRefused",
    "Policy",
    "default_root",
    "link_layer",
    "remove_tree",
]

#: Where a sandbox finds its layers: each directory below goes on ``sys.path`` (see _agent.py).
IN_SANDBOX = "/opt/packages"

#: Seconds a requirement list keeps its resolution: ``>=`` may resolve otherwise later.
MEMO_SECONDS = 600.0
#: Characters of uv's own message kept in a refusal.
_MESSAGE_CHARS = 600
_PIN = re.compile(r"([A-Za-z0-9][A-Za-z0-9._-]*)==([A-Za-z0-9!+._-]+)")
_MARKER = ".complete"

Why = Literal["not allowed", "invalid", "not found", "no wheel", "too large", "timed out", "failed"]


class PackageRefused(Exception):
    """A requirement that cannot be installed; ``requirement`` is it (or ``None``: the set)."""

    def __init__(self, requirement: str | None, why: Why, detail: str) -> None:
        named = f"{requirement!r}: " if requirement is not None else ""
        super().__init__(f"{named}{why}: {detail}")
        self.requirement = requirement
        self.why = why
        self.detail = detail


@dataclass(frozen=True)
class Policy:
    """Which projects may be asked for: none (``off``), any, or those named."""

    allowed: frozenset[str] | None  # None: any
    enabled: bool = True

    @classmethod
    def parse(cls, text: str) -> Policy:
        """``off``, ``any``, or a comma-separated allow-list of project names."""
        value = text.strip()
        if value.lower() == "off":
            return cls(frozenset(), enabled=False)
        if value.lower() == "any":
            return cls(None)
        names = [name.strip() for name in value.split(",") if name.strip()]
        if not names:
            raise ValueError("an empty package allow-list: say 'off' to allow none")
        return cls(frozenset(canonicalize_name(name) for name in names))

    def allows(self, name: str) -> bool:
        return self.enabled and (self.allowed is None or canonicalize_name(name) in self.allowed)

    @property
    def kind(self) -> Literal["off", "any", "allow-list"]:
        """How ``GET /info`` names it."""
        if not self.enabled:
            return "off"
        return "any" if self.allowed is None else "allow-list"


@dataclass(frozen=True)
class Layer:
    """A resolved set, installed: ``path`` goes on ``sys.path`` (read-only in the sandbox)."""

    key: str
    path: Path
    pins: tuple[str, ...]
    #: Seconds it took to resolve and install (or only to find, when ``cached``).
    seconds: float
    cached: bool


class PackageCache:
    """The layers of one evaluator (or of several sharing ``root``).

    Args:
        root: The cache's directory (made if missing), on the host, never writable by runs.
        uv: The uv executable.
        policy: Which projects may be asked for.
        index_args: uv's arguments naming the index (``[]``: the one uv is configured with;
            e.g. ``["--index-url", URL]``, or ``["--no-index", "--find-links", DIR]``).
        max_layer_bytes: The largest installed set.
        max_total_bytes: The cache's bound on disk.
        timeout: Seconds a resolution or an install may take.
    """

    def __init__(
        self,
        root: Path,
        *,
        uv: str,
        policy: Policy,
        index_args: Sequence[str] = (),
        max_layer_bytes: int = 512 * 1024 * 1024,
        max_total_bytes: int = 4 * 1024 * 1024 * 1024,
        timeout: float = 120.0,
    ) -> None:
        self.root = root
        self.uv = uv
        self.policy = policy
        self.index_args = tuple(index_args)
        self.max_layer_bytes = max_layer_bytes
        self.max_total_bytes = max_total_bytes
        self.timeout = timeout
        #: Installs done by this process (a concurrent request for the same set waits).
        self.installs = 0
        self._memo: dict[tuple[str, tuple[str, ...]], tuple[tuple[str, ...], float]] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        root.mkdir(parents=True, exist_ok=True)

    async def layer(
        self, requirements: Sequence[str], python: str, *, trusted: bool = False
    ) -> Layer:
        """The layer of ``requirements`` for the interpreter ``python``, installed if need be.

        ``trusted``: the operator's own set (``EVALUATOR_PYTHON_PACKAGES``), not the policy's.

        Raises:
            PackageRefused: a requirement is refused, or the set cannot be installed.
        """
        started = time.monotonic()
        wanted = tuple(sorted(self._checked(r, trusted) for r in requirements))
        memo = self._memo.get((python, wanted))
        pins = memo[0] if memo is not None and memo[1] > time.monotonic() else None
        if pins is None:
            pins = await self._resolve(wanted, python)
            self._memo[(python, wanted)] = (pins, time.monotonic() + MEMO_SECONDS)
        key = hashlib.sha256("\n".join((python, *pins)).encode()).hexdigest()[:32]
        path = self.root / key
        cached = (path / _MARKER).exists()
        if not cached:
            async with self._locks.setdefault(key, asyncio.Lock()):
                cached = (path / _MARKER).exists()
                if not cached:
                    await self._install(key, pins, python)
        with contextlib.suppress(OSError):
            os.utime(path / _MARKER)  # used now: the least recently used go first
        if not cached:
            self._evict(keep=key)
        return Layer(key, path, pins, time.monotonic() - started, cached)

    def _checked(self, text: str, trusted: bool = False) -> str:
        """``text`` as a PEP 508 requirement the policy allows, normalized.

        Raises:
            PackageRefused: it is not one, names a URL, or is not allowed.
        """
        try:
            requirement = Requirement(text)
        except InvalidRequirement as exc:
            raise PackageRefused(text, "invalid", f"not a PEP 508 requirement ({exc})") from None
        if requirement.url is not None:
            raise PackageRefused(text, "invalid", "direct URLs are not installed; name a version")
        if not trusted and not self.policy.allows(requirement.name):
            allowed = (
                "package installs are turned off here"
                if not self.policy.enabled
                else f"the operator allows only: {', '.join(sorted(self.policy.allowed or ()))}"
            )
            raise PackageRefused(text, "not allowed", allowed)
        requirement.name = canonicalize_name(requirement.name)
        return str(requirement)

    async def _resolve(self, wanted: tuple[str, ...], python: str) -> tuple[str, ...]:
        args = ["pip", "compile", "-", "--python", python, "--only-binary", ":all:"]
        args += ["--no-header", "--no-annotate", "--quiet", *self.index_args]
        out = await self._uv(args, "\n".join(wanted), wanted)
        pins = []
        for line in out.splitlines():
            line = line.split(";", 1)[0].strip()
            if not line or line.startswith("#"):
                continue
            match = _PIN.fullmatch(line)
            if match is None:
                raise PackageRefused(None, "failed", f"uv resolved to {line[:100]!r}")
            pins.append(f"{canonicalize_name(match[1])}=={match[2]}")
        return tuple(sorted(pins))

    async def _install(self, key: str, pins: tuple[str, ...], python: str) -> None:
        lock_path = self.root / f"{key}.lock"
        with lock_path.open("w") as lock:
            await asyncio.to_thread(fcntl.flock, lock, fcntl.LOCK_EX)  # another process's
            if (self.root / key / _MARKER).exists():
                return
            staging = self.root / f".staging-{key}-{secrets.token_hex(4)}"
            try:
                args = ["pip", "install", "--target", str(staging), "--python", python]
                # Compiled here: the sandbox cannot write bytecode, and would recompile on
                # every import.
                args += ["--only-binary", ":all:", "--no-deps", "--compile-bytecode", "--quiet"]
                # Copies, not uv's default hard links to its own cache, which _read_only would
                # change too, and whose files the layer must not share.
                args += ["--link-mode", "copy"]
                args += self.index_args
                await self._uv([*args, *pins], None, pins)
                odd = _not_plain(staging)
                if odd is not None:
                    # A link would be followed when a session's copy is hard-linked (to a
                    # host file on the cache's file system): a layer holds only plain files.
                    raise PackageRefused(
                        None, "failed", f"the set installs {odd}, which is not a plain file"
                    )
                size = _size(staging)
                if size > self.max_layer_bytes:
                    raise PackageRefused(
                        None,
                        "too large",
                        f"the set takes {size:,} bytes installed; at most "
                        f"{self.max_layer_bytes:,} are allowed",
                    )
                (staging / _MARKER).write_text("\n".join(pins) + "\n")
                _read_only(staging)
                final = self.root / key
                if final.exists():  # an install that did not finish: its marker is missing
                    remove_tree(final)
                staging.rename(final)
                self.installs += 1
            finally:
                if staging.exists():
                    remove_tree(staging)

    async def _uv(self, args: list[str], stdin: str | None, wanted: Sequence[str]) -> str:
        process = await asyncio.create_subprocess_exec(
            self.uv,
            *args,
            stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        try:
            async with asyncio.timeout(self.timeout):
                out, err = await process.communicate(stdin.encode() if stdin else None)
        except TimeoutError:
            process.kill()
            await process.wait()
            raise PackageRefused(
                None, "timed out", f"uv took more than {self.timeout:g} s for {list(wanted)}"
            ) from None
        if process.returncode != 0:
            raise _refusal(err.decode("utf-8", "replace"), wanted)
        return out.decode("utf-8", "replace")

    def _evict(self, *, keep: str) -> None:
        """Remove the least recently used layers until the cache is within its bound."""
        layers = []
        for path in self.root.iterdir():
            marker = path / _MARKER
            if path.name == keep or not marker.exists():
                continue
            with contextlib.suppress(OSError):
                layers.append((marker.stat().st_mtime, path))
        total = sum(_size(path) for _, path in layers) + _size(self.root / keep)
        for _, path in sorted(layers):
            if total <= self.max_total_bytes:
                break
            size = _size(path)
            remove_tree(path)
            total -= size


def default_root() -> Path:
    """``$XDG_CACHE_HOME/mcp-python-evaluator/packages`` (``~/.cache`` when unset)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "mcp-python-evaluator" / "packages"


def link_layer(layer: Layer, directory: Path, order: int) -> bool:
    """Put ``layer`` into ``directory`` (a sandbox's, bound read-only at :data:`IN_SANDBOX`)
    as ``NNN-key``, its files hard-linked: no copy, and visible at once to the sandbox's
    interpreter, which puts it on ``sys.path`` before the next cell. ``False``: it was there.

    Raises:
        OSError: it cannot be linked (``directory`` is on another file system than the cache).
    """
    if any(entry.name.endswith(f"-{layer.key}") for entry in directory.iterdir()):
        return False
    # symlinks=True: should one be there, it is copied as a link (resolved in the sandbox),
    # never followed to a host file (layers hold none: see _not_plain).
    target = directory / f"{order:03d}-{layer.key}"
    shutil.copytree(layer.path, target, symlinks=True, copy_function=_link)
    return True


def _link(source: str, target: str) -> None:
    os.link(source, target, follow_symlinks=False)


def _refusal(message: str, wanted: Sequence[str]) -> PackageRefused:
    """What uv's error says, as a refusal naming the requirement it names, if any."""
    text = " ".join(message.split())[:_MESSAGE_CHARS].rstrip(".")
    lowered = text.lower()
    # The requirement uv names: as written (``tinypkg==9.9``), else by its project's name.
    named = max((r for r in wanted if r.lower() in lowered), key=len, default=None) or next(
        (r for r in wanted if canonicalize_name(Requirement(r).name) in lowered), None
    )
    if any(s in lowered for s in ("no wheels", "wheels are required", "from source is disabled")):
        why: Why = "no wheel"
    elif "not found" in lowered or "no solution" in lowered or "no versions" in lowered:
        why = "not found"
    else:
        why = "failed"
    return PackageRefused(named, why, text or "uv failed without a message")


def _not_plain(path: Path) -> str | None:
    """The first entry below ``path`` that is neither a directory nor a regular file."""
    for root, dirs, files in os.walk(path):
        for name in [*dirs, *files]:
            mode = os.lstat(os.path.join(root, name)).st_mode
            if not (stat.S_ISDIR(mode) or stat.S_ISREG(mode)):
                return os.path.relpath(os.path.join(root, name), path)
    return None


def _size(path: Path) -> int:
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(root, name)).st_size
    return total


def _read_only(path: Path) -> None:
    """A layer's files cannot be changed, even by the service, once installed."""
    for root, dirs, files in os.walk(path):
        for name in files:
            os.chmod(os.path.join(root, name), 0o444)
        for name in dirs:
            os.chmod(os.path.join(root, name), 0o555)


def remove_tree(path: Path) -> None:
    """Remove a layer (read-only, see :func:`_read_only`) or a staging directory."""
    for root, dirs, _ in os.walk(path):
        os.chmod(root, 0o755)
        for name in dirs:
            with contextlib.suppress(OSError):
                os.chmod(os.path.join(root, name), 0o755)
    shutil.rmtree(path, ignore_errors=True)
