"""Failure fingerprints: normalization, the parsers, and stability across workspaces."""

from __future__ import annotations

import hashlib
import json
import math
import os
import signal
import subprocess
import sys
import textwrap
import unicodedata
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flaketriage.bundle.manifest import FailureCriteria, MetricBound
from flaketriage.errors import ConfigError, MetricsFileError
from flaketriage.failure.fingerprint import fingerprint_failure, frame_key
from flaketriage.failure.metrics import bound_violation, read_metrics
from flaketriage.failure.normalize import MAX_MESSAGE_CHARS, collapse_long_reprs, normalize_message
from flaketriage.failure.tracebacks import parse_pytest_failures, parse_python_traceback


def has_control(text: str) -> bool:
    return any(unicodedata.category(ch) in ("Cc", "Cf", "Cs") for ch in text)


# Pieces that exercise the masks and their interactions, mixed with arbitrary text.
FRAGMENTS = st.sampled_from(
    [
        "0x7f3a2b",
        "/tmp/",
        "/",
        "\\",
        "C:",
        "./",
        "../",
        "~",
        ".",
        "-",
        "+",
        "e",
        "E",
        "1",
        "42",
        "3.5",
        "1e-5",
        "nan",
        "inf",
        "tmp",
        "tmpab12cd3_",
        "deadbeef1234",
        "550e8400-e29b-41d4-a716-446655440000",
        ".py",
        "x",
        "_",
        "<",
        ">",
        " ",
        "\n",
        "\x1b[31m",
        "\x1b",
        "[",
        "\x00",
        "'",
        '"',
        ":",
    ]
)
MESSY_TEXT = st.lists(st.one_of(FRAGMENTS, st.text(max_size=5)), max_size=40).map("".join)


# --- normalize_message --------------------------------------------------------------------------


@settings(max_examples=400, deadline=None)
@given(st.one_of(st.text(), MESSY_TEXT))
def test_normalize_is_idempotent_and_clean(text: str) -> None:
    once = normalize_message(text)
    assert normalize_message(once) == once
    assert not has_control(once)
    assert "\x1b" not in once
    assert len(once) <= MAX_MESSAGE_CHARS
    assert once == once.strip()
    assert "  " not in once


@pytest.mark.parametrize(
    ("raw", "normalized"),
    [
        ("object at 0x7f3a2b1c00 is gone", "object at <hex> is gone"),
        ("no file /tmp/pytest-of-root/pytest-3/x/y.py here", "no file <path> here"),
        (r"no file C:\Users\me\x.csv here", "no file <path> here"),
        ("read ./a/b.csv and ../up and data/train.csv", "read <path> and <path> and <path>"),
        ("run 550e8400-e29b-41d4-a716-446655440000 sha 3f2a9b8c7d6e5f4a", "run <id> sha <id>"),
        ("wrote 'tmpab12_x9z'", "wrote '<tmp>'"),
        ("loss=nan lr=1e-5 delta -3.5 step 12 of 1,000", "loss=nan lr=<n> delta <n> step <n> of <n>,<n>"),
        ("loss is inf, grad -inf", "loss is inf, grad -inf"),
        ("float32 vs float64 on cuda:0", "float32 vs float64 on cuda:<n>"),
        ("\x1b[31mFAILED\x1b[0m\t  two\n\nlines\x00", "FAILED two lines"),
        ("version 1.2.3 expected", "version <n> expected"),
    ],
)
def test_normalize_examples(raw: str, normalized: str) -> None:
    assert normalize_message(raw) == normalized


def test_normalize_caps_length() -> None:
    assert len(normalize_message("word " * 1000)) <= MAX_MESSAGE_CHARS


# --- parse_python_traceback ---------------------------------------------------------------------

