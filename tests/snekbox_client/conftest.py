"""Real evaluators on loopback addresses of their own, for the client's tests.

Linux routes all of 127.0.0.0/8 to the loopback interface, so ``python -m evaluator`` can listen
on 127.0.0.1, 127.0.0.2 and 127.0.0.3 at the same port: three replicas of one service, as
Docker's DNS would present them behind one name. A test resolver stands in for that DNS.
"""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
from collections.abc import Iterator, Sequence

import pytest

from tests.support import TIME_LIMIT, closed_port, wait_until_answers

#: The replicas' addresses.
REPLICAS = ("127.0.0.1", "127.0.0.2", "127.0.0.3")


def port_free_on(addresses: Sequence[str]) -> int:
    """A port that nothing listens on at any of ``addresses``."""
    for _ in range(50):
        port = closed_port(addresses[0])
        try:
            for address in addresses[1:]:
                with socket.socket() as other:
                    other.bind((address, port))
        except OSError:
            continue
        return port
    raise RuntimeError(f"no port free on all of {addresses}")


@contextlib.contextmanager
def evaluator_at(address: str, port: int, *extra: str) -> Iterator[subprocess.Popen[bytes]]:
    """``python -m evaluator`` listening on ``address:port``."""
    command = [sys.executable, "-m", "evaluator", "--host", address, "--port", str(port)]
    command += ["--log-level", "warning", "--time-limit", str(TIME_LIMIT), *extra]
    process = subprocess.Popen(command)
    try:
        wait_until_answers(f"http://{address}:{port}/eval", process, method="OPTIONS")
        yield process
    finally:
        if process.poll() is None:
            process.terminate()
            process.wait(timeout=20)


@pytest.fixture(scope="session")
def replica_port() -> int:
    # 127.0.0.4 stays free: a replica that is listed but down.
    return port_free_on([*REPLICAS, "127.0.0.4"])


@pytest.fixture(scope="session")
def replicas(replica_port: int) -> Iterator[int]:
    """Three evaluators on 127.0.0.{1,2,3}:port; replica N returns at most N files.

    That is how a test tells which replica ran a call: the code writes nine files, and the
    answer lists as many as the replica's ``--max-files``.
    """
    with contextlib.ExitStack() as stack:
        for number, address in enumerate(REPLICAS, 1):
            stack.enter_context(evaluator_at(address, replica_port, "--max-files", str(number)))
        yield replica_port


#: Code whose answer says which replica ran it (see :func:`replicas`).
IDENTIFY = "for n in range(9):\n    open(f'f{n}', 'w').close()\n"
