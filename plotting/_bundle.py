"""The prelude as it travels: the first file, the bundle's fixed parts, and its digest.

Only the standard library and the package's own files, read beside this one: an image of the
real Snekbox runs this file as a script, with each of its interpreters, to keep the prelude
resident (see :func:`write_resident` and ``docker/snekbox/Dockerfile``), and the gateway
imports it to build each request (``plotting.prelude_files``).
"""

import ast
import hashlib
import importlib.util
import io
import marshal
import os
import sys
import tokenize
import zlib
from pathlib import Path
from types import CodeType

#: Where a service keeps resident preludes, read-only in every sandbox: ``_boot.py`` looks there.
#: In the real Snekbox's user base, which its NsJail configuration binds; the built-in evaluator
#: binds its own directory there.
RESIDENT_DIR = "/snekbox/user_base/share/mcp-prelude"
#: A resident prelude's first file, compiled, is named as the prelude, with this in place of
#: ``.bin``.
BOOT_SUFFIX = ".boot"
#: Beside the resident preludes: what a warm sandbox's interpreter runs to load its own ahead.
WARM_PATH = f"{RESIDENT_DIR}/warm.py"

#: The prelude's parts: one module made of their statements, in this order.
_PRELUDE_PARTS = ("_prelude", "_ending")
#: The support module's parts, each after those it imports, and the module itself last (named
#: ``""`` in the bundle): see ``_support.py``.
_SUPPORT_PARTS = ("_output", "_tracebacks", "_figures", "_imports", "_manifest", "_support")
_HERE = Path(__file__).parent


class Parts:
    """The prelude compiled by this interpreter (see ``plotting.prelude_files``).

    ``boot``: the first file; ``magic``: this interpreter's bytecode magic number;
    ``prelude_code`` and ``prelude_source``: the prelude ``marshal``-ed, and its source
    compressed; ``tail``: the support module's code and sources; ``digest``: the name of this
    prelude, taken over its files (and this one) alone: the same for every interpreter.
    """

    def __init__(self) -> None:
        boot = _as_it_travels((_HERE / "_boot.py").read_bytes())
        ours = [(_HERE / f"{name}.py").read_bytes() for name in _PRELUDE_PARTS]
        sources = [(_HERE / f"{name}.py").read_bytes() for name in _SUPPORT_PARTS]
        prelude_code, prelude = _compiled_and_source("<mcp-prelude>", *ours)
        names = [*_SUPPORT_PARTS[:-1], ""]
        parts = [_compiled_and_source("<mcp-support>", source) for source in sources]
        codes = tuple(zip(names, (code for code, _ in parts), strict=True))
        texts = tuple(zip(names, (text for _, text in parts), strict=True))
        self.boot = boot
        self.magic = importlib.util.MAGIC_NUMBER
        self.prelude_code = marshal.dumps(prelude_code, 4)
        self.prelude_source = zlib.compress(prelude, 9)
        self.tail = marshal.dumps(
            (zlib.compress(marshal.dumps(codes, 4), 9), zlib.compress(marshal.dumps(texts, 4), 9)),
            4,
        )
        # This file too: it decides what the bundle holds.
        making = (_HERE / "_bundle.py").read_bytes()
        self.digest = hashlib.sha256(b"\0".join([boot, making, *ours, *sources])).digest()[:16]

    def head(self, code: bytes) -> bytes:
        """The bundle's head for ``code``, padded to whole base64 quanta (``marshal`` ignores
        what follows it, and the tail is read from the end)."""
        fields = (self.magic, self.prelude_code, self.prelude_source, code, len(self.tail))
        head = marshal.dumps((*fields, self.digest), 4)
        return head + b"\0" * (-len(head) % 3)


def resident_path(digest: bytes, magic: bytes) -> str:
    """Where a service keeps the prelude ``digest`` compiled by interpreters of ``magic`` (its
    first file, compiled: the same path, :data:`BOOT_SUFFIX` in place of ``.bin``)."""
    return f"{RESIDENT_DIR}/{digest.hex()}-{magic.hex()}.bin"


def launcher(parts: Parts, missing: str) -> str:
    """The ``-c`` code of a run launched from the resident prelude ``parts`` (see
    ``plotting.build_request``): it makes the bundle's head of its argument, the user's code
    (the bytes sent: ``os.fsencode`` undoes python's decoding), then runs the first file kept
    beside the prelude for its interpreter's bytecode, which takes that head
    (``sys._mcp_launched``). With none kept there, it prints ``missing`` and ends with status
    121, as the first file does without the prelude.

    Its frame stays below the code's while the code runs, named ``<string>`` (python's name of
    ``-c`` code, and the code's): a stack the code prints shows it beside the code's line of
    the same number."""
    code = "__import__('os').fsencode(__import__('sys').argv.pop(1))"
    magic_hex, digest_hex = parts.magic.hex(), parts.digest.hex()
    head = f"bytes.fromhex('{magic_hex}'),b'',b'',{code},0,bytes.fromhex('{digest_hex}')"
    magic = (
        "getattr(__import__('sys').modules.get('_frozen_importlib_external'),"
        "'MAGIC_NUMBER',b'').hex()"
    )
    boot = f"{RESIDENT_DIR}/{digest_hex}-{{{magic}}}{BOOT_SUFFIX}"
    return (
        "try:\n"
        f" with open(f\"{boot}\",'rb') as _boot_file:_boot_data=_boot_file.read()\n"
        f"except OSError:\n print({missing!r},flush=True)\n raise SystemExit(121)\n"
        "_boot_resident=__import__('marshal').loads(_boot_data)\n"
        f"__import__('sys')._mcp_launched=({head})\n"
        "exec(_boot_resident)\n"
    )


