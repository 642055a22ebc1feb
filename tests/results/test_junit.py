"""`flaketriage.results.junit` on files the real tools wrote (``fixtures/``, see its README) and on
hostile input: every outcome, attempt and test id pinned exactly, and every bad file one
`ResultsError` that says what is wrong."""

from __future__ import annotations

import hashlib
import os
import subprocess
import threading
import tracemalloc
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flaketriage.errors import ResultsError
from flaketriage.results import junit
from flaketriage.results.junit import read_junit, read_junit_file
from flaketriage.results.model import MAX_ATTEMPTS, MAX_MESSAGE, MAX_TEST_ID, Outcome, TestResult

FIXTURES = Path(__file__).parent / "fixtures"
MiB = 2**20


def read(name: str) -> dict[str, TestResult]:
    found = read_junit_file(FIXTURES / name, max_bytes=MiB)
    tests = {t.test_id: t for t in found.tests}
    assert len(tests) == len(found.tests)
    return tests


def counts(tests: dict[str, TestResult]) -> dict[str, int]:
    out = Counter(t.outcome.value for t in tests.values())
    out["passed_on_retry"] = sum(t.passed_on_retry for t in tests.values())
    return dict(out)


def attempts(test: TestResult) -> list[str]:
    """Every attempt's outcome, oldest first, the final one last."""
    return [a.outcome.value for a in test.attempts] + [test.outcome.value]


def test_every_fixture_is_read_with_its_name_and_digest() -> None:
    files = sorted(FIXTURES.glob("*.xml"))
    assert [f.name for f in files] == [
        "go-junit-report-rerun.xml",
        "go-junit-report.xml",
        "gotestsum.xml",
        "jest-junit-invocations.xml",
        "jest-junit.xml",
        "pytest-reruns.xml",
        "pytest-xunit1.xml",
        "pytest.xml",
        "surefire-flaky.xml",
        "surefire.xml",
    ]
    for path in files:
        found = read_junit_file(path, max_bytes=MiB)
        assert found.name == str(path)
        assert found.digest == hashlib.sha256(path.read_bytes()).digest()
        assert found.tests and found.tests == tuple(read_junit(path.read_bytes()))


# -- pytest -------------------------------------------------------------------------------------
PYTEST_IDS = {
    "pkg/test_things.py::TestC::test_y[1]": "passed",
    "pkg/test_things.py::TestC::test_y[2]": "passed",
    "pkg/test_things.py::TestC::test_y[3]": "failed",
    "pkg/test_things.py::TestC::test_z": "passed",
    "pkg/test_things.py::test_ids[1.0]": "passed",
    "pkg/test_things.py::test_ids[a::b]": "passed",
    "pkg/test_things.py::test_passes_then_teardown_errors": "error",
    "pkg/test_things.py::test_fails_then_teardown_errors": "failed",
    "test_top.py::test_passes": "passed",
    "test_top.py::test_fails": "failed",
    "test_top.py::test_skipped": "skipped",
    "test_top.py::test_skips_inside": "skipped",
    "test_top.py::test_xfail": "skipped",
    "test_top.py::test_errors_in_setup": "error",
    "test_top.py::test_flaky": "failed",
}


def test_pytest_gives_node_ids_back_and_every_outcome() -> None:
    tests = read("pytest.xml")
    assert {k: t.outcome.value for k, t in tests.items()} == PYTEST_IDS
    assert counts(tests) == {"passed": 6, "failed": 4, "error": 2, "skipped": 3, "passed_on_retry": 0}
    assert all(t.attempts == () for t in tests.values())
    assert tests["pkg/test_things.py::TestC::test_y[3]"].message == (
        "AssertionError: 3 is too big\nassert 3 < 3"
    )
    assert tests["test_top.py::test_errors_in_setup"].message == (
        'failed on setup with "RuntimeError: database is down"'
    )
    assert 0.25 <= tests["test_top.py::test_passes"].duration_s < 1


def test_pytest_call_failure_then_teardown_error_is_one_failed_attempt() -> None:
    # pytest writes it as two <testcase>s: the <failure>, then the teardown's <error>.
    raw = (FIXTURES / "pytest.xml").read_text()
    assert raw.count('name="test_fails_then_teardown_errors"') == 2
    test = read("pytest.xml")["pkg/test_things.py::test_fails_then_teardown_errors"]
    assert attempts(test) == ["failed"]
    assert test.message == "AssertionError: call failed"


