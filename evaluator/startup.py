"""The evaluator's start-up: what it checks and prepares on the host, and the probe run.

Each step is a function :meth:`.service.Evaluator.start` calls in turn: the sandbox's view of the
host (bwrap found, user namespaces allowed), the cgroups (those a dead evaluator left swept), the
files every sandbox binds, the seccomp filter, then a first run that proves the whole sandbox
works here (:func:`probe`). In the background: the environment's bytecode (matplotlib's caches
are :mod:`.matplotlib_caches`'s).
"""

from __future__ import annotations

import logging
import os
import platform
import py_compile
import resource
from collections.abc import Awaitable, Callable
from pathlib import Path

from plotting import write_resident
from snekbox_client import EvalResult

from . import bytecode, limits, seccomp
from .cgroups import Cgroups
from .commands import AGENT_IN_SANDBOX, CommandLines
from .config import EvaluatorConfig, MiB
from .errors import HostTooBusy, SandboxNotMade, SandboxUnavailable
from .host import (
    HOME,
    WHAT_TO_DO,
    check_prerequisites,
    environment,
    interpreter_paths,
    sandbox_view,
)
from .jail import SandboxView
from .launch import LAUNCHER
from .pool import SandboxPool
from .pythons import Interpreter
from .sandbox import Sandbox, SandboxMaker
from .users import RunUsers
from .workdir import WorkdirRoot

__all__ = [
    "PROBE",
    "PROBE_TIME_LIMIT",
    "check_bytecode",
    "detect_cgroups",
    "log_lowered_nproc",
    "log_plain_directories",
    "log_sessions",
    "make_pool",
    "place_agent_files",
    "place_launcher",
    "place_resident_prelude",
    "probe",
    "sandbox_view_of",
    "seccomp_filter",
    "warn_if_unsandboxed",
]

log = logging.getLogger(__name__)

#: The code of the start-up check run.
PROBE = "import sys; print('ok')"
#: Seconds the start-up check run may take, whatever the runs' limit: it needs ~50 ms, but a
#: busy host (load 10-27 on 2 cores was seen) must not be taken for a missing sandbox.
PROBE_TIME_LIMIT = 60.0
# How the launcher's own failures begin (_launcher.py).
_LAUNCH_FAILED = "the sandbox could not start"
# The warm agent, bound read-only into its sandbox: the sandbox binds only the interpreter's
# environment, where this package may not be (a checkout run with uv run).
_AGENT = Path(__file__).with_name("_agent.py")


def warn_if_unsandboxed(config: EvaluatorConfig) -> None:
    """Say loudly, at every start, that code runs without a sandbox, if it does."""
    if config.unsandboxed:
        log.warning(
            "THE EVALUATOR RUNS CODE UNSANDBOXED: no namespaces, no read-only file system, "
            "no network isolation; code runs as this process's user (uid %d). "
            "Never expose this service.",
            os.geteuid(),
        )


def sandbox_view_of(
    config: EvaluatorConfig, pythons: tuple[Interpreter, ...]
) -> tuple[SandboxView | None, dict[str, tuple[str, ...]]]:
    """What the sandboxes see of the host, and the paths of each interpreter but the default
    (bound only into the sandboxes that run them: each sees its own interpreter); unsandboxed,
    nothing.

    Raises:
        SandboxUnavailable: bwrap is missing, or user namespaces are disabled.
    """
    if config.unsandboxed:
        return None, {}
    check_prerequisites(config.bwrap)
    python_binds = {p.path: interpreter_paths(p.path) for p in pythons if not p.default}
    others = [path for paths in python_binds.values() for path in paths]
    view = sandbox_view(config, others)
    if view.home != HOME:
        log.info(
            "the working directory inside the sandbox is %s: the interpreter lies "
            "under %s, where it is bound read-only",
            view.home,
            HOME,
        )
    return view, python_binds


def detect_cgroups(config: EvaluatorConfig) -> Cgroups:
    """The cgroup support of this host, with the cgroups of a dead evaluator swept."""
    cgroups = Cgroups.detect(
        config.cgroup_name, config.memory_limit * MiB, config.pids_limit, config.cpu_limit
    )
    swept = cgroups.sweep()
    if swept:
        log.info("removed %d cgroups left by a previous evaluator", swept)
    return cgroups


