"""JUnit XML read safely into test results: the format pytest, Jest (``jest-junit``), go
(``gotestsum``, ``go-junit-report``), cargo-nextest, Maven Surefire and Bazel write.

The XML is checked by expat before a tree is built (no DTD, no entities, no external references:
an entity-expansion bomb or an ``<!ENTITY x SYSTEM "file:///etc/passwd">`` is refused, never
expanded) and walked with ElementTree, by the element names of junitparser's xunit2 model. Each
``<testcase>`` is one `TestResult`:

* ``<failure>`` is ``failed``, ``<error>`` ``error``, ``<skipped>`` ``skipped``, none of them ``passed``;
* Surefire's ``<flakyFailure>``/``<flakyError>`` (failed, then passed on a rerun) and
  ``<rerunFailure>``/``<rerunError>`` (failed on every rerun too) are earlier failed attempts;
* a test written once per attempt (gotestsum ``--rerun-fails``, pytest-rerunfailures, a file with
  the same test twice) is one result, its last outcome final and the ones before it attempts; the
  records that are not attempts are told apart in `_attempts` (pytest's teardown error written as a
  second record, pytest-rerunfailures' blank reruns, jest-junit's suite that failed to load).

What the writers leave out cannot be read back: jest-junit writes neither Jest's retries nor its
``test.todo`` (a todo reads as a pass), gotestsum leaves out a package that does not build. The
files in ``tests/results/fixtures`` were written by the tools themselves (their README says which).

Test ids: a pytest file (its suite is named ``pytest``, or its root ``pytest tests``) gives
pytest's node id back (``classname="tests.unit.test_io.TestRead"``, ``name="test_empty[gz]"`` is
``tests/unit/test_io.py::TestRead::test_empty[gz]``: the module is the last dotted part named
``test_*`` or ``*_test``, the parts after it classes); any other runner's is ``classname.name``
(the name alone when the class is empty or the same as the name), both stripped of spaces.

Every problem is one `ResultsError` naming the file: not XML, not JUnit, a DTD or entities, too
large, too many tests.
"""

from __future__ import annotations

import functools
import hashlib
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn
from xml.etree.ElementTree import Element, ParseError

from flaketriage.errors import ResultsError
from flaketriage.results.model import (
    MAX_ATTEMPTS,
    MAX_MESSAGE,
    MAX_TEST_ID,
    MAX_TESTS,
    Attempt,
    Outcome,
    TestResult,
)

MAX_DEPTH = 64
"""Test suites nested deeper than this are not JUnit XML (they nest a few levels)."""


@dataclass(frozen=True)
class JUnitFile:
    """The results of one file and the digest of its bytes (what keys an upload)."""

    name: str
    tests: tuple[TestResult, ...]
    digest: bytes


def read_junit_file(path: Path, *, max_bytes: int) -> JUnitFile:
    """Read one JUnit XML file: a regular file (a symlink is followed to one), at most `max_bytes`,
    checked before it is read."""
    name = str(path)
    try:
        # O_NONBLOCK: opening a FIFO (or a symlink to one) returns at once instead of waiting
        # for a writer; the fstat below then refuses it. A regular file reads as usual.
        with open(os.open(path, os.O_RDONLY | os.O_NONBLOCK), "rb") as handle:
            info = os.fstat(handle.fileno())
            if stat.S_ISDIR(info.st_mode):
                raise IsADirectoryError
            if not stat.S_ISREG(info.st_mode):
                raise ResultsError(
                    f"{name} is not a regular file; give the JUnit XML file a test runner wrote"
                )
            if info.st_size > max_bytes:
                raise ResultsError(
                    f"{name} is {info.st_size / 2**20:.0f} MiB, larger than the {max_bytes / 2**20:.0f} MiB "
                    "a results file may be (FLAKETRIAGE_MAX_RESULTS_MB); split the suite into shards"
                )
            data = handle.read(max_bytes + 1)
    except FileNotFoundError:
        raise ResultsError(f"{name} does not exist") from None
    except IsADirectoryError:
        raise ResultsError(f"{name} is a directory; give the JUnit XML files in it") from None
    except OSError as exc:
        raise ResultsError(f"cannot read {name}: {exc.strerror or exc}") from None
    if len(data) > max_bytes:
        raise ResultsError(f"{name} grew past {max_bytes / 2**20:.0f} MiB while it was read")
    return JUnitFile(
        name=name, tests=tuple(read_junit(data, name=name)), digest=hashlib.sha256(data).digest()
    )


