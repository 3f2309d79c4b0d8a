"""How an evaluation result is rendered for the model (pure functions, no service needed)."""

from __future__ import annotations

import pytest
from mcp.types import TextContent

from python_mcp_server import Settings, describe_exit, render_result
from snekbox_client import EvalResult


@pytest.mark.parametrize(
    ("returncode", "stdout", "status", "words"),
    [
        (0, "", "ok", "exit code 0: ok"),
        (2, "", "error", "exit code 2"),
        (1, "Traceback (most recent call last):\n  ...\nValueError: x\n", "exception", "traceback"),
        (1, "", "error", "exit code 1"),
        (137, "", "killed", "killed after 3.0 s"),
        (143, "", "output_limit", "output limit was reached"),
        (139, "", "signal", "SIGSEGV"),
        (134, "", "signal", "SIGABRT"),
        (255, "", "sandbox_error", "sandbox itself failed"),
        (None, "invalid UTF-8", "not_run", "could not run the code"),
    ],
)
def test_exit_status_in_words(returncode: int | None, stdout: str, status: str, words: str) -> None:
    got_status, message = describe_exit(returncode, stdout, 3.0)
    assert got_status == status
    assert words in message


def test_long_output_keeps_head_and_tail_and_says_sizes() -> None:
    stdout = "".join(f"line {i}\n" for i in range(100_000))
    result = render_result(
        EvalResult(stdout=stdout, returncode=0),
        duration=0.1,
        settings=Settings(max_output_chars=1000),
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


def test_not_run_keeps_the_services_message() -> None:
    result = render_result(
        EvalResult(stdout="UnicodeDecodeError: invalid start byte", returncode=None),
        duration=0.1,
        settings=Settings(),
    )
    assert not result.is_error
    text = result.content[0]
    assert isinstance(text, TextContent)
    assert text.text.startswith("UnicodeDecodeError: invalid start byte\n[the evaluator could not")
