"""JUnit XML read safely into test results: the format pytest, Jest (``jest-junit``), go
(``gotestsum``, ``go-junit-report``), cargo-nextest, Maven Surefire and Bazel write.

The document is parsed by defusedxml with DTDs, entities and external references forbidden (an
entity-expansion bomb or an ``<!ENTITY x SYSTEM "file:///etc/passwd">`` is refused, never
expanded, nothing outside the file is read) and streamed: no tree is built, each ``<testcase>`` is
read as it goes by and only its outcome kept, so memory does not grow with the elements of a file
(a hostile one of millions) and 50,000 tests read in about half a second. Each ``<testcase>`` is
one record, read by the element names of junitparser's xunit2 model:

* ``<failure>`` is ``failed``, ``<error>`` ``error``, ``<skipped>`` ``skipped``, none of them ``passed``;
* Surefire's ``<flakyFailure>``/``<flakyError>`` (failed, then passed on a rerun) and
  ``<rerunFailure>``/``<rerunError>`` (failed on every rerun too) are earlier failed attempts;
* jest-junit writes a test Jest retried once, its last run; with the testcase property its README
  shows (``dd_tags[test.invocations]``, Jest's count of runs) the runs before the last are failed
  attempts (Jest retries only what failed);
* a test written once per attempt (gotestsum ``--rerun-fails``, pytest-rerunfailures, a file with
  the same test twice) is one result, its last outcome final and the ones before it attempts; the
  records that are not attempts are told apart in `_attempts` (pytest's teardown error written as a
  second record, pytest-rerunfailures' blank reruns, jest-junit's suite that failed to load).

What the writers leave out cannot be read back: jest-junit writes neither Jest's retries (without
the property) nor its ``test.todo`` (a todo reads as a pass), gotestsum leaves out a package that
does not build. The files in ``tests/results/fixtures`` were written by the tools themselves (their
README says which).

Test ids are pytest's node ids for a pytest file, else ``classname.name``
(`flaketriage.results.node_ids`).

A failure's message is its ``message`` attribute, else (none, or a placeholder such as go's
``Failed``) the first line of its text that is not framing (go test's ``=== RUN``, Jest's
``● title``), cut to `MAX_MESSAGE`.

Every problem is one `ResultsError` naming the file: not XML, not JUnit, a DTD or entities, too
large, too deep, too many tests or elements.
"""

from __future__ import annotations

import functools
import hashlib
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

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
from flaketriage.results.node_ids import test_id

MAX_JUNIT_BYTES = 100 * 2**20
"""The largest JUnit XML document read (the CLI's limit, FLAKETRIAGE_MAX_RESULTS_MB, is lower)."""
MAX_DEPTH = 64
"""Elements nested deeper than this are not JUnit XML (suites nest a few levels)."""
MAX_ELEMENTS = 5_000_000
"""Elements in one document: 25 for each of the `MAX_TESTS` tests it may hold. Memory does not grow
with them; this bounds the time a hostile file takes (about 2 µs an element)."""
MAX_SECONDS = 7 * 86400
"""A duration above this (or negative, or not a number) is read as 0, as the model bounds it."""

_SUITES = frozenset({"testsuites", "testsuite"})
_PYTEST_ROOT = "pytest tests"
"""pytest names its root so whatever ``junit_suite_name`` calls the suite."""
_INVOCATIONS = "dd_tags[test.invocations]"
"""The testcase property jest-junit's README shows for Jest's count of runs of a test."""
_PLACEHOLDERS = frozenset({"Failed", "Skipped", "Build error", "Runtime error"})
"""The message attribute go-junit-report and gotestsum write whatever failed: the text says what."""
_FRAMING = ("=== RUN", "=== PAUSE", "=== CONT", "=== NAME", "--- FAIL", "--- SKIP", "--- PASS", "● ")
"""Lines that frame a test's output rather than say what failed: go test's, and Jest's ``● title``."""
_TEXT_KEPT = 16_384
"""The head of a result's text that is kept: a test's output can run to megabytes, its gist is at
the top."""
_NAME_KEPT = MAX_TEST_ID + 64
"""Characters of a name kept before it is stripped (an attribute may be megabytes)."""
_RECORDS_KEPT = 2 * MAX_ATTEMPTS + 2
"""Records of one test kept: enough for `MAX_ATTEMPTS` attempts of two records each (pytest's
teardown error), and the first."""
_PYTEST_TEARDOWN = 'failed on teardown with "'
_JEST_SUITE_ERROR = "Test suite failed to run."


