"""What the prelude does so that a run's output and files reach the gateway whole and truly.

The evaluator discards the whole output (and the files) of a run that wrote one byte that is not
UTF-8, so the standard streams write only UTF-8; a figure takes its name only once complete; and
a run that leaves files lists them in the manifest, for the gateway to name those not returned.
"""

import signal
import textwrap

from plotting import MANIFEST_MAX_BYTES, MANIFEST_NAME, Manifest, read_manifest

from .conftest import Run, RunCode

NOTE = "of the output were not valid UTF-8 and were replaced with U+FFFD]\n"


def code(text: str) -> str:
    return textwrap.dedent(text).lstrip("\n")


def manifest(run: Run) -> Manifest | None:
    path = run.workdir / MANIFEST_NAME
    return read_manifest(path.read_bytes()) if path.exists() else None


def test_bytes_that_are_not_utf8_are_replaced_in_order_and_said_once(run_code: RunCode) -> None:
    # The interpreter runs with -E here: stdout is block-buffered, with surrogateescape, which
    # writes a lone surrogate as a byte that is not UTF-8.
    run = run_code(
        code("""
            import sys
            print("one")
            sys.stdout.buffer.write(b"two \\xff\\xfe\\n")
            sys.stdout.flush()
            sys.stderr.buffer.write(b"three \\xc3\\n")
            sys.stderr.flush()
            print("four \\udc80")
        """)
    )
    assert run.returncode == 0, run.output
    text = run.raw.decode("utf-8")  # strictly: the evaluator would have dropped everything else
    # stderr's binary side follows stderr's own handler: backslashreplace, as Python's stderr.
    assert text == (
        "one\ntwo \ufffd\ufffd\nthree \\xc3\nfour \ufffd\n[3 character(s) or byte(s) " + NOTE
    )


def test_a_character_split_over_writes_stays_whole_and_a_cut_one_is_replaced(
    run_code: RunCode,
) -> None:
    run = run_code(
        code("""
            import sys
            out = sys.stdout.buffer
            out.write(b"\\xe2\\x82")
            out.write(b"\\xac\\n")
            out.write(memoryview(b"\\xe2\\x82"));
        """)
    )
    assert run.raw.decode("utf-8") == "\u20ac\n\ufffd[1 character(s) or byte(s) " + NOTE


def test_reconfiguring_detaching_or_rewrapping_the_streams_keeps_them_utf8(
    run_code: RunCode,
) -> None:
    run = run_code(
        code("""
            import io, sys
            sys.stdout.reconfigure(encoding="latin-1", errors="surrogateescape")
            print("\\u00e9 \\udcff", flush=True)
            latin = io.TextIOWrapper(sys.stdout.buffer, encoding="latin-1", write_through=True)
            latin.write("\\u00e9\\n")
            sys.stdout = io.TextIOWrapper(sys.stdout.detach(), encoding="latin-1")
            print("\\u00e8")
        """)
    )
    assert run.returncode == 0, run.output
    assert (
        run.raw.decode("utf-8")
        == "\u00e9 \ufffd\n\ufffd\n\ufffd\n[3 character(s) or byte(s) " + NOTE
    )


def test_the_streams_still_look_like_the_standard_ones(run_code: RunCode) -> None:
    run = run_code(
        code("""
            import sys
            out = sys.stdout
            print(out is sys.__stdout__, sys.stderr is sys.__stderr__, out.encoding, out.errors)
            print(out.fileno(), out.buffer.fileno(), out.isatty(), out.name, out.buffer.name)
            print(out.buffer is out.buffer, out.buffer.writable(), out.buffer.mode)
            print(sys.stderr.errors, sys.stderr.fileno())
        """)
    )
    assert run.output.splitlines() == [
        "True True utf-8 mcp-replace",
        "1 1 False <stdout> <stdout>",
        "True True wb",
        "backslashreplace 2",
    ]


def test_the_file_descriptor_itself_is_not_guarded(run_code: RunCode) -> None:
    # Only Python-level writes can be guarded; the gateway explains the evaluator's answer then.
    run = run_code("import os\nos.write(1, b'\\xff\\n');")
    assert run.raw == b"\xff\n"


def test_a_figure_being_saved_when_the_run_is_killed_is_left_as_a_partial(
    run_code: RunCode,
) -> None:
    run = run_code(
        code("""
            import os, signal
            import matplotlib.pyplot as plt
            from matplotlib.artist import Artist

            class Kill(Artist):
                def draw(self, renderer):
                    os.kill(os.getpid(), signal.SIGKILL)

            plt.figure(figsize=(2, 1))
            plt.show()
            plt.figure(figsize=(2, 1)).add_artist(Kill())
            plt.show()
        """)
    )
    assert run.returncode == -signal.SIGKILL
    assert run.files() == ["figure_001.png", "figure_002.png.part"]


