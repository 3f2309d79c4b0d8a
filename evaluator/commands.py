"""The command lines of runs: which interpreter a request names, and bwrap's command line around
it, a warm agent or a session's agent (the sandbox's binds, its environment, its filter)."""

from __future__ import annotations

import os
from collections.abc import Sequence

from plotting import RESIDENT_DIR, WARM_PATH, prelude_digest
from snekbox_client import EvalRequest

from ._artist_docs import TABLES
from .config import EvaluatorConfig
from .errors import InvalidExecutable
from .host import HOME, interpreter_paths
from .jail import SandboxView
from .preimports import Preimports
from .pythons import Interpreter
from .run_packages import RunPackages
from .sandbox import Sandbox
from .users import covers
from .workdir import Workdir, WorkdirRoot

__all__ = ["AGENT_IN_SANDBOX", "ARTIST_DOCS_IN_SANDBOX", "CommandLines"]

#: Where the warm agent's file is bound inside its sandbox.
AGENT_IN_SANDBOX = "/run/evaluator/agent.py"
#: The agent compiled for the default interpreter, where sandboxes running it see it.
COMPILED_AGENT_IN_SANDBOX = "/run/evaluator/agent.pyc"
#: Where a warm sandbox sees the script that reads matplotlib's artist tables (``_artist_docs``),
#: and the tables beside it.
ARTIST_DOCS_IN_SANDBOX = "/run/evaluator/artist_docs.py"
_ARTIST_TABLES_IN_SANDBOX = f"/run/evaluator/{TABLES}"