@dataclass(frozen=True)
class JUnitFile:
    """The results of one file and the digest of its bytes (what keys an upload)."""

    name: str
    tests: tuple[TestResult, ...]
    digest: bytes


def read_junit_file(path: Path, *, max_bytes: int = MAX_JUNIT_BYTES) -> JUnitFile:
    """Read one JUnit XML file: a regular file (a symlink is followed to one) of at most `max_bytes`.
    Its kind and size are checked before it is opened (a device, a FIFO or a file too large is never
    opened), and again on the open file."""
    name = str(path)
    try:
        _check_kind(os.stat(path), name, max_bytes)
        # O_NONBLOCK: a FIFO swapped in after the stat cannot make the open wait for a writer.
        with open(os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC), "rb") as handle:
            _check_kind(os.fstat(handle.fileno()), name, max_bytes)
            data = handle.read(max_bytes + 1)
    except FileNotFoundError:
        raise ResultsError(f"{name} does not exist; give the JUnit XML file the test runner wrote") from None
    except OSError as exc:
        raise ResultsError(f"cannot read {name}: {exc.strerror or exc}") from None
    if len(data) > max_bytes:
        raise ResultsError(f"{name} grew past {_mib(max_bytes)} while it was read; read it once written")
    return JUnitFile(
        name=name, tests=tuple(read_junit(data, name=name)), digest=hashlib.sha256(data).digest()
    )


def _check_kind(info: os.stat_result, name: str, max_bytes: int) -> None:
    if stat.S_ISDIR(info.st_mode):
        raise ResultsError(f"{name} is a directory; give the JUnit XML files in it")
    if not stat.S_ISREG(info.st_mode):
        raise ResultsError(
            f"{name} is not a regular file (a device, a pipe or a socket); give the JUnit XML file "
            "the test runner wrote"
        )
    if info.st_size > max_bytes:
        raise ResultsError(
            f"{name} is {_mib(info.st_size)}, larger than the {_mib(max_bytes)} a results file may be "
            "(FLAKETRIAGE_MAX_RESULTS_MB); it was not read: split the suite into shards"
        )


def read_junit(data: bytes, *, name: str = "the file") -> list[TestResult]:
    """The test results in one JUnit XML document, in the order each test first appears."""
    if len(data) > MAX_JUNIT_BYTES:
        raise ResultsError(
            f"{name} is {_mib(len(data))}, larger than the {_mib(MAX_JUNIT_BYTES)} a JUnit XML "
            "document may be; split the suite into shards"
        )
    head = data.lstrip()[:1]
    if not head:
        raise ResultsError(f"{name} is empty; it is not JUnit XML (was the run killed before it wrote?)")
    if head not in (b"<", b"\xef", b"\xff", b"\xfe"):  # a tag, or a UTF-8 or UTF-16 byte order mark
        kind = " (it looks like JSON)" if head in (b"{", b"[") else ""
        raise ResultsError(
            f"{name} is not XML{kind}: JUnit XML starts with '<'; give the file the runner's JUnit "
            "reporter wrote (pytest --junitxml, jest-junit, gotestsum --junitfile ...)"
        )
    reader = _Reader(name)
    reader.read(data)
    return reader.results()


@dataclass(frozen=True)
class _Tags:
    """The element names junitparser's xunit2 model gives each outcome and interim result."""

    outcomes: dict[str, Outcome]
    interim: dict[str, Outcome]

    @classmethod
    @functools.cache
    def of(cls) -> _Tags:
        from junitparser import Error, Failure, Skipped
        from junitparser.xunit2 import FlakyError, FlakyFailure, RerunError, RerunFailure

        return cls(
            outcomes={Failure._tag: Outcome.FAILED, Error._tag: Outcome.ERROR, Skipped._tag: Outcome.SKIPPED},
            interim={
                FlakyFailure._tag: Outcome.FAILED,
                RerunFailure._tag: Outcome.FAILED,
                FlakyError._tag: Outcome.ERROR,
                RerunError._tag: Outcome.ERROR,
            },
        )


