"""The package's public surface: the request it builds and the names it promises."""

import ast
import importlib.util
import marshal
import re
import sys
import zlib
from pathlib import Path

import pytest

import plotting
from plotting import (
    BUNDLE_NAME,
    MANIFEST_MAX_BYTES,
    MANIFEST_NAME,
    PNG_SIGNATURE,
    PRELUDE_NAME,
    Manifest,
    build_request,
    figure_number,
    is_figure,
    prelude_files,
    read_manifest,
    sort_files,
)
from snekbox_client import File

from .conftest import RunCode

#: The support module's parts, in the bundle's order (the module itself follows them).
SUPPORT_PARTS = ["_output", "_tracebacks", "_figures", "_imports", "_manifest"]


def test_exported_members() -> None:
    assert set(plotting.__all__) == {
        "BUNDLE_NAME",
        "CODE_FILENAME",
        "FIGURE_DPI",
        "FIGURE_MAX_PIXELS",
        "FIGURE_PATTERN",
        "LOST_FIGURE_PATTERN",
        "MANIFEST_MAX_BYTES",
        "MANIFEST_NAME",
        "WARM_PATH",
        "PNG_SIGNATURE",
        "PRELUDE_NAME",
        "RESIDENT_DIR",
        "Manifest",
        "ReturnedFiles",
        "build_request",
        "carries_prelude",
        "figure_number",
        "is_figure",
        "prelude_digest",
        "prelude_files",
        "prelude_missing",
        "read_manifest",
        "sort_files",
        "write_resident",
    }
    for name in plotting.__all__:
        assert getattr(plotting, name) is not None


def test_build_request_sends_the_prelude_and_the_code_as_files() -> None:
    request = build_request("print('é')", executable_path="/usr/bin/python3")
    assert request.input is None
    assert list(request.args or ()) == [PRELUDE_NAME]
    assert list(request.files) == list(prelude_files("print('é')".encode()))
    assert [f.path for f in request.files] == [PRELUDE_NAME, BUNDLE_NAME]
    assert request.executable_path == "/usr/bin/python3"
    body = request.to_json()
    assert set(body) == {"args", "files", "executable_path"}
    assert build_request("1").to_json().keys() == {"args", "files"}


def test_helper_files_are_never_returned_and_figures_are() -> None:
    # Snekbox returns files matching **/[!_]* that are not hidden.
    for name in (PRELUDE_NAME, BUNDLE_NAME):
        assert name.startswith("_")
    assert not is_figure(PRELUDE_NAME) and is_figure("figure_001.png")
    # The manifest is returned, and first among names in path order ("!" sorts before them).
    assert not MANIFEST_NAME.startswith(("_", "."))
    names = ["figure_001.png", "data.csv", "Data", "0.txt", "-x", "+y", MANIFEST_NAME]
    assert min(names) == MANIFEST_NAME