def test_pytest_rerunfailures_blank_reruns_are_failed_attempts() -> None:
    tests = read("pytest-reruns.xml")
    expected = PYTEST_IDS | {"test_top.py::test_flaky": "passed"}
    assert {k: t.outcome.value for k, t in tests.items()} == expected
    assert counts(tests) == {"passed": 7, "failed": 3, "error": 2, "skipped": 3, "passed_on_retry": 1}
    flaky = tests["test_top.py::test_flaky"]
    assert attempts(flaky) == ["failed", "passed"] and flaky.passed_on_retry
    assert flaky.failed_attempts == 1 and flaky.lost_s == pytest.approx(
        flaky.attempts[0].duration_s + flaky.duration_s
    )
    assert attempts(tests["test_top.py::test_fails"]) == ["failed"] * 3
    assert attempts(tests["pkg/test_things.py::TestC::test_y[3]"]) == ["failed"] * 3
    assert attempts(tests["pkg/test_things.py::test_fails_then_teardown_errors"]) == ["failed"] * 3
    assert attempts(tests["test_top.py::test_errors_in_setup"]) == ["error"] * 3
    assert attempts(tests["pkg/test_things.py::test_passes_then_teardown_errors"]) == ["error"] * 3
    never_rerun = [k for k, t in tests.items() if t.outcome in (Outcome.PASSED, Outcome.SKIPPED)]
    assert [k for k in never_rerun if tests[k].attempts] == ["test_top.py::test_flaky"]


def test_pytest_ids_come_from_the_root_when_the_suite_is_renamed() -> None:
    # junit_suite_name renames the <testsuite>; pytest's root stays "pytest tests".
    data = (FIXTURES / "pytest.xml").read_bytes().replace(b'<testsuite name="pytest"', b'<testsuite name="x"')
    assert {t.test_id for t in read_junit(data)} == set(PYTEST_IDS)


def test_pytest_xunit1_names_the_file_and_gives_the_same_ids() -> None:
    raw = (FIXTURES / "pytest-xunit1.xml").read_text()
    assert ' file="pkg/test_things.py"' in raw and " file=" not in (FIXTURES / "pytest.xml").read_text()
    tests = read("pytest-xunit1.xml")
    assert {k: t.outcome.value for k, t in tests.items()} == PYTEST_IDS


# -- Jest (jest-junit) ----------------------------------------------------------------------------
def test_jest_junit() -> None:
    tests = read("jest-junit.xml")
    assert {k: t.outcome.value for k, t in tests.items()} == {
        "math adds": "passed",
        "math subtracts wrongly": "failed",
        "math divides by zero": "skipped",
        "math multiplies matrices": "passed",  # a test.todo: jest-junit writes it as a pass
        "math slow waits a quarter second": "passed",
        "flaky at the top level": "passed",  # jest-junit's " flaky ..." stripped
        "Test suite failed to run.src/broken.test.js": "error",
    }
    assert counts(tests) == {"passed": 4, "failed": 1, "error": 1, "skipped": 1, "passed_on_retry": 0}
    # jest.retryTimes(2): jest-junit writes the last run only, so no attempts can be read back.
    assert all(t.attempts == () for t in tests.values())
    assert tests["math subtracts wrongly"].message == (
        "Error: expect(received).toBe(expected) // Object.is equality"
    )
    # Written twice (<error>, then <failure>): one error, its message past Jest's "● title" line.
    broken = tests["Test suite failed to run.src/broken.test.js"]
    assert broken.message == "Cannot find module './does-not-exist' from 'src/broken.test.js'"
    assert 0.25 <= tests["math slow waits a quarter second"].duration_s < 1


def test_jest_junit_with_jests_count_of_runs() -> None:
    """With the testcase property jest-junit's README shows (src/jest/properties), Jest's retries
    are read: the runs before the last failed (Jest retries only what failed)."""
    tests = read("jest-junit-invocations.xml")
    assert {k: attempts(t) for k, t in tests.items()} == {
        "math adds": ["passed"],
        "math subtracts wrongly": ["failed"] * 3,  # jest.retryTimes(2)
        "math divides by zero": ["skipped"],
        "math multiplies matrices": ["passed"],
        "math slow waits a quarter second": ["passed"],
        "flaky at the top level": ["failed", "passed"],
        "Test suite failed to run.src/broken.test.js": ["error"],  # its count is "undefined"
    }
    assert counts(tests) == {"passed": 4, "failed": 1, "error": 1, "skipped": 1, "passed_on_retry": 1}


# -- go -----------------------------------------------------------------------------------------
CALC = "example.com/fixture/calc."