CHAINED = """\
some output
Traceback (most recent call last):
  File "/w/app.py", line 3, in load
    return data[key]
           ~~~~^^^^^
KeyError: 'lr'

The above exception was the direct cause of the following exception:

Traceback (most recent call last):
  File "/w/app.py", line 9, in <module>
    main()
  File "/w/app.py", line 7, in main
    load({}, "lr")
  File "/usr/lib/python3.11/site-packages/numpy/core/_methods.py", line 41, in _sum
    raise x
numpy.core._exceptions._ArrayMemoryError: Unable to allocate 8.00 GiB
for an array with shape (1024, 1024, 1024)

trailing log line
"""


def test_traceback_takes_the_final_chained_exception() -> None:
    error = parse_python_traceback(CHAINED)
    assert error is not None
    assert error.exception_type == "numpy.core._exceptions._ArrayMemoryError"
    assert error.message == "Unable to allocate 8.00 GiB\nfor an array with shape (1024, 1024, 1024)"
    assert [(f.filename, f.function, f.lineno) for f in error.frames] == [
        ("/w/app.py", "<module>", 9),
        ("/w/app.py", "main", 7),
        ("/usr/lib/python3.11/site-packages/numpy/core/_methods.py", "_sum", 41),
    ]
    assert error.text.startswith("Traceback (most recent call last):")
    assert "KeyError" not in error.text and "trailing" not in error.text


def test_traceback_with_crlf_line_ends() -> None:
    error = parse_python_traceback(CHAINED.replace("\n", "\r\n"))
    assert error is not None and error.exception_type == "numpy.core._exceptions._ArrayMemoryError"
    assert len(parse_pytest_failures(PYTEST_OUTPUT.replace("\n", "\r\n"))) == 4


def test_traceback_without_message() -> None:
    text = 'Traceback (most recent call last):\n  File "x.py", line 1, in <module>\nKeyboardInterrupt\n'
    error = parse_python_traceback(text)
    assert error is not None
    assert (error.exception_type, error.message) == ("KeyboardInterrupt", "")


def test_traceback_cut_off_is_none() -> None:
    assert parse_python_traceback('Traceback (most recent call last):\n  File "x.py", line 1, in f\n') is None
    assert parse_python_traceback("all good\n") is None


def test_exception_group_is_reported_as_the_group() -> None:
    text = textwrap.dedent(
        """\
          + Exception Group Traceback (most recent call last):
          |   File "/w/g.py", line 4, in <module>
          |     raise ExceptionGroup("two failed", [ValueError("a"), TypeError("b")])
          | ExceptionGroup: two failed (2 sub-exceptions)
          +-+---------------- 1 ----------------
            | Traceback (most recent call last):
            |   File "/w/g.py", line 2, in f
            | ValueError: a
            +---------------- 2 ----------------
            | TypeError: b
            +------------------------------------
        """
    )
    error = parse_python_traceback(text)
    assert error is not None
    assert error.exception_type == "ExceptionGroup"
    assert error.message == "two failed (2 sub-exceptions)"
    assert [f.function for f in error.frames] == ["<module>"]


def test_syntax_error_without_traceback_header() -> None:
    text = '  File "/w/bad.py", line 1\n    def f(:\n          ^\nSyntaxError: invalid syntax\n'
    error = parse_python_traceback(text)
    assert error is not None
    assert (error.exception_type, error.message) == ("SyntaxError", "invalid syntax")
    assert error.frames[0].filename == "/w/bad.py" and error.frames[0].function == ""


# --- parse_pytest_failures ----------------------------------------------------------------------

PYTEST_OUTPUT = """\
tests/test_x.py::test_y[0.1] FAILED                                      [ 50%]
=========================== short test summary info ============================
FAILED tests/test_x.py::test_y[a - b] - AssertionError: assert 0.3 < 0.1
FAILED tests/test_x.py::test_z - [XPASS(strict)] should fail
ERROR tests/test_bad.py - ModuleNotFoundError: No module named 'foo'
\x1b[31mERROR\x1b[0m tests/test_x.py::test_w - RuntimeError: fixture broke
========================= 2 failed, 2 errors in 0.12s ==========================
"""


