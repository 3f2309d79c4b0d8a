"""The prelude runs the user's code the way ``python`` would, minus any trace of itself."""

import re
import signal
import subprocess
import textwrap

import pytest

from .conftest import PYTHON, RunCode


def code(text: str) -> str:
    return textwrap.dedent(text).lstrip("\n")


def test_print(run_code: RunCode) -> None:
    run = run_code("print('hello')\nprint(1 + 1)")
    assert (run.output, run.returncode) == ("hello\n2\n", 0)


def test_exception_shows_only_the_users_frames_and_lines(run_code: RunCode) -> None:
    run = run_code(
        code("""
            print("before")
            def divide(a, b):
                return a / b

            divide(1, 0)
        """)
    )
    assert run.returncode == 1
    assert run.output.startswith("before\nTraceback (most recent call last):\n")
    assert '  File "<string>", line 5, in <module>\n    divide(1, 0)\n' in run.output
    assert '  File "<string>", line 3, in divide\n    return a / b\n' in run.output
    assert run.output.endswith("ZeroDivisionError: division by zero\n")
    assert run.output.count('File "') == 2
    assert "_mcp" not in run.output and "prelude" not in run.output


def test_chained_exceptions_are_kept(run_code: RunCode) -> None:
    run = run_code(
        code("""
            try:
                {}["key"]
            except KeyError as exc:
                raise ValueError("no key") from exc
        """)
    )
    assert run.returncode == 1
    assert "The above exception was the direct cause of the following exception:" in run.output
    assert '  File "<string>", line 2, in <module>\n    {}["key"]\n' in run.output
    assert '  File "<string>", line 4, in <module>\n    raise ValueError("no key") from exc\n' in (
        run.output
    )
    assert run.output.endswith("ValueError: no key\n")
    assert "_mcp" not in run.output


def test_syntax_error_points_at_the_users_line(run_code: RunCode) -> None:
    run = run_code("x = 1\ny = 2\nif x = y:\n    pass\n")
    assert run.returncode == 1
    assert run.output.startswith('  File "<string>", line 3\n    if x = y:\n')
    assert "SyntaxError: " in run.output
    assert "Traceback" not in run.output and "_mcp" not in run.output


@pytest.mark.parametrize(
    ("source", "message"),
    [
        # SyntaxError, or ValueError on the Pythons before the parser said so (Debian's 3.11.2).
        (b"x = 1\x00\n", "Error: source code string cannot contain null bytes"),
        (b'print("\xed\xa0\x80")\n', "SyntaxError: (unicode error)"),
    ],
)
def test_unreadable_source_is_a_syntax_error(
    run_code: RunCode, source: bytes, message: str
) -> None:
    run = run_code(source)
    assert run.returncode == 1
    assert message in run.output
    assert "Traceback" not in run.output and "_mcp" not in run.output


def test_lone_surrogates_from_a_json_string_are_reported_not_crashed(run_code: RunCode) -> None:
    run = run_code('print("\ud800")')
    assert run.returncode == 1
    assert "SyntaxError: (unicode error)" in run.output


def test_from_future_imports_work_and_the_preludes_do_not_leak(run_code: RunCode) -> None:
    run = run_code(
        code("""
            from __future__ import annotations
            def f(x: Undefined) -> None: ...
            print(f.__annotations__)
        """)
    )
    assert (run.output, run.returncode) == ("{'x': 'Undefined', 'return': 'None'}\n", 0)
    run = run_code("def f(x: int): ...\nprint(f.__annotations__)")
    assert run.output == "{'x': <class 'int'>}\n"


@pytest.mark.parametrize(
    ("statement", "status"),
    [
        ("sys.exit(3)", 3),
        ("sys.exit(0)", 0),
        ("sys.exit()", 0),
        ("raise SystemExit(None)", 0),
        ("sys.exit(True)", 1),
        ("raise RuntimeError('x')", 1),
    ],
)
def test_exit_status(run_code: RunCode, statement: str, status: int) -> None:
    run = run_code(f"import sys\n{statement}\nprint('not reached')")
    assert run.returncode == status
    assert "not reached" not in run.output


def test_sys_exit_with_a_message_prints_it_and_exits_1(run_code: RunCode) -> None:
    run = run_code("import sys\nprint('before')\nsys.exit('boom')")
    assert (run.output, run.returncode) == ("before\nboom\n", 1)


def test_keyboard_interrupt_behaves_like_python(run_code: RunCode) -> None:
    run = run_code(
        code("""
            import atexit
            atexit.register(print, "atexit ran")
            raise KeyboardInterrupt
        """)
    )
    assert run.returncode == -signal.SIGINT
    assert '  File "<string>", line 3, in <module>\n' in run.output
    assert "KeyboardInterrupt\n" in run.output and "atexit ran\n" in run.output
    assert "_mcp" not in run.output


def test_code_runs_as_main_in_a_fresh_module(run_code: RunCode) -> None:
    run = run_code(
        code("""
            import pickle, sys
            class Point:
                pass
            print(__name__, sys.argv, "__file__" in globals())
            print(sys.modules["__main__"].__dict__ is globals())
            print(type(pickle.loads(pickle.dumps(Point()))).__name__)
            print(sorted(k for k in globals() if k.startswith("_")))
        """)
    )
    assert run.returncode == 0, run.output
    assert run.output.splitlines() == [
        "__main__ ['<string>'] False",
        "True",
        "Point",
        "['__builtins__', '__doc__', '__loader__', '__name__', '__package__', '__spec__']",
    ]


