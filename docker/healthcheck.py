"""Container healthchecks, standard library only (the images have no curl).

    python healthcheck.py gateway     GET /readyz of the gateway (200 once its evaluator answers)
    python healthcheck.py evaluator   a real evaluation: POST /eval {"input": "print(6 * 7)"}

Exit 0 when healthy, 1 otherwise (the reason on stderr, shown by `docker inspect`).
Works against the real Snekbox as well as the built-in evaluator (same API).
"""

from __future__ import annotations

import json
import os
import sys
import urllib.request


def _gateway() -> None:
    port = os.environ.get("MCP_PORT", "18080")
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=4) as answer:
        if answer.status != 200:
            raise RuntimeError(f"/readyz answered {answer.status}")


def _evaluator() -> None:
    port = os.environ.get("EVALUATOR_PORT", "8060")
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/eval",
        data=json.dumps({"input": "print(6 * 7)"}).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=4) as answer:
        result = json.load(answer)
    if result.get("returncode") != 0 or result.get("stdout", "").strip() != "42":
        raise RuntimeError(f"evaluation failed: {result!r}"[:500])


def main() -> int:
    checks = {"gateway": _gateway, "evaluator": _evaluator}
    which = sys.argv[1] if len(sys.argv) > 1 else ""
    if which not in checks:
        print(f"usage: healthcheck.py {{{'|'.join(checks)}}}", file=sys.stderr)
        return 2
    try:
        checks[which]()
    except Exception as error:
        print(f"unhealthy: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
