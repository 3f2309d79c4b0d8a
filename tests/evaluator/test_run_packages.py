"""Runs that ask for packages, and for another Python: installed outside, imported inside.

The wheels are made in the test (tests/wheels.py) and the evaluator is pointed at their folder
(``EVALUATOR_PACKAGE_INDEX``); nothing reaches an outside index. Each run and each session's
cell is a real sandbox: the layer is read-only there and the network stays unreachable.
"""

from __future__ import annotations

import asyncio
import os
import socket
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from evaluator import Evaluator, create_app
from tests.evaluator.conftest import config, run
from tests.evaluator.test_warm import until_warm
from tests.wheels import wheel, wheels

pytestmark = pytest.mark.anyio

#: Another Python than the one running the tests: pyenv's (these machines have them; uv does
#: not find them by itself).
RUNNING = f"{sys.version_info.major}.{sys.version_info.minor}"
_PYENV = [Path(f"/root/.pyenv/versions/{v}/bin/python{v[:4]}") for v in ("3.13.0", "3.12.1")]
OTHER = next(
    # os.path.exists: False where /root cannot be searched (an ordinary user's suite)
    (p for p in _PYENV if os.path.exists(p) and not p.name.endswith(RUNNING)),
    None,
)
OTHER_MINOR = OTHER.name.removeprefix("python") if OTHER is not None else ""
needs_other = pytest.mark.skipif(OTHER is None, reason=f"none of {_PYENV} is here")


def searchable(directory: Path) -> Path:
    """A package cache the runs' users can traverse (pytest makes its directories 0700)."""
    directory.chmod(0o755)
    return directory