def read_junit(data: bytes, *, name: str = "the file") -> list[TestResult]:
    """The test results in one JUnit XML document."""
    root = _parse(data, name)
    if root.tag not in ("testsuites", "testsuite"):
        raise ResultsError(
            f"{name} is XML but not JUnit XML: its root element is <{_shown(root.tag)}>, not <testsuites> "
            "or <testsuite>"
        )
    suites = [root] if root.tag == "testsuite" else root.findall("testsuite")
    tags = _Tags.of()
    merged: dict[str, list[_Run]] = {}
    count = 0
    # pytest names its root <testsuites name="pytest tests"> whatever junit_suite_name says.
    pytest_root = root.get("name") == "pytest tests"
    pytest_file = pytest_root
    for suite in suites:
        pytest_ids = pytest_root or suite.get("name") == "pytest"
        pytest_file = pytest_file or pytest_ids
        for case in _cases(suite, name):
            count += 1
            if count > MAX_TESTS:
                raise ResultsError(
                    f"{name} holds more than {MAX_TESTS} tests; upload a sharded suite one shard at a time"
                )
            test_id = _test_id(case.get("classname") or "", case.get("name") or "", pytest_ids)
            merged.setdefault(test_id, []).append(_run(case, tags))
    return [
        _result(test_id, runs if len(runs) == 1 else _attempts(test_id, runs, pytest_file))
        for test_id, runs in merged.items()
    ]


@dataclass(frozen=True)
class _Tags:
    """The element names junitparser's xunit2 model gives each outcome and interim result."""

    failed: str
    error: str
    skipped: str
    interim: dict[str, Outcome]

    @classmethod
    def of(cls) -> _Tags:
        from junitparser import Error, Failure, Skipped
        from junitparser.xunit2 import FlakyError, FlakyFailure, RerunError, RerunFailure

        return cls(
            failed=Failure._tag,
            error=Error._tag,
            skipped=Skipped._tag,
            interim={
                FlakyFailure._tag: Outcome.FAILED,
                RerunFailure._tag: Outcome.FAILED,
                FlakyError._tag: Outcome.ERROR,
                RerunError._tag: Outcome.ERROR,
            },
        )


_Run = tuple[Outcome, float, str | None, list[Attempt]]


class _Refused(ResultsError):
    """What the checking pass raises at a DTD or an entity declaration (caught, and said whole)."""


def _refuse(*_: object) -> NoReturn:
    raise _Refused


def _refuse_doctype(name: str | None, *_: object) -> NoReturn:
    raise _Refused(name or "")