def test_pytest_summary_lines() -> None:
    failures = parse_pytest_failures(PYTEST_OUTPUT)
    assert [(f.nodeid, f.outcome, f.exception_type, f.message) for f in failures] == [
        ("tests/test_x.py::test_y[a - b]", "failed", "AssertionError", "assert 0.3 < 0.1"),
        ("tests/test_x.py::test_z", "failed", None, "[XPASS(strict)] should fail"),
        ("tests/test_bad.py", "error", "ModuleNotFoundError", "No module named 'foo'"),
        ("tests/test_x.py::test_w", "error", "RuntimeError", "fixture broke"),
    ]


def test_the_types_pytest_leaves_out_of_a_summary_line_are_read() -> None:
    # What pytest itself prints: a rewritten bare assert without "AssertionError: ", an exception
    # raised without a message as its class name alone.
    text = (
        "=========================== short test summary info ============================\n"
        "FAILED t.py::test_total - assert 16.99 == 17.0\n"
        "FAILED t.py::test_plain - AssertionError\n"
        "FAILED t.py::test_key - KeyError\n"
        "FAILED t.py::test_mine - t.MyErr\n"
        "FAILED t.py::test_fail - Failed: assert nothing\n"
        "FAILED t.py::test_text - [XPASS(strict)] should fail\n"
        "FAILED t.py::test_word - fixture broke\n"
    )
    assert [(f.exception_type, f.message, f.printed_type) for f in parse_pytest_failures(text)] == [
        ("AssertionError", "assert 16.99 == 17.0", False),
        ("AssertionError", "", False),
        ("KeyError", "", False),
        ("t.MyErr", "", False),
        ("Failed", "assert nothing", True),
        (None, "[XPASS(strict)] should fail", True),
        (None, "fixture broke", True),
    ]


def test_a_bare_asserts_signature_names_assertion_error_and_still_matches_earlier_bundles() -> None:
    header = PYTEST_OUTPUT.splitlines()[1]
    info = fingerprint_failure(
        exit_code=1, stdout=f"{header}\nFAILED t.py::test_total - assert 16.99 == 17.0\n", stderr=""
    )
    assert info is not None
    assert (info.exception_type, info.message) == ("AssertionError", "assert 16.99 == 17.0")
    assert info.signature.startswith("pytest|t.py::test_total|AssertionError|assert ")
    # The signature a release that read no type wrote for the same line: its bundles still match.
    (earlier,) = info.earlier_signatures
    assert earlier == info.signature.replace("|AssertionError|", "||")
    old = hashlib.sha256(earlier.encode()).hexdigest()
    matched = info.as_of(old)
    assert matched is not None and (matched.fingerprint, matched.signature) == (old, earlier)
    assert info.as_of(info.fingerprint) is info
    assert info.as_of("0" * 64) is None
    # A line that printed its type has one signature only.
    typed = fingerprint_failure(exit_code=1, stdout=f"{header}\nFAILED t.py::t - ValueError: x\n", stderr="")
    assert typed is not None and typed.earlier_signatures == ()


CUT_REPORT = """\
=================================== FAILURES ===================================
__________________________________ test_other __________________________________
E       ValueError: bad price for SKU-0137: -4.99 in another test
_________________________________ test_price ___________________________________

    def test_price():
>       raise ValueError("bad price for SKU-0137: -4.99 is below zero; see row 1182")
E       ValueError: bad price for SKU-0137: -4.99 is below zero; see row 1182
E         second line

test_prices.py:5: ValueError
=========================== short test summary info ============================
FAILED test_prices.py::test_price - ValueError: bad price for SKU-0137: -4.99...
"""


def test_a_message_pytest_cut_to_the_terminal_is_read_whole_from_the_report() -> None:
    (failure,) = parse_pytest_failures(CUT_REPORT)
    assert failure.message == "bad price for SKU-0137: -4.99..."
    assert failure.whole_message == "bad price for SKU-0137: -4.99 is below zero; see row 1182\n  second line"
    info = fingerprint_failure(exit_code=1, stdout=CUT_REPORT, stderr="")
    assert info is not None and info.message == failure.whole_message
    # The signature is the summary line's: a replay printed at the same width matches.
    alone = fingerprint_failure(exit_code=1, stdout="\n".join(CUT_REPORT.splitlines()[-2:]), stderr="")
    assert alone is not None and alone.fingerprint == info.fingerprint and alone.message == failure.message