@pytest.fixture(scope="module")
def index(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return wheels(tmp_path_factory.mktemp("index"))


@pytest.fixture(scope="module")
async def evaluator(
    index: Path, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Evaluator]:
    pythons = (str(OTHER),) if OTHER is not None else ()
    settings = config(
        package_index=str(index),
        package_cache=str(searchable(tmp_path_factory.mktemp("cache"))),
        pythons=pythons,
        python_packages=("tinypkg==1.0",),
        max_sessions=4,
    )
    async with Evaluator(settings) as started:
        # The other Python's base layer installs in the background from the start: done before
        # any test, so that the installs a test counts are its own (run first, a test saw 2).
        await started.preinstalled()
        yield started


@pytest.fixture(scope="module")
async def client(evaluator: Evaluator) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(create_app(evaluator))
    async with httpx.AsyncClient(transport=transport, base_url="http://e", timeout=60) as http:
        yield http


async def test_a_run_imports_what_it_asked_for_from_a_read_only_layer(
    client: httpx.AsyncClient,
) -> None:
    code = (
        "import tinypkg, os, sys\n"
        "print(tinypkg.VALUE)\n"
        "try:\n"
        "    open(tinypkg.__file__, 'a').close()\n"
        "    print('WRITABLE')\n"
        "except OSError as e:\n"
        "    print('read-only', e.errno)\n"
        "print(os.listdir('/opt/packages'))"
    )
    result = await run(client, code, packages=["tinypkg==1.1"])
    lines = result["stdout"].splitlines()
    assert result["returncode"] == 0, result
    assert lines[0] == "11"
    assert lines[1] in ("read-only 30", "read-only 13")  # EROFS, or EACCES before it
    assert len(eval(lines[2])) == 1  # its own layer only, none of the cache's others
    assert result["installed"] == "tinypkg==1.1"
    assert result["install_seconds"] >= 0


async def test_dependencies_are_resolved_and_a_cached_set_is_not_installed_again(
    client: httpx.AsyncClient, evaluator: Evaluator
) -> None:
    first = await run(client, "import withdep; print(withdep.VALUE)", packages=["withdep"])
    assert first["stdout"] == "11\n" and first["installed"] == "tinypkg==1.1 withdep==2.0"
    assert evaluator._run_packages.cache is not None
    installs = evaluator._run_packages.cache.installs
    again = await run(client, "import withdep; print(withdep.VALUE)", packages=["withdep==2.0"])
    assert again["stdout"] == "11\n"
    assert evaluator._run_packages.cache.installs == installs


async def test_concurrent_runs_asking_for_one_new_set_install_it_once(
    client: httpx.AsyncClient, evaluator: Evaluator
) -> None:
    assert evaluator._run_packages.cache is not None
    installs = evaluator._run_packages.cache.installs
    results = await asyncio.gather(
        *(run(client, "import bulky; print(len(bulky.DATA))", packages=["bulky"]) for _ in "ab")
    )
    assert [r["stdout"] for r in results] == ["300000\n", "300000\n"]
    assert evaluator._run_packages.cache.installs == installs + 1


@pytest.mark.parametrize(
    ("requirement", "why"),
    [
        ("sourceonly", "no wheel"),
        ("nosuchproject==1.0", "not found"),
        ("tinypkg==9.9", "not found"),
        ("tinypkg @ https://example.com/t.whl", "invalid"),
        ("not a requirement!", "invalid"),
    ],
)
async def test_a_refused_requirement_is_named_with_why_and_the_code_does_not_run(
    client: httpx.AsyncClient, requirement: str, why: str
) -> None:
    result = await run(client, "print('RAN')", packages=["tinypkg", requirement])
    assert result["returncode"] is None and result["ended_by"] == "packages_refused"
    assert f"{requirement!r} was refused ({why})" in result["stdout"], result["stdout"]
    assert "The code did not run" in result["stdout"] and "RAN" not in result["stdout"]


async def test_packages_are_installed_only_for_an_offered_interpreter(
    client: httpx.AsyncClient, evaluator: Evaluator
) -> None:
    # Any executable the sandbox can see may be named; uv would run it on the host.
    bin_dir = Path(evaluator.config.executable).parent
    script = next(
        p
        for p in sorted(bin_dir.iterdir())
        if p.is_file() and os.access(p, os.X_OK) and not p.name.startswith("python")
    )
    result = await run(client, "print('RAN')", executable_path=str(script), packages=["tinypkg"])
    assert result["ended_by"] == "packages_refused" and "RAN" not in result["stdout"]
    assert "not allowed): packages are installed only for " in result["stdout"]


async def test_a_set_its_markers_exclude_installs_nothing_and_runs(
    client: httpx.AsyncClient,
) -> None:
    result = await run(client, "print('RAN')", packages=['tinypkg; sys_platform == "win32"'])
    assert result["stdout"] == "RAN\n" and result["installed"] == ""


async def test_the_layer_directories_of_a_gone_evaluator_are_swept(
    index: Path, tmp_path: Path
) -> None:
    root = searchable(tmp_path)
    gone = root / ".sandboxes" / "12345-gone" / "sandbox"
    gone.mkdir(parents=True)
    settings = config(package_index=str(index), package_cache=str(root), pythons=())
    async with Evaluator(settings), Evaluator(settings):  # a second one keeps the first's
        left = sorted(p.name for p in (root / ".sandboxes").iterdir())
    assert len(left) == 2 and "12345-gone" not in left
    assert not list((root / ".sandboxes").iterdir())  # each removes its own


async def test_the_sandbox_stays_offline_with_packages(client: httpx.AsyncClient) -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        code = (
            "import socket, tinypkg\n"
            f"for address in [('127.0.0.1', {port}), ('192.0.2.1', 80)]:\n"
            "    try:\n"
            "        socket.create_connection(address, timeout=3).close(); print('CONNECTED')\n"
            "    except OSError as e:\n"
            "        print(e.errno)"
        )
        result = await run(client, code, packages=["tinypkg"])
    assert result["stdout"].split() == ["111", "101"], result  # ECONNREFUSED, ENETUNREACH


async def test_a_session_imports_packages_a_later_cell_adds_without_a_restart(
    client: httpx.AsyncClient,
) -> None:
    session = {"session": "packages-later"}
    first = await run(
        client, "import os; x = os.getpid(); print('tinypkg' in globals())", **session
    )
    assert first["stdout"] == "False\n" and "installed" not in first
    second = await run(
        client, "import tinypkg; print(tinypkg.VALUE, os.getpid() == x)", packages=["tinypkg==1.0"],
        **session,
    )  # fmt: skip
    assert second["stdout"] == "1 True\n", second
    assert second["installed"] == "tinypkg==1.0"
    # A later set keeps the versions the session has (tinypkg 1.0, imported already).
    third = await run(
        client, "import withdep; print(withdep.VALUE, os.getpid() == x)",
        packages=["withdep==2.0"], **session,
    )  # fmt: skip
    assert third["stdout"] == "1 True\n", third
    assert third["installed"] == "tinypkg==1.0 withdep==2.0"
    other = await run(client, "print(x)", packages=["tinypkg==1.1"], **session)
    assert other["ended_by"] == "packages_refused" and other["session_ended"] is False
    assert (
        "'tinypkg==1.1' was refused (conflict): this session has tinypkg==1.0" in (other["stdout"])
    )
    after = await run(client, "print(os.getpid() == x)", **session)
    assert after["stdout"] == "True\n"


async def test_a_module_imported_before_its_package_was_added_is_said_to_stay(
    client: httpx.AsyncClient,
) -> None:
    session = {"session": "imported-before"}
    await run(
        client, "import sys, types; sys.modules['tinypkg'] = types.ModuleType('x')", **session
    )
    added = await run(client, "print(hasattr(tinypkg, 'VALUE'))", packages=["tinypkg"], **session)
    assert "note: tinypkg was imported in this session before this call added" in added["stdout"]


async def test_packages_turned_off_are_refused_by_name() -> None:
    async with Evaluator(config(packages="off", pythons=())) as evaluator:
        transport = httpx.ASGITransport(create_app(evaluator))
        async with httpx.AsyncClient(transport=transport, base_url="http://e") as http:
            result = await run(http, "print('RAN')", packages=["tinypkg"])
            info = (await http.get("/info")).json()
    assert result["ended_by"] == "packages_refused" and "RAN" not in result["stdout"]
    assert "'tinypkg' was refused (not allowed)" in result["stdout"]
    assert "EVALUATOR_PACKAGES=off" in result["stdout"]
    assert info["packages"] == {
        "policy": "off",
        "allowed": [],
        "why": "turned off by configuration (EVALUATOR_PACKAGES=off)",
    }


async def test_an_allow_list_refuses_the_others(index: Path, tmp_path: Path) -> None:
    settings = config(
        packages="tinypkg, withdep", package_index=str(index),
        package_cache=str(searchable(tmp_path)),
        pythons=(),
    )  # fmt: skip
    async with Evaluator(settings) as evaluator:
        transport = httpx.ASGITransport(create_app(evaluator))
        async with httpx.AsyncClient(transport=transport, base_url="http://e", timeout=60) as http:
            allowed = await run(http, "import withdep; print(withdep.VALUE)", packages=["withdep"])
            refused = await run(http, "print('RAN')", packages=["bulky"])
            info = (await http.get("/info")).json()
    assert allowed["stdout"] == "11\n"
    assert (
        "'bulky' was refused (not allowed): the operator allows only: tinypkg, withdep"
        in (refused["stdout"])
    )
    assert info["packages"] == {
        "policy": "allow-list",
        "allowed": ["tinypkg", "withdep"],
        "timeout": 120.0,
    }


@needs_other
async def test_info_lists_the_interpreters_and_a_run_chooses_one(
    client: httpx.AsyncClient, evaluator: Evaluator
) -> None:
    info = (await client.get("/info")).json()
    versions = {p["version"]: p["executable_path"] for p in info["pythons"]}
    assert versions[evaluator._pythons[0].version] == evaluator.config.executable
    (path,) = [p for v, p in versions.items() if v.startswith(OTHER_MINOR + ".")]
    await evaluator.preinstalled()
    code = "import sys, tinypkg; print('%d.%d' % sys.version_info[:2], tinypkg.VALUE)"
    result = await run(client, code, executable_path=path)
    # Its preinstalled set (python_packages, here tinypkg 1.0) comes with it.
    assert result["stdout"] == f"{OTHER_MINOR} 1\n", result
    asked = await run(client, code, executable_path=path, packages=["tinypkg==1.1"])
    assert asked["stdout"] == f"{OTHER_MINOR} 11\n", asked


@needs_other
async def test_each_sandbox_sees_only_its_own_interpreter(client: httpx.AsyncClient) -> None:
    assert OTHER is not None
    prefix = str(OTHER.parents[1])  # pyenv's versions/<version>
    code = f"import os, sys; print(os.path.exists({prefix!r}), sys.executable)"
    default = await run(client, code)
    other = await run(client, code, executable_path=str(OTHER))
    assert default["stdout"].startswith("False "), default
    assert other["stdout"] == f"True {OTHER}\n", other


@needs_other
async def test_a_session_keeps_the_interpreter_it_started_with(
    client: httpx.AsyncClient, evaluator: Evaluator
) -> None:
    session: dict[str, Any] = {"session": "on-other", "executable_path": str(OTHER)}
    code = "import sys; v = '%d.%d' % sys.version_info[:2]; print(v)"
    first = await run(client, code, **session)
    assert first["stdout"] == f"{OTHER_MINOR}\n", first
    second = await run(client, "print(v)", **session)
    assert second["stdout"] == f"{OTHER_MINOR}\n"
    other = await run(client, "print(v)", session="on-other")
    assert other["returncode"] is None and "a session keeps its interpreter" in other["stdout"]


async def test_a_run_with_new_packages_takes_a_warm_sandbox_and_one_shadowing_goes_cold(
    index: Path, tmp_path: Path
) -> None:
    """A warm agent has numpy imported: a set of modules the environment lacks joins it; one
    providing ``numpy`` (a stand-in of that name) must not meet the imported numpy."""
    wheel(index, "numpy", "0.0.1", "VALUE = 'from the layer'\n")
    settings = config(
        package_index=str(index), package_cache=str(searchable(tmp_path)), pythons=(),
        warm_sandboxes=1, preimport=("numpy",),
    )  # fmt: skip
    async with Evaluator(settings) as evaluator:
        transport = httpx.ASGITransport(create_app(evaluator))
        async with httpx.AsyncClient(transport=transport, base_url="http://e", timeout=60) as http:
            await until_warm(evaluator)
            joined = await run(http, "import tinypkg; print(tinypkg.VALUE)", packages=["tinypkg"])
            assert evaluator.warm_runs == 1, "a set the environment lacks runs warm"
            await until_warm(evaluator)
            code = "import numpy; print(getattr(numpy, 'VALUE', 'the imported one'))"
            shadowing = await run(http, code, packages=["numpy==0.0.1"])
            assert evaluator.warm_runs == 1, "one providing numpy starts cold"
    assert joined["stdout"] == "11\n" and joined["installed"] == "tinypkg==1.1"
    assert shadowing["stdout"] == "from the layer\n", shadowing


async def test_packages_reach_the_runs_of_a_service_started_with_a_restrictive_umask(
    index: Path, tmp_path: Path
) -> None:
    """systemd's ``UMask=0077``: the cache the evaluator makes itself, the layers uv writes and
    a session's own directory of layers are still reachable by the runs' users."""
    settings = config(
        package_index=str(index), package_cache=str(searchable(tmp_path) / "made" / "here"),
        pythons=(), prewarm=False,
    )  # fmt: skip
    old = os.umask(0o077)
    try:
        async with Evaluator(settings) as evaluator:
            transport = httpx.ASGITransport(create_app(evaluator))
            async with httpx.AsyncClient(
                transport=transport, base_url="http://e", timeout=60
            ) as http:
                one_shot = await run(http, "import tinypkg; print(tinypkg.VALUE)",
                                     packages=["tinypkg==1.0"])  # fmt: skip
                session = {"session": "umask"}
                await run(http, "x = 1", **session)
                cell = await run(http, "import withdep; print(withdep.VALUE + x)",
                                 packages=["withdep"], **session)  # fmt: skip
    finally:
        os.umask(old)
    assert (one_shot["stdout"], one_shot["returncode"]) == ("1\n", 0), one_shot
    assert (cell["stdout"], cell["returncode"]) == ("12\n", 0), cell
