"""Written files as the model and the client see them (issue 27, 7; issue 28's MIME types).

Through real gateways (the built-in evaluator in-process and as a one-shot service) and a real
MCP client: a small text file is inlined only if the output's cleaning would leave it as it is,
so no bidi control, invisible tag character or carriage return reaches the transcript that way,
and a line says which files were not inlined; ``resources/read`` gives the exact bytes, and
every read says the MIME type ``files[]`` says.
"""

from __future__ import annotations

import re
from typing import Any

import anyio
import pytest
from mcp.types import BlobResourceContents, EmbeddedResource, TextResourceContents

from gateway.render import mime_type
from tests.support import call_code, connect, facts, text_of

pytestmark = pytest.mark.anyio

#: Each file the code writes, and its content.
WRITTEN = {
    "plain.csv": "city,temp\nOslo,3\n",
    "override.txt": "pay \u202eevil\u202c now\n",
    "isolate.txt": "a\u2066b\u2069c\n",
    "tags.txt": "hi\U000e0049\U000e0047\U000e004e\n",  # invisible "IGN"
    "crlf.csv": "a,b\r\n1,2\r\n",
    "overwrite.txt": "shown\rhidden\n",
}
#: What output never shows, and so no inlined file may hold.
UNSEEN = re.compile(r"[\r\u202a-\u202e\u2066-\u2069\U000e0000-\U000e007f]")
PNG = b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR"


def code() -> str:
    writes = [f"open({name!r}, 'w', newline='').write({text!r})" for name, text in WRITTEN.items()]
    return "\n".join([*writes, f"open('chart.png', 'wb').write({PNG!r})"])


def strings(value: Any) -> list[str]:
    """Every string in a JSON-like value."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for item in value.values() for s in strings(item)]
    if isinstance(value, list):
        return [s for item in value for s in strings(item)]
    return []


def test_one_mime_type_for_every_view_of_a_file() -> None:
    assert mime_type("a.csv") == "text/csv"
    assert mime_type("figure.png") == "image/png"
    assert mime_type("no-extension") == "application/octet-stream"


async def test_inlined_files_pass_the_outputs_rules_and_reads_give_exact_bytes(
    gateway_url: str,
) -> None:
    async with connect(gateway_url, "http") as client:
        with anyio.fail_after(120):
            result = await call_code(client, code())
        written = {f["path"]: f for f in facts(result)["files"]}
        assert set(written) == {*WRITTEN, "chart.png"}
        embedded = [b for b in result.content if isinstance(b, EmbeddedResource)]
        assert [b.resource.uri for b in embedded] == [written["plain.csv"]["uri"]]
        assert not [s for s in strings(result.model_dump(mode="json")) if UNSEEN.search(s)]
        (line,) = [line for line in text_of(result).splitlines() if "not shown inline" in line]
        named = line.split("exact bytes): ")[1].rstrip("]").split(", ")
        assert sorted(named) == sorted(f'"{name}"' for name in WRITTEN if name != "plain.csv")
        for name, info in written.items():
            (read,) = (await client.read_resource(info["uri"])).contents
            assert read.mime_type == info["mime_type"] == mime_type(name)
            if name == "chart.png":
                assert isinstance(read, BlobResourceContents)
            else:
                assert isinstance(read, TextResourceContents) and read.text == WRITTEN[name]