def _summary_fingerprint(line: str) -> str:
    info = fingerprint_failure(exit_code=1, stdout=f"{PYTEST_OUTPUT.splitlines()[1]}\n{line}\n", stderr="")
    assert info is not None
    return info.fingerprint


def test_an_assertion_that_prints_the_state_it_checks_is_one_failure_whatever_the_state() -> None:
    # six's test_lazy: `assert 'html.parser' not in sys.modules` prints sys.modules, whose contents
    # (and order) depend on the tests that ran before; a polluter search that drops an unrelated one
    # must still see the same failure.
    def modules(*names: str) -> str:
        return "{" + ", ".join(f"'{n}': <module '{n}' (built-in)>" for n in names)

    victim = "FAILED test_six.py::test_lazy - AssertionError: assert 'html.parser' not in "
    after_all = _summary_fingerprint(victim + modules("sys", "builtins", "dbm", "html.parser") + "}")
    after_one = _summary_fingerprint(victim + modules("sys", "html.parser", "_markupbase") + "}")
    cut_short = _summary_fingerprint(
        victim + modules("sys", "builtins", "tkinter", "winreg")
    )  # cut, unclosed
    assert after_all == after_one == cut_short
    # Short values are the failure itself, and a different comparison is a different failure.
    assert _summary_fingerprint(
        "FAILED t.py::test_x - assert ['a', 'b'] == ['a', 'c']"
    ) != _summary_fingerprint("FAILED t.py::test_x - assert ['a', 'b'] == ['a', 'd']")
    assert after_all != _summary_fingerprint(victim.replace("not in", "in") + modules("sys", "dbm") + "}")


@pytest.mark.parametrize(
    ("raw", "collapsed"),
    [
        ("assert {'a': 1} == {'a': 2}", "assert {'a': 1} == {'a': 2}"),
        ("assert x in [" + "1, " * 30 + "2]", "assert x in [...]"),
        ("f(" + "a" * 50 + ") and {" + "b" * 45, "f(...) and {...}"),
        # A bracket inside a string is text, not a container: the quoted string stays whole.
        ("KeyError: '" + "(" * 60 + "'", "KeyError: '" + "(" * 60 + "'"),
        ("got {'k': ')" + "x" * 50 + "'}", "got {...}"),
    ],
)
def test_collapse_long_reprs_examples(raw: str, collapsed: str) -> None:
    assert collapse_long_reprs(raw) == collapsed


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet="([{}])'\"ab ,:", max_size=200))
def test_collapse_long_reprs_is_idempotent_and_never_longer(text: str) -> None:
    once = collapse_long_reprs(text)
    assert collapse_long_reprs(once) == once
    assert len(once) <= len(text)


def test_pytest_lines_need_a_node_id() -> None:
    assert parse_pytest_failures("ERROR: file or directory not found: x\nFAILED to connect\n") == []


# --- frame_key ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("filename", "key"),
    [
        ("/home/runner/work/repo/src/pkg/mod.py", "src/pkg/mod.py:f"),
        ("/tmp/replay-1/ws/src/pkg/mod.py", "src/pkg/mod.py:f"),
        ("/opt/venv/lib/python3.11/site-packages/torch/nn/module.py", "torch/nn/module.py:f"),
        ("/usr/lib/python3/dist-packages/numpy/core.py", "numpy/core.py:f"),
        ("/usr/lib/python3.11/json/decoder.py", "json/decoder.py:f"),
        ("/elsewhere/tool.py", "tool.py:f"),
        ("<frozen runpy>", "<frozen runpy>:f"),
        (r"C:\ws\src\x.py", "src/x.py:f"),
    ],
)
def test_frame_key(filename: str, key: str) -> None:
    roots = ["/home/runner/work/repo", "/tmp/replay-1/ws/", "C:\\ws"]
    assert frame_key(filename, "f", roots) == key