def test_gotestsum_rerun_fails() -> None:
    tests = read("gotestsum.xml")
    assert {k: attempts(t) for k, t in tests.items()} == {
        CALC + "TestSub": ["failed"] * 3,
        CALC + "TestTable/wrong": ["failed"] * 3,
        CALC + "TestTable": ["failed"] * 3,
        CALC + "TestFlaky": ["failed", "passed"],
        CALC + "TestSkipped": ["skipped"],
        CALC + "TestAdd": ["passed"],
        CALC + "TestTable/small": ["passed"],
        CALC + "TestTable/zero": ["passed"],
        "example.com/fixture/strutil.TestUpper": ["passed"],
    }
    assert counts(tests) == {"passed": 5, "failed": 3, "skipped": 1, "passed_on_retry": 1}
    flaky = tests[CALC + "TestFlaky"]
    assert flaky.passed_on_retry and flaky.message == "calc_test.go:56: fails the first time only"
    # message="Failed" says nothing: the test's output does, past go test's "=== RUN" line.
    assert tests[CALC + "TestSub"].message == "calc_test.go:33: Sub(3, 1) = 4, want 2"
    assert tests[CALC + "TestTable"].message == "Failed"  # its output is only go test's framing
    assert 0.25 <= tests[CALC + "TestAdd"].duration_s < 1


def test_go_junit_report() -> None:
    tests = read("go-junit-report.xml")
    assert {k: t.outcome.value for k, t in tests.items()} == {
        "example.com/fixture/broken.[build failed]": "error",
        CALC + "TestAdd": "passed",
        CALC + "TestSub": "failed",
        CALC + "TestSkipped": "skipped",
        CALC + "TestTable": "failed",
        CALC + "TestTable/small": "passed",
        CALC + "TestTable/zero": "passed",
        CALC + "TestTable/wrong": "failed",
        CALC + "TestFlaky": "failed",
        "example.com/fixture/panics.TestPanics": "failed",
        "example.com/fixture/strutil.TestUpper": "passed",
    }
    assert counts(tests) == {"passed": 4, "failed": 5, "error": 1, "skipped": 1, "passed_on_retry": 0}
    assert tests["example.com/fixture/broken.[build failed]"].message == (
        "broken/broken_test.go:9:2: undefined: undefinedHelper"
    )
    assert tests[CALC + "TestSub"].message == "calc_test.go:33: Sub(3, 1) = 4, want 2"
    assert 0.25 <= tests[CALC + "TestAdd"].duration_s < 1


def test_go_junit_report_of_a_scripted_rerun() -> None:
    # Two <testsuite>s of one package: the second run of the failed tests.
    tests = read("go-junit-report-rerun.xml")
    assert attempts(tests[CALC + "TestFlaky"]) == ["failed", "passed"]
    assert attempts(tests[CALC + "TestSub"]) == ["failed", "failed"]
    assert counts(tests) == {"passed": 5, "failed": 3, "skipped": 1, "passed_on_retry": 1}


# -- Maven Surefire -------------------------------------------------------------------------------
CHECKOUT = "com.example.checkout.CheckoutTest."


def test_surefire() -> None:
    """What Maven Surefire 3.2.5 wrote with rerunFailingTestsCount=2 (JUnit Jupiter)."""
    tests = read("surefire.xml")
    assert {k: attempts(t) for k, t in tests.items()} == {
        CHECKOUT + "flakyFailure": ["failed", "passed"],
        CHECKOUT + "quantity(int)[1]": ["passed"],
        CHECKOUT + "quantity(int)[2]": ["failed"] * 3,
        CHECKOUT + "quantity(int)[3]": ["passed"],
        CHECKOUT + "isSlow": ["passed"],
        CHECKOUT + "totals": ["failed"] * 3,
        CHECKOUT + "adds": ["passed"],
        CHECKOUT + "flakyError": ["error", "passed"],
        CHECKOUT + "needsGpu": ["skipped"],
        CHECKOUT + "throwsOutsideAnAssertion": ["error"] * 3,
    }
    assert counts(tests) == {"passed": 6, "failed": 2, "error": 1, "skipped": 1, "passed_on_retry": 2}
    flaky = tests[CHECKOUT + "flakyFailure"]
    assert flaky.message == "flaky: first run (run 1) ==> expected: <true> but was: <false>"
    assert tests[CHECKOUT + "throwsOutsideAnAssertion"].message == "cart is null"
    assert tests[CHECKOUT + "needsGpu"].message is None
    assert 0.2 <= tests[CHECKOUT + "isSlow"].duration_s < 1


# Written by hand after Surefire's XSD (see fixtures/README.md): what the real file above does not
# show (a rerun element without a message, a time with a thousands separator).
SUREFIRE = "com.example.CalculatorTest."


