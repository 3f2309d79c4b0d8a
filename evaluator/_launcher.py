"""The launcher of one sandbox: exec'd ahead of time, it becomes the run's first process.

The service never forks itself (it has threads: a fork could deadlock, and Python 3.12+ warns).
It spawns this script with ``posix_spawn``; the script runs in a fresh, single-threaded
interpreter (``-I -S``: the standard library only, nothing of the service imported) and, in
this order:

1. joins the run's cgroups (while it may still write ``cgroup.procs``);
2. sets the run's rlimits;
3. when the service is root and the interpreter lives below directories the sandbox user may
   not traverse (``/root`` is 0700), enters a private mount namespace and covers each such
   directory with a small tmpfs holding bind mounts of only the paths the sandbox needs;
4. drops to the run's unprivileged host uid and gid (no supplementary groups), which clears
   every capability;
4'. or, when the service is not root (it cannot mount), enters a user and mount namespace of
   its own (its uid and gid mapped to themselves), mounts the run's size-bounded tmpfs on the
   working directory there (and the run's ``noexec`` ``/dev/shm`` beside it, which bwrap binds),
   and writes :data:`_MOUNTED` to stdout: the service then opens the directory through
   ``/proc/<pid>/root``, which keeps the tmpfs reachable after the run; and sets the run's
   RLIMIT_NPROC there, where the kernel counts the tasks of this namespace alone;
5. blocks reading its command line from fd 3, and execs it (bwrap) with fd 4 its seccomp
   program (and fd 5, for a warm agent, the pipe its run will come through: ``_agent.py``).
   EOF without the release marker means the run was cancelled, or the service died: it exits
   at once. After the exec, bwrap's ``--die-with-parent`` ties the run to the service.

Its one argument is a ``marshal``-ed dict, in hex (see ``evaluator.launch.LaunchSpec``): marshal
is built in, where json would import ``re`` and double the launcher's start-up cost (a launcher
starts for every sandbox). Failures are written to stderr (the run's output pipe) and end it
with 255, which the service reports as a sandbox failure.
"""

# The C half: signal.py imports enum, 4 of the 12 ms a launcher took to start (one per sandbox).
import _signal as signal  # type: ignore[import-not-found]
import marshal
import os
import resource
import sys

_RELEASE = b"\xffrun\xff"
#: The release of an agent (warm, or a session's), which keeps fds 5 and 6.
_RELEASE_AGENT = b"\xffagent\xff"
_ARGS_FD = 3
#: Where the pipes of an agent are; a plain run does not get them.
_AGENT_FDS = (5, 6)
# stdin, stdout, stderr, the command line, the seccomp program, a warm agent's request pipe and
# a session agent's status pipe
_KEPT_FDS = 7

_MOUNTED = b"\x06"

_CLONE_NEWNS, _CLONE_NEWUSER = 0x00020000, 0x10000000
_MS_NOSUID, _MS_NODEV, _MS_NOEXEC, _MS_BIND, _MS_REC, _MS_SLAVE = 2, 4, 8, 4096, 16384, 1 << 19


class _Libc:
    """unshare(2) and mount(2), which ``os`` lacks before 3.12 (and mount(2) always)."""

    def __init__(self) -> None:
        # Imported only here: a run as root with nothing to cover needs no mount, and ctypes
        # costs a few ms to load.
        import ctypes

        self._ctypes = ctypes
        self._libc = ctypes.CDLL(None, use_errno=True)

    def _check(self, result: int, what: str) -> None:
        if result != 0:
            err = self._ctypes.get_errno()
            raise OSError(err, f"{what}: {os.strerror(err)}")

    def unshare(self, flags: int) -> None:
        self._check(self._libc.unshare(flags), f"unshare({flags:#x})")

    def mount(
        self, source: str, target: str, fstype: str | None, flags: int, data: str | None
    ) -> None:
        encoded = [x.encode() if x else None for x in (source, target, fstype, data)]
        self._check(
            self._libc.mount(encoded[0], encoded[1], encoded[2], flags, encoded[3]),
            f"mount {target}",
        )