def place_agent_files(root: WorkdirRoot, default: Interpreter) -> tuple[str, str | None, str]:
    """The agent's file, the same compiled for the ``default`` interpreter (``None`` if it is
    not this process's version, whose bytecode this process writes), and an empty file: all
    read-only in the private directory, which every sandbox user can reach (the package may
    lie below one it cannot, /root).

    Why compiled: a sandbox never writes bytecode, so an agent run from source is compiled at
    every start (5 ms, what a session started cold paid more than a one-shot run)."""
    agent = root.path / "agent.py"
    agent.write_bytes(_AGENT.read_bytes())
    agent.chmod(0o444)
    compiled: str | None = None
    if default.version == platform.python_version():
        compiled = _compile_read_only(str(agent), root.path / "agent.pyc", AGENT_IN_SANDBOX)
    empty = root.path / "empty"
    empty.touch(0o444)
    return str(agent), compiled, str(empty)


def place_launcher(root: WorkdirRoot) -> str:
    """The sandboxes' launcher compiled for this interpreter (which runs it), read-only in the
    private directory: a script run from its source is compiled at every start, 1.5 of the
    8.5 ms a launcher took to start (one per sandbox)."""
    return _compile_read_only(LAUNCHER, root.path / "_launcher.pyc")


def _compile_read_only(source: str, compiled: Path, shown_as: str | None = None) -> str:
    """``source`` compiled to ``compiled``, read-only; ``shown_as``: the file a traceback
    through it names. Run as a script, a ``.pyc`` is never checked against its source."""
    py_compile.compile(
        source,
        cfile=str(compiled),
        dfile=shown_as,
        doraise=True,
        invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH,
    )
    compiled.chmod(0o444)
    return str(compiled)


def place_resident_prelude(
    config: EvaluatorConfig, root: WorkdirRoot, default: Interpreter
) -> str | None:
    """The directory keeping the gateway's prelude resident (``plotting.write_resident``),
    which every sandbox binds where the prelude's first file looks for it
    (``plotting.RESIDENT_DIR``), so that a run carries only its code. ``None`` (the gateway
    then sends the prelude with each run) when unsandboxed, where nothing is bound, or when the
    ``default`` interpreter is not this process's version, which compiles it."""
    if default.version != platform.python_version() or config.unsandboxed:
        return None
    directory = root.path / "mcp-prelude"
    write_resident(str(directory))
    directory.chmod(0o555)
    return str(directory)


def seccomp_filter(config: EvaluatorConfig, users: RunUsers) -> tuple[bytes | None, str]:
    """The compiled syscall filter, or ``None`` and why there is none."""
    if not config.seccomp or config.unsandboxed:
        return None, "disabled by configuration"
    reason = seccomp.unavailable_reason()
    if reason is not None:
        return None, reason
    return seccomp.compile_filter(shared_user=not users.dropping), "disabled by configuration"


def make_pool(
    config: EvaluatorConfig,
    root: WorkdirRoot,
    cgroups: Cgroups,
    users: RunUsers,
    commands: CommandLines,
    seccomp_program: bytes | None,
    *,
    on_dispose: Callable[[Sandbox], None],
) -> tuple[SandboxPool, int | None]:
    """The pool of sandboxes, with the limits ``config`` gives them here (their launcher
    placed in ``root``, see :func:`place_launcher`), and the RLIMIT_NPROC (``None``: none) each
    run gets."""
    rlimits, nproc = limits.rlimits(
        config,
        cgroups,
        mounted=root.bounded,
        own_uid=users.dropping,
        own_namespace=root.launchers_mount,
    )
    maker = SandboxMaker(
        root,
        cgroups,
        users,
        covers=commands.covers(root) if users.dropping else (),
        workdir_size=config.workdir_size * MiB,
        workdir_inodes=config.workdir_inodes,
        shm_size=None if config.unsandboxed else config.shm_size * MiB,
        rlimits=rlimits,
        nproc=None if users.dropping else nproc,
        seccomp_program=seccomp_program,
        host_env=environment(config) if config.unsandboxed else None,
        on_dispose=on_dispose,
        launcher=place_launcher(root),
    )
    ready = config.concurrency if config.prewarm else 0
    return SandboxPool(maker, ready=ready, preimports=commands.preimports), nproc


def log_lowered_nproc(config: EvaluatorConfig, nproc: int | None, users: RunUsers) -> None:
    """Warn when this user's RLIMIT_NPROC holds runs sharing its uid below ``pids_limit``: its
    hard limit lowers each run's own; its soft limit bounds all its tasks together (the kernel
    checks them against it above the runs' namespaces), the runs' among them."""
    if nproc is not None and nproc < config.pids_limit:
        log.warning(
            "EVALUATOR_PIDS_LIMIT %d is above this user's hard RLIMIT_NPROC: each run gets %d "
            "processes and threads (raise the hard limit, or lower the setting)",
            config.pids_limit,
            nproc,
        )
    each = config.pids_limit if nproc is None else nproc
    soft = limits.users_soft_nproc(users)
    if soft is not None and soft < each * config.concurrency:
        hard = resource.getrlimit(resource.RLIMIT_NPROC)[1]
        log.warning(
            "this user's soft RLIMIT_NPROC (%d) bounds all its processes and threads together, "
            "the runs' among them: %d runs at once of %d each do not fit in it, and a run may "
            "get fewer (raise it with ulimit -u, up to the hard limit, %s; or lower "
            "EVALUATOR_PIDS_LIMIT)",
            soft,
            config.concurrency,
            each,
            "unlimited" if hard == resource.RLIM_INFINITY else hard,
        )