def test_frame_key_prefers_the_longest_root() -> None:
    assert frame_key("/r/sub/a.py", "g", ["/r", "/r/sub"]) == "a.py:g"


# --- fingerprints from templates -----------------------------------------------------------------

TEMPLATE = """\
Traceback (most recent call last):
  File "{root}/train.py", line {l1}, in <module>
    main()
  File "{root}/pkg/model.py", line {l2}, in forward
    return self.layer(x)
           ^^^^^^^^^^^^^
  File "/opt/venv/lib/python3.11/site-packages/torch/nn/modules/module.py", line {l3}, in _call_impl
    return forward_call(*args)
{etype}: tensor at 0x{addr:x} read {root}/data/{tmp}/batch_{batch}.npy: shape ({n}, 3)
"""

ROOTS = st.builds(
    lambda parts: "/" + "/".join(parts),
    st.lists(
        st.text("abcdefghijklmnopqrstuvwxyz0123456789_-.", min_size=1, max_size=8), min_size=1, max_size=4
    ),
).filter(lambda r: "/." not in r)
LINES = st.integers(1, 99_999)


def render(etype: str, root: str, data: st.DataObject) -> str:
    return TEMPLATE.format(
        etype=etype,
        root=root,
        l1=data.draw(LINES),
        l2=data.draw(LINES),
        l3=data.draw(LINES),
        addr=data.draw(st.integers(0, 2**48)),
        tmp="tmp" + data.draw(st.text("abcdefghijklmnopqrstuvwxyz0123456789_", min_size=8, max_size=8)),
        batch=data.draw(st.integers(0, 10**6)),
        n=data.draw(st.integers(0, 10**6)),
    )


@settings(max_examples=100, deadline=None)
@given(ROOTS, ROOTS, st.data())
def test_fingerprint_stable_across_workspaces(root_a: str, root_b: str, data: st.DataObject) -> None:
    a = fingerprint_failure(
        exit_code=1, stdout="", stderr=render("RuntimeError", root_a, data), roots=[root_a]
    )
    b = fingerprint_failure(
        exit_code=1, stdout="", stderr=render("RuntimeError", root_b, data), roots=[root_b]
    )
    assert a is not None and b is not None
    assert a.kind == "exception" and a.exception_type == "RuntimeError"
    assert a.signature == b.signature
    assert a.fingerprint == b.fingerprint
    assert "train.py:<module>>pkg/model.py:forward>torch/nn/modules/module.py:_call_impl" in a.signature


@settings(max_examples=50, deadline=None)
@given(
    st.lists(
        st.from_regex(r"[A-Z][A-Za-z]{0,12}(Error|Exception)", fullmatch=True),
        min_size=2,
        max_size=2,
        unique=True,
    ),
    st.data(),
)
def test_different_exception_types_differ(types: list[str], data: st.DataObject) -> None:
    a = fingerprint_failure(exit_code=1, stdout="", stderr=render(types[0], "/w", data), roots=["/w"])
    b = fingerprint_failure(exit_code=1, stdout="", stderr=render(types[1], "/w", data), roots=["/w"])
    assert a is not None and b is not None
    assert a.fingerprint != b.fingerprint


@settings(max_examples=200, deadline=None)
@given(
    st.one_of(st.none(), st.integers(-64, 255)),
    st.one_of(st.text(), MESSY_TEXT),
    st.one_of(st.text(), MESSY_TEXT),
    st.booleans(),
)
def test_signatures_have_no_control_characters(
    code: int | None, stdout: str, stderr: str, timeout: bool
) -> None:
    criteria = FailureCriteria(fail_patterns=("x",), metrics=(MetricBound(name="loss", above=1.0),))
    info = fingerprint_failure(
        exit_code=code, stdout=stdout, stderr=stderr, criteria=criteria, timed_out=timeout
    )
    if info is not None:
        assert not has_control(info.signature)
        assert len(info.fingerprint) == 64