def _mount_workdir(
    path: str, size: int, inodes: int, shm: list[object] | None, nproc: int | None
) -> None:
    """Mount the run's tmpfs on ``path`` in a user and mount namespace of this process's own,
    and ``shm`` (``[path, bytes, inodes]``), the one bwrap binds as ``/dev/shm``; set ``nproc``
    there as the run's RLIMIT_NPROC."""
    libc = _Libc()
    uid, gid = os.getuid(), os.getgid()
    libc.unshare(_CLONE_NEWUSER | _CLONE_NEWNS)
    if nproc is not None:
        # Set here, not with the rlimits before: Linux 5.14 and later check a task's
        # RLIMIT_NPROC against its uid's tasks in its own user namespace and those nested in it
        # (bwrap's), so this bounds this run alone; set before the namespace it would bound
        # every task of the uid, the user's other processes and every other run included.
        resource.setrlimit(resource.RLIMIT_NPROC, (nproc, nproc))
    for name, line in (
        ("setgroups", "deny"),
        ("uid_map", f"{uid} {uid} 1"),
        ("gid_map", f"{gid} {gid} 1"),
    ):
        with open(f"/proc/self/{name}", "w") as file:
            file.write(line)
    libc.mount("none", "/", None, _MS_REC | _MS_SLAVE, None)
    libc.mount(
        "tmpfs",
        path,
        "tmpfs",
        _MS_NOSUID | _MS_NODEV | _MS_NOEXEC,
        f"size={size},nr_inodes={inodes},mode=0700",
    )
    if shm is not None:
        shm_path, shm_size, shm_inodes = shm
        # noexec, as the working directory: bwrap's own --tmpfs cannot be.
        libc.mount(
            "tmpfs",
            str(shm_path),
            "tmpfs",
            _MS_NOSUID | _MS_NODEV | _MS_NOEXEC,
            f"size={shm_size},nr_inodes={shm_inodes},mode=0700",
        )
    os.mkdir(f"{path}/.tmp", 0o700)
    os.write(1, _MOUNTED)


def _expose(covers: list[tuple[str, list[str]]]) -> None:
    """Cover each blocked directory with a tmpfs holding bind mounts of only the given paths."""
    libc = _Libc()
    mount = libc.mount
    # The modes below are what the runs' user needs, whatever umask started the service
    # (systemd's UMask=0077 would leave the covers' directories closed to it); the run itself
    # gets the service's umask back.
    umask = os.umask(0)
    libc.unshare(_CLONE_NEWNS)
    # Slave: unmounts made by the service (a run's working directory) still reach this view.
    mount("none", "/", None, _MS_REC | _MS_SLAVE, None)
    for blocked, paths in covers:
        # Opened before the cover hides them; bound from /proc/self/fd, in this namespace.
        fds = [os.open(p, os.O_PATH | os.O_CLOEXEC) for p in paths]
        mount("tmpfs", blocked, "tmpfs", _MS_NOSUID | _MS_NODEV, "mode=0711,size=1m")
        for path, fd in zip(paths, fds, strict=True):
            parent = os.path.dirname(path)
            os.makedirs(parent, mode=0o711, exist_ok=True)
            if os.path.isdir(f"/proc/self/fd/{fd}"):
                os.mkdir(path, 0o711)
            else:
                os.close(os.open(path, os.O_CREAT | os.O_WRONLY | os.O_CLOEXEC, 0o444))
            mount(f"/proc/self/fd/{fd}", path, None, _MS_BIND | _MS_REC, None)
            os.close(fd)
    os.umask(umask)


def main() -> None:
    spec = marshal.loads(bytes.fromhex(sys.argv[1]))
    for path in spec["cgroup_procs"]:
        with open(path, "w") as procs:
            procs.write(str(os.getpid()))
    if spec["idle"]:  # made ahead of its run; joined first, at full weight (see run_cgroup)
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    for which, limit in spec["rlimits"]:
        resource.setrlimit(which, (limit, limit))
    if spec["covers"]:
        _expose(spec["covers"])
    if spec["uid"] is not None:
        os.setgroups([])
        os.setresgid(spec["gid"], spec["gid"], spec["gid"])
        os.setresuid(spec["uid"], spec["uid"], spec["uid"])
        if os.getresuid() != (spec["uid"],) * 3 or os.getgroups():
            raise PermissionError("the sandbox user could not be assumed")
    if spec["workdir"] is not None:
        path, size, inodes = spec["workdir"]
        _mount_workdir(path, size, inodes, spec["shm"], spec["nproc"])
    os.closerange(_KEPT_FDS, os.sysconf("SC_OPEN_MAX"))
    os.chdir(spec["cwd"])
    chunks = []
    while chunk := os.read(_ARGS_FD, 65536):
        chunks.append(chunk)
    os.close(_ARGS_FD)
    data = b"".join(chunks)
    if data.endswith(_RELEASE_AGENT):
        argv = data[: -len(_RELEASE_AGENT)].split(b"\0")[:-1]
    elif data.endswith(_RELEASE):
        argv = data[: -len(_RELEASE)].split(b"\0")[:-1]
        os.closerange(_AGENT_FDS[0], _AGENT_FDS[-1] + 1)  # a sandbox made for either
    else:
        os._exit(0)
    for signum in (signal.SIGPIPE, signal.SIGXFSZ):
        signal.signal(signum, signal.SIG_DFL)  # Python ignores them; exec keeps that
    env = {k.encode(): v.encode() for k, v in spec["env"].items()}
    os.execve(argv[0], argv, env)


if __name__ == "__main__":
    try:
        main()
    except BaseException as exc:  # whatever it is, the run must not start
        try:
            os.write(2, f"evaluator: the sandbox could not start: {exc!r}\n".encode())
        finally:
            os._exit(255)