def test_surefire_flaky_and_rerun_elements() -> None:
    tests = read("surefire-flaky.xml")
    assert {k: attempts(t) for k, t in tests.items()} == {
        SUREFIRE + "adds": ["passed"],
        SUREFIRE + "dividesFlakily": ["failed", "passed"],
        SUREFIRE + "connectsFlakily": ["error", "error", "passed"],
        SUREFIRE + "subtracts": ["failed"] * 3,
        SUREFIRE + "opensFile": ["error"] * 3,
        SUREFIRE + "multipliesMatrices": ["skipped"],
    }
    assert counts(tests) == {"passed": 3, "failed": 1, "error": 1, "skipped": 1, "passed_on_retry": 2}
    connects = tests[SUREFIRE + "connectsFlakily"]
    # The first <flakyError> has no message: its <stackTrace>'s first line is it.
    assert [a.message for a in connects.attempts] == [
        "java.net.ConnectException: Connection refused",
        "Connection reset",
    ]
    assert connects.message == "Connection reset"
    assert tests[SUREFIRE + "subtracts"].duration_s == 1001.5  # "1,001.5"
    assert tests[SUREFIRE + "dividesFlakily"].message == "expected: <2> but was: <3>"


# -- hostile input ------------------------------------------------------------------------------
def refused(data: bytes) -> str:
    with pytest.raises(ResultsError) as caught:
        read_junit(data, name="ci.xml")
    message = str(caught.value)
    assert message.startswith("ci.xml ")
    return message


BILLION_LAUGHS = b"""<?xml version="1.0"?>
<!DOCTYPE lolz [
 <!ENTITY lol "lol">
 <!ENTITY lol2 "&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;">
 <!ENTITY lol3 "&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;">
 <!ENTITY lol4 "&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;">
 <!ENTITY lol5 "&lol4;&lol4;&lol4;&lol4;&lol4;&lol4;&lol4;&lol4;&lol4;&lol4;">
 <!ENTITY lol6 "&lol5;&lol5;&lol5;&lol5;&lol5;&lol5;&lol5;&lol5;&lol5;&lol5;">
 <!ENTITY lol7 "&lol6;&lol6;&lol6;&lol6;&lol6;&lol6;&lol6;&lol6;&lol6;&lol6;">
 <!ENTITY lol8 "&lol7;&lol7;&lol7;&lol7;&lol7;&lol7;&lol7;&lol7;&lol7;&lol7;">
 <!ENTITY lol9 "&lol8;&lol8;&lol8;&lol8;&lol8;&lol8;&lol8;&lol8;&lol8;&lol8;">
]>
<testsuite name="x"><testcase name="&lol9;"/></testsuite>
"""
EXTERNAL_ENTITY = b"""<?xml version="1.0"?>
<!DOCTYPE testsuite [<!ENTITY passwd SYSTEM "file:///etc/passwd">]>
<testsuite name="x"><testcase name="t"><failure message="&passwd;"/></testcase></testsuite>
"""
DTD_ALONE = b"""<?xml version="1.0"?>
<!DOCTYPE testsuite [<!ELEMENT testsuite ANY>]>
<testsuite name="x"><testcase name="t"/></testsuite>
"""
QUADRATIC = (
    b'<?xml version="1.0"?>\n<!DOCTYPE testsuite [<!ENTITY a "'
    + b"x" * 100_000
    + b'">]>\n<testsuite name="x"><testcase name="t"><failure message="'
    + b"&a;" * 10_000
    + b'"/></testcase></testsuite>'
)


@pytest.mark.parametrize(
    "data", [BILLION_LAUGHS, EXTERNAL_ENTITY, DTD_ALONE, QUADRATIC], ids=["laughs", "xxe", "dtd", "quadratic"]
)
def test_dtds_and_entities_are_refused_unexpanded(data: bytes) -> None:
    message = refused(data)
    assert "declares a DTD or entities" in message and "refused unread" in message
    assert "root:" not in message and "lol" not in message


