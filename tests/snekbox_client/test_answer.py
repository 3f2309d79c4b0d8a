"""The incremental answer reader on its own: the same result as ``json.loads``, chunk by chunk."""

from __future__ import annotations

import base64
import json
import random
import re
from typing import Any

import pytest

from snekbox_client import (
    ContentWanted,
    EndedBy,
    EvalResult,
    File,
    InvalidResponse,
)
from snekbox_client._answer import AnswerReader

EVERYTHING = ContentWanted(("*",), 1 << 30)


def read(body: bytes, wanted: ContentWanted = EVERYTHING, chunk: int = 7, **caps: int) -> Any:
    limits = {"max_answer_bytes": 1 << 30, "max_text_bytes": 1 << 30, "max_files": 1000}
    reader = AnswerReader(wanted, **{**limits, **caps})
    for start in range(0, len(body), chunk):
        reader.feed(body[start : start + chunk])
    return reader.result()


def random_answer(rng: random.Random) -> dict[str, Any]:
    """An answer with the awkward parts: escapes, non-ASCII, unknown keys, nested values."""
    alphabet = ["a", "\n", "\\", '"', "é", "\u2028", "\x00", "😀", "/"]
    files = []
    for n in range(rng.randint(0, 5)):
        data = rng.randbytes(rng.randint(0, 80))
        path = rng.choice([f"figure_{n:03d}.png", f'd/é"{n}', f"a\\b{n}"])
        entry: dict[str, Any] = {"path": path, "size": len(data)}
        entry["content"] = base64.b64encode(data).decode()
        entry["extra"] = [1, {"k": [None, True, '\\"', -1.5e3]}]
        files.append(entry)
    stdout = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 60)))
    answer: dict[str, Any] = {
        "stdout": stdout,
        "returncode": rng.choice([0, 1, None, 137]),
        "files": files,
    }
    answer["unknown"] = {"nested": [[], {}, "x" * rng.randint(0, 30)]}
    ended_by = rng.choice(
        ["absent", None, "exit", "time_limit", "memory_limit", "output_limit", "packages_refused"]
    )
    if ended_by != "absent":
        answer["ended_by"] = ended_by
    if rng.random() < 0.5:
        answer["installed"] = rng.choice(["", "a==1", "tinypkg==1.1 with-dep==2.0.post1"])
        answer["install_seconds"] = rng.choice([0, 0.25, 12])
    return answer


@pytest.mark.parametrize("seed", range(40))
def test_the_same_result_as_json_loads_whatever_the_chunking(seed: int) -> None:
    rng = random.Random(seed)
    answer = random_answer(rng)
    body = json.dumps(answer, ensure_ascii=rng.random() < 0.5, indent=rng.choice([None, 1]))
    for chunk in (1, 2, 3, 5, 64, 1 << 20):
        assert read(body.encode(), chunk=chunk) == EvalResult.from_json(answer)


@pytest.mark.parametrize("seed", range(20))
def test_only_the_wanted_contents_are_kept(seed: int) -> None:
    """Matching files whole while the budget lasts, else their head; the others: size only."""
    rng = random.Random(seed)
    answer = random_answer(rng)
    wanted = ContentWanted(("figure_*.png",), max_bytes=60, head_bytes=5)
    result = read(json.dumps(answer).encode(), wanted, chunk=rng.randint(1, 9))
    budget = 60
    for got, sent in zip(result.files, EvalResult.from_json(answer).files, strict=True):
        assert (got.path, got.size) == (sent.path, sent.size)
        if not wanted.matches(sent.path):
            assert got.content == b""
        elif sent.size <= budget:
            assert got.content == sent.content and got.complete
            budget -= sent.size
        else:
            assert got.content == sent.content[:5]


def test_without_a_size_the_size_comes_from_the_content() -> None:
    """Snekbox sends ``size``; an answer without it still gives every file's size."""
    data = b"0123456789" * 10
    files = [{"path": p, "content": base64.b64encode(data).decode()} for p in ("a", "b")]
    body = json.dumps({"stdout": "", "returncode": 0, "files": files}).encode()
    result = read(body, ContentWanted(("a",), 1000))
    assert result.files == (File("a", data), File("b", b"", 100))


