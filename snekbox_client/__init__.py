"""An async client for Snekbox's ``POST /eval`` API.

This package is the only code in the project that knows the wire format of ``/eval``. It works
against the real Snekbox and against the project's built-in evaluator alike::

    from snekbox_client import EvalRequest, File, SnekboxClient

    async with SnekboxClient("http://127.0.0.1:8060") as client:
        result = await client.eval(EvalRequest(input="print(1)"))
        print(result.returncode, result.stdout)

Pass ``transport=httpx.ASGITransport(app)`` instead of a URL to reach an ASGI app in-process.
Every failure of the service raises a subclass of :class:`SnekboxError` (see ``_exceptions``).
"""

from ._client import DEFAULT_TIMEOUT, SnekboxClient
from ._exceptions import (
    EvaluatorRejected,
    EvaluatorTimeout,
    EvaluatorUnavailable,
    InvalidResponse,
    SnekboxError,
)
from ._models import EvalRequest, EvalResult, File

__all__ = [
    "DEFAULT_TIMEOUT",
    "EvalRequest",
    "EvalResult",
    "EvaluatorRejected",
    "EvaluatorTimeout",
    "EvaluatorUnavailable",
    "File",
    "InvalidResponse",
    "SnekboxClient",
    "SnekboxError",
]
