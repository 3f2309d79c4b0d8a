"""The request's body as sent: the JSON of ``to_json``, its files' base64 encoded once."""

from __future__ import annotations

import base64
import json

import pytest

from snekbox_client import ContentWanted, EvalRequest, File

REQUESTS = [
    EvalRequest(input="print(1)"),
    EvalRequest(args=["-c", "print('é')"], files=[File('a "quoted" é', b"\x00\xff" * 7)]),
    EvalRequest(
        args=["main.py"],
        files=[File("main.py", b"print(1)"), File("empty")],
        executable_path="/usr/bin/python3",
        content_wanted=ContentWanted(("*.png",), 100, 24),
        time_limit=2.5,
        session="s",
        session_resume=True,
        end_sessions=["old"],
        session_owner="owner",
        packages=["tabulate"],
        wait=0.0,
    ),
]


@pytest.mark.parametrize("request_", REQUESTS)
def test_the_body_is_the_json_of_the_request(request_: EvalRequest) -> None:
    assert json.loads(request_.to_bytes()) == request_.to_json()


def test_a_file_is_encoded_once() -> None:
    file = File("f", b"data")
    assert file.base64 is file.base64 == base64.b64encode(b"data")
    assert file.to_json() == {"path": "f", "content": "ZGF0YQ=="}


def test_a_file_encoded_already_is_sent_as_given() -> None:
    file = File.encoded("f", b"data", b"ZGF0YQ==")
    assert file == File("f", b"data") and file.size == 4
    assert json.loads(EvalRequest(input="x", files=[file]).to_bytes())["files"] == [
        {"path": "f", "content": "ZGF0YQ=="}
    ]
