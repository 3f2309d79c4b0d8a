"""``python -m evaluator``: the evaluation service on its own, served by uvicorn.

Every setting is a flag and an environment variable of the same name (``--time-limit`` /
``EVALUATOR_TIME_LIMIT``), both made from the declarations of :class:`EvaluatorConfig` and
:class:`ServiceSettings`; a flag wins over its variable. The environment is read here, at
start-up, and a value that is not allowed stops it with one line saying so.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Mapping, Sequence
from typing import Annotated

import uvicorn
from pydantic import Field
from pydantic_settings import SettingsConfigDict

from serving import (
    KEEP_ALIVE_TIMEOUT,
    ExplicitSettings,
    Flag,
    RequestDeadline,
    SettingsError,
    add_flags,
    guarded_protocol,
    load,
)

from .api import create_app
from .config import EvaluatorConfig
from .service import Evaluator

__all__ = ["ServiceSettings", "main", "parse_args"]

_LOG_LEVELS = ("critical", "error", "warning", "info", "debug")


class ServiceSettings(ExplicitSettings):
    """Where the service listens, and the bounds on its clients' connections."""

    model_config = SettingsConfigDict(env_prefix="EVALUATOR_")

    host: Annotated[
        str,
        Field(min_length=1, description="`python -m evaluator` only: address to listen on"),
        Flag("address to listen on"),
    ] = "127.0.0.1"
    port: Annotated[
        int,
        Field(ge=1, le=65_535, description="`python -m evaluator` only: port to listen on"),
        Flag("port to listen on"),
    ] = 8060
    request_timeout: Annotated[
        float,
        Field(
            gt=0,
            le=3600,
            description="`python -m evaluator` only: seconds a request's headers may take to "
            "arrive, then as long again for its body; later: 408, connection closed",
        ),
        Flag("seconds a request's headers, then as long again its body, may take; then 408"),
    ] = 30.0
    max_connections: Annotated[
        int,
        Field(
            ge=1,
            le=1_000_000,
            description="`python -m evaluator` only: connections open at once; one more "
            "closes one idle 5 s, or gets a 503",
        ),
        Flag("connections open at once; then one idle 5 s is closed, or a new one refused"),
    ] = 256
    keep_alive_timeout: Annotated[
        int,
        Field(
            ge=1,
            le=3600,
            description="`python -m evaluator` only: seconds an idle kept-alive connection "
            "stays open (unless closed for a new one at the cap): longer than a gateway keeps "
            "one (4 s)",
        ),
        Flag("seconds an idle kept-alive connection stays open"),
    ] = KEEP_ALIVE_TIMEOUT


def parse_args(argv: Sequence[str], environ: Mapping[str, str]) -> argparse.Namespace:
    """Flags over environment variables over defaults: ``config`` (the EvaluatorConfig),
    ``service`` (the ServiceSettings) and ``log_level``.

    Raises:
        SettingsError: a flag or variable has a value that is not allowed.
    """
    parser = argparse.ArgumentParser(
        prog="python -m evaluator",
        description="A Snekbox-compatible evaluation service (POST /eval) sandboxed by bubblewrap.",
    )
    add_flags(parser, ServiceSettings)
    add_flags(parser, EvaluatorConfig)
    parser.add_argument(
        "--log-level", default="info", type=str.lower, choices=_LOG_LEVELS, help="log level"
    )
    args = parser.parse_args(argv)
    args.service = load(ServiceSettings, environ, args)
    args.config = load(EvaluatorConfig, environ, args)
    return args


def main(argv: Sequence[str] | None = None) -> None:
    try:
        args = parse_args(sys.argv[1:] if argv is None else argv, os.environ)
    except SettingsError as exc:
        sys.exit(f"python -m evaluator: {exc}")
    service: ServiceSettings = args.service
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    app = create_app(Evaluator(args.config), manage_evaluator=True)
    # Slow or surplus clients must not hold the service's sockets: a deadline for each request's
    # headers (the protocol) and body (the middleware), and a cap on connections.
    protocol = guarded_protocol(
        header_timeout=service.request_timeout, max_connections=service.max_connections
    )
    served = RequestDeadline(app, service.request_timeout)
    uvicorn.run(
        served,
        host=service.host,
        port=service.port,
        log_level=args.log_level,
        http=protocol,
        timeout_keep_alive=service.keep_alive_timeout,
    )


if __name__ == "__main__":
    main()
