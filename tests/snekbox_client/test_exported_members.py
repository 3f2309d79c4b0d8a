"""The package's public surface: what the gateway and the evaluator use, and nothing more."""

from __future__ import annotations

import snekbox_client

EXPORTED = {
    # The client, and what it reads and sends.
    "BalancingTransport",
    "SnekboxClient",
    "ContentWanted",
    "EndedBy",
    "EvalRequest",
    "EvalResult",
    "File",
    "Python",
    "ServiceInfo",
    # Its errors.
    "ConnectionLost",
    "EvaluatorRejected",
    "EvaluatorTimeout",
    "EvaluatorUnavailable",
    "InvalidResponse",
    "ReplicaGone",
    "SnekboxError",
    # The service's side: the one check of a request, and its errors.
    "InvalidRequest",
    "InvalidRequestFile",
    "check_request",
    "parse_request",
}


def test_exported_members() -> None:
    assert set(snekbox_client.__all__) == EXPORTED
    assert len(snekbox_client.__all__) == len(EXPORTED)  # no name twice
    for name in snekbox_client.__all__:
        member = getattr(snekbox_client, name)
        if hasattr(member, "__module__") and name != "EndedBy":
            assert member.__module__.startswith("snekbox_client._"), name