def test_the_first_file_is_the_packaged_boot_and_the_bundle_holds_the_rest() -> None:
    package = Path(plotting.__file__).parent
    boot, bundle = prelude_files(b"print(1)")
    # The packaged boot file's statements, line for line, without its docstring or comments.
    packaged = (package / "_boot.py").read_bytes()
    statements = packaged[packaged.index(b"\nimport ") + 1 :]
    without_comments = [line.split(b"  #")[0].rstrip() for line in statements.splitlines()]
    without_comments = [
        b"" if line.lstrip().startswith(b"#") else line for line in without_comments
    ]
    assert boot.content.lstrip(b"\n").splitlines() == without_comments
    assert boot.content.count(b"\n") == packaged.count(b"\n") and b"#" not in boot.content
    magic, prelude, prelude_source, code, tail_size, digest = marshal.loads(bundle.content)
    assert (magic, code) == (importlib.util.MAGIC_NUMBER, b"print(1)")
    # A later cell of a session: the same first file, and the head alone with the same digest.
    later_boot, later = prelude_files(b"print(1)", later_cell=True)
    assert later_boot == boot
    assert marshal.loads(later.content) == (magic, b"", b"", code, 0, digest)
    support, support_sources = marshal.loads(bundle.content[-tail_size:])
    codes = marshal.loads(zlib.decompress(support))
    parts = marshal.loads(zlib.decompress(support_sources))
    # Each part of the support module after those it imports, the module itself last.
    assert [name for name, _ in parts] == [name for name, _ in codes] == [*SUPPORT_PARTS, ""]
    # The prelude is one module made of two files.
    sources: dict[tuple[str, ...], bytes] = {
        ("_prelude.py", "_ending.py"): zlib.decompress(prelude_source)
    }
    sources.update({(f"{name or '_support'}.py",): source for name, source in parts})
    for names, source in sources.items():
        # The same module, without what nothing reads at run time.
        original = "\n".join((package / name).read_text() for name in names)
        assert _names(source.decode()) == _names(original)
        assert len(source) < len(original) / 1.5 and b'"""' not in source and b"# " not in source
    assert marshal.loads(prelude).co_filename == "<mcp-prelude>"
    assert {code.co_filename for _, code in codes} == {"<mcp-support>"}
    # Small: the first file is compiled by every run, the rest only loaded; the whole is about
    # what the files were when the prelude and support module traveled as sources (without
    # what sessions need, 36 KiB then; the manifest's gone files took it past 42, the run's
    # end past 43).
    assert len(boot.content) < 2048
    assert len(boot.content) + len(bundle.content) < 44 * 1024


def _names(source: str) -> list[str]:
    """The names a module defines at its top level, in order."""
    names = []
    for node in ast.parse(source).body:
        if isinstance(node, ast.FunctionDef | ast.ClassDef):
            names.append(node.name)
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.extend(ast.unparse(target) for target in targets)
    return names


@pytest.mark.parametrize(
    "source",
    ["_boot.py", "_prelude.py", "_ending.py", "_support.py", *(f"{p}.py" for p in SUPPORT_PARTS)],
)
def test_importing_the_files_sent_does_nothing(source: str) -> None:
    path = Path(plotting.__file__).parent / source
    meta_path, main, argv = list(sys.meta_path), sys.modules["__main__"], list(sys.argv)
    # In the package: the support module's parts import one another relatively.
    spec = importlib.util.spec_from_file_location("plotting.copy_of_" + path.stem, path)
    assert spec is not None and spec.loader is not None
    spec.loader.exec_module(importlib.util.module_from_spec(spec))
    assert (sys.meta_path, sys.modules["__main__"], sys.argv) == (meta_path, main, argv)


def test_the_prelude_its_boot_and_its_support_module_agree() -> None:
    from plotting import _figures, _prelude, _tracebacks

    assert _prelude.CODE_FILENAME == _tracebacks.CODE_FILENAME == plotting.CODE_FILENAME
    assert _figures.BACKEND_MODULE in _prelude.WATCHED_IMPORTS
    # The first file names the one it reads (it stays a few lines: no constants).
    boot = (Path(plotting.__file__).parent / "_boot.py").read_text()
    assert re.findall(r'"(_mcp[^"]*\.[a-z]+)"', boot) == [BUNDLE_NAME]
    assert (_prelude.PRELUDE_NAME, _prelude.BUNDLE_NAME) == (PRELUDE_NAME, BUNDLE_NAME)


@pytest.mark.parametrize(
    ("path", "number"),
    [
        ("figure_001.png", 1),
        ("figure_042.png", 42),
        ("figure_1000.png", 1000),
    ],
)
def test_figure_names(path: str, number: int) -> None:
    assert is_figure(path)
    assert figure_number(path) == number
    assert not is_figure(path + ".part") and figure_number(path + ".part") == number


