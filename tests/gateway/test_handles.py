"""Session handles: verified only for the client and the secret they were issued with, and
the replica they carry is readable by gateways with that secret and by nobody else."""

from __future__ import annotations

import base64

import pytest

from gateway.handles import SessionHandles

SECRET = b"a secret shared by every gateway replica"


@pytest.mark.parametrize("replica", ["10.0.3.7", "fd00::17", None])
def test_a_handle_carries_its_replica_to_another_gateway_with_the_secret(
    replica: str | None,
) -> None:
    issued = SessionHandles(SECRET).issue("client-a", replica)
    found = SessionHandles(SECRET).verify(issued.text, "client-a")
    assert found == issued
    assert found is not None and found.replica == replica
    assert len(base64.urlsafe_b64decode(found.name + "==")) == 16  # 128 random bits
    if replica is not None:
        assert replica not in issued.text


def test_a_handle_is_refused_to_another_client_secret_or_edit() -> None:
    handles = SessionHandles(SECRET)
    text = handles.issue("client-a", "10.0.3.7").text
    name, sealed, tag = text.split(".")
    assert handles.verify(text, "client-b") is None
    assert handles.verify(text, None) is None
    assert SessionHandles(b"another secret, another deployment").verify(text, "client-a") is None
    flipped = "A" if sealed[0] != "A" else "B"
    edits = [
        f"{name}.{flipped}{sealed[1:]}.{tag}",  # another replica
        f"{name[::-1]}.{sealed}.{tag}",  # another session
        f"{name}.{sealed}.{tag[:-1]}",
        f"{name}..{tag}",
        f"{name}.{sealed}",
        text + ".",
        "x" * 200,
        "",
        f"{name}.{sealed}.{'é' * len(tag)}",
        "\x00.\x00.\x00",
    ]
    for edited in edits:
        assert handles.verify(edited, "client-a") is None, edited


def test_without_a_secret_each_gateway_has_its_own() -> None:
    first, second = SessionHandles(), SessionHandles()
    text = first.issue(None, None).text
    assert first.verify(text, None) is not None
    assert second.verify(text, None) is None
    assert first.issue(None, None).name != first.issue(None, None).name