class _Record:
    """One ``<testcase>``: its outcome, duration and message, and the failed attempts it lists
    before itself (Surefire's flaky and rerun results, jest-junit's invocations)."""

    __slots__ = ("earlier", "message", "outcome", "pytest", "recorded", "seconds", "test_id")

    def __init__(self, attrib: dict[str, str], suite: str, pytest_root: bool) -> None:
        get = attrib.get
        file = get("file")
        file = file[:_NAME_KEPT].strip() if file else ""
        self.pytest = pytest_root or suite == "pytest" or file.endswith(".py")
        classname, name = get("classname", "")[:_NAME_KEPT].strip(), get("name", "")[:_NAME_KEPT].strip()
        self.test_id = test_id(classname, name, file, pytest=self.pytest)
        self.seconds = _seconds(get("time"))
        self.outcome = Outcome.PASSED
        self.message: str | None = None
        self.recorded = False
        """An outcome element says how it ended (pytest-rerunfailures writes its reruns without)."""
        self.earlier: list[Attempt] = []

    def add(self, outcome: Outcome, message: str | None) -> None:
        """A result of this record's own run: a failure or an error outranks a skip."""
        self.recorded = True
        if self.outcome is Outcome.PASSED or (self.outcome is Outcome.SKIPPED and outcome.failing):
            self.outcome, self.message = outcome, message if outcome.failing else None