def test_multiprocessing_spawn_works_without_a_main_file(run_code: RunCode) -> None:
    run = run_code(
        code("""
            import multiprocessing
            with multiprocessing.get_context("spawn").Pool(1) as pool:
                print(pool.map(abs, [-1, -2]))
        """)
    )
    assert (run.output, run.returncode) == ("[1, 2]\n", 0)


def test_working_directory_holds_only_the_users_files(run_code: RunCode) -> None:
    run = run_code("import os\nprint(sorted(os.listdir('.')))", files={"data.csv": b"a,b\n"})
    assert run.output == "['data.csv']\n"
    assert run.files() == ["data.csv"]


def test_handled_tracebacks_and_warnings_show_the_users_source(run_code: RunCode) -> None:
    run = run_code(
        code("""
            import traceback, warnings
            try:
                1 / 0
            except ZeroDivisionError:
                traceback.print_exc()
            warnings.warn("careful")
        """)
    )
    assert run.returncode == 0
    assert '  File "<string>", line 3, in <module>\n    1 / 0\n' in run.output
    assert '<string>:6: UserWarning: careful\n  warnings.warn("careful")\n' in run.output


def test_inspect_finds_the_users_source(run_code: RunCode) -> None:
    run = run_code(
        "import inspect\n\ndef double(x):\n    return 2 * x\n\n"
        "print(inspect.getsource(double), end='')"
    )
    assert (run.output, run.returncode) == ("def double(x):\n    return 2 * x\n", 0)


def test_a_users_excepthook_is_honoured(run_code: RunCode) -> None:
    run = run_code(
        code("""
            import sys
            def hook(kind, value, tb):
                print("hook:", kind.__name__, tb.tb_frame.f_code.co_filename)
            sys.excepthook = hook
            raise ValueError
        """)
    )
    assert (run.output, run.returncode) == ("hook: ValueError <string>\n", 1)


def test_output_order_is_kept_with_buffered_stdout(run_code: RunCode) -> None:
    run = run_code("for i in range(3):\n    print(i)\nraise ValueError('late')")
    assert re.match(r"0\n1\n2\nTraceback \(most recent call last\):\n", run.output)


def test_unused_matplotlib_is_not_imported_and_nothing_else_is(run_code: RunCode) -> None:
    probe = "import sys; print(sorted(set(sys.modules) - {'__main__'}))"
    run = run_code(probe + "\nprint('matplotlib' in sys.modules)")
    bare = subprocess.run([*PYTHON, "-c", probe], capture_output=True, text=True, check=True)
    modules, matplotlib_loaded = run.output.splitlines()
    assert matplotlib_loaded == "False"
    assert modules == bare.stdout.strip()


@pytest.mark.parametrize("compiled", [True, False])
@pytest.mark.parametrize(
    ("source", "output"),
    [
        ("1 + 1", "2\n"),
        ("x = 5\nx * 2  # doubled\n\n", "10\n"),
        ("import math\n[\n    math.floor(2.5),\n    'a',\n]", "[2, 'a']\n"),
        ("'text'", "'text'\n"),
        ("import math; math.floor(2.5)", "2\n"),
        ("None", ""),
        ("x = 1", ""),
        ("print(3)", "3\n"),
        ("for i in range(2):\n    i", ""),
        ("def f():\n    return 1", ""),
    ],
)
def test_a_last_expression_is_shown_as_a_notebook_shows_it(
    run_code: RunCode, source: str, output: str, compiled: bool
) -> None:
    run = run_code(source, compiled=compiled)
    assert (run.output, run.returncode) == (output, 0)


def test_a_long_value_is_cut_in_the_middle(run_code: RunCode) -> None:
    run = run_code("'a' * 5000 + 'b' * 20000")
    assert run.returncode == 0
    assert run.output.startswith("'" + "a" * 4999) and run.output.endswith("b" * 4999 + "'\n")
    assert "[15,002 characters cut]" in run.output and len(run.output) < 10_100


def test_an_error_in_the_last_expression_is_the_codes_own(run_code: RunCode) -> None:
    run = run_code("x = 1\n\nx / 0")
    assert run.returncode == 1
    assert '  File "<string>", line 3, in <module>\n    x / 0\n' in run.output
    assert run.output.count('File "') == 1
    failing = "class Odd:\n    def __repr__(self):\n        raise ValueError('no repr')\nOdd()"
    run = run_code(failing)
    assert run.returncode == 1 and run.output.endswith("ValueError: no repr\n")
    assert "_mcp" not in run.output and "prelude" not in run.output


def test_a_trailing_semicolon_or_a_matplotlib_object_shows_nothing(run_code: RunCode) -> None:
    assert run_code("1 + 1;").output == ""
    run = run_code("import matplotlib.pyplot as plt\nplt.plot([1, 2])")
    assert (run.output, run.returncode) == ("", 0)
    assert run_code("[1, 2]  # a list of ints is shown\n").output == "[1, 2]\n"