def write_resident(
    directory: str, parts: Parts | None = None, *, seen_as: str = RESIDENT_DIR
) -> str:
    """Write this interpreter's resident prelude (``parts``, else compiled now) into
    ``directory``: a whole bundle without code, named as :func:`resident_path` names it there,
    the first file compiled (which :func:`launcher` runs), and the script that loads it ahead
    (``_warm.py``, as :data:`WARM_PATH`). Returns the prelude's path. ``seen_as``: where the
    sandboxes see ``directory``, which the compiled first file reads (a test's own)."""
    parts = parts or Parts()
    name = os.path.basename(resident_path(parts.digest, parts.magic))
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, name)
    _write_readable(path, parts.head(b"") + parts.tail)
    boot_source = parts.boot.replace(RESIDENT_DIR.encode(), seen_as.encode())
    boot = compile(boot_source, "<mcp-boot>", "exec", dont_inherit=True)
    _write_readable(path.removesuffix(".bin") + BOOT_SUFFIX, marshal.dumps(boot, 4))
    _write_readable(
        os.path.join(directory, os.path.basename(WARM_PATH)), (_HERE / "_warm.py").read_bytes()
    )
    return path


def _write_readable(path: str, data: bytes) -> None:
    """Write ``data`` as ``path``, readable by all, whole or not at all (a sandbox may be
    reading the file it replaces)."""
    with open(path + ".part", "wb") as file:
        file.write(data)
    os.chmod(path + ".part", 0o644)
    os.replace(path + ".part", path)


def _as_it_travels(source: bytes) -> bytes:
    """``source`` (ASCII) with its module docstring's lines left empty and its comments cut:
    the first file travels with runs and is compiled by each, and those are for whoever reads
    it here. Line numbers stay."""
    text = source.decode("ascii")
    lines = text.splitlines(keepends=True)
    for token in tokenize.generate_tokens(io.StringIO(text).readline):
        if token.type == tokenize.COMMENT:
            row, column = token.start
            lines[row - 1] = lines[row - 1][:column].rstrip() + "\n"
    tree = ast.parse(source)
    first = tree.body[0] if tree.body else None
    if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
        end = first.end_lineno or first.lineno
        lines[:end] = ["\n"] * end
    return "".join(lines).encode("ascii")


def _compiled_and_source(filename: str, *sources: bytes) -> tuple[CodeType, bytes]:
    """A module's code, compiled here, and its source, as they travel: the statements of
    ``sources``, in order, with no docstrings, annotations or comments, which nothing reads at
    run time (bytes each run would pay for), nor what ``if TYPE_CHECKING:`` imports. Line
    numbers are each file's in the code, not in the source."""
    trees = [ast.parse(source, filename) for source in sources]
    for node in (node for tree in trees for node in ast.walk(tree)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            node.returns = None
            arguments = node.args
            for arg in (*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs):
                arg.annotation = None
            for rest in (arguments.vararg, arguments.kwarg):
                if rest is not None:
                    rest.annotation = None
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef) and _is_docstring(node):
            del node.body[0]
        if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING":
            node.body = [ast.copy_location(ast.Pass(), node)]  # imports for the type checker
        for field in ("body", "orelse", "finalbody"):
            statements = getattr(node, field, None)
            if not isinstance(statements, list):
                continue
            for index, statement in enumerate(statements):
                if isinstance(statement, ast.AnnAssign) and statement.value is not None:
                    assign = ast.Assign([statement.target], statement.value)
                    statements[index] = ast.copy_location(assign, statement)
            if field == "body" and not statements:
                statements.append(ast.copy_location(ast.Pass(), node))
    tree = ast.Module([statement for part in trees for statement in part.body], [])
    ast.fix_missing_locations(tree)
    code = compile(tree, filename, "exec", dont_inherit=True, optimize=2)  # asserts: none
    return code, ast.unparse(tree).encode()


def _is_docstring(node: ast.Module | ast.ClassDef | ast.FunctionDef) -> bool:
    first = node.body[0] if node.body else None
    return (
        isinstance(first, ast.Expr)
        and isinstance(first.value, ast.Constant)
        and isinstance(first.value.value, str)
    )


if __name__ == "__main__":  # python plotting/_bundle.py [DIRECTORY [SEEN_AS]] (the Dockerfile)
    arguments = sys.argv[1:]
    directory = arguments[0] if arguments else RESIDENT_DIR
    seen_as = arguments[1] if len(arguments) > 1 else RESIDENT_DIR
    print(write_resident(directory, seen_as=seen_as))