# --- fingerprint_failure: kinds and precedence -------------------------------------------------


def test_success_is_none() -> None:
    assert fingerprint_failure(exit_code=0, stdout="ok", stderr="") is None
    assert fingerprint_failure(exit_code=None, stdout="", stderr="") is None
    assert (
        fingerprint_failure(exit_code=3, stdout="", stderr="", criteria=FailureCriteria(nonzero_exit=False))
        is None
    )


def test_exit_uses_the_last_error_line() -> None:
    stderr = "starting\nerror: disk 3 is full\nfinishing up\n"
    info = fingerprint_failure(exit_code=2, stdout="", stderr=stderr)
    assert info is not None
    assert (info.kind, info.signature, info.message) == (
        "exit",
        "exit:2|error: disk <n> is full",
        "error: disk 3 is full",
    )
    info = fingerprint_failure(exit_code=2, stdout="", stderr="a\nlast line 7\n\n")
    assert info is not None and info.signature == "exit:2|last line <n>"


PYTEST_NOT_FOUND = "ERROR: not found: /x/test_a.py::test_b\n(no match in any of [<Module test_a.py>])\n\n"
PYTEST_UNKNOWN_OPTION = (
    "ERROR: usage: python -m pytest [options] [file_or_dir] [file_or_dir] [...]\n"
    "python -m pytest: error: unrecognized arguments: --cov\n  inifile: /x/pytest.ini\n  rootdir: /x\n"
)


@pytest.mark.parametrize(
    ("exit_code", "stdout", "stderr", "detail"),
    [
        (
            4,
            "=== no tests ran in 0.10s ===\n",
            PYTEST_NOT_FOUND,
            "exit:4 (pytest usage error): ERROR: not found: /x/test_a.py::test_b",
        ),
        (
            4,
            "",
            PYTEST_UNKNOWN_OPTION,
            "exit:4 (pytest usage error): python -m pytest: error: unrecognized arguments: --cov",
        ),
        (
            4,
            "",
            "ERROR: file or directory not found: a.py\n\nERROR: file or directory not found: b.py\n",
            "exit:4 (pytest usage error): ERROR: file or directory not found: a.py; "
            "ERROR: file or directory not found: b.py",
        ),
        (
            5,
            "collected 2 items / 2 deselected / 0 selected\n\n===== 2 deselected in 0.11s =====\n",
            "",
            "exit:5 (pytest collected no tests): 2 deselected",
        ),
        (
            5,
            "collected 0 items\n\n===== no tests ran in 0.10s =====\n",
            "",
            "exit:5 (pytest collected no tests): no tests ran",
        ),
        # Not pytest's words, or not its statuses: the status alone.
        (4, "", "could not open the device\n", "exit:4"),
        (3, "", "ERROR: not found: x\n", "exit:3"),
    ],
)
def test_a_pytest_run_that_tested_nothing_says_why(
    exit_code: int, stdout: str, stderr: str, detail: str
) -> None:
    info = fingerprint_failure(exit_code=exit_code, stdout=stdout, stderr=stderr)
    assert info is not None and info.kind == "exit"
    assert info.detail == detail
    # The reason is for people: the signature stays the status and the last error line.
    assert info.signature.startswith(f"exit:{exit_code}|")


def test_signal() -> None:
    info = fingerprint_failure(
        exit_code=-signal.SIGSEGV, stdout="", stderr="Fatal Python error: Segmentation fault"
    )
    assert info is not None
    assert (info.kind, info.signal) == ("signal", "SIGSEGV")
    assert info.signature == "signal:SIGSEGV|Fatal Python error: Segmentation fault"


def test_signal_outranks_an_earlier_handled_traceback() -> None:
    stderr = 'Traceback (most recent call last):\n  File "x.py", line 1, in f\nValueError: handled\n'
    info = fingerprint_failure(exit_code=-9, stdout="", stderr=stderr)
    assert info is not None and info.kind == "signal" and info.signal == "SIGKILL"


