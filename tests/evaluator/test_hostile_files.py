"""Files put where they hurt: at the evaluator's own paths, with modes that lock out their owner.

A request file where the evaluator keeps a directory of its own is refused with a 400 that names
it. Whatever a run does to its own files, the answer is a 200 with Snekbox's files, the next run
works, and the working directory is removed, at any depth and without following a symlink. (As
root here; ``test_unprivileged.py`` runs the same lock-outs as an ordinary user, who has to give
itself back the permissions.)
"""

from __future__ import annotations

import asyncio
import base64
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import anyio
import httpx
import pytest

from evaluator import Evaluator
from evaluator.config import MiB
from evaluator.workdir import Workdir, WorkdirRoot, sweep
from snekbox_client import File

from .conftest import b64, run
from .lockouts import LOCKOUTS, code, directories_marked

T = TypeVar("T")

root_only = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (chown, a second uid)")
#: A host user of a run: none of the machine's, like the ones the evaluator gives runs.
RUN_USER = (2_000_000_777, 2_000_000_777)


@pytest.mark.parametrize(
    ("path", "reserved"),
    [
        (".config/matplotlib", ".config/matplotlib"),  # a file where MPLCONFIGDIR must be
        (".config/matplotlib/matplotlibrc", ".config/matplotlib"),
        (".config/matplotlib/fontlist-v390.json", ".config/matplotlib"),
        ("./.config//matplotlib/", ".config/matplotlib"),
        (".config", ".config/matplotlib"),  # a file where its parent must be
        (".tmp", ".tmp"),
        (".tmp/x", ".tmp"),
        ("x/../.tmp/y", ".tmp"),
    ],
)
async def test_a_file_at_a_directory_of_the_evaluator_is_refused(
    client: httpx.AsyncClient, path: str, reserved: str
) -> None:
    response = await client.post("/eval", json={"input": "", "files": [{"path": path}]})
    assert response.status_code == 400
    assert response.json() == {
        "title": "Request file is invalid",
        "description": f"File path '{path}' collides with '{reserved}', a directory the "
        "evaluator keeps for itself",
    }


async def test_files_beside_those_directories_are_written(client: httpx.AsyncClient) -> None:
    paths = [".configx", ".config/other", ".tmpx", "x/.tmp", "x/.config/matplotlib"]
    files = [{"path": path, "content": b64(path.encode())} for path in paths]
    result = await run(client, f"print([open(p).read() for p in {paths!r}])", files=files)
    assert (result["stdout"], result["returncode"]) == (f"{paths!r}\n", 0)


async def test_a_path_that_is_not_utf8_is_refused(client: httpx.AsyncClient) -> None:
    response = await client.post("/eval", content=b'{"input": "", "files": [{"path": "a\\ud800"}]}')
    assert response.status_code == 400
    assert response.json() == {
        "title": "Request file is invalid",
        "description": "File path 'a\\ud800' is not valid UTF-8",
    }


@pytest.mark.parametrize("name", LOCKOUTS)
async def test_a_run_that_locks_out_its_files_is_answered_and_removed(
    client: httpx.AsyncClient, evaluator: Evaluator, name: str
) -> None:
    marker = f".marker-{uuid.uuid4().hex}"
    result = await run(client, code(name, marker))
    assert result["returncode"] == 0, result["stdout"]
    returned = {f["path"]: base64.b64decode(f["content"]).decode() for f in result["files"]}
    assert returned == LOCKOUTS[name][1]
    assert (await run(client, "print(1)"))["stdout"] == "1\n"
    assert evaluator._root is not None
    with anyio.fail_after(60):  # removed in the background, after the answer
        while True:
            if not directories_marked(evaluator._root.path, marker):
                break
            await anyio.sleep(0.05)


@root_only  # an ordinary user's working directory is a tmpfs that goes with its launcher
def test_removal_goes_any_depth_and_never_follows_a_symlink(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "kept").write_text("kept")
    tree = tmp_path / "run-x"
    tree.mkdir()
    fd = os.open(tree, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for depth in range(1500):  # deeper than Python's recursion limit
            if depth % 10 == 0:
                os.symlink(outside, "outside", dir_fd=fd)
            os.mkdir("d", dir_fd=fd)
            fd, parent = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd), fd
            os.chmod("d", 0, dir_fd=parent)
            os.close(parent)
    finally:
        os.close(fd)
    try:
        Workdir(tree, False, 0).remove()
        assert not tree.exists()
    finally:
        subprocess.run(["rm", "-rf", tree], check=True)  # pytest's own clean-up would recurse
    assert [p.name for p in outside.iterdir()] == ["kept"]


def test_a_directory_holds_nothing_to_collect_only_with_a_few_hidden_entries(
    tmp_path: Path,
) -> None:
    """What a run's answer holds is looked for on the event loop only while the directory has
    nothing but a few hidden entries; anything else, or many of them (the code may make any
    number), is walked in a thread."""
    workdir = Workdir(tmp_path, False, 0)
    assert workdir.holds_nothing()
    (tmp_path / ".tmp").mkdir()
    assert workdir.holds_nothing()
    (tmp_path / "_private").write_text("not returned, but not hidden either")
    assert not workdir.holds_nothing()
    (tmp_path / "_private").unlink()
    for n in range(3):
        (tmp_path / f".hidden{n}").touch()
    assert workdir.holds_nothing()
    (tmp_path / ".one_too_many").touch()
    assert not workdir.holds_nothing()