def _parse(data: bytes, name: str) -> Element:
    """The document's root element. A first pass with expat alone (no tree) refuses a document
    type declaration, an entity declaration or an external entity reference before anything is
    built: without them no entity can expand (the billion laughs, a quadratic blowup) and nothing
    outside the file is read. The tree is then built by ElementTree's C parser."""
    import xml.etree.ElementTree as ElementTree
    from xml.parsers import expat

    head = data.lstrip()[:1]
    if not head:
        raise ResultsError(f"{name} is empty; it is not JUnit XML")
    if head not in (b"<", b"\xef", b"\xff", b"\xfe"):
        raise ResultsError(f"{name} is not XML (JUnit XML starts with '<'); is it another report format?")
    checker = expat.ParserCreate()
    checker.StartDoctypeDeclHandler = _refuse_doctype
    checker.EntityDeclHandler = _refuse
    checker.UnparsedEntityDeclHandler = _refuse
    checker.ExternalEntityRefHandler = _refuse
    try:
        checker.Parse(data, True)
        return ElementTree.fromstring(data)
    except _Refused as refused:
        if str(refused).lower() == "html":
            raise ResultsError(
                f"{name} is an HTML page, not JUnit XML; give the XML file the test runner wrote "
                "(pytest --junitxml, jest-junit, gotestsum --junitfile ...), not a rendered report"
            ) from None
        raise ResultsError(
            f"{name} declares a DTD or entities; JUnit XML has none, so it is refused unread"
        ) from None
    except (expat.ExpatError, ParseError) as exc:
        raise ResultsError(f"{name} is not well-formed XML: {exc}") from None
    except LookupError as exc:  # expat asks Python for a codec the declaration names
        raise ResultsError(
            f"{name} declares an encoding Python does not know ({exc}); JUnit XML is UTF-8"
        ) from None
    except (ValueError, RecursionError) as exc:
        raise ResultsError(f"{name} is not XML this reads: {type(exc).__name__}") from None


def _cases(suite: Element, name: str, depth: int = 0) -> list[Element]:
    """The test cases of a suite and of the suites nested in it (Bazel, Surefire nest them)."""
    if depth > MAX_DEPTH:
        raise ResultsError(f"{name} nests test suites more than {MAX_DEPTH} deep; JUnit XML does not")
    found: list[Element] = []
    for child in suite:
        if child.tag == "testcase":
            found.append(child)
        elif child.tag == "testsuite":
            found.extend(_cases(child, name, depth + 1))
    return found


def _test_id(classname: str, name: str, pytest_ids: bool) -> str:
    # Stripped: jest-junit's "{classname} {title}" starts with a space for a test outside any
    # describe block.
    name, classname = _text(name).strip() or "(unnamed)", _text(classname).strip()
    if pytest_ids and classname:
        prefix = _pytest_prefix(classname)
        if prefix is not None:
            return f"{prefix}::{name}"[:MAX_TEST_ID]
    if not classname or classname == name:
        return name[:MAX_TEST_ID]
    return f"{classname}.{name}"[:MAX_TEST_ID]


@functools.lru_cache(maxsize=4096)
def _pytest_prefix(classname: str) -> str | None:
    """``tests/unit/test_io.py::TestRead`` for pytest's ``tests.unit.test_io.TestRead``: the module
    is the last dotted part named ``test_*`` or ``*_test``; None when no part is."""
    parts = classname.split(".")
    module = max(
        (i for i, part in enumerate(parts) if part.startswith("test_") or part.endswith("_test")),
        default=None,
    )
    if module is None:
        return None
    return "::".join(["/".join(parts[: module + 1]) + ".py", *parts[module + 1 :]])


def _run(case: Element, tags: _Tags) -> _Run:
    """One record of a test: its outcome, duration, message and the interim results before it."""
    outcome, message = Outcome.PASSED, None
    attempts: list[Attempt] = []
    for child in case:
        tag = child.tag
        if tag == tags.failed or tag == tags.error:
            if outcome is Outcome.PASSED or outcome is Outcome.SKIPPED:
                outcome = Outcome.FAILED if tag == tags.failed else Outcome.ERROR
                message = _message(child)
        elif tag == tags.skipped:
            if outcome is Outcome.PASSED:
                outcome = Outcome.SKIPPED
        elif tag in tags.interim:
            attempts.append(
                Attempt(
                    outcome=tags.interim[tag], duration_s=_seconds(child.get("time")), message=_message(child)
                )
            )
    return outcome, _seconds(case.get("time")), message, attempts


_PYTEST_TEARDOWN = 'failed on teardown with "'
_JEST_SUITE_ERROR = "Test suite failed to run."


