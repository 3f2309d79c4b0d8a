"""What the model reads about the tool: its description, and the environment resource's report.

Written for the model that calls the tool, from what the service was found to offer (its
Python, packages, sessions, limits: :class:`~gateway.connection.Connection`), never more.
"""

from __future__ import annotations

from typing import Any

from .budget import INLINE_FILE_BYTES
from .connection import Connection
from .environment import CORE, ENVIRONMENT_URI, Environment
from .settings import Settings
from .text import duration

__all__ = ["environment_report", "tool_description"]


def tool_description(settings: Settings, connection: Connection) -> str:
    """The description of ``execute_python_code``, as the service is known now."""
    backend = connection.backend
    environment = backend.environment if backend is not None else None
    python = f"Python {environment.python}" if environment is not None else "Python 3"
    plots = environment is None or "matplotlib" in environment.packages
    figures = (
        "- Figures: every matplotlib figure comes back as a PNG image, in drawing order, with "
        "no extra step: plt.show() or simply leaving the figure open is enough. At most "
        f"{settings.max_image_side:,} pixels a side are returned.\n"
        if plots
        else ""
    )
    return (
        f"Run {python} code in an isolated sandbox and return what it prints.\n\n"
        f"{_sessions(settings, connection)}\n"
        f"- `files`: at most {settings.max_upload_files} files, "
        f"{settings.max_upload_bytes:,} bytes in all, each with a relative path; `encoding` "
        "'base64' for bytes that are not text.\n"
        f"- `timeout_seconds`: this call's time limit, at most "
        f"{connection.max_time_limit():g} s (more is lowered to that).\n"
        f"{_long_runs(settings, connection)}"
        f"- {_packages(connection, environment)}\n"
        f"{_installs(connection)}"
        f"{_pythons(connection)}"
        "- The result is stdout and stderr together, in order (terminal control sequences "
        "removed), then a line [end of output] (numbered, [end of output #2], if the output "
        "holds that text), then the gateway's own lines: the exit status in words, figures "
        "not returned, files written. As in a notebook, when the last statement is an "
        "expression its value's repr follows the output (not for None, matplotlib objects or "
        "a line ending in ';'). There is no stdin: input() gets EOF. Output must be UTF-8: "
        "bytes that are not, written straight to a file descriptor, lose the whole output (output "
        "read while the code runs shows them as U+FFFD instead).\n"
        f"{figures}"
        "- Files the code writes in its working directory are listed with their sizes, "
        "their names in double quotes with JSON-style escapes; each can be read with "
        "resources/read at its files[].uri while the session lives, and small text files "
        f"(up to {INLINE_FILE_BYTES:,} bytes) also come inline, as embedded resources.\n"
        f"- {_limits(settings, connection)} Output longer than "
        f"{settings.max_output_chars:,} characters is cut in the middle, keeping its start "
        "and end."
    )


def environment_report(connection: Connection) -> dict[str, Any]:
    """What :data:`ENVIRONMENT_URI` answers: the probe's findings and the sessions' kind."""
    backend = connection.backend
    environment = backend.environment if backend is not None else None
    found: dict[str, Any] = (
        environment.to_json()
        if environment is not None
        else {"python": None, "packages": None, "unknown_because": connection.unknown_why()}
    )
    info = connection.info
    return {
        **found,
        "sessions": "live interpreters" if connection.live_sessions else "files only",
        "package_installs": (
            {"policy": info.packages, "allowed": list(info.allowed) or None}
            if info.packages in ("any", "allow-list")
            else {"policy": "none", "why": connection.why_no_installs()}
        ),
        "pythons": [offer.version for offer in connection.offers()] or None,
    }


def _limits(settings: Settings, connection: Connection) -> str:
    """The limits a run meets: a local evaluator's, claimed only where this host bounds them
    (see /readyz's not_enforced); a remote service's are its own."""
    local = connection.local
    if local is None:
        return (
            "The evaluation service sets the limits on time, memory, processes and output; "
            "a run that exceeds the time or memory limit is killed (exit code 137)."
        )
    cfg = settings.evaluator_config
    weaker = {item["limit"] for item in connection.limits_not_enforced()}
    in_force = {lim.name: lim for lim in local.limits_in_force()}
    memory = (
        f"about {cfg.memory_limit} MiB of memory (a MemoryError beyond, not a kill)"
        if "memory" in in_force and "rlimit" in in_force["memory"].how
        else f"{cfg.memory_limit} MiB of memory"
    )
    parts = [f"{cfg.time_limit:g} s wall-clock", memory]
    if "processes" not in weaker:
        processes = in_force["processes"].value
        parts.append(f"{cfg.pids_limit if processes is None else processes} processes and threads")
    parts.append(f"{cfg.output_limit:,} bytes of output")
    limits = "Limits: " + ", ".join(parts)
    if "working directory" not in weaker:
        limits += f"; the working directory holds {cfg.workdir_size} MiB"
    return limits + "."