def test_timeout_outranks_everything() -> None:
    info = fingerprint_failure(exit_code=-9, stdout="loss=nan", stderr="", timed_out=True)
    assert info is not None and (info.kind, info.signature) == ("timeout", "timeout")


def test_metric_bounds() -> None:
    criteria = FailureCriteria(
        metrics=(MetricBound(name="loss", above=2.0), MetricBound(name="acc", below=0.5))
    )
    above = fingerprint_failure(
        exit_code=0, stdout="step 1 loss=1.0\nstep 2 loss=3.5 acc=0.9", stderr="", criteria=criteria
    )
    assert above is not None and (above.kind, above.signature) == ("metric", "metric|loss|above")
    higher = fingerprint_failure(exit_code=0, stdout="loss=99", stderr="", criteria=criteria)
    assert higher is not None and higher.fingerprint == above.fingerprint
    below = fingerprint_failure(exit_code=1, stdout="", stderr="acc: 0.1", criteria=criteria, metrics=None)
    assert below is not None and below.signature == "metric|acc|below"
    nan = fingerprint_failure(
        exit_code=0, stdout="", stderr="", criteria=criteria, metrics={"loss": math.nan}
    )
    assert nan is not None and nan.signature == "metric|loss|nan"
    assert fingerprint_failure(exit_code=0, stdout="loss=1.5 acc=0.7", stderr="", criteria=criteria) is None


def test_nan_breaks_any_declared_metric() -> None:
    assert bound_violation(MetricBound(name="x"), math.nan) == "nan"
    assert bound_violation(MetricBound(name="x", above=1), math.inf) == "above"
    assert bound_violation(MetricBound(name="x", below=1), -math.inf) == "below"
    assert bound_violation(MetricBound(name="x", above=1, below=0), 0.5) is None


def test_pattern() -> None:
    criteria = FailureCriteria(fail_patterns=(r"CUDA error",))
    stderr = "ok\nRuntimeError: CUDA error: illegal memory access at 0x7f00\nmore\n"
    info = fingerprint_failure(exit_code=0, stdout="", stderr=stderr, criteria=criteria)
    assert info is not None and info.kind == "pattern"
    assert info.signature == "pattern|CUDA error|RuntimeError: CUDA error: illegal memory access at <hex>"


def test_bad_pattern_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match=r"\(unclosed"):
        fingerprint_failure(
            exit_code=1, stdout="", stderr="", criteria=FailureCriteria(fail_patterns=("(unclosed",))
        )


def test_pytest_summary_outranks_tracebacks() -> None:
    stdout = (
        'Traceback (most recent call last):\n  File "/w/t.py", line 1, in f\nValueError: x\n' + PYTEST_OUTPUT
    )
    info = fingerprint_failure(exit_code=1, stdout=stdout, stderr="")
    assert info is not None and info.kind == "test"
    assert info.test_id == "tests/test_bad.py"
    assert info.signature.startswith("pytest|tests/test_bad.py|ModuleNotFoundError|No module named 'foo' ; ")
    assert "tests/test_x.py::test_y[a - b]|AssertionError|assert <n> < <n>" in info.signature
    failure = info.to_failure(duration_s=1.5)
    assert failure.fingerprint == info.fingerprint and failure.kind == "test"


# --- read_metrics -------------------------------------------------------------------------------


def test_read_metrics_from_output_and_file(tmp_path: Path) -> None:
    out = "step 1 loss=3.2 val_loss=9\nstep 2 loss: inf\n{'acc': 0.25}\ngrad=tensor(nan)\ntrain/loss=7"
    values = read_metrics(out, ["loss", "acc", "grad", "missing"])
    assert values["loss"] == math.inf and values["acc"] == 0.25 and math.isnan(values["grad"])
    assert "missing" not in values
    lines = tmp_path / "metrics.jsonl"
    lines.write_text('{"loss": 1.0}\n{"loss": -Infinity, "acc": true}\n{"loss": 2', encoding="utf-8")
    assert read_metrics(out, ["loss", "acc"], lines) == {"loss": -math.inf, "acc": 0.25}
    single = tmp_path / "metrics.json"
    single.write_text(json.dumps({"loss": 0.5}), encoding="utf-8")
    assert read_metrics("", ["loss"], single) == {"loss": 0.5}
    with pytest.raises(MetricsFileError, match="no such file") as absent:
        read_metrics("", ["loss"], tmp_path / "absent.json")
    assert absent.value.reason == "missing"


