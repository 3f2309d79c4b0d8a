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
import collections
import contextlib
import fcntl
import hashlib
import os
import re
import secrets
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import IO

from packaging.utils import canonicalize_name

from .errors import PackageRefused
from .layers import (
    IN_SANDBOX,
    MARKER,
    Layer,
    link_layer,
    make_read_only,
    not_plain,
    remove_tree,
    tree_size,
)
from .package_policy import Policy, check_requirement, refusal_from_uv

__all__ = [
    "IN_SANDBOX",
    "MARKER",
    "MEMO_SECONDS",
    "Layer",
    "PackageCache",
    "PackageRefused",
    "Policy",
    "default_root",
    "link_layer",
    "remove_tree",
]

#: Seconds a requirement list keeps its resolution: ``>=`` may resolve otherwise later.
MEMO_SECONDS = 600.0
_PIN = re.compile(r"([A-Za-z0-9][A-Za-z0-9._-]*)==([A-Za-z0-9!+._-]+)")
# Beside a layer (not in it, where the runs would see when others use it): its last use.
_USED = ".used"
#: Seconds a set that failed to resolve or install is refused again without asking uv.
REFUSAL_SECONDS = 60.0
_MAX_MEMO = 1024


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
        max_installs: uv processes at once; more requests wait, up to ``max_waiting``.
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
        max_installs: int = 2,
        max_waiting: int = 32,
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
        self._memo: dict[tuple[str, ...], tuple[tuple[str, ...], float]] = {}
        self._refusals: dict[tuple[str, ...], tuple[PackageRefused, float]] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        self._uv_slots = asyncio.Semaphore(max_installs)
        self._waiting, self._max_waiting = 0, max_waiting
        #: Layers runs of this process use now: never evicted (see :meth:`holding`).
        self._in_use: collections.Counter[str] = collections.Counter()
        root.mkdir(parents=True, exist_ok=True)

    async def layer(
        self,
        requirements: Sequence[str],
        python: str,
        *,
        tag: str = "",
        trusted: bool = False,
        constraints: Sequence[str] = (),
    ) -> Layer:
        """The layer of ``requirements`` for the interpreter ``python``, installed if need be.

        ``tag`` names the interpreter in the layer's key (its version and ABI; default: its
        path). ``trusted``: the operator's own set (``EVALUATOR_PYTHON_PACKAGES``), not the
        policy's. ``constraints``: pins the set must keep (those a session imported already).
        A set that resolves to nothing (markers exclude it all) is a layer without pins.

        Raises:
            PackageRefused: a requirement is refused, or the set cannot be installed.
        """
        started = time.monotonic()
        # As asked (a session's, then its call's): a refusal names the later of two alike.
        wanted = tuple(check_requirement(r, self.policy, trusted=trusted) for r in requirements)
        memo_key = (python, *sorted(wanted), "-c", *sorted(constraints))
        refused = self._refusals.get(memo_key)
        if refused is not None and refused[1] > time.monotonic():
            raise refused[0]
        try:
            pins = await self._pins(memo_key, wanted, python, constraints)
            if not pins:
                return Layer("", self.root, (), time.monotonic() - started, True)
            key = hashlib.sha256("\n".join((tag or python, *pins)).encode()).hexdigest()[:32]
            path = self.root / key
            cached = path.is_dir()
            if not cached:
                lock = self._locks.setdefault(key, asyncio.Lock())
                async with lock:
                    cached = path.is_dir()
                    if not cached:
                        await self._install(key, pins, python)
                if not lock.locked():
                    self._locks.pop(key, None)
        except PackageRefused as exc:
            if exc.why not in ("invalid", "not allowed", "busy"):
                self._refusals[memo_key] = (exc, time.monotonic() + REFUSAL_SECONDS)
            raise
        with contextlib.suppress(OSError):
            (self.root / f"{key}{_USED}").touch()  # the least recently used go first
        if not cached:
            await asyncio.to_thread(self._evict, keep=key)
        return Layer(key, path, pins, time.monotonic() - started, cached)

    @contextlib.contextmanager
    def holding(self, layers: Sequence[Layer]) -> Iterator[None]:
        """While a run uses ``layers``: they are not evicted by this process."""
        keys = [layer.key for layer in layers if layer.pins]
        self._in_use.update(keys)
        try:
            yield
        finally:
            self._in_use.subtract(keys)
            self._in_use += collections.Counter()  # drop the zeros

    async def _pins(
        self,
        memo_key: tuple[str, ...],
        wanted: tuple[str, ...],
        python: str,
        constraints: Sequence[str],
    ) -> tuple[str, ...]:
        memo = self._memo.get(memo_key)
        if memo is not None and memo[1] > time.monotonic():
            return memo[0]
        pins = await self._resolve(wanted, python, constraints)
        now = time.monotonic()
        if len(self._memo) >= _MAX_MEMO:
            self._memo = {k: v for k, v in self._memo.items() if v[1] > now}
            self._refusals = {k: v for k, v in self._refusals.items() if v[1] > now}
            while len(self._memo) >= _MAX_MEMO:
                del self._memo[next(iter(self._memo))]
        self._memo[memo_key] = (pins, now + MEMO_SECONDS)
        return pins

    async def _resolve(
        self, wanted: tuple[str, ...], python: str, constraints: Sequence[str]
    ) -> tuple[str, ...]:
        args = ["pip", "compile", "-", "--python", python, "--only-binary", ":all:"]
        args += ["--no-header", "--no-annotate", "--quiet", *self.index_args]
        with contextlib.ExitStack() as stack:
            if constraints:
                file = stack.enter_context(
                    tempfile.NamedTemporaryFile("w", dir=self.root, prefix=".constraints-")
                )
                file.write("\n".join(constraints) + "\n")
                file.flush()
                args += ["--constraint", file.name]
            try:
                out = await self._uv(args, "\n".join(wanted), wanted)
            except PackageRefused as exc:
                if constraints and exc.why in ("not found", "conflict"):
                    raise PackageRefused(
                        exc.requirement,
                        "conflict",
                        f"this session has {', '.join(constraints)} already (its interpreter "
                        f"may have imported them): start a new session for other versions; "
                        f"uv says: {exc.detail}",
                    ) from None
                raise
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
            await self._flock(lock, pins)  # another process's install of the same set
            if (self.root / key).is_dir():
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
                await asyncio.to_thread(self._seal, staging, key, pins)
                self.installs += 1
            finally:
                if staging.exists():
                    await asyncio.to_thread(remove_tree, staging)

    def _seal(self, staging: Path, key: str, pins: tuple[str, ...]) -> None:
        """Check an installed set, make it read-only and put it in place (one rename)."""
        odd = not_plain(staging)
        if odd is not None:
            # A link would be followed when a session's copy is hard-linked (to a host file
            # on the cache's file system): a layer holds only plain files.
            raise PackageRefused(
                None, "failed", f"the set installs {odd}, which is not a plain file"
            )
        size = tree_size(staging)
        if size > self.max_layer_bytes:
            raise PackageRefused(
                None,
                "too large",
                f"the set takes {size:,} bytes installed; at most "
                f"{self.max_layer_bytes:,} are allowed",
            )
        (staging / MARKER).write_text("\n".join(pins) + "\n")
        make_read_only(staging)
        staging.rename(self.root / key)

    async def _flock(self, lock: IO[str], pins: Sequence[str]) -> None:
        """Take ``lock`` (another process may hold it while it installs), within the timeout."""
        try:
            async with asyncio.timeout(self.timeout):
                while True:
                    try:
                        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                        return
                    except BlockingIOError:
                        await asyncio.sleep(0.05)
        except TimeoutError:
            raise PackageRefused(
                None, "timed out", f"another install of {list(pins)} took over {self.timeout:g} s"
            ) from None

    async def _uv(self, args: list[str], stdin: str | None, wanted: Sequence[str]) -> str:
        if self._uv_slots.locked() and self._waiting >= self._max_waiting:
            raise PackageRefused(None, "busy", "too many installs are waiting; retry later")
        self._waiting += 1
        try:
            await self._uv_slots.acquire()
        finally:
            self._waiting -= 1
        try:
            return await self._run_uv(args, stdin, wanted)
        finally:
            self._uv_slots.release()

    async def _run_uv(self, args: list[str], stdin: str | None, wanted: Sequence[str]) -> str:
        # In the cache, not the service's directory: no project's uv settings apply. Without
        # uv's own cache, which nothing would bound: the layers are the cache.
        process = await asyncio.create_subprocess_exec(
            self.uv,
            *args,
            "--no-cache",
            cwd=self.root,
            stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        try:
            async with asyncio.timeout(self.timeout):
                out, err = await process.communicate(stdin.encode() if stdin else None)
        except TimeoutError:
            raise PackageRefused(
                None, "timed out", f"uv took more than {self.timeout:g} s for {list(wanted)}"
            ) from None
        finally:
            if process.returncode is None:  # timed out, or cancelled: uv must not go on
                process.kill()
                await asyncio.shield(process.wait())
        if process.returncode != 0:
            raise refusal_from_uv(err.decode("utf-8", "replace"), wanted)
        return out.decode("utf-8", "replace")

    def _evict(self, *, keep: str) -> None:
        """Remove the least recently used layers until the cache is within its bound; never
        one in use here, nor one another process is installing."""
        layers = []
        for path in self.root.iterdir():
            if path.name == keep or path.name in self._in_use or not (path / MARKER).exists():
                continue
            used = self.root / f"{path.name}{_USED}"
            with contextlib.suppress(OSError):
                layers.append((used.stat().st_mtime if used.exists() else 0.0, path))
        total = sum(tree_size(path) for _, path in layers) + tree_size(self.root / keep)
        for _, path in sorted(layers):
            if total <= self.max_total_bytes:
                break
            with (self.root / f"{path.name}.lock").open("w") as lock:
                try:
                    fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    continue
                size = tree_size(path)
                remove_tree(path)
                total -= size


def default_root() -> Path:
    """``$XDG_CACHE_HOME/mcp-python-evaluator/packages`` (``~/.cache`` when unset)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "mcp-python-evaluator" / "packages"