def _attempts(test_id: str, runs: list[_Run], pytest_file: bool) -> list[_Run]:
    """The runs of a test written more than once, one per attempt, oldest first.

    Elsewhere each record is an attempt (gotestsum ``--rerun-fails`` writes every run with its
    outcome), but two writers repeat a test within one attempt and one leaves reruns blank:

    * pytest writes a test whose call failed and whose teardown then raised twice, the failure
      and then an ``<error message='failed on teardown with "..."'>``: one attempt, failed;
    * pytest-rerunfailures leaves each attempt it reran as an empty ``<testcase>`` (what a pass
      looks like): it reruns only what failed, so those are failed attempts (errors when the
      last one is an error);
    * jest-junit writes a test file that failed to load (``Test suite failed to run``) as an
      ``<error>`` and again as a ``<failure>``: one error (jest-junit writes no retries).
    """
    if test_id.startswith(_JEST_SUITE_ERROR):
        return runs[:1]
    if not pytest_file:
        return runs
    joined: list[_Run] = []
    for run in runs:
        outcome, seconds, message, interim = run
        if joined and outcome is Outcome.ERROR and (message or "").startswith(_PYTEST_TEARDOWN):
            before, spent, first, earlier = joined[-1]
            if before is Outcome.FAILED:
                joined[-1] = (before, spent + seconds, first, earlier + interim)
                continue
        joined.append(run)
    blank = Outcome.ERROR if joined[-1][0] is Outcome.ERROR else Outcome.FAILED
    return [
        (blank, seconds, message, interim)
        if outcome is Outcome.PASSED and message is None and not interim
        else (outcome, seconds, message, interim)
        for outcome, seconds, message, interim in joined[:-1]
    ] + joined[-1:]


def _result(test_id: str, runs: list[_Run]) -> TestResult:
    """One test from its records in a file: earlier records and interim results are attempts."""
    attempts: list[Attempt] = []
    for outcome, seconds, message, interim in runs[:-1]:
        attempts += interim
        attempts.append(Attempt(outcome=outcome, duration_s=seconds, message=message))
    outcome, seconds, message, interim = runs[-1]
    attempts += interim
    if message is None and attempts:
        message = next((a.message for a in reversed(attempts) if a.message), None)
    return TestResult(
        test_id=test_id,
        outcome=outcome,
        duration_s=seconds,
        attempts=tuple(attempts[-MAX_ATTEMPTS:]),
        message=message,
    )


_PLACEHOLDERS = frozenset({"Failed", "Skipped", "Build error", "Runtime error"})
"""The message attribute go-junit-report and gotestsum write whatever failed: the text says what."""
_FRAMING = ("=== RUN", "=== PAUSE", "=== CONT", "=== NAME", "--- FAIL", "--- SKIP", "--- PASS", "● ")
"""Lines that frame a test's output rather than say what failed: go test's, and Jest's ``● title``."""


def _message(elem: Element) -> str | None:
    """The gist of a failure: its message attribute, else the first line of its text (of its
    ``<stackTrace>`` for Surefire's reruns), the framing lines before it skipped."""
    text = elem.get("message")
    if not text or text in _PLACEHOLDERS:
        trace = elem.find("stackTrace")
        body = elem.text if trace is None else trace.text
        text = _first_line(body) or text
    return _text(text)[:MAX_MESSAGE] or None


def _first_line(body: str | None) -> str:
    # The head only: a test's output can run to megabytes, its gist is at the top.
    for line in (body or "")[:16384].splitlines():
        line = line.strip()
        if line and not line.startswith(_FRAMING):
            return line
    return ""


def _seconds(raw: str | None) -> float:
    if not raw:
        return 0.0
    try:
        value = float(raw)
    except ValueError:
        try:
            value = float(raw.replace(",", ""))  # Surefire: "1,234.5"
        except ValueError:
            return 0.0
    return value if 0 <= value <= 7 * 86400 else 0.0


def _text(value: str | None) -> str:
    """Text from the file made storable: no NUL, no lone surrogate."""
    if not value:
        return ""
    if value.isascii():
        return value.replace("\x00", "")
    return value.replace("\x00", "").encode("utf-8", "replace").decode("utf-8")


def _shown(tag: str) -> str:
    return _text(tag)[:60]
