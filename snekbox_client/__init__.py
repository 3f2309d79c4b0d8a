"""An async client for Snekbox's ``POST /eval`` API.

This package is the only code in the project that knows the wire format of ``/eval``: the
gateway's requests and the built-in evaluator's answers are its models. It works against the
real Snekbox and against the project's built-in evaluator alike::

    from snekbox_client import EvalRequest, File, SnekboxClient

    async with SnekboxClient("http://127.0.0.1:8060") as client:
        result = await client.eval(EvalRequest(input="print(1)"))
        print(result.returncode, result.stdout)

Pass ``transport=httpx.ASGITransport(app)`` instead of a URL to reach an ASGI app in-process.
Every failure of the service raises a subclass of :class:`SnekboxError` (see ``_exceptions``).

Beyond Snekbox's API: a request's ``content_wanted`` (:class:`ContentWanted`) says which
returned files' contents the client wants, so that the others come back as names and sizes
only; an answer's ``ended_by`` (:data:`EndedBy`) says which limit, if any, ended the run (the
built-in evaluator sends it, Snekbox does not, and answers without it are read as before); and a
plain ``http`` URL whose host resolves to several addresses (replicas behind one name) has its
requests spread over them (:class:`BalancingTransport`).

For the service's side, the one check of a request: :func:`parse_request` (a JSON body) and
:func:`check_request` (a request built in process) refuse what breaks the rules of ``/eval``
with :class:`InvalidRequest`, worded as Snekbox words its 400 answers.
"""

from ._balancing import BalancingTransport
from ._checks import check_request, parse_request
from ._client import SnekboxClient
from ._exceptions import (
    ConnectionLost,
    EvaluatorRejected,
    EvaluatorTimeout,
    EvaluatorUnavailable,
    InvalidRequest,
    InvalidRequestFile,
    InvalidResponse,
    ReplicaGone,
    SnekboxError,
)
from ._info import Python, ServiceInfo
from ._request import ContentWanted, EvalRequest, File
from ._result import EndedBy, EvalResult

__all__ = [
    "BalancingTransport",
    "ConnectionLost",
    "ContentWanted",
    "EndedBy",
    "EvalRequest",
    "EvalResult",
    "EvaluatorRejected",
    "EvaluatorTimeout",
    "EvaluatorUnavailable",
    "File",
    "InvalidRequest",
    "InvalidRequestFile",
    "InvalidResponse",
    "Python",
    "ReplicaGone",
    "ServiceInfo",
    "SnekboxClient",
    "SnekboxError",
    "check_request",
    "parse_request",
]
