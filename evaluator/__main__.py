"""``python -m evaluator``: the evaluation service on its own, served by uvicorn.

Every setting is a flag whose default comes from an environment variable of the same name
(``--time-limit`` / ``EVALUATOR_TIME_LIMIT``). The environment is read here, at start-up.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import sys
from collections.abc import Mapping, Sequence

import uvicorn

from gateway import RequestDeadline, guarded_protocol

from .api import create_app
from .config import ENVIRONMENT, UNSANDBOXED_CONSENT, EvaluatorConfig
from .service import Evaluator

_HELP = {
    "time_limit": "wall-clock seconds per run",
    "memory_limit": "MiB of memory per run",
    "pids_limit": "processes and threads per run",
    "output_limit": "bytes of output per run",
    "workdir_size": "MiB of the working directory",
    "max_files": "output files returned at most",
    "concurrency": "runs at once",
    "max_queue": "runs allowed to wait (default: 4 x concurrency)",
}


def parse_args(argv: Sequence[str], environ: Mapping[str, str]) -> argparse.Namespace:
    """Flags over environment variables over defaults; ``config`` holds the EvaluatorConfig."""
    base = EvaluatorConfig.from_env(environ)
    parser = argparse.ArgumentParser(
        prog="python -m evaluator",
        description="A Snekbox-compatible evaluation service (POST /eval) sandboxed by bubblewrap.",
    )
    parser.add_argument(
        "--host",
        default=environ.get("EVALUATOR_HOST") or "127.0.0.1",
        help="address to listen on (env EVALUATOR_HOST; default 127.0.0.1)",
    )
    parser.add_argument(
        "--port",
        type=int,
        default=int(environ.get("EVALUATOR_PORT") or 8060),
        help="port to listen on (env EVALUATOR_PORT; default 8060)",
    )
    for env_name, (name, parse) in ENVIRONMENT.items():
        if name in _HELP:
            value = getattr(base, name)
            parser.add_argument(
                f"--{name.replace('_', '-')}",
                type=parse,
                default=value,
                help=f"{_HELP[name]} (env {env_name}; now {value})",
            )
    parser.add_argument(
        f"--{UNSANDBOXED_CONSENT}",
        dest="unsandboxed",
        action="store_true",
        default=base.unsandboxed,
        help="run code WITHOUT the sandbox: no isolation at all, for debugging only "
        f"(env EVALUATOR_UNSANDBOXED={UNSANDBOXED_CONSENT})",
    )
    parser.add_argument(
        "--request-timeout",
        type=float,
        default=float(environ.get("EVALUATOR_REQUEST_TIMEOUT") or 30),
        help="seconds a request's headers, then its body, may take to arrive; then 408 "
        "(env EVALUATOR_REQUEST_TIMEOUT; default 30)",
    )
    parser.add_argument(
        "--max-connections",
        type=int,
        default=int(environ.get("EVALUATOR_MAX_CONNECTIONS") or 256),
        help="connections open at once; one more is answered 503 "
        "(env EVALUATOR_MAX_CONNECTIONS; default 256)",
    )
    parser.add_argument("--log-level", default="info", help="uvicorn and evaluator log level")
    args = parser.parse_args(argv)
    args.config = dataclasses.replace(
        base, unsandboxed=args.unsandboxed, **{name: getattr(args, name) for name in _HELP}
    )
    return args


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(sys.argv[1:] if argv is None else argv, os.environ)
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    app = create_app(Evaluator(args.config), manage_evaluator=True)
    try:
        # Slow or surplus clients must not hold the service's sockets: a deadline for each
        # request's headers (the protocol) and body (the middleware), and a cap on connections.
        protocol = guarded_protocol(
            header_timeout=args.request_timeout, max_connections=args.max_connections
        )
        served = RequestDeadline(app, args.request_timeout)
    except ValueError as exc:
        sys.exit(f"python -m evaluator: {exc}")
    uvicorn.run(
        served, host=args.host, port=args.port, log_level=args.log_level.lower(), http=protocol
    )


if __name__ == "__main__":
    main()