async def test_a_few_small_files_are_written_without_a_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The gateway's two prelude files are written on the event loop; more, or larger, files
    in a worker thread. Either way the same files land."""
    hops: list[object] = []
    to_thread = asyncio.to_thread

    async def counted(function: Callable[..., T], *args: object, **kwargs: object) -> T:
        if getattr(getattr(function, "__self__", None), "path", None) == tmp_path:  # ours only
            hops.append(function)
        return await to_thread(function, *args, **kwargs)

    monkeypatch.setattr(asyncio, "to_thread", counted)
    workdir = Workdir(tmp_path, True, 0)  # as if a tmpfs: the test writes nowhere else
    small = [File(f"s{n}.txt", b"x" * 4096) for n in range(4)]
    assert set(await workdir.write_in(small)) == {f"s{n}.txt" for n in range(4)}
    assert hops == []
    large = [File("big.bin", b"y" * (16 * 1024 + 1))]
    many = [File(f"m{n}.txt", b"z") for n in range(5)]
    deep = [File("a/b/c/d/e.txt", b"z")]
    for files in (large, many, deep):
        assert set(await workdir.write_in(files)) == {file.path for file in files}
    assert len(hops) == 3
    assert (tmp_path / "big.bin").stat().st_size == 16 * 1024 + 1
    assert (tmp_path / "s3.txt").read_bytes() == b"x" * 4096
    # Once code has run there (it may have left a large file where a small one goes, which
    # would take long to truncate), or on a disk: a thread.
    workdir.fresh = False
    assert set(await workdir.write_in([File("big.bin", b"small")])) == {"big.bin"}
    assert (tmp_path / "big.bin").read_bytes() == b"small"
    on_disk = Workdir(tmp_path, False, 0)
    assert set(await on_disk.write_in(small[:1])) == {"s0.txt"}
    assert len(hops) == 5


@root_only
def test_the_sweep_removes_only_what_is_ours_and_dead(tmp_path: Path) -> None:
    finished = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, check=True
    )
    dead = int(finished.stdout)
    ours = tmp_path / f"evaluator-{dead}-ours"
    theirs = tmp_path / f"evaluator-{dead}-theirs"  # another user's, in a shared /tmp
    alive = tmp_path / f"evaluator-{os.getpid()}-alive"
    for path in (ours, theirs, alive):
        (path / "run-y").mkdir(parents=True)
    os.chown(theirs, *RUN_USER)
    sweep(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([theirs.name, alive.name])


@pytest.fixture
def shared_base() -> Iterator[Path]:
    """A directory under /tmp that another uid may traverse (pytest's tmp_path is 0700)."""
    base = Path(tempfile.mkdtemp(prefix="evaluator-owner-test-", dir="/tmp"))
    base.chmod(0o711)
    try:
        yield base
    finally:
        shutil.rmtree(base, ignore_errors=True)


@root_only
@pytest.mark.parametrize("mounted", [True, False], ids=["tmpfs", "directory"])
def test_a_working_directory_given_to_the_run_user_is_theirs_alone(
    shared_base: Path, mounted: bool
) -> None:
    root = WorkdirRoot.create(str(shared_base))
    assert root.can_mount
    root.can_mount = mounted
    workdir = Workdir.create(root, MiB, 64, owner=RUN_USER)
    try:
        workdir.write_files([File("d/e/f.txt", b"f"), File("top", b"t")])

        def owner_and_mode(path: Path) -> tuple[int, int, int]:
            info = os.lstat(path)
            return info.st_uid, info.st_gid, stat.S_IMODE(info.st_mode)

        assert owner_and_mode(root.path) == (0, 0, 0o711)
        assert owner_and_mode(workdir.path) == (*RUN_USER, 0o700)
        assert owner_and_mode(workdir.path / ".tmp") == (*RUN_USER, 0o700)
        for relative in ("d", "d/e", "d/e/f.txt", "top"):
            assert owner_and_mode(workdir.path / relative)[:2] == RUN_USER, relative
        as_run_user = ["setpriv", f"--reuid={RUN_USER[0]}", f"--regid={RUN_USER[1]}"]
        as_run_user.append("--clear-groups")

        def succeeds(*command: str | Path) -> bool:
            done = subprocess.run([*as_run_user, *command], capture_output=True, check=False)
            return done.returncode == 0

        assert not succeeds("ls", root.path), "the private directory is not listable"
        assert succeeds("ls", workdir.path / "d" / "e")
        assert succeeds("touch", workdir.path / "d" / "e" / "new", workdir.path / ".tmp" / "t")
        assert succeeds("rm", workdir.path / "top")
    finally:
        workdir.remove()
        root.remove()
    assert not root.path.exists()