def log_plain_directories(failure: SandboxNotMade, *, processes_lost: bool) -> None:
    """Say that the launchers could not mount, and what the runs lose for it: the size of
    their working directory, and the RLIMIT_NPROC set in the same namespace, if any. Not the
    advice on making sandboxes work: they do, with less."""
    log.warning(
        "a run's own tmpfs cannot be mounted here (%s): runs go on in plain directories, "
        "their %s not bounded per run",
        failure.reason,
        "size and processes" if processes_lost else "size",
    )


def log_sessions(
    config: EvaluatorConfig, session_limit: int, session_bytes: int, cgroups: Cgroups
) -> None:
    """Say how many live sessions there may be, and what each is counted at."""
    log.info(
        "live sessions: at most %d%s, each counted at %d MiB (%s)",
        session_limit,
        " (EVALUATOR_MAX_SESSIONS)" if config.max_sessions is not None else "",
        session_bytes // MiB,
        "its memory limit"
        if cgroups.memory is not None
        else "no memory cgroup: its interpreter's address space, working directory and /dev/shm",
    )


async def probe(run_once: Callable[[float], Awaitable[EvalResult]], memory_limit: int) -> None:
    """A first run (``run_once(seconds)`` runs :data:`PROBE`), to prove the whole sandbox
    works on this machine.

    It has a generous time limit of its own, and one more try when killed at it: a busy
    host is said to be busy, never taken for a missing sandbox.

    Raises:
        SandboxUnavailable: the run failed, or was killed at its time limit twice
            (:class:`HostTooBusy`); the message names the cause.
    """
    limit = PROBE_TIME_LIMIT
    for attempt in (1, 2):
        result = await run_once(limit)
        if result.ended_by != "time_limit":
            break
        if attempt == 1:
            log.warning(
                "the start-up check run did not finish within %g s (a busy host?): "
                "trying once more",
                limit,
            )
    else:
        raise HostTooBusy(
            f"the start-up check run did not finish within {limit:g} s, twice: the host is "
            "too busy (see its load average), which says nothing against the sandbox. "
            "Start the evaluator again once the host is less loaded."
        )
    if result.returncode != 0 or result.stdout != "ok\n":
        raise _probe_failure(result, memory_limit)


def _probe_failure(result: EvalResult, memory_limit: int) -> SandboxUnavailable:
    """Why the start-up check run failed, in words naming the cause: what to install only
    when bwrap or the namespaces it needs are what failed (:class:`SandboxNotMade`)."""
    output = result.stdout.strip()[:2000]
    if result.ended_by == "memory_limit":
        return SandboxUnavailable(
            "the start-up check run was killed at the memory limit "
            f"({memory_limit} MiB): the interpreter cannot start within it; "
            "raise the limit"
        )
    failed = f"a first run in the sandbox failed (returncode {result.returncode}): {output}"
    # bwrap's own errors, and the launcher's (its namespaces, its mounts), come before
    # the interpreter: the sandbox could not be made.
    if "bwrap:" in output or _LAUNCH_FAILED in output:
        return SandboxNotMade(failed, WHAT_TO_DO)
    return SandboxUnavailable(failed)


def check_bytecode(config: EvaluatorConfig) -> None:
    """Compile the environment the runs import from, if it lacks bytecode (see bytecode.py)."""
    executable = config.executable
    names = {*bytecode.DEFAULT_MODULES, *(m.split(".")[0] for m in config.preimport)}
    try:
        found = bytecode.uncompiled(executable, sorted(names))
    except (RuntimeError, ValueError) as exc:
        log.warning("could not check the bytecode of the runs' packages: %s", exc)
        return
    if not found:
        return
    stale = sum(item.stale for item in found)
    names_found = ", ".join(item.module for item in found)
    log.warning(
        "%d source files of %s have no fresh bytecode, which every run would compile "
        "again (e.g. %s); compiling them now",
        stale, names_found, found[0].example,
    )  # fmt: skip
    if bytecode.compile_in_place(executable, [p for item in found for p in item.paths]):
        log.info("compiled the bytecode of %s", names_found)
    else:
        log.warning(
            "the bytecode of %s cannot be written here: make the environment with "
            "`uv sync` (this project compiles it) or run `%s -m compileall` on it as its owner",
            names_found, executable,
        )  # fmt: skip
