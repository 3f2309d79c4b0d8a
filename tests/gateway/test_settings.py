"""The gateway's settings: validated once, a bad value worded in one line, the docs in step.

Pure tests: the settings are built from mappings, and ``main`` is called in this process with a
bad environment (it stops before it would serve). Two subprocesses check what an operator sees
from the real commands.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import gateway
import serving
from gateway.cli import main
from gateway.settings import SNEKBOX_WORKERS, Settings, SettingsError
from python_mcp_server import create_app

CONFIGURATION = Path(__file__).parents[2] / "docs" / "configuration.md"


@pytest.fixture
def token_file(tmp_path: Path) -> Path:
    return tmp_path / "token"


#: The values the issue reproduced, and the line each now gets.
BAD_VALUES = [
    (
        {"MCP_PROGRESS_INTERVAL": "0"},
        "MCP_PROGRESS_INTERVAL='0' is not allowed: it must be a finite number >= 0.05",
    ),
    (
        {"MCP_LOG_LEVEL": "verbose"},
        "MCP_LOG_LEVEL='verbose' is not allowed: it must be one of 'debug', 'info', 'warning', "
        "'error'",
    ),
    (
        {"MCP_PORT": "abc"},
        "MCP_PORT='abc' is not allowed: it must be an integer >= 1 and <= 65535",
    ),
    (
        {"MCP_PORT": "65536"},
        "MCP_PORT='65536' is not allowed: it must be an integer >= 1 and <= 65535",
    ),
    (
        {"SNEKBOX_URL": "snekbox:8060"},
        "SNEKBOX_URL='snekbox:8060' is not allowed: it must be an http:// or https:// URL with a "
        "host, e.g. http://snekbox:8060",
    ),
    (
        {"MCP_MAX_OUTPUT_CHARS": "-5"},
        "MCP_MAX_OUTPUT_CHARS='-5' is not allowed: it must be an integer > 0",
    ),
    (
        {"MCP_EVAL_TIMEOUT": "-1"},
        "MCP_EVAL_TIMEOUT='-1' is not allowed: it must be a finite number > 0",
    ),
    (
        {"MCP_MAX_WAIT": "nan"},
        "MCP_MAX_WAIT='nan' is not allowed: it must be a finite number >= 0",
    ),
    (
        {"MCP_SESSION_IDLE_TIMEOUT": "inf"},
        "MCP_SESSION_IDLE_TIMEOUT='inf' is not allowed: it must be a finite number > 0",
    ),
    (
        {"MCP_ALLOW_UNAUTHENTICATED": "perhaps"},
        "MCP_ALLOW_UNAUTHENTICATED='perhaps' is not allowed: it must be true or false",
    ),
    (
        {"EVALUATOR_TIME_LIMIT": "nan"},
        "EVALUATOR_TIME_LIMIT='nan' is not allowed: it must be a finite number > 0 and <= 86400",
    ),
    (
        {"EVALUATOR_TIME_LIMIT": "x", "MCP_PORT": "abc"},
        "EVALUATOR_TIME_LIMIT='x' is not allowed: it must be a finite number > 0 and <= 86400; "
        "MCP_PORT='abc' is not allowed: it must be an integer >= 1 and <= 65535",
    ),
]


@pytest.mark.parametrize(("environ", "line"), BAD_VALUES, ids=lambda v: str(v)[:40])
def test_a_bad_value_stops_start_up_with_one_line(
    monkeypatch: pytest.MonkeyPatch, environ: dict[str, str], line: str
) -> None:
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(SystemExit) as stopped:
        main([])
    assert stopped.value.code == f"python-mcp-server: {line}"


def test_an_empty_token_file_does_not_turn_authentication_off(
    monkeypatch: pytest.MonkeyPatch, token_file: Path
) -> None:
    token_file.write_text(" \n")
    monkeypatch.setenv("MCP_AUTH_TOKEN_FILE", str(token_file))
    with pytest.raises(SystemExit) as stopped:
        main([])
    assert stopped.value.code == (
        f"python-mcp-server: MCP_AUTH_TOKEN_FILE={str(token_file)!r} is not allowed: the file "
        "is empty (it must hold the token)"
    )


def test_the_token_file_gives_the_token_which_is_never_shown(token_file: Path) -> None:
    token_file.write_text("s3cret\n")
    settings = Settings.from_env({"MCP_AUTH_TOKEN_FILE": str(token_file)})
    assert settings.auth_token == "s3cret"
    assert "s3cret" not in repr(settings)
    # MCP_AUTH_TOKEN wins over the file.
    assert Settings.from_env(
        {"MCP_AUTH_TOKEN_FILE": str(token_file), "MCP_AUTH_TOKEN": "other"}
    ).auth_token == ("other")


def test_every_bad_value_is_named_in_the_same_line() -> None:
    with pytest.raises(SettingsError) as refused:
        Settings.from_env({"MCP_PORT": "0", "MCP_MAX_IMAGES": "-1"})
    assert str(refused.value) == (
        "MCP_PORT='0' is not allowed: it must be an integer >= 1 and <= 65535; "
        "MCP_MAX_IMAGES='-1' is not allowed: it must be an integer >= 0"
    )


def test_the_gateway_and_the_evaluator_share_one_settings_error() -> None:
    assert SettingsError is gateway.SettingsError is serving.SettingsError


def test_help_works_whatever_the_environment_holds(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("MCP_PORT", "abc")
    with pytest.raises(SystemExit) as stopped:
        main(["--help"])
    assert stopped.value.code == 0
    shown = capsys.readouterr().out
    for flag in ("--host", "--port", "--snekbox-url", "--allow-unauthenticated", "--log-level"):
        assert flag in shown
    assert "(env MCP_PORT; default: 18080)" in shown
    assert "--log-level {debug,info,warning,error}" in shown
    assert "--allow-unauthenticated\n" in shown  # a switch: it takes no value


def test_a_flag_wins_over_the_environment_and_is_named_when_bad() -> None:
    assert Settings.from_env({"MCP_PORT": "abc"}, flags={"port": "8081"}).port == 8081
    with pytest.raises(SettingsError) as refused:
        Settings.from_env({}, flags={"port": "x"})
    assert (
        str(refused.value) == "--port='x' is not allowed: it must be an integer >= 1 and <= 65535"
    )
    flagged = Settings.from_env({}, flags={"allow_unauthenticated": True, "log_level": "DEBUG"})
    assert (flagged.allow_unauthenticated, flagged.log_level) == (True, "debug")


def test_an_ipv6_host_with_a_token_serves() -> None:
    settings = Settings.from_env({"MCP_HOST": "::", "MCP_AUTH_TOKEN": "t0ken"})
    assert settings.url == "http://[::]:18080"
    create_app(settings)  # the token's issuer URL is valid (it was a pydantic URL error)
    with pytest.raises(ValueError, match="refusing to listen on :: without authentication"):
        Settings.from_env({"MCP_HOST": "::"}).check()
    Settings(host="::1").check()


def test_empty_variables_are_unset_and_values_are_stripped() -> None:
    settings = Settings.from_env(
        {"SNEKBOX_URL": "", "MCP_PORT": " 8082 ", "MCP_ALLOWED_HOSTS": " a.example, b:* ,"}
    )
    assert settings.snekbox_url is None
    assert settings.port == 8082
    assert settings.allowed_hosts == ("a.example", "b:*")


def test_admission_defaults_to_the_services_workers() -> None:
    remote = Settings(snekbox_url="http://snekbox:8060")
    assert remote.in_flight_limit == SNEKBOX_WORKERS == 2
    assert remote.model_copy(update={"max_in_flight": 5}).in_flight_limit == 5
    builtin = Settings()
    assert builtin.in_flight_limit == builtin.evaluator_config.concurrency
    assert Settings.from_env({"MCP_MAX_IN_FLIGHT": "3"}).in_flight_limit == 3


def test_the_evaluators_settings_are_read_too() -> None:
    assert Settings.from_env({"EVALUATOR_TIME_LIMIT": "7"}).evaluator_config.time_limit == 7
    with pytest.raises(SettingsError) as refused:
        Settings.from_env({"EVALUATOR_TIME_LIMIT": "nan", "MCP_PORT": "8081"})
    assert str(refused.value) == (
        "EVALUATOR_TIME_LIMIT='nan' is not allowed: it must be a finite number > 0 and <= 86400"
    )


def test_the_commands_say_a_bad_value_in_one_line_without_a_traceback() -> None:
    environ = {**os.environ, "MCP_LOG_LEVEL": "verbose"}
    for command in (
        ["-m", "python_mcp_server"],
        ["-m", "uvicorn", "python_mcp_server:starlette_app"],
    ):
        done = subprocess.run(
            [sys.executable, *command], env=environ, capture_output=True, text=True, timeout=60
        )
        assert done.returncode == 1, done.stderr
        assert done.stderr == (
            "python-mcp-server: MCP_LOG_LEVEL='verbose' is not allowed: it must be one of "
            "'debug', 'info', 'warning', 'error'\n"
        )


# --- The configuration reference (docs/configuration.md) -----------------------------------------


def reference_rows() -> dict[str, tuple[str, str]]:
    """The gateway's table in docs/configuration.md: ``{variable: (flag, default)}``, as written."""
    text = CONFIGURATION.read_text()
    section = text[text.index("## The gateway") : text.index("## The built-in evaluator")]
    table = section[section.index("| variable | flag |") :].split("\n\n", 1)[0]
    rows: dict[str, tuple[str, str]] = {}
    for line in table.splitlines()[2:]:
        variable, flag, default = (cell.strip() for cell in line.strip("|").split("|")[:3])
        rows[variable.strip("`")] = (flag.strip("`"), default)
    return rows


