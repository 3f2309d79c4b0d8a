"""How an evaluation result is rendered for the model (pure functions, no service needed)."""

from __future__ import annotations

import pytest
from mcp.types import TextContent

from gateway.render import RenderLimits
from python_mcp_server import Settings, describe_exit, render_result
from snekbox_client import EndedBy, EvalResult


@pytest.mark.parametrize(
    ("returncode", "stdout", "status", "words"),
    [
        (0, "", "ok", "exit code 0: ok"),
        (2, "", "error", "exit code 2"),
        (1, "Traceback (most recent call last):\n  ...\nValueError: x\n", "exception", "traceback"),
        (1, "", "error", "exit code 1"),
        # Without a memory cgroup the limit is an address-space rlimit: MemoryError, not 137.
        (1, "Traceback (most recent call last):\nMemoryError\n", "exception", "memory limit"),
        (137, "", "killed", "killed after 3.0 s"),
        (143, "", "output_limit", "output limit was reached"),
        (139, "", "signal", "SIGSEGV"),
        (134, "", "signal", "SIGABRT"),
        (255, "", "sandbox_error", "sandbox itself failed"),
        # returncode null: the evaluator's message says whether the code ran (Snekbox's words).
        (
            None,
            "UnicodeDecodeError: invalid Unicode in output pipe",
            "invalid_output",
            "the code ran, but it wrote bytes that are not UTF-8 straight to a file descriptor",
        ),
        (
            None,
            "FileParsingError: Exceeded directory depth limit while parsing attachments",
            "files_not_collected",
            "the code ran, but the evaluator could not collect the files it wrote",
        ),
        (
            None,
            "FileParsingError: invalid bytes in filename while parsing attachments",
            "files_not_collected",
            "discarded all of its output and files",
        ),
        (
            None,
            "TimeoutError: Exceeded time limit while parsing attachments",
            "files_not_collected",
            "the code ran",
        ),
        (
            None,
            "IsADirectoryError: Failed to create file 'data/'.",
            "not_run",
            "could not run the code",
        ),
        (None, "ValueError: embedded null byte", "not_run", "could not run the code"),
        (
            None,
            "the session's interpreter could not start: bwrap: Creating new namespace failed: "
            "Resource temporarily unavailable",
            "not_run",
            "the evaluator's user has too many running (its own programs count too)",
        ),
        (None, "something new", "evaluator_error", "whether the code ran is not known"),
    ],
)
def test_exit_status_in_words(returncode: int | None, stdout: str, status: str, words: str) -> None:
    got_status, message = describe_exit(returncode, stdout, 3.0)
    assert got_status == status
    assert words in message


@pytest.mark.parametrize(
    ("returncode", "ended_by", "status", "words"),
    [
        # Snekbox does not say which limit: both are named.
        (137, None, "killed", "killed after 3.0 s (exit code 137, SIGKILL): the time limit or"),
        (137, "time_limit", "killed", "the time limit was reached; make the code faster"),
        (137, "memory_limit", "killed", "the memory limit was reached; use less memory"),
        (143, "output_limit", "output_limit", "the output limit was reached"),
        # The code's own signals: no limit is blamed.
        (137, "exit", "signal", "killed by signal SIGKILL (exit code 137)"),
        (143, "exit", "signal", "killed by signal SIGTERM (exit code 143)"),
    ],
)
def test_the_limit_the_evaluator_names_is_the_one_said(
    returncode: int, ended_by: EndedBy | None, status: str, words: str
) -> None:
    got_status, message = describe_exit(returncode, "", 3.0, ended_by)
    assert (got_status, words in message) == (status, True), message
    other = {"time_limit": "memory", "memory_limit": "time"}.get(str(ended_by))
    assert other is None or other not in message


def test_a_memory_kill_names_the_limit_when_the_gateway_knows_it() -> None:
    _, message = describe_exit(137, "", 0.4, "memory_limit", memory_limit_mib=1536)
    assert "the memory limit (1,536 MiB) was reached; use less memory" in message
    built_in = render_result(
        EvalResult(stdout="", returncode=137, ended_by="memory_limit"),
        duration=0.4,
        limits=RenderLimits.of(Settings()),
    )
    assert f"memory limit ({Settings().evaluator_config.memory_limit:,} MiB)" in str(built_in)
    remote = render_result(
        EvalResult(stdout="", returncode=137),
        duration=0.4,
        limits=RenderLimits.of(Settings(snekbox_url="http://snekbox:8060")),
    )
    assert "MiB" not in str(remote) and "does not say which" in str(remote)


def test_long_output_keeps_head_and_tail_and_says_sizes() -> None:
    stdout = "".join(f"line {i}\n" for i in range(100_000))
    result = render_result(
        EvalResult(stdout=stdout, returncode=0),
        duration=0.1,
        limits=RenderLimits.of(Settings(max_output_chars=1000)),
    )
    text = result.content[0]
    assert isinstance(text, TextContent)
    assert text.text.startswith("line 0\nline 1\n")
    assert "line 99999\n" in text.text
    assert (
        f"of {len(stdout):,} characters omitted; the first 600 and the last 400 are shown"
        in text.text
    )
    assert result.structured_content is not None
    assert result.structured_content["stdout_truncated"] is True


def test_text_is_output_then_a_closing_line_then_the_status() -> None:
    result = render_result(
        EvalResult(stdout="hello\n", returncode=0), duration=0.1, limits=RenderLimits.of(Settings())
    )
    text = result.content[0]
    assert isinstance(text, TextContent)
    assert text.text == "hello\n[end of output]\n[exit code 0: ok]"
    assert result.structured_content is not None
    assert result.structured_content["stdout"] == "hello\n"


def test_a_cut_output_is_said_to_be_cut_after_it() -> None:
    result = render_result(
        EvalResult(stdout="x" * 5000, returncode=0),
        duration=0.1,
        limits=RenderLimits.of(Settings(max_output_chars=100)),
    )
    text = result.content[0]
    assert isinstance(text, TextContent)
    assert text.text.endswith("x\n[end of output; it was cut in the middle]\n[exit code 0: ok]")


def test_the_evaluators_message_is_quoted_in_the_status_not_shown_as_output() -> None:
    message = "UnicodeDecodeError: invalid Unicode in output pipe"
    result = render_result(
        EvalResult(stdout=message, returncode=None),
        duration=0.1,
        limits=RenderLimits.of(Settings()),
    )
    assert not result.is_error
    text = result.content[0]
    assert isinstance(text, TextContent)
    first, status = text.text.split("\n")
    assert first == "(no output)"
    assert status.startswith("[the code ran, but it wrote bytes that are not UTF-8")
    assert f'(its message: "{message}")' in status
    assert result.structured_content is not None
    assert result.structured_content["status"] == "invalid_output"
    assert result.structured_content["stdout"] == message