def test_a_figure_that_fails_to_save_leaves_no_partial(run_code: RunCode) -> None:
    run = run_code(
        "import matplotlib.pyplot as plt\nplt.figure().text(0, 0, r'$\\frac{$')\nplt.show()"
    )
    assert run.output.startswith("[figure 1 could not be saved: ValueError: ")
    assert run.files() == []


def test_the_manifest_lists_what_the_evaluator_should_return(run_code: RunCode) -> None:
    run = run_code(
        code("""
            import os
            os.makedirs("out/deeper")
            open("out/deeper/b.txt", "w").write("bb")
            open("a.csv", "w").write("a")
            open("_hidden", "w").write("never returned")
            os.makedirs(".cache/x")
            open(".cache/x/c", "w").write("never returned")
            os.makedirs("_dir")
            open("_dir/d", "w").write("dd")
            os.symlink("a.csv", "link")
            os.mkfifo("pipe")
            with open("sparse.bin", "wb") as f:
                f.truncate(10**12)
            open("new\\nline \\x1b[31m", "w").write("n")
            open(%r, "w").write("forged")
        """)
        % MANIFEST_NAME,
        files={"input.txt": b"sent in"},
    )
    assert run.returncode == 0, run.output
    # Files sent in and left alone are not returned by Snekbox, so not listed.
    assert manifest(run) == Manifest(
        (
            ("_dir/d", 2),
            ("a.csv", 1),
            ("new\nline \x1b[31m", 1),
            ("out/deeper/b.txt", 2),
            ("sparse.bin", 10**12),
        ),
        5,
        True,
    )


def test_a_changed_input_is_listed(run_code: RunCode) -> None:
    run = run_code("open('data.csv', 'a').write('more')", files={"data.csv": b"a,b\n"})
    assert manifest(run) == Manifest((("data.csv", 8),), 1, True)


def test_the_manifest_names_the_inputs_that_are_gone(run_code: RunCode) -> None:
    """A session's files kept by the gateway forget them: a file the code removed, or turned
    into a folder, is not given to its later runs."""
    run = run_code(
        "import os\nos.remove('old.txt')\nos.remove('d')\nos.mkdir('d')\n"
        "open('d/x', 'w').write('x')",
        files={"old.txt": b"o", "d": b"file", "kept.txt": b"k"},
    )
    assert run.returncode == 0, run.output
    assert manifest(run) == Manifest((("d/x", 1),), 1, True, ("d", "old.txt"))


def test_the_manifest_names_the_last_input_gone(run_code: RunCode) -> None:
    """Nothing left in the directory: the manifest is written all the same."""
    run = run_code("import os\nos.remove('old.txt')", files={"old.txt": b"o"})
    assert manifest(run) == Manifest((), 0, True, ("old.txt",))


def test_gone_inputs_come_first_and_only_names_the_gateway_can_hold(run_code: RunCode) -> None:
    """A name that is not UTF-8 never came back to the gateway (its U+FFFD decoding would name
    another file); and a long list of files written does not push the gone ones out."""
    run = run_code(
        "import os\nos.remove('old.txt')\nos.remove(b'bad\\xff')\n"
        "for i in range(2000):\n    open('%04d' % i + 'n' * 200, 'w').close()",
        files={"old.txt": b"o", "bad\udcff": b"b"},
    )
    listed = manifest(run)
    assert listed is not None and listed.gone == ("old.txt",)
    assert listed.total == 2000 and 0 < len(listed.files) < 2000


def test_the_manifest_is_bounded_and_says_what_it_left_out(run_code: RunCode) -> None:
    run = run_code(
        code("""
            for i in range(2000):
                open("%04d" % i + "n" * 200, "w").close()
        """)
    )
    listed = manifest(run)
    assert listed is not None and (listed.total, listed.complete) == (2000, True)
    assert 0 < len(listed.files) < 2000 and listed.files[0] == ("0000" + "n" * 200, 0)
    assert (run.workdir / MANIFEST_NAME).stat().st_size <= MANIFEST_MAX_BYTES


def test_the_manifests_walk_is_bounded_in_depth_and_entries(run_code: RunCode) -> None:
    run = run_code(
        code("""
            import os
            top = os.getcwd()
            for _ in range(105):
                os.mkdir("d")
                os.chdir("d")
            open("deep.txt", "w").write("x")
            os.chdir(top)
            os.mkdir("many")
            for i in range(10_001):
                open("many/%05d" % i, "w").close()
        """)
    )
    listed = manifest(run)
    assert listed is not None and listed.complete is False
    assert listed.total < 10_001
    assert all(not path.endswith("deep.txt") for path, _ in listed.files)