# --- real programs, run in two workspaces ------------------------------------------------------

PROGRAMS = {
    "zero": {
        "main.py": "import helper\n\ndef run():\n    return helper.divide(1)\n\nrun()\n",
        "helper.py": "def divide(x):\n    return inner(x)\n\ndef inner(x):\n    return x / 0\n",
    },
    "chained": {
        "main.py": textwrap.dedent(
            """\
            import os
            def load():
                try:
                    return {}["lr"]
                except KeyError as exc:
                    raise RuntimeError(f"config {os.getcwd()} has no lr (object at {hex(id(exc))})") from exc
            load()
            """
        ),
    },
    "syntax": {"main.py": "import bad\n", "bad.py": "def f(:\n    pass\n"},
    "exit": {"main.py": "import sys\nprint('error: 3 shards missing', file=sys.stderr)\nsys.exit(3)\n"},
    "segv": {"main.py": "import os, signal\nos.kill(os.getpid(), signal.SIGSEGV)\n"},
}


def run_program(name: str, workspace: Path) -> str:
    workspace.mkdir(parents=True)
    for filename, source in PROGRAMS[name].items():
        (workspace / filename).write_text(source, encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    proc = subprocess.run(
        [sys.executable, str(workspace / "main.py")],
        cwd=workspace,
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    info = fingerprint_failure(
        exit_code=proc.returncode, stdout=proc.stdout, stderr=proc.stderr, roots=[str(workspace)]
    )
    assert info is not None, proc
    return info.signature


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")
def test_real_failures_match_across_workspaces(tmp_path: Path) -> None:
    first = {name: run_program(name, tmp_path / "a" / name) for name in PROGRAMS}
    second = {name: run_program(name, tmp_path / "elsewhere" / "b" / f"{name}-2") for name in PROGRAMS}
    assert first == second
    assert len(set(first.values())) == len(PROGRAMS)
    frames = "main.py:<module>>main.py:run>helper.py:divide>helper.py:inner"
    assert first["zero"] == f"python|ZeroDivisionError|division by zero|{frames}"
    assert first["chained"].startswith(
        "python|RuntimeError|config <path> has no lr (object at <hex>)|main.py:"
    )
    assert first["syntax"].startswith("python|SyntaxError|")
    assert first["syntax"].endswith("main.py:<module>>bad.py:")
    assert first["exit"] == "exit:3|error: <n> shards missing"
    assert first["segv"] == "signal:SIGSEGV|"


def test_a_bundle_captured_before_long_reprs_were_collapsed_still_matches_its_replays() -> None:
    import hashlib

    from flaketriage.failure.tracebacks import parse_pytest_failures

    line = (
        "FAILED t.py::test_x - AssertionError: assert 'k' in {"
        + ", ".join(f"'m{i}': {i}" for i in range(20))
        + "}"
    )
    (test,) = parse_pytest_failures(f"{PYTEST_OUTPUT.splitlines()[1]}\n{line}\n")
    entry = f"t.py::test_x|AssertionError|{normalize_message(test.message)}"  # the earlier signature
    old = hashlib.sha256(f"pytest|{entry}".encode()).hexdigest()
    info = fingerprint_failure(exit_code=1, stdout=f"{PYTEST_OUTPUT.splitlines()[1]}\n{line}\n", stderr="")
    assert info is not None and info.fingerprint != old
    matched = info.as_of(old)
    assert matched is not None and matched.fingerprint == old