class CommandLines:
    """Builds the command lines of one evaluator's runs.

    Args:
        config: The evaluator's settings.
        pythons: The interpreters offered (the default one first).
        view: What the sandboxes see of the host; ``None``: runs are unsandboxed.
        python_binds: The paths of each interpreter but the default, bound only into the
            sandboxes that run it.
        seccomp: Whether the runs get the syscall filter.
        agent_file: The agent's file on the host (see :func:`.startup.place_agent_files`).
        compiled_agent: The same compiled for the default interpreter, if it could be.
        empty_file: An empty read-only file on the host, bound over what must look empty.
        packages: The package wiring, whose layer directory a session's sandbox binds.
        resident_prelude: The directory keeping the gateway's prelude resident (see
            :func:`.startup.place_resident_prelude`), bound as ``plotting.RESIDENT_DIR``.
    """

    def __init__(
        self,
        config: EvaluatorConfig,
        pythons: tuple[Interpreter, ...],
        view: SandboxView | None,
        python_binds: dict[str, tuple[str, ...]],
        *,
        seccomp: bool,
        agent_file: str,
        compiled_agent: str | None = None,
        empty_file: str | None,
        packages: RunPackages,
        resident_prelude: str | None = None,
    ) -> None:
        self._config = config
        self._pythons = frozenset(p.path for p in pythons)
        self._view = view
        self._python_binds = python_binds
        self._seccomp = seccomp
        self._agent_file = agent_file
        self._compiled_agent = compiled_agent
        self._empty_file = empty_file
        self._packages = packages
        self._resident = [(resident_prelude, RESIDENT_DIR)] if resident_prelude else []
        #: The digest of the prelude kept resident, said in ``GET /info`` (``None``: none).
        self.resident_prelude = prelude_digest() if resident_prelude else None
        #: Which of ``preimport`` the next warm sandbox imports (what first cells use).
        self.preimports = Preimports(config.preimport)
        #: matplotlib's font list, once built: its host file and its path in the sandbox.
        self.fontlist: tuple[str, str] | None = None
        #: The script reading matplotlib's artist tables and the tables, on the host, once built
        #: (:mod:`.matplotlib_caches`): warm sandboxes importing pyplot run it first.
        self.artist_docs: tuple[str, str] | None = None

    @property
    def default(self) -> str:
        """The default interpreter."""
        return self._config.executable

    @property
    def view(self) -> SandboxView | None:
        """What the sandboxes see of the host (``None``: runs are unsandboxed)."""
        return self._view

    @property
    def home(self) -> str:
        """The working directory inside the sandbox."""
        return self._view.home if self._view is not None else HOME

    def command(self, request: EvalRequest) -> list[str]:
        """The interpreter and its arguments a request runs.

        Raises:
            InvalidExecutable: ``executable_path`` does not exist in the sandbox, is not a
                file, or is not executable.
        """
        return [self.executable(request.executable_path), *_lstrip_empty(request.argv)]

    def argv(
        self,
        command: list[str],
        workdir: Workdir,
        extra: Sequence[tuple[str, str]] = (),
        env: Sequence[tuple[str, str]] = (),
    ) -> list[str]:
        """bwrap's command line running ``command`` in ``workdir``, with ``extra`` read-only
        binds (host path, sandbox path) and ``env``; unsandboxed: ``command`` itself."""
        if self._view is None:
            return command
        interpreter = [(p, p) for p in sorted(self._python_binds.get(command[0], ()), key=len)]
        return self._view.argv(
            command,
            workdir=workdir.path,
            seccomp=self._seccomp,
            readonly_files=[
                *interpreter,
                *([self.fontlist] if self.fontlist else []),
                *self._resident,
                *extra,
            ],
            empty_file=self._empty_file,
            env=env,
            shm=workdir.shm,
        )

    def warm_eligible(self, command: list[str]) -> bool:
        """Whether a warm agent runs ``command`` as the interpreter would: the default
        interpreter given ``-c CODE`` or a ``.py`` script, and no other option."""
        return command[0] == self._config.executable and self.runs_as_agent(command)

    def runs_as_agent(self, command: list[str]) -> bool:
        """Whether the agent runs ``command`` as its interpreter would: an offered interpreter
        given ``-c CODE`` or a ``.py`` script, and no other option."""
        if command[0] not in self._pythons or len(command) < 2:
            return False
        first = command[1]
        return (first == "-c" and len(command) > 2) or (
            first.endswith(".py") and not first.startswith("-")
        )

    def agent_argv(self, workdir: Workdir, *, imports: bool = True) -> list[str]:
        """bwrap's command line of a warm sandbox: the agent, with the modules it imports now
        (:attr:`preimports`; before them, where pyplot is one, the script reading matplotlib's
        artist tables, once built), and the script loading the resident prelude ahead
        (``plotting.WARM_PATH``), if one is."""
        executable = self._config.executable
        host, agent = self._agent(executable)
        ahead = [
            *(self.preimports.current() if imports else ()),
            *([WARM_PATH] if self._resident else []),
        ]
        binds = self._agent_binds(workdir, host, agent)
        if self.artist_docs is not None and "matplotlib.pyplot" in ahead:
            first = next(i for i, m in enumerate(ahead) if m.split(".")[0] == "matplotlib")
            ahead.insert(first, ARTIST_DOCS_IN_SANDBOX)  # before anything imports matplotlib
            script, tables = self.artist_docs
            binds += [(script, ARTIST_DOCS_IN_SANDBOX), (tables, _ARTIST_TABLES_IN_SANDBOX)]
        command = [executable, agent, *self.preimports.watch_argument, *ahead]
        return self.argv(command, workdir, binds)

    def started_argv(self, workdir: Workdir) -> list[str]:
        """bwrap's command line of a started sandbox (see :mod:`.pool`): the agent, importing
        nothing (the resident prelude is loaded: a few milliseconds)."""
        return self.agent_argv(workdir, imports=False)

    def session_argv(self, sandbox: Sandbox, executable: str) -> list[str]:
        """bwrap's command line of a session's agent started cold (see :mod:`.live`).

        It imports nothing ahead: its first cell waits for it, and imports only what it uses,
        as a cold one-shot run does (the warm sandboxes that sessions take have imported what
        first cells use of ``preimport`` while nothing waited)."""
        host, agent = self._agent(executable)
        watch = self.preimports.watch_argument
        command = [executable, agent if self._view is not None else host, *watch, "--session"]
        return self.argv(command, sandbox.workdir, self._agent_binds(sandbox.workdir, host, agent))

    def _agent(self, executable: str) -> tuple[str, str]:
        """The agent's file ``executable`` runs, on the host and in the sandbox: compiled for
        the default interpreter (if it could be), else its source."""
        if executable == self._config.executable and self._compiled_agent is not None:
            return self._compiled_agent, COMPILED_AGENT_IN_SANDBOX
        return self._agent_file, AGENT_IN_SANDBOX

    def _agent_binds(self, workdir: Workdir, host: str, agent: str) -> list[tuple[str, str]]:
        """The agent's file, and the sandbox's own directory of package layers (empty: a
        session fills it, see :meth:`.run_packages.RunPackages.add_layers`)."""
        binds = [(host, agent)]
        layers = self._packages.sandbox_bind(workdir) if self._view is not None else None
        if layers is not None:
            binds.append(layers)
        return binds

    def executable(self, path: str | None) -> str:
        """The interpreter ``executable_path`` names, the default one for ``None``.

        Raises:
            InvalidExecutable: it does not exist in the sandbox, is not a file, or is not
                executable.
        """
        if path is None:
            return self._config.executable
        visible = self._view.readonly_paths if self._view is not None else ()
        if self._view is not None and not _visible(
            path, visible + self._python_binds.get(path, ())
        ):
            raise InvalidExecutable("executable_path does not exist")
        if not os.path.exists(path):
            raise InvalidExecutable("executable_path does not exist")
        if not os.path.isfile(path):
            raise InvalidExecutable("executable_path is not a file")
        if not os.access(path, os.X_OK):
            raise InvalidExecutable("executable_path is not executable")
        return path

    def covers(self, root: WorkdirRoot) -> tuple[tuple[str, tuple[str, ...]], ...]:
        """What the runs' own uid could not reach on the host, to be covered (see users.py)."""
        cache = self._packages.cache
        cached = [str(cache.root)] if cache is not None else []
        if self._view is None:
            return covers([*interpreter_paths(self._config.executable), str(root.path), *cached])
        bwrap_dir = os.path.dirname(self._view.bwrap)
        others = [p for paths in self._python_binds.values() for p in paths]
        return covers([*self._view.readonly_paths, *others, bwrap_dir, str(root.path), *cached])


def _visible(path: str, readonly_paths: tuple[str, ...]) -> bool:
    """Whether ``path`` (and what it points to) is inside the sandbox's read-only binds."""
    if not os.path.isabs(path):
        return False

    def inside(p: str) -> bool:
        return any(p == root or p.startswith(root.rstrip("/") + "/") for root in readonly_paths)

    return inside(os.path.normpath(path)) and inside(os.path.realpath(path))


def _lstrip_empty(args: tuple[str, ...]) -> list[str]:
    """Leading empty arguments are dropped, as Snekbox does (they confuse the interpreter)."""
    items = list(args)
    while items and items[0] == "":
        items.pop(0)
    return items