def shown(value: Any) -> str:
    """A default as the reference writes it."""
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, float):
        return f"`{value:g}`"
    return f"`{value}`"


def test_the_reference_lists_exactly_the_settings_with_their_defaults_and_flags() -> None:
    # Generated from the declarations (tests/test_docs.py checks the file is the generator's
    # output); this checks what the generator makes of them.
    fields = {name: Settings.model_fields[name] for name in Settings.variables()}
    assert "evaluator_config" in Settings.model_fields and "evaluator_config" not in fields
    rows = reference_rows()
    assert set(rows) == {Settings.variable(name) for name in fields}
    for name, field in fields.items():
        assert field.description, f"{name}: the reference's meaning is its description"
        flag, default = rows[Settings.variable(name)]
        marked = name in Settings.flags()
        assert flag == (f"--{name.replace('_', '-')}" if marked else ""), name
        if field.default in (None, ()):
            # Derived or absent: said in words, never as a value.
            assert not re.fullmatch(r"`[^`]*`", default), (name, default)
        else:
            assert default == shown(field.default), name


def test_a_tokens_file_names_each_clients_token_and_never_shows_one(tmp_path: Path) -> None:
    tokens = tmp_path / "tokens"
    tokens.write_text(
        "# the team\nalice alice-0123456789abcdef\n\n  bob   bob-0123456789abcdef  \n"
    )
    settings = Settings.from_env(
        {"MCP_AUTH_TOKENS_FILE": str(tokens), "MCP_AUTH_TOKEN": "single-0123456789abcdef"}
    )
    assert settings.client_tokens == {
        "alice-0123456789abcdef": "alice",
        "bob-0123456789abcdef": "bob",
        "single-0123456789abcdef": "default",
    }
    assert settings.authenticated
    Settings(host="0.0.0.0", auth_tokens_file=settings.auth_tokens_file).check()
    assert "0123456789abcdef" not in repr(settings)


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("alice\n", "line 1 must be 'NAME TOKEN' (two words)"),
        ("alice a b c\n", "line 1 must be 'NAME TOKEN' (two words)"),
        ("# none\n", "the file holds no 'NAME TOKEN' line"),
        ("al/ice alice-0123456789abcdef\n", "line 1: a name is 1-64 letters"),
        ("alice short\n", "line 1: the token of 'alice' is shorter than 16 characters"),
        (
            "alice alice-0123456789abcdef\nalice other-0123456789abcdef\n",
            "line 2: the name 'alice' is given twice",
        ),
        (
            "alice same-0123456789abcdef\nbob same-0123456789abcdef\n",
            "line 2: the token of 'bob' is another's too",
        ),
    ],
)
def test_a_bad_tokens_file_is_refused_by_its_line(tmp_path: Path, text: str, why: str) -> None:
    tokens = tmp_path / "tokens"
    tokens.write_text(text)
    with pytest.raises(SettingsError) as refused:
        Settings.from_env({"MCP_AUTH_TOKENS_FILE": str(tokens)})
    assert f"MCP_AUTH_TOKENS_FILE={str(tokens)!r} is not allowed: {why}" in str(refused.value)
    assert "0123456789abcdef" not in str(refused.value)