@pytest.mark.parametrize(
    ("data", "said"),
    [
        (b"", "is empty"),
        (b"  \n\t ", "is empty"),
        (b'{"tests": [{"name": "t", "outcome": "passed"}]}', "is not XML"),
        (b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\x00\x00\x00\x01", "is not XML"),
        (b'<testsuite name="x"><testcase name="t">', "is not well-formed XML"),
        (b'<testsuite name="\xff\xfe\xc3"><testcase name="t"/></testsuite>', "is not well-formed XML"),
        (b"<html><body><p>Test report</p></body></html>", "root element is <html>"),
        (b"<!DOCTYPE html>\n<html><body>Test report</body></html>", "is an HTML page"),
        (b'<?xml version="1.0" encoding="no-such-codec"?><testsuite/>', "declares an encoding Python"),
    ],
    ids=["empty", "blank", "json", "png", "truncated", "invalid-utf8", "html", "html-doctype", "codec"],
)
def test_what_is_not_junit_xml_is_one_clear_error(data: bytes, said: str) -> None:
    assert said in refused(data)


def test_a_truncated_real_file_is_not_well_formed() -> None:
    data = (FIXTURES / "gotestsum.xml").read_bytes()
    assert "is not well-formed XML: " in refused(data[: len(data) // 2])


def test_suites_nested_100_deep_are_refused() -> None:
    data = b"<testsuites>" + b"<testsuite>" * 100 + b'<testcase name="t"/>' + b"</testsuite>" * 100
    assert f"nests elements more than {junit.MAX_DEPTH} deep" in refused(data + b"</testsuites>")


def test_more_tests_than_an_upload_holds_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(junit, "MAX_TESTS", 5)
    cases = "".join(f'<testcase classname="c" name="t{i}"/>' for i in range(6))
    message = refused(f"<testsuite>{cases}</testsuite>".encode())
    assert "holds more than 5 tests" in message and "one shard at a time" in message
    assert len(read_junit(f"<testsuite>{cases[: cases.index('<testcase', 1)]}</testsuite>".encode())) == 1


def file_refused(path: Path, max_bytes: int = MiB) -> str:
    with pytest.raises(ResultsError) as caught:
        read_junit_file(path, max_bytes=max_bytes)
    message = str(caught.value)
    assert message.startswith(str(path))
    return message


def test_a_file_over_the_limit_is_refused_by_its_size_unread(tmp_path: Path) -> None:
    big = tmp_path / "huge.xml"
    subprocess.run(["truncate", "-s", "120M", str(big)], check=True)  # sparse: no disk, no time
    tracemalloc.start()
    try:
        message = file_refused(big, max_bytes=64 * MiB)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert "is 120 MiB, larger than the 64 MiB" in message and "FLAKETRIAGE_MAX_RESULTS_MB" in message
    assert peak < 4 * MiB  # its 64 MiB were never read


def test_what_is_not_a_regular_file_is_refused(tmp_path: Path) -> None:
    zero = tmp_path / "zero.xml"
    zero.symlink_to("/dev/zero")
    assert "is not a regular file" in file_refused(zero)
    assert "is a directory" in file_refused(tmp_path)
    assert "missing.xml does not exist; give the JUnit XML file" in file_refused(tmp_path / "missing.xml")
    dangling = tmp_path / "dangling.xml"
    dangling.symlink_to(tmp_path / "gone.xml")
    assert "does not exist" in file_refused(dangling)


def test_a_fifo_is_refused_without_waiting_for_a_writer(tmp_path: Path) -> None:
    fifo = tmp_path / "results.xml"
    os.mkfifo(fifo)
    said: list[str] = []
    reader = threading.Thread(target=lambda: said.append(file_refused(fifo)), daemon=True)
    reader.start()
    reader.join(30)
    if reader.is_alive():  # unblock it before failing
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        pytest.fail("reading a FIFO waited for a writer")
    assert said and "is not a regular file" in said[0]


def test_a_symlink_to_a_junit_file_is_read(tmp_path: Path) -> None:
    link = tmp_path / "latest.xml"
    link.symlink_to(FIXTURES / "pytest.xml")
    assert len(read_junit_file(link, max_bytes=MiB).tests) == len(PYTEST_IDS)


def test_a_file_over_the_limit_is_never_opened(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    big = tmp_path / "big.xml"
    with big.open("wb") as handle:
        handle.truncate(120 * MiB)  # sparse
    monkeypatch.setattr(junit.os, "open", lambda *_: pytest.fail("the file was opened"))
    message = file_refused(big, max_bytes=junit.MAX_JUNIT_BYTES)
    assert "is 120 MiB, larger than the 100 MiB" in message and "it was not read" in message
    with pytest.raises(ResultsError, match="larger than the 100 MiB"):
        read_junit_file(big)  # the default limit


def test_a_document_over_the_limit_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(junit, "MAX_JUNIT_BYTES", 100)
    assert "is 0.0 MiB, larger than the 0.0 MiB" in refused(b"<testsuite>" + b" " * 100 + b"</testsuite>")


# -- what the reader makes of each construct -------------------------------------------------------
def doc(*cases: str, suite: str = "s") -> bytes:
    return f'<testsuites><testsuite name="{suite}">{"".join(cases)}</testsuite></testsuites>'.encode()


def one(data: bytes) -> TestResult:
    (test,) = read_junit(data)
    return test


def test_a_test_written_many_times_keeps_its_latest_attempts() -> None:
    fails = [
        f'<testcase classname="c" name="t" time="1"><failure message="try {i}"/></testcase>'
        for i in range(30)
    ]
    test = one(doc(*fails, '<testcase classname="c" name="t" time="2"/>'))
    assert (test.outcome, test.duration_s, test.passed_on_retry) == (Outcome.PASSED, 2.0, True)
    assert [a.message for a in test.attempts] == [f"try {i}" for i in range(10, 30)]  # the last 20
    assert test.message == "try 29"


def test_an_empty_earlier_record_is_a_pass_outside_pytest() -> None:
    """Only pytest-rerunfailures writes its reruns without an outcome; a test written twice by
    another runner (two Jest tests of one name) did not fail."""
    test = one(doc('<testcase classname="c" name="t"/>', '<testcase classname="c" name="t"/>'))
    assert attempts(test) == ["passed", "passed"] and not test.passed_on_retry


@pytest.mark.parametrize(
    ("classname", "name", "file", "expected"),
    [
        ("tests.test_io.TestRead", "test_empty[gz]", "", "tests/test_io.py::TestRead::test_empty[gz]"),
        ("tests.io_test", "test_x", "", "tests/io_test.py::test_x"),
        ("tests.test_io.Describe.Nested", "test_x", "", "tests/test_io.py::Describe::Nested::test_x"),
        # python_files = check_*.py: no part names the module, so no node id is made up.
        ("tests.check_io", "test_x", "", "tests.check_io.test_x"),
        # A directory with a dot in its name: only the file attribute says where the module ends.
        ("tests.v1.2.test_io.TestA", "t", "tests/v1.2/test_io.py", "tests/v1.2/test_io.py::TestA::t"),
        ("tests.v1.2.test_io", "test_x[a/b]", "tests/v1.2/test_io.py", "tests/v1.2/test_io.py::test_x[a/b]"),
        # Collectors pytest reports as test cases: a top-level module that failed to collect, a
        # directory whose conftest.py failed.
        ("", "test_x", "", "test_x.py"),
        ("", "tests", "", "tests"),
    ],
)  # fmt: skip
def test_pytest_node_ids(classname: str, name: str, file: str, expected: str) -> None:
    attrs = f'classname="{classname}" name="{name}"' + (f' file="{file}"' if file else "")
    assert one(doc(f"<testcase {attrs}/>", suite="pytest")).test_id == expected


@pytest.mark.parametrize(
    ("attrs", "expected"),
    [
        ('classname="com.acme.FooTest" name="bar"', "com.acme.FooTest.bar"),
        ('classname="tests.test_io" name="test_x"', "tests.test_io.test_x"),  # no sign of pytest
        ('classname="tests.test_io" name="test_x" file="tests/test_io.py"', "tests/test_io.py::test_x"),
        ('classname="" name="only"', "only"),
        ('name="  padded  "', "padded"),
        ('classname="same" name="same"', "same"),
        ("", "(unnamed)"),
    ],
)
def test_other_test_ids(attrs: str, expected: str) -> None:
    assert one(doc(f"<testcase {attrs}/>")).test_id == expected


@pytest.mark.parametrize(
    ("time", "seconds"),
    [("1.5", 1.5), ("1,234.5", 1234.5), ("abc", 0.0), ("-1", 0.0), ("nan", 0.0), ("inf", 0.0), ("1e9", 0.0)],
)
def test_durations(time: str, seconds: float) -> None:
    assert one(doc(f'<testcase name="t" time="{time}"/>')).duration_s == seconds


def test_messages() -> None:
    failure = '<testcase name="t"><failure message="{}">{}</failure></testcase>'
    assert one(doc(failure.format("", "\n\n  first line  \nsecond"))).message == "first line"
    assert one(doc(failure.format("m", "text"))).message == "m"
    assert one(doc(failure.format("x" * 5000, ""))).message == "x" * MAX_MESSAGE
    assert one(doc(failure.format("Failed", "=== RUN   T\n--- FAIL: T"))).message == "Failed"
    assert one(doc('<testcase name="t"><failure/></testcase>')).message is None
    assert one(doc('<testcase name="t"><skipped message="no GPU"/></testcase>')).message is None


def test_character_references_anywhere() -> None:
    case = '<testcase name="&#9679; t">&#9679;<system-out>&#233;</system-out><failure>&#233;t&#233;</failure>'
    test = one(doc(case + "</testcase>"))
    assert (test.test_id, test.message) == ("● t", "été")


def test_a_failure_outranks_a_skip() -> None:
    test = one(doc('<testcase name="t"><skipped/><error message="teardown"/></testcase>'))
    assert (test.outcome, test.message) == (Outcome.ERROR, "teardown")


def test_where_test_cases_are_read() -> None:
    nested = b'<testsuites><testsuite name="a"><testsuite name="b"><testcase name="t"/></testsuite>'
    nested += b'<properties><property name="x" value="y"/></properties></testsuite></testsuites>'
    assert [t.test_id for t in read_junit(nested)] == ["t"]  # Bazel and Surefire nest suites
    assert [t.test_id for t in read_junit(b'<testsuite><testcase name="u"/></testsuite>')] == ["u"]
    assert read_junit(b'<testsuite><properties><testcase name="v"/></properties></testsuite>') == []


def test_a_huge_attribute_costs_about_the_size_of_the_file() -> None:
    """Memory grows with the file, no faster: expat's buffers and the strings it makes, three to
    four times its size. bench/junit.py measures a 50 MB attribute; 8 MB keeps this test fast."""
    name, message = "n" * (8 * MiB), "m" * (2 * MiB)
    data = (
        f'<testsuite><testcase name="{name}"><failure message="{message}"/></testcase></testsuite>'.encode()
    )
    tracemalloc.start()
    try:
        test = one(data)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert len(test.test_id) == MAX_TEST_ID and len(test.message or "") == MAX_MESSAGE
    assert peak < 5 * len(data)


def test_memory_holds_what_is_kept_not_the_tree() -> None:
    """A test case of 200,000 elements, then the same test written 20,000 times."""
    elements = doc('<testcase name="t"><system-out>' + "<a/>" * 200_000 + "</system-out></testcase>")
    repeated = doc(*['<testcase name="t"><failure message="m"/></testcase>'] * 20_000)
    for data in (elements, repeated):
        tracemalloc.start()
        try:
            (test,) = read_junit(data)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert peak < len(data) + MiB  # a tree of the elements would take about 15 MiB
    assert len(test.attempts) == MAX_ATTEMPTS


def test_more_elements_than_any_runner_writes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(junit, "MAX_ELEMENTS", 100)
    message = refused(doc('<testcase name="t"><system-out>' + "<b/>" * 200 + "</system-out></testcase>"))
    assert "holds more than 100 elements" in message


def test_elements_nested_100_000_deep_are_refused_at_the_65th() -> None:
    deep = (
        b"<testsuite><testcase name='t'>" + b"<a>" * 100_000 + b"</a>" * 100_000 + b"</testcase></testsuite>"
    )
    assert "nests elements more than 64 deep" in refused(deep)


@pytest.mark.parametrize(
    ("data", "said"),
    [
        (b'[{"name": "t"}]', "is not XML (it looks like JSON): JUnit XML starts with '<'"),
        (b'<testsuite name="x"><testcase name="t">', "was it cut short"),
        (b'<testsuite><testcase name="caf\xe9"/></testsuite>', "its bytes are not UTF-8 (at byte 30)"),
        (b'<testsuite><testcase name="a\x00b"/></testsuite>', "XML 1.0 forbids control characters"),
        (b'<testsuite><testcase name="a\x1bb"/></testsuite>', "XML 1.0 forbids control characters"),
        (b'<testsuite><testcase name="a&#0;b"/></testsuite>', "not well-formed XML: reference to invalid"),
        (b"<testsuite><testcase name='t'></testsuite>", "not well-formed XML: mismatched tag"),
        (b"<testsuite/><testsuite/>", "not well-formed XML: junk after document element"),
        (b'<!DOCTYPE t SYSTEM "http://example.invalid/t.dtd"><testsuite/>', "declares a DTD or entities"),
        (b'<!DOCTYPE t [<!ENTITY % p SYSTEM "file:///etc/passwd"> %p;]><testsuite/>', "declares a DTD"),
    ],
    ids=["json-list", "cut-short", "latin-1", "nul", "escape", "char-ref-0", "mismatched", "two-roots",
         "external-dtd", "parameter-entity"],
)  # fmt: skip
def test_more_of_what_is_not_junit_xml(data: bytes, said: str) -> None:
    assert said in refused(data)


def test_an_encoding_the_file_declares_is_read() -> None:
    latin = b'<?xml version="1.0" encoding="ISO-8859-1"?><testsuite><testcase name="caf\xe9"/></testsuite>'
    assert one(latin).test_id == "café"
    assert one('<testsuite><testcase name="ü"/></testsuite>'.encode("utf-16")).test_id == "ü"


FRAGMENTS = [
    "<testsuites>", "</testsuites>", '<testsuites name="pytest tests">', "<testsuite>",
    '<testsuite name="pytest">', "</testsuite>", '<testcase classname="pkg.test_a.TestB" name="t[1]"',
    '<testcase name=" x "', ' classname=""', ' time="', "1,5", "nan", "-1", "1e9", '"', ">", "/>",
    "</testcase>", "<failure/>", '<failure message="Failed">=== RUN x\n', "</failure>", "<error>",
    "</error>", "<skipped/>", "<flakyFailure><stackTrace>", "</stackTrace></flakyFailure>",
    "<rerunError/>", '<error message=\'failed on teardown with "x"\'/>', "&amp;", "&#0;", "&#xD800;",
    "<!DOCTYPE x>", "<?xml version='1.0'?>", "<?xml version='1.0' encoding='", "utf-16", "latin-1'?>",
    "<![CDATA[", "]]>", "\x00", "\ud800", "é",
]  # fmt: skip


@settings(max_examples=200, derandomize=True, database=None, deadline=None)
@given(
    st.one_of(
        st.binary(max_size=300),
        st.lists(st.one_of(st.sampled_from(FRAGMENTS), st.text(max_size=4)), max_size=30).map(
            lambda parts: "".join(parts).encode("utf-8", "surrogatepass")
        ),
    )
)
def test_any_bytes_give_results_or_a_results_error(data: bytes) -> None:
    try:
        tests = read_junit(data, name="fuzzed.xml")
    except ResultsError as exc:
        assert str(exc).startswith("fuzzed.xml ")
        return
    for test in tests:
        assert test.test_id and test.duration_s >= 0 and len(test.attempts) <= 20
        TestResult.model_validate(test.model_dump())


# Well-formed documents of every element and attribute the reader looks at, in any combination.
Child = tuple[str, str | None, str | None]
Case = tuple[str, str, str, list[Child]]
Suite = tuple[str, list[Case]]

_words = st.text(st.characters(blacklist_categories=("Cs", "Cc")), max_size=8)
_child = st.tuples(
    st.sampled_from(
        [
            *("failure", "error", "skipped", "system-out", "properties"),
            *("flakyFailure", "rerunFailure", "flakyError", "rerunError"),
        ]
    ),
    st.one_of(st.none(), st.sampled_from(["Failed", 'failed on teardown with "x"']), _words),
    st.one_of(st.none(), st.sampled_from(["=== RUN   T\n--- FAIL: T", "● t\n\n  why"]), _words),
)
_case = st.tuples(
    st.sampled_from(["", "pkg.test_a.TestB", "Test suite failed to run", " ", "a"]),
    st.one_of(st.sampled_from(["t", "t[1]", " t "]), _words),
    st.sampled_from(["", "0.5", "1,234.5", "nan", "inf", "-3", "x", "1e999", "0.000000"]),
    st.lists(_child, max_size=3),
)
_suites = st.lists(
    st.tuples(st.sampled_from(["pytest", "pkg", ""]), st.lists(_case, max_size=6)), min_size=1, max_size=3
)


def document(root_name: str | None, suites: list[Suite]) -> bytes:
    import xml.etree.ElementTree as ElementTree

    root = ElementTree.Element("testsuites", {"name": root_name} if root_name else {})
    for suite_name, cases in suites:
        suite = ElementTree.SubElement(root, "testsuite", {"name": suite_name})
        for classname, name, time, children in cases:
            case = ElementTree.SubElement(
                suite, "testcase", {"classname": classname, "name": name, "time": time}
            )
            for tag, message, text in children:
                child = ElementTree.SubElement(case, tag, {} if message is None else {"message": message})
                child.text = text
    return ElementTree.tostring(root)


@settings(max_examples=200, derandomize=True, database=None, deadline=None)
@given(st.one_of(st.none(), st.sampled_from(["pytest tests", "jest tests"])), _suites)
def test_any_junit_document_gives_valid_results(root_name: str | None, suites: list[Suite]) -> None:
    tests = read_junit(document(root_name, suites), name="made.xml")
    assert len(tests) <= sum(len(cases) for _, cases in suites)
    for test in tests:
        TestResult.model_validate(test.model_dump())
        assert test.test_id and test.test_id == test.test_id.strip()
        assert test.attempts or not test.passed_on_retry