def _long_runs(settings: Settings, connection: Connection) -> str:
    """How to see code as it runs and let it outlive the call, where the service can."""
    if not connection.reads_cells:
        return (
            "- This evaluation service runs each call to its end before answering: "
            "`wait_seconds`, get_output and interrupt have nothing to read or stop here, and "
            "progress notifications say only how long the call has run.\n"
        )
    longest = connection.max_time_limit()
    return (
        "- Long runs: a client that asked for progress gets the newest output in its progress "
        f"notifications as the code runs (at most one each {settings.progress_interval:g} s). "
        "Pass `wait_seconds` (e.g. 20) for code that may run longer than your own timeout "
        "(training, a long simulation): the call answers after that long at most, with status "
        "'running', the output so far and the session_id, and the code goes on in its session "
        f"for up to {duration(longest)} (without `timeout_seconds`). Then call get_output("
        "session_id, wait_seconds) to read what it printed since (each line once) and, once it "
        "ended, its result with figures and files; interrupt(session_id) stops it and keeps "
        "the session's variables. A call on that session while its code runs is refused at "
        "once.\n"
    )


def _installs(connection: Connection) -> str:
    info = connection.info
    if info.packages not in ("any", "allow-list"):
        return (
            "- The sandbox has no network: pip install and downloads do not work, and no "
            f"package can be added ({connection.why_no_installs()}).\n"
        )
    which = "any project" if info.packages == "any" else "only " + ", ".join(info.allowed)
    return (
        '- `packages`: PEP 508 requirements (e.g. ["tabulate==0.9.0"]) installed for the '
        f"call before its code runs, outside the sandbox, wheels only ({which}); the install "
        "time is not counted in the time limit, and a set used before is ready at once. A "
        "session keeps them for its later calls. A PEP 723 '# /// script' block in the code "
        "(dependencies, requires-python) is honoured the same way; arguments win over it. "
        "The sandbox itself has no network: pip install and downloads in the code fail.\n"
    )


def _pythons(connection: Connection) -> str:
    offers = connection.offers()
    if len(offers) < 2:
        return ""
    versions = [f"{offers[0].version} (the default)", *(o.version for o in offers[1:])]
    return (
        f"- `python`: the Python version to run, one of {', '.join(versions)}; the "
        "preinstalled packages listed above are the default's.\n"
    )


def _packages(connection: Connection, environment: Environment | None) -> str:
    if environment is None:
        return (
            f"Installed packages are not known ({connection.unknown_why()}); the standard "
            "library is there."
        )
    notable = environment.notable()
    others = len(environment.packages) - len(notable)
    missing = [name for name in CORE if name not in environment.packages]
    text = f"Preinstalled: {', '.join([*notable, 'the standard library'])}"
    if others:
        plural = "s" if others != 1 else ""
        text += f", and {others} more package{plural} listed by the resource {ENVIRONMENT_URI}"
    if missing:
        text += f"; NOT installed: {', '.join(missing)}"
    return text + "."


def _sessions(settings: Settings, connection: Connection) -> str:
    idle = settings.code_session_idle_timeout
    live = connection.live_sessions
    if live and connection.info.session_idle_timeout is not None:
        idle = min(idle, connection.info.session_idle_timeout)  # the interpreter's end
    ending = f"A session ends after {duration(idle)} without a call, or when end_session ends it."
    if live:
        return (
            "- Sessions are like a notebook: a call without session_id starts a new session, "
            "and every result gives its session_id; pass it to later calls to run in the "
            "same interpreter, with the variables, imports and files of the calls before "
            "(files sent with `files` and files the code wrote). Each call's code runs like "
            "a notebook cell; sys.exit() ends the cell, not the session. A call past its "
            "time limit is interrupted (KeyboardInterrupt) and the session goes on; if the "
            "code does not stop, on a memory kill, or past the output limit, the interpreter "
            "ends: its variables are lost, its files kept (the result says so). " + ending
        )
    return (
        "- Sessions keep files, not variables. A call without session_id starts a new "
        "session, and every result gives its session_id: pass it to later calls to find the "
        "files sent with `files` and the files the code wrote (up to "
        f"{settings.max_session_bytes:,} bytes; names starting with '_' or '.' are not "
        "kept). Each call is a fresh interpreter: variables and imports do NOT carry over, "
        "so save what later calls need to a file (df.to_pickle('df.pkl'), json.dump). " + ending
    )