def test_a_renamed_variable_is_read_this_release_with_a_line_naming_the_new_one(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level("WARNING", logger="serving.settings"):
        old = Settings.from_env({"MCP_MAX_SESSIONS": "7", "MCP_SESSION_IDLE_TIMEOUT": "5"})
    assert (old.max_transport_sessions, old.transport_session_idle_timeout) == (7, 5.0)
    assert [r.getMessage() for r in caplog.records] == [
        "MCP_MAX_SESSIONS is deprecated and will be read for this release only: set "
        "MCP_MAX_TRANSPORT_SESSIONS instead",
        "MCP_SESSION_IDLE_TIMEOUT is deprecated and will be read for this release only: set "
        "MCP_TRANSPORT_SESSION_IDLE_TIMEOUT instead",
    ]
    both = Settings.from_env({"MCP_MAX_SESSIONS": "7", "MCP_MAX_TRANSPORT_SESSIONS": "9"})
    assert both.max_transport_sessions == 9  # the new name wins


def test_the_request_body_limit_follows_the_uploads_unless_set() -> None:
    assert Settings().request_bytes_limit == 6 * 1024 * 1024
    assert Settings(max_upload_bytes=3 * 1024).request_bytes_limit == 4 * 1024 + 2 * 1024 * 1024
    assert Settings(max_request_bytes=1000).request_bytes_limit == 1000