def test_escaped_base64_is_decoded() -> None:
    """JSON lets an encoder write ``/`` as ``\\/``."""
    data = bytes(range(256))
    content = base64.b64encode(data).decode().replace("/", "\\/")
    files = [{"path": "x", "content": "CONTENT"}]
    body = json.dumps({"stdout": "", "returncode": 0, "files": files}).replace("CONTENT", content)
    assert read(body.encode()).files == (File("x", data),)


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"[]", "expected a JSON object, got list"),
        (b'"x"', "expected a JSON object, got str"),
        (b"", "not JSON: Expecting value: line 1 column 1 (char 0)"),
        (b'{"stdout": 1}', "'stdout' is missing or not a string"),
        (b'{"returncode": 0}', "'stdout' is missing or not a string"),
        (b'{"stdout": "a"', "Expecting ',' delimiter: line 1 column 15 (char 14)"),
        (b'{"stdout": "a",}', "Expecting property name enclosed in double quotes"),
        (b'{"stdout": "a"} x', "not JSON: Extra data: line 1 column 17 (char 16)"),
        (b'{"stdout": "a" "b"}', "Expecting ',' delimiter"),
        # Past the body's first 64 KiB, the reader's own words.
        (b'{"stdout": "' + b"a" * 70_000 + b'"} x', "not JSON: unexpected 'x'"),
        (b'{"stdout": "' + b"a" * 70_000, "not JSON: it ends too early"),
        (b'{"stdout": "\\x"}', "not JSON"),
        (b'{"stdout": "a", "returncode": true}', "'returncode' is neither an integer nor null"),
        (b'{"stdout": "a", "returncode": "0"}', "'returncode' is neither an integer nor null"),
        (b'{"stdout": "a", "returncode": 01}', "Expecting ',' delimiter"),
        (b'{"stdout": "a", "files": {}}', "'files' is not a list"),
        (b'{"stdout": "a", "files": [1]}', "a file entry is not an object"),
        (b'{"stdout": "a", "files": [{"content": ""}]}', "lacks a string 'path'"),
        (b'{"stdout": "a", "files": [{"path": 1}]}', "lacks a string 'path'"),
        (b'{"stdout": "a", "files": [{"path": "x", "content": "!!"}]}', "invalid base64"),
        (b'{"stdout": "a", "files": [{"path": "x", "content": "YQ=a"}]}', "invalid base64"),
        (b'{"stdout": "a", "files": [{"path": "x", "content": "YWJ"}]}', "invalid base64"),
        (b'{"stdout": "a", "files": [{"path": "x", "size": "1"}]}', "invalid 'size'"),
        (b'{"stdout": "a", "files": [{"path": "x", "size": 1, "content": "YWI="}]}', "'size'"),
        (b'{"x": ' + b"[" * 100 + b"]" * 100 + b', "stdout": ""}', "nested too deep"),
        (b'{"stdout": "a", "ended_by": "killed"}', "'ended_by' is not one of exit, time_limit"),
        (b'{"stdout": "a", "ended_by": 137}', "'ended_by' is not one of"),
        (b'{"stdout": "a", "ended_by": ["time_limit"]}', "'ended_by' is not one of"),
        (b'{"stdout": "a", "ended_by": {"x": [1]}}', "'ended_by' is not one of"),
        (b'{"stdout": "a", "installed": 1}', "'installed' is neither a string nor null"),
        (b'{"stdout": "a", "installed": ["a==1"]}', "'installed' is neither a string nor"),
        (b'{"stdout": "a", "installed": "a b==1"}', "'installed' is not a list of name==vers"),
        (b'{"stdout": "a", "installed": "a==1\\u0000"}', "not a list of name==version"),
        (b'{"stdout": "a", "install_seconds": -1}', "'install_seconds' is not a non-negative"),
        (b'{"stdout": "a", "install_seconds": "1"}', "'install_seconds' is not a non-negative"),
        (b'{"stdout": "a", "install_seconds": [1]}', "'install_seconds' is not a non-negative"),
    ],
)
def test_what_is_not_an_eval_result_is_invalid(body: bytes, message: str) -> None:
    with pytest.raises(InvalidResponse, match=re.escape(message)):
        read(body, chunk=3, max_files=1)
    with pytest.raises(InvalidResponse, match=re.escape(message)):  # content not wanted
        read(body, ContentWanted(), chunk=1000, max_files=1)


@pytest.mark.parametrize("ended_by", [None, "exit", "time_limit", "memory_limit", "output_limit"])
def test_ended_by_is_read_and_written(ended_by: EndedBy | None) -> None:
    """The built-in evaluator's extension; Snekbox's answers, without it, read as ``None``."""
    result = EvalResult("out", 137, (File("a", b"xy"),), ended_by)
    body = json.dumps(result.to_json()).encode()
    assert ("ended_by" in json.loads(body)) == (ended_by is not None)
    assert read(body) == EvalResult.from_json(json.loads(body)) == result


def test_caps() -> None:
    files = [{"path": f"f{n}", "size": 0, "content": ""} for n in range(3)]
    body = json.dumps({"stdout": "x" * 100, "returncode": 0, "files": files}).encode()
    with pytest.raises(InvalidResponse, match="larger than 50 bytes"):
        read(body, max_answer_bytes=50)
    with pytest.raises(InvalidResponse, match="output and file names are larger than 90"):
        read(body, max_text_bytes=90)
    with pytest.raises(InvalidResponse, match="more than 2 files"):
        read(body, max_files=2)
    assert len(read(body, max_answer_bytes=len(body), max_text_bytes=200).files) == 3