@pytest.mark.parametrize(
    "path",
    [
        "figure_1.png",
        "figure_01.png",
        "sub/figure_001.png",
        "figure_001.png.txt",
        "x.png",
        "figure_\u0661\u0662\u0663.png",  # Arabic-Indic digits: names are ASCII
    ],
)
def test_not_figure_names(path: str) -> None:
    assert not is_figure(path)
    with pytest.raises(ValueError, match="not the name of a captured figure"):
        figure_number(path)


def test_sort_files_orders_figures_by_number_and_keeps_the_rest() -> None:
    png = PNG_SIGNATURE + b"..."
    files = [
        File("figure_010.png", png),
        File("data.csv", b"a,b"),
        File("figure_002.png", png),
        File("figure_003.png", b"not a png"),
        File("figure_1000.png", png),
        File("figure_005.png.part", b"\x89PN"),
        File("figure_004.png.part", b""),
        File("figure_002.png.part", png),  # left beside its complete figure: dropped
        File(MANIFEST_NAME, b"mcp-manifest 1 1 1\n3 data.csv\0"),
    ]
    sorted_files = sort_files(files)
    assert [f.path for f in sorted_files.figures] == [
        "figure_002.png",
        "figure_010.png",
        "figure_1000.png",
    ]
    assert [f.path for f in sorted_files.lost_figures] == [
        "figure_004.png.part",
        "figure_005.png.part",
    ]
    assert [f.path for f in sorted_files.others] == ["data.csv", "figure_003.png"]
    assert sorted_files.manifest == Manifest((("data.csv", 3),), 1, True)


def test_a_manifest_returned_without_all_of_its_content_is_not_read() -> None:
    head = b"mcp-manifest 1 1 1\n3 data.csv\0"
    assert sort_files([File(MANIFEST_NAME, head[:10], len(head))]).manifest is None
    assert sort_files([File(MANIFEST_NAME, b"", 0)]).others == []


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (b"mcp-manifest 1 0 1\n", Manifest((), 0, True)),
        (b"mcp-manifest 1 5 0\n1 a\0" + b"22 b\nc\0", Manifest((("a", 1), ("b\nc", 22)), 5, False)),
        (b"mcp-manifest 1 1 1\n1 \xff\0", Manifest((("\ufffd", 1),), 1, True)),
        (b"mcp-manifest 1 1 1\n1 a\0- b\0- c/d\0", Manifest((("a", 1),), 1, True, ("b", "c/d"))),
        (b"mcp-manifest 1 0 1\n- b\0", Manifest((), 0, True, ("b",))),
        (b"mcp-manifest 1 1 1\n- b\0" + b"1 a\0", None),  # the files come first
        (b"mcp-manifest 1 0 1\n- \0", None),
        (b"mcp-manifest 1 0 1\n-- b\0", None),
        (b"mcp-manifest 1 1 1\n1 a", None),  # the last record lacks its NUL
        (b"mcp-manifest 1 1 1\n1 a\0" + b"1 b\0", None),  # more records than files
        (b"mcp-manifest 1 1 1\nx a\0", None),
        (b"mcp-manifest 1 1 1\n1 \0", None),  # an empty name
        (b"mcp-manifest 1 -1 1\n", None),
        (b"mcp-manifest 2 0 1\n", None),
        (b"MCP-MANIFEST 1 0 1\n", None),
        (b"", None),
        (b"mcp-manifest 1 1 1\n" + b"1 " + b"a" * MANIFEST_MAX_BYTES + b"\0", None),
    ],
)
def test_read_manifest_takes_only_a_well_formed_bounded_list(
    data: bytes, expected: Manifest | None
) -> None:
    assert read_manifest(data) == expected


def test_code_larger_than_an_argument_may_be_runs(run_code: RunCode) -> None:
    # Linux limits one argv string to 128 KiB; the code travels as a file instead.
    padding = "# " + "x" * 1000 + "\n"
    run = run_code(padding * 300 + "print('big')")
    assert (run.output, run.returncode) == ("big\n", 0)