class _Reader:
    """An ElementTree parser target that reads the test cases as the document streams by, keeping
    their outcomes and nothing else; it checks the root, the depth and the counts on the way."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.tags = _Tags.of()
        self.runs: dict[str, list[_Record]] = {}
        self.tests = 0
        self.elements = 0
        self.depth = 0
        self.pytest_root = False
        self.suites: list[str] = []  # the names of the open suites, outermost first
        self.case: _Record | None = None
        self.case_depth = 0
        self.result: tuple[str, dict[str, str]] | None = None  # the case's open result element
        self.text: list[str] | None = None  # the head of its text, while it is open
        self.text_size = 0
        self.properties = False  # the case's <properties> is open
        self.expat: Any = None  # the expat parser, when this target is wired to it directly

    def read(self, data: bytes) -> None:
        from defusedxml import DefusedXmlException, DTDForbidden
        from defusedxml.ElementTree import DefusedXMLParser, ParseError

        parser = DefusedXMLParser(target=self, forbid_dtd=True, forbid_entities=True, forbid_external=True)
        expat = getattr(parser, "parser", None)  # the expat parser defusedxml set its refusals on
        if expat is not None:
            # Elements straight to this target, their attributes a dict made by expat: ElementTree's
            # own handlers in between (in Python) were a third of the time of a 50,000-test file.
            expat.ordered_attributes = False
            expat.StartElementHandler = self.start
            expat.EndElementHandler = self.end
            # Text is only wanted inside a result element (a failure's message): between elements
            # (the indentation) expat skips it without calling Python at all.
            # (ElementTree's default handler would then take character references for undefined
            # entities; without it, expat delivers them as text where text is read and refuses a
            # truly undefined entity itself.)
            expat.CharacterDataHandler = None
            expat.DefaultHandlerExpand = None
            self.expat = expat
        try:
            parser.feed(data)  # whole: expat reparses a long token from the start at each new chunk
            parser.close()
        except DTDForbidden as exc:
            if (exc.name or "").lower() == "html":
                raise ResultsError(
                    f"{self.name} is an HTML page, not JUnit XML; give the XML file the test runner "
                    "wrote (pytest --junitxml, jest-junit, gotestsum --junitfile ...), not a rendered report"
                ) from None
            raise self._refused() from None
        except DefusedXmlException:
            raise self._refused() from None
        except ParseError as exc:
            raise ResultsError(_not_well_formed(self.name, data, exc)) from None
        except LookupError as exc:  # expat asks Python for a codec the declaration names
            raise ResultsError(
                f"{self.name} declares an encoding Python does not know ({exc}); JUnit XML is UTF-8"
            ) from None
        except (ValueError, RecursionError) as exc:
            raise ResultsError(f"{self.name} is not XML this reads ({type(exc).__name__}: {exc})") from None

    def _refused(self) -> ResultsError:
        return ResultsError(
            f"{self.name} declares a DTD or entities; JUnit XML has none, so it is refused unread"
        )

    # The parser target's protocol: start, end, data, close.

    def start(self, tag: str, attrib: dict[str, str]) -> None:
        depth = self.depth = self.depth + 1
        self.elements += 1
        if depth > MAX_DEPTH or self.elements > MAX_ELEMENTS:
            self._refuse_size()
        case = self.case
        if case is not None:
            if depth == self.case_depth + 1:
                self._open_child(tag, attrib)
            elif self.properties and depth == self.case_depth + 2 and attrib.get("name") == _INVOCATIONS:
                case.earlier += _invocations(attrib.get("value"))
        elif depth == len(self.suites) + 1:  # the root, or a child of the innermost suite
            if tag == "testcase":
                self._open_case(attrib)
            elif tag in _SUITES:
                self.suites.append(attrib.get("name") or "")
                self.pytest_root = self.pytest_root or (depth == 1 and attrib.get("name") == _PYTEST_ROOT)
            elif depth == 1:
                raise ResultsError(
                    f"{self.name} is XML but not JUnit XML: its root element is <{tag[:60]}>, not "
                    "<testsuites> or <testsuite>; give the file the runner's JUnit reporter wrote"
                )

    def end(self, tag: str) -> None:
        depth = self.depth
        self.depth -= 1
        case = self.case
        if case is None:
            if depth == len(self.suites) and tag in _SUITES:
                self.suites.pop()
        elif depth == self.case_depth:
            runs = self.runs.get(case.test_id)
            if runs is None:
                self.runs[case.test_id] = [case]
            else:
                runs.append(case)
                if len(runs) > _RECORDS_KEPT:
                    del runs[1]  # the first stays: it may be jest-junit's suite error
            self.case = None
        elif depth == self.case_depth + 1:
            self._close_child(case)

    def data(self, text: str) -> None:
        if self.text is not None and self.text_size < _TEXT_KEPT:
            self.text.append(text)
            self.text_size += len(text)

    def close(self) -> None:
        """The end of the document: nothing is left to do."""

    def _open_case(self, attrib: dict[str, str]) -> None:
        self.tests += 1
        if self.tests > MAX_TESTS:
            raise ResultsError(
                f"{self.name} holds more than {MAX_TESTS} tests; upload a sharded suite one shard at a time"
            )
        self.case = _Record(attrib, self.suites[-1], self.pytest_root)
        self.case_depth = self.depth

    def _open_child(self, tag: str, attrib: dict[str, str]) -> None:
        if tag in self.tags.outcomes or tag in self.tags.interim:
            self.result, self.text, self.text_size = (tag, attrib), [], 0
            if self.expat is not None:
                self.expat.CharacterDataHandler = self.data
        elif tag == "properties":
            self.properties = True

    def _close_child(self, case: _Record) -> None:
        self.properties = False
        if self.expat is not None:
            self.expat.CharacterDataHandler = None
        if self.result is None:
            return
        (tag, attrib), text = self.result, "".join(self.text or ())
        self.result = self.text = None
        outcome = self.tags.outcomes.get(tag)
        if outcome is not None:
            case.add(outcome, _message(attrib, text) if outcome.failing else None)
        else:
            seconds = _seconds(attrib.get("time"))
            case.earlier.append(_attempt(self.tags.interim[tag], seconds, _message(attrib, text)))
            del case.earlier[:-MAX_ATTEMPTS]

    def _refuse_size(self) -> None:
        if self.depth > MAX_DEPTH:
            raise ResultsError(
                f"{self.name} nests elements more than {MAX_DEPTH} deep; JUnit XML nests a few levels"
            )
        raise ResultsError(
            f"{self.name} holds more than {MAX_ELEMENTS} elements; no test runner writes that many "
            f"for the {MAX_TESTS} tests a file may hold"
        )

    def results(self) -> list[TestResult]:
        return [self._result(test_id, runs) for test_id, runs in self.runs.items()]

    def _result(self, test_id: str, runs: list[_Record]) -> TestResult:
        """One test from its records: the last is final, the attempts before it earlier."""
        final = runs[-1]
        if len(runs) == 1:
            attempts = final.earlier
        else:
            final, attempts = _attempts(test_id, runs)
        fields: dict[str, object] = {"test_id": test_id, "outcome": final.outcome}
        if final.seconds:
            fields["duration_s"] = final.seconds
        if attempts:
            fields["attempts"] = tuple(attempts[-MAX_ATTEMPTS:])
        message = final.message
        if not message and attempts:
            message = next((a.message for a in reversed(attempts) if a.message), None)
        if message:
            fields["message"] = message
        try:
            return TestResult.model_validate(fields)
        except ValidationError as exc:  # the values are cut and clamped here: a bug if it happens
            raise ResultsError(
                f"{self.name} has a test that cannot be read ({test_id[:200]!r}): {exc}"
            ) from None


def _attempts(test_id: str, runs: list[_Record]) -> tuple[_Record, list[Attempt]]:
    """The final record of a test written more than once, and the attempts before it, oldest first.

    Elsewhere each record is an attempt (gotestsum ``--rerun-fails`` writes every run with its
    outcome), but two writers repeat a test within one attempt and one leaves reruns blank:

    * pytest writes a test whose call failed and whose teardown then raised twice, the failure
      and then an ``<error message='failed on teardown with "..."'>``: one attempt, failed;
    * pytest-rerunfailures leaves each attempt it reran as an empty ``<testcase>`` (what a pass
      looks like): it reruns only what failed, so those are failed attempts (errors when the
      last one is an error);
    * jest-junit writes a test file that failed to load (``Test suite failed to run``) as an
      ``<error>`` and again as a ``<failure>``: one error.
    """
    if test_id.startswith(_JEST_SUITE_ERROR):
        return runs[0], runs[0].earlier
    joined: list[tuple[_Record, float]] = []  # each attempt's record and its seconds
    for run in runs:
        if (
            joined
            and run.pytest
            and run.outcome is Outcome.ERROR
            and (run.message or "").startswith(_PYTEST_TEARDOWN)
            and joined[-1][0].outcome is Outcome.FAILED
        ):
            before, seconds = joined[-1]
            before.earlier += run.earlier
            joined[-1] = (before, seconds + run.seconds)
            continue
        joined.append((run, run.seconds))
    (final, final_seconds), earlier = joined[-1], joined[:-1]
    final.seconds = final_seconds
    attempts: list[Attempt] = []
    for run, seconds in earlier[-MAX_ATTEMPTS:]:
        attempts += run.earlier
        outcome = run.outcome
        if run.pytest and not run.recorded:  # pytest-rerunfailures reran it: it failed, unsaid how
            outcome = Outcome.ERROR if final.outcome is Outcome.ERROR else Outcome.FAILED
        attempts.append(_attempt(outcome, seconds, run.message))
    return final, attempts + final.earlier


def _not_well_formed(name: str, data: bytes, exc: Exception) -> str:
    """What expat found, with the likely cause: cut short, bytes that are not UTF-8, or characters
    XML forbids (NUL and other control characters in a test's name or output)."""
    why = str(exc)
    if why.startswith(("no element found", "unclosed token")):
        hint = "it ends before its root element closes: was it cut short (a job killed while writing)?"
    else:
        try:
            data.decode("utf-8")
            hint = "XML 1.0 forbids control characters such as NUL, which a test's name or output may hold"
        except UnicodeDecodeError as bad:
            hint = f"its bytes are not UTF-8 (at byte {bad.start}) and it declares no other encoding"
    return f"{name} is not well-formed XML: {why}; {hint}"


def _invocations(value: str | None) -> list[Attempt]:
    """The failed runs before the last of a test jest-junit wrote with Jest's count of its runs."""
    try:
        runs = int((value or "1")[:20])
    except ValueError:  # jest-junit writes "undefined" for a suite that failed to load
        return []
    return [_attempt(Outcome.FAILED, 0.0, None)] * min(max(runs - 1, 0), MAX_ATTEMPTS)


def _attempt(outcome: Outcome, seconds: float, message: str | None) -> Attempt:
    return Attempt(outcome=outcome, duration_s=seconds, message=message)


def _message(attrib: dict[str, str], text: str) -> str | None:
    """The gist of a failure: its message attribute, else the first line of its text (of its
    ``<stackTrace>``, for Surefire's reruns) that is not framing."""
    given = attrib.get("message", "")[: MAX_MESSAGE + 64].strip()
    if not given or given in _PLACEHOLDERS:
        lines = (line.strip() for line in text[:_TEXT_KEPT].splitlines())
        given = next((line for line in lines if line and not line.startswith(_FRAMING)), given)
    return given[:MAX_MESSAGE].rstrip() or None


def _seconds(raw: str | None) -> float:
    if not raw:
        return 0.0
    try:
        value = float(raw[:40])
    except ValueError:
        try:
            value = float(raw[:40].replace(",", ""))  # Surefire: "1,234.5"
        except ValueError:
            return 0.0
    return value if 0 <= value <= MAX_SECONDS else 0.0


def _mib(size: int) -> str:
    mib = size / 2**20
    return f"{mib:.0f} MiB" if size % 2**20 == 0 else f"{mib:.1f} MiB"
