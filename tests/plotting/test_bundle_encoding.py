"""The prelude's files, whose base64 is put together from parts encoded once, encode right."""

from __future__ import annotations

import base64
import marshal

import pytest

import plotting


@pytest.mark.parametrize("code", ["", "x", "ab", "print(1)", "é" * 5, "\n" * 7])
@pytest.mark.parametrize("later_cell", [False, True])
def test_each_file_s_base64_is_its_content_s(code: str, later_cell: bool) -> None:
    for file in plotting.build_request(code, later_cell=later_cell).files:
        assert file.base64 == base64.b64encode(file.content), file.path
    bundle = plotting.build_request(code, later_cell=later_cell).files[1].content
    assert marshal.loads(bundle)[3] == code.encode()  # the padding after the head is ignored
