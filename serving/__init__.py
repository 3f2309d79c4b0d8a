"""Serving plumbing both services share; it imports neither (``gateway``, ``evaluator``).

- :mod:`serving.settings`: settings read from environment variables and ``--flags``, both made
  from one declaration (:class:`ExplicitSettings`, :func:`load`), refused values in one line.
- :mod:`serving.protocol`: uvicorn's h11 protocol with a deadline for each request's headers
  and a cap on connections, each answer written in one piece (:func:`guarded_protocol`).
- :mod:`serving.deadline`: ASGI middleware with a deadline for each request's body
  (:class:`RequestDeadline`).
- :mod:`serving.table`: a bounded table whose longest idle entries close to make room, fairly
  between groups, busy ones spared (:class:`BoundedTable`).
- :mod:`serving.slots`: a bounded number of calls at once and a bounded wait queue, shared
  fairly between groups (:class:`FairSlots`).

The gateway (``python-mcp-server``) and the built-in evaluator (``python -m evaluator``) are
each served with both bounds; the layering is checked by ``tests/test_layering.py``.
"""

from .deadline import RequestDeadline, send_text
from .protocol import KEEP_ALIVE_TIMEOUT, GuardedH11Protocol, guarded_protocol
from .settings import (
    EnvironmentSource,
    ExplicitSettings,
    Flag,
    SettingsError,
    add_flags,
    comma_separated,
    flag,
    load,
    shown_default,
)
from .slots import FairSlots, SlotsFull, SlotTimeout
from .table import BoundedTable, Entry, TableFull

__all__ = [
    "KEEP_ALIVE_TIMEOUT",
    "BoundedTable",
    "Entry",
    "EnvironmentSource",
    "ExplicitSettings",
    "FairSlots",
    "Flag",
    "GuardedH11Protocol",
    "RequestDeadline",
    "SettingsError",
    "SlotTimeout",
    "SlotsFull",
    "TableFull",
    "add_flags",
    "comma_separated",
    "flag",
    "guarded_protocol",
    "load",
    "send_text",
    "shown_default",
]
