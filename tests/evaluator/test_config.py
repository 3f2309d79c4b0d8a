"""The evaluator's settings: one declaration, read from the environment and flags, validated.

Pure tests, but for ``python -m evaluator`` refusing to start, which is a real process.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Annotated, Any

import pytest
from pydantic import Field
from pydantic_settings import SettingsConfigDict

from evaluator import EvaluatorConfig
from evaluator.__main__ import ServiceSettings, parse_args
from evaluator.config import UNSANDBOXED_CONSENT
from serving import ExplicitSettings, Flag, SettingsError, load, shown_default

PROJECT = Path(__file__).resolve().parents[2]
#: Every setting an operator sets, as docs/configuration.md lists it.
SETTINGS = {**ServiceSettings.flags(), **EvaluatorConfig.flags()}


def test_keyword_construction_copies_and_properties() -> None:
    config = EvaluatorConfig(time_limit=2, concurrency=2)
    assert (config.time_limit, config.queue_limit, config.sandbox_uids) == (2.0, 8, 65536)
    copied = config.model_copy(update={"time_limit": 5, "max_queue": 0})
    assert (copied.time_limit, copied.queue_limit, copied.concurrency) == (5.0, 0, 2)
    with pytest.raises(ValueError, match="frozen"):
        config.time_limit = 3


@pytest.mark.parametrize("update", [{"time_limit": float("nan")}, {"concurrency": 0}])
def test_a_copy_is_validated_too(update: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        EvaluatorConfig().model_copy(update=update)
    with pytest.raises(ValueError):
        EvaluatorConfig(**update)


def test_building_a_config_never_reads_the_process_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # TIME_LIMIT: what pydantic-settings would read by default.
    for name in ("EVALUATOR_TIME_LIMIT", "TIME_LIMIT", "time_limit"):
        monkeypatch.setenv(name, "3")
    assert EvaluatorConfig().time_limit == 15.0
    assert EvaluatorConfig.from_env(os.environ).time_limit == 3.0


def test_from_env_reads_each_variable_stripped_and_empty_is_unset() -> None:
    environ = {
        "EVALUATOR_TIME_LIMIT": " 2.5 ",
        "EVALUATOR_MAX_QUEUE": "0",
        "EVALUATOR_MEMORY_LIMIT": "",
        "EVALUATOR_MAX_REQUEST_FILES": "5",
        "EVALUATOR_MAX_REQUEST_BYTES": "1000",
        "EVALUATOR_UNSANDBOXED": UNSANDBOXED_CONSENT,
        "EVALUATOR_WORKDIR_INODES": "1",  # not a setting with a variable: ignored
    }
    config = EvaluatorConfig.from_env(environ)
    assert (config.time_limit, config.queue_limit, config.memory_limit) == (2.5, 0, 384)
    assert (config.max_request_files, config.request_bytes_limit) == (5, 1000)
    assert config.unsandboxed and config.workdir_inodes == 4096


@pytest.mark.parametrize(
    ("name", "value", "allowed"),
    [
        ("EVALUATOR_TIME_LIMIT", "nan", "a finite number > 0 and <= 86400"),
        ("EVALUATOR_TIME_LIMIT", "inf", "a finite number > 0 and <= 86400"),
        ("EVALUATOR_TIME_LIMIT", "-1", "a finite number > 0 and <= 86400"),
        ("EVALUATOR_TIME_LIMIT", "soon", "a finite number > 0 and <= 86400"),
        ("EVALUATOR_MEMORY_LIMIT", "-256", "an integer >= 16 and <= 1048576"),
        ("EVALUATOR_MEMORY_LIMIT", "1.5", "an integer >= 16 and <= 1048576"),
        ("EVALUATOR_CONCURRENCY", "0", "an integer >= 1 and <= 10000"),
        ("EVALUATOR_MAX_QUEUE", "-1", "an integer >= 0 and <= 1000000"),
        ("EVALUATOR_CPU_LIMIT", "nan", "a finite number >= 0.01 and <= 10000"),
        ("EVALUATOR_MAX_REQUEST_BYTES", "0", "an integer >= 1 and <= 1099511627776"),
        ("EVALUATOR_UNSANDBOXED", "yes", f"exactly {UNSANDBOXED_CONSENT}, or unset"),
        (
            "EVALUATOR_SANDBOX_UID",
            "0",
            "an integer from 1000 that leaves 65536 uids below 2**31 (the range the services of a "
            "host share)",
        ),
    ],
)
def test_a_bad_value_is_one_line_naming_variable_value_and_rule(
    name: str, value: str, allowed: str
) -> None:
    environ = {name: value, "EVALUATOR_CONCURRENCY": "2"} if "UID" in name else {name: value}
    with pytest.raises(SettingsError) as caught:
        EvaluatorConfig.from_env(environ)
    assert str(caught.value) == f"{name}={value!r} is not allowed: it must be {allowed}"


class Secretive(ExplicitSettings):
    """Settings of a test, with a secret."""

    model_config = SettingsConfigDict(env_prefix="TEST_")

    key: Annotated[str, Field(min_length=8), Flag("a secret")] = Field(
        default="0123456789", repr=False
    )
    level: Annotated[int, Field(ge=0, le=9), Flag("a level")] = 1


def test_a_secret_is_never_shown_and_every_bad_value_is_in_the_one_line() -> None:
    with pytest.raises(SettingsError) as caught:
        load(Secretive, {"TEST_KEY": " s3cret ", "TEST_LEVEL": "high"})
    assert str(caught.value) == (
        "TEST_KEY=(hidden) is not allowed: it must be a string of at least 8 characters; "
        "TEST_LEVEL='high' is not allowed: it must be an integer >= 0 and <= 9"
    )
    with pytest.raises(SettingsError, match=r"^--level=10 is not allowed: it must be an integer"):
        load(Secretive, {"TEST_LEVEL": "3"}, {"level": 10, "other": "ignored"})
    assert load(Secretive, {"TEST_LEVEL": "3"}, {"level": 4}).level == 4


@pytest.mark.parametrize(
    ("environ", "argv", "line"),
    [
        ({"EVALUATOR_TIME_LIMIT": "nan"}, [], "EVALUATOR_TIME_LIMIT='nan' is not allowed"),
        ({"EVALUATOR_TIME_LIMIT": "-1"}, [], "EVALUATOR_TIME_LIMIT='-1' is not allowed"),
        ({"EVALUATOR_PORT": "abc"}, [], "EVALUATOR_PORT='abc' is not allowed"),
        ({}, ["--time-limit", "abc"], "--time-limit='abc' is not allowed"),
        ({}, ["--max-request-bytes", "-5"], "--max-request-bytes='-5' is not allowed"),
    ],
)
def test_python_m_evaluator_refuses_to_start_with_one_line(
    environ: dict[str, str], argv: list[str], line: str
) -> None:
    process = subprocess.run(
        [sys.executable, "-m", "evaluator", *argv],
        env={**os.environ, **environ},
        capture_output=True,
        text=True,
        timeout=60,
        cwd=PROJECT,
    )
    assert process.returncode == 1
    assert process.stderr.startswith(f"python -m evaluator: {line}: it must be ")
    assert process.stderr.count("\n") == 1, process.stderr


def test_a_flag_wins_over_its_variable() -> None:
    environ = {"EVALUATOR_TIME_LIMIT": "7", "EVALUATOR_MEMORY_LIMIT": "70", "EVALUATOR_PORT": "70"}
    args = parse_args(["--time-limit", "3", "--max-request-files", "9"], environ)
    assert (args.config.time_limit, args.config.max_request_files) == (3.0, 9)
    assert (args.config.memory_limit, args.service.port) == (70, 70)


@pytest.mark.parametrize("name", SETTINGS)
def test_every_variable_is_a_flag(name: str) -> None:
    value = {
        "host": "127.0.0.2",
        "unsandboxed": UNSANDBOXED_CONSENT,
        "sandbox_uid": "3000",
        "preimport": "json",
        "memory_reserve": "0.2",
    }
    args = parse_args(["--" + name.replace("_", "-"), value.get(name, "20")], {})
    settings = args.service if name in ServiceSettings.model_fields else args.config
    assert getattr(settings, name) != getattr(type(settings)(), name)


def test_the_reference_lists_exactly_the_settings_with_their_flags_and_defaults() -> None:
    # docs/configuration.md is generated from the declarations (tests/test_docs.py checks it is
    # the generator's output); this checks what the generator makes of them.
    reference = (PROJECT / "docs" / "configuration.md").read_text()
    rows = re.findall(
        r"^\| `(EVALUATOR_[A-Z_]+)` \| `([^`|]+)` \| ([^|]+) \|", reference, re.MULTILINE
    )
    listed = {name: (flag, default.strip()) for name, flag, default in rows}
    declared = {}
    for name, (field, marker) in SETTINGS.items():
        assert field.description, f"{name}: the reference's meaning is its description"
        default = shown_default(field, marker)
        variable = EvaluatorConfig.variable(name)
        assert variable == ServiceSettings.variable(name) == f"EVALUATOR_{name.upper()}"
        shown = default if marker.default is not None else f"`{default}`"
        declared[variable] = ("--" + name.replace("_", "-"), shown)
    assert listed == declared


def test_preimport_is_a_list_of_module_names_and_empty_turns_it_off() -> None:
    assert EvaluatorConfig.from_env({"EVALUATOR_PREIMPORT": " json , xml.dom "}).preimport == (
        "json",
        "xml.dom",
    )
    assert EvaluatorConfig.from_env({"EVALUATOR_PREIMPORT": ""}).preimport == ()
    assert EvaluatorConfig.from_env({}).preimport == ("numpy", "pandas", "matplotlib.pyplot")
    with pytest.raises(SettingsError, match="it must be comma-separated module names"):
        EvaluatorConfig.from_env({"EVALUATOR_PREIMPORT": "numpy,os; rm -rf /"})
