"""A run ends as python's shutdown would, without tearing the imported modules down.

Threads, atexit functions, the code's own objects and its files are seen to as python sees to
them; what python would free module by module is left to the process's exit (milliseconds for
a bare interpreter, over 100 ms once numpy and pyplot are loaded). Each test also runs the same
code under plain ``python``, which is what the prelude must match.
"""

import subprocess
import textwrap
from pathlib import Path

import pytest

from plotting import PRELUDE_NAME, build_request
from tests.support import C_BUFFERED

from .conftest import PYTHON, RunCode

#: Code whose objects say when they are freed: one held by the code, one by a module.
NOISY = """
import atexit, os, sys, threading, time
class Noisy:
    def __init__(self, name): self.name = name
    def __del__(self, write=os.write): write(1, f"freed {self.name}\\n".encode())
keeper = sys.modules["keeper"] = type(sys)("keeper")
keeper.held = Noisy("a module's object")
mine = Noisy("the code's object")
out = open("out.txt", "w"); out.write("flushed")
"""

#: What python itself prints of NOISY's objects at its shutdown, and what the prelude prints.
TORN_DOWN = "freed the code's object\nfreed a module's object\n"
LEFT = "freed the code's object\n"


def plain_python(source: str, workdir: Path) -> tuple[str, int]:
    """Merged output and status of ``source`` run by python itself, as a script (in a
    directory of its own in ``workdir``)."""
    (workdir / "plain").mkdir()
    (workdir / "plain" / "plain.py").write_text(source)
    proc = subprocess.run(
        [*PYTHON, "plain.py"],
        cwd=workdir / "plain",
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=60,
        check=False,
    )
    return proc.stdout, proc.returncode


def test_threads_atexit_and_the_codes_objects_are_seen_to_and_modules_left(
    run_code: RunCode, tmp_path: Path
) -> None:
    source = NOISY + textwrap.dedent("""
        atexit.register(print, "atexit ran")
        threading.Thread(target=lambda: (time.sleep(0.2), print("thread ended"))).start()
        print("main ended")
        sys.exit(3)
    """)
    ended = "main ended\nthread ended\natexit ran\n"
    assert plain_python(source, tmp_path) == (ended + TORN_DOWN, 3)
    run = run_code(source)
    assert (run.output, run.returncode) == (ended + LEFT, 3)
    assert (tmp_path / "out.txt").read_text() == "flushed"


@pytest.mark.parametrize(
    ("ending", "status", "freed"),
    [
        ("", 0, LEFT),
        ("raise ValueError", 1, LEFT),
        # Past 255 or below 0, python's own exit computes the status: the prelude leaves it so.
        ("sys.exit(300)", 44, TORN_DOWN),
        ("sys.exit(-1)", 255, TORN_DOWN),
    ],
)
def test_every_status_is_pythons(
    run_code: RunCode, tmp_path: Path, ending: str, status: int, freed: str
) -> None:
    source = NOISY + ending
    output, plain_status = plain_python(source, tmp_path)
    run = run_code(source)
    assert (plain_status, run.returncode) == (status, status)
    assert output.endswith(TORN_DOWN) and run.output.endswith(freed)


def test_a_message_status_is_printed_by_python(run_code: RunCode) -> None:
    run = run_code(NOISY + "sys.exit('why')")
    assert (run.output, run.returncode) == ("why\n" + TORN_DOWN, 1)


def test_what_c_code_printed_is_kept_and_the_modules_still_left(
    run_code: RunCode, tmp_path: Path
) -> None:
    # C's stdio holds a pipe's output until C's exit() (unless python -u), which os._exit()
    # would skip.
    source = NOISY + C_BUFFERED + 'print("python")\n'
    assert plain_python(source, tmp_path) == ("python\n" + TORN_DOWN + "from C\n", 0)
    run = run_code(source)
    assert (run.output, run.returncode) == ("python\n" + LEFT + "from C\n", 0)


@pytest.mark.parametrize(
    ("imports", "loaded"),
    [
        ("import json, math, socket", False),
        ("import PIL.Image", True),  # its C extension, without ctypes
        ("import numpy", True),  # which imports ctypes too
    ],
)
def test_c_code_is_told_from_the_standard_librarys(imports: str, loaded: bool) -> None:
    # Their C code may hold stdio buffers or exit handlers of its own (OpenBLAS, Fortran).
    ending = Path(__file__).parents[2] / "plotting" / "_ending.py"
    check = f"import runpy, sys\nending = runpy.run_path({str(ending)!r})\n{imports}\n"
    check += "print(ending['_loads_c'](), '_ctypes' in sys.modules)"
    proc = subprocess.run(
        [*PYTHON, "-c", check], capture_output=True, text=True, timeout=60, check=True
    )
    assert proc.stdout == f"{loaded} {'numpy' in imports}\n"


def test_a_sessions_cell_does_not_end_its_interpreter(tmp_path: Path) -> None:
    # A session's interpreter (the warm agent's) runs cell after cell in one process.
    runner = textwrap.dedent(f"""
        import sys
        sys._mcp_session = True
        source = open({PRELUDE_NAME!r}, "rb").read()
        exec(compile(source, {PRELUDE_NAME!r}, "exec"), {{"__name__": "__main__"}})
        print("the interpreter goes on")
    """)
    for file in build_request("print('cell')").files:
        (tmp_path / file.path).write_bytes(file.content)
    proc = subprocess.run(
        [*PYTHON, "-c", runner], cwd=tmp_path, capture_output=True, text=True, check=False
    )
    assert (proc.stdout, proc.returncode) == ("cell\nthe interpreter goes on\n", 0)


def test_a_file_a_failed_function_left_open_and_a_del_using_globals_are_seen_to(
    run_code: RunCode, tmp_path: Path
) -> None:
    # The traceback python keeps (sys.last_*) holds the function's frame; the names go, the
    # last bound first, so that a __del__ still finds the module it uses.
    source = textwrap.dedent("""
        import json
        class Saver:
            def __del__(self):
                with open("saved.json", "w") as file:
                    json.dump(["saved"], file)
        saver = Saver()
        def write():
            out = open("out.txt", "w"); out.write("flushed")
            raise ValueError("failed")
        write()
    """)
    run = run_code(source)
    assert run.returncode == 1 and run.output.endswith("ValueError: failed\n"), run.output
    assert (tmp_path / "out.txt").read_text() == "flushed"
    assert (tmp_path / "saved.json").read_text() == '["saved"]'


@pytest.mark.parametrize(
    ("streams", "status"),
    [
        ("sys.stdout = None", 0),
        ("sys.stdout.close()", 0),
        (
            "class Tee:\n    def write(self, text): return len(text)\n    def flush(self): pass\n"
            "sys.stdout = Tee()",
            0,
        ),
        (
            "class Broken:\n    def write(self, text): return len(text)\n"
            "    def flush(self): raise OSError('cannot')\nsys.stdout = Broken()",
            120,
        ),
    ],
)
def test_standard_streams_are_flushed_as_python_flushes_them(
    run_code: RunCode, tmp_path: Path, streams: str, status: int
) -> None:
    # One that is None or closed is left alone, one without "closed" flushed; one that cannot
    # flush makes the status 120, python's, said on stderr.
    source = f"import sys\nprint('before')\n{streams}\n"
    output, plain_status = plain_python(source, tmp_path)
    run = run_code(source)
    assert (plain_status, run.returncode) == (status, status), run.output
    assert ("OSError: cannot" in run.output) == (status == 120) == ("OSError: cannot" in output)
