"""The SSE message path when a session's stream ends while a POST to it is being handled.

The SDK looks the session's stream up, answers 202, then hands the message to the stream; a
client that closes its stream as it posts can end it in between (seen on a loaded machine in
tests/gateway/test_hostile.py's expired-sse-session). That window cannot be hit on demand with
the real SDK, so the app below takes its place and does what the SDK does in it: raise
anyio.ClosedResourceError, after its 202 or before any answer.
"""

from __future__ import annotations

import anyio
import httpx
import pytest
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from gateway.sessions import SessionTable
from gateway.sse_sessions import SseSessions

SESSION = "0123456789abcdef0123456789abcdef"
BODY = {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}


def sdk_in_the_race(*, answered: bool) -> ASGIApp:
    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        while (await receive()).get("more_body", False):
            pass
        if answered:
            await Response("Accepted", status_code=202)(scope, receive, send)
        raise anyio.ClosedResourceError

    return app


@pytest.mark.parametrize("known", [True, False], ids=["counted-session", "unknown-session"])
@pytest.mark.parametrize(
    ("answered", "status"), [(True, 202), (False, 404)], ids=["after-202", "before-any-answer"]
)
async def test_a_message_whose_stream_just_ended_is_answered_not_dropped(
    known: bool, answered: bool, status: int
) -> None:
    table = SessionTable(limit=4)
    if known:
        table.admit(f"sse:{SESSION}", lambda: None, lambda: True)
    app = SseSessions(sdk_in_the_race(answered=answered), table)
    transport = httpx.ASGITransport(app)
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1:1") as http:
        answer = await http.post(f"/messages/?session_id={SESSION}", json=BODY)
    assert answer.status_code == status
    if status == 404:
        assert answer.text == "Could not find session"
    session = table.get(f"sse:{SESSION}")
    if session is not None and not answered:
        assert session.requests == set()  # refused: not left counted as awaiting an answer
