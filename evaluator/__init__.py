"""The built-in evaluation service: Snekbox's ``POST /eval`` API, code isolated by bubblewrap.

In-process, as the gateway uses it::

    evaluator = Evaluator(EvaluatorConfig())
    await evaluator.start()            # raises SandboxUnavailable, saying what to do
    app = create_app(evaluator)        # POST /eval, OPTIONS /eval
    client = httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://evaluator")
    ...
    await evaluator.aclose()

Or directly, with the wire format's own models: ``await evaluator.run(EvalRequest(input=code))``
returns an ``EvalResult`` (both from :mod:`snekbox_client`, the one definition of ``/eval``).

As a service of its own: ``python -m evaluator`` (see ``--help``).
"""

from .api import create_app
from .config import EvaluatorConfig
from .errors import (
    EvaluatorError,
    InvalidExecutable,
    InvalidFile,
    QueueFull,
    RequestInvalid,
    SandboxUnavailable,
    SessionNotFound,
)
from .inprocess import InProcessClient
from .models import Limit
from .service import Evaluator

__all__ = [
    "Evaluator",
    "EvaluatorConfig",
    "EvaluatorError",
    "InProcessClient",
    "InvalidExecutable",
    "InvalidFile",
    "Limit",
    "QueueFull",
    "RequestInvalid",
    "SandboxUnavailable",
    "SessionNotFound",
    "create_app",
]
