"""A test runner's results: which tests a captured pytest command failed, from its output and JUnit XML.

A bundle captured as a whole command (``flaketriage capture -- python -m pytest tests/``) is one
failure of the whole run; when it is triaged ``flaky``, the tests it failed are what CI quarantines.
They are read from pytest's short test summary (``FAILED id - ...``, ``ERROR id``) and, when the
command wrote one (``--junitxml=PATH``), from the JUnit XML report the capture attached as
`JUNIT_ATTACHMENT`. Ids are node ids as pytest prints them (relative to where it ran); a JUnit
testcase, which names its test by a dotted ``classname``, is turned back into a node id by CI
history's rule (`flaketriage.results.node_ids`), made relative to the
same directory when pytest's ``rootdir:`` line says where the report's ids are rooted.

A report is read as data and nothing else: a document type declaration (the only way to declare an
entity, so also a billion-laughs or external-entity payload) is refused before anything expands, and
sizes and counts are bounded (`MAX_JUNIT_BYTES`; at most `flaketriage.quarantine.MAX_TESTS` ids).
"""

from __future__ import annotations

import os
import posixpath
import re
import stat
import xml.parsers.expat
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from flaketriage.errors import CaptureError
from flaketriage.failure.normalize import strip_ansi
from flaketriage.failure.tracebacks import parse_pytest_failures
from flaketriage.quarantine import MAX_TESTS
from flaketriage.results.node_ids import pytest_node_id

JUNIT_ATTACHMENT = "junit.xml"
"""The name under which a bundle's attachments hold the JUnit XML report its command wrote."""

MAX_JUNIT_BYTES = 16 * 1024 * 1024
"""The largest JUnit report captured (and read back): a bigger one is left out, with a warning."""

_MAX_TESTCASES = 200_000
"""Testcases read from one report before the rest is ignored (a report of a million is hostile)."""

_RUNNERS = frozenset({"pytest", "py.test"})
_JUNIT_FLAGS = ("--junitxml", "--junit-xml")
_ROOTDIR = re.compile(
    r"^rootdir: (?P<dir>.+?)(?:, (?:configfile|inifile|testpaths): .*)?[ \t\r]*$", re.MULTILINE
)
_CLASS = re.compile(r"^Test")


def runner_args(argv: Sequence[str]) -> list[str] | None:
    """The arguments pytest got, when `argv` runs pytest (``pytest``, ``py.test``, a path to one,
    ``python -m pytest``); None for any other command."""
    for i, arg in enumerate(argv[:4]):
        name = posixpath.basename(arg.replace("\\", "/"))
        if name in _RUNNERS:
            return list(argv[i + 1 :])
        if re.fullmatch(r"python[\d.]*(?:\.exe)?", name) and argv[i + 1 : i + 3] == ["-m", "pytest"]:
            return list(argv[i + 3 :])
    return None


def is_test_runner(argv: Sequence[str]) -> bool:
    """Whether `argv` runs pytest (see `runner_args`)."""
    return runner_args(argv) is not None


def junit_argument(argv: Sequence[str]) -> str | None:
    """The path pytest writes its JUnit XML report to (``--junitxml=PATH``, ``--junit-xml PATH``),
    as given; None when `argv` is not a pytest command or names none. The last one wins, as in pytest."""
    args = runner_args(argv) or []
    found: str | None = None
    for i, arg in enumerate(args):
        if arg == "--":
            break
        flag, eq, value = arg.partition("=")
        if flag in _JUNIT_FLAGS:
            found = value if eq else (args[i + 1] if i + 1 < len(args) else None)
    return found or None


def read_junit_file(cwd: Path, path: str, workspace: Path, *, max_bytes: int = MAX_JUNIT_BYTES) -> bytes:
    """The bytes of the JUnit report at `path` (relative to `cwd`), which must be a regular file inside
    `workspace`, not a link, and at most `max_bytes`. Raises `CaptureError` saying why not."""
    full = Path(path) if os.path.isabs(path) else cwd / path
    where = f"the JUnit report {path!r} (--junitxml)"
    real, top = Path(os.path.realpath(full.parent)) / full.name, Path(os.path.realpath(workspace))
    if not real.is_relative_to(top):
        raise CaptureError(f"{where} is outside the workspace {top}; it is not captured (write it inside)")
    try:
        fd = os.open(real, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as exc:
        # ELOOP: the report is a link; a link could point anywhere, so it is never followed.
        why = "it is a symbolic link" if os.path.islink(real) else (exc.strerror or str(exc))
        raise CaptureError(f"{where} cannot be read ({why}); it is not captured") from exc
    with os.fdopen(fd, "rb") as handle:
        info = os.fstat(handle.fileno())
        if not stat.S_ISREG(info.st_mode):
            raise CaptureError(f"{where} is not a regular file; it is not captured")
        data = handle.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise CaptureError(f"{where} is larger than {max_bytes} bytes; it is not captured")
    return data


@dataclass(frozen=True)
class FailedTests:
    """The tests a captured run failed: at most `MAX_TESTS` ids, and how many there were in all."""

    ids: tuple[str, ...]
    total: int
    notes: tuple[str, ...] = ()
    """What could not be read (a malformed or refused JUnit report), for the entry's reason."""

    @property
    def left_out(self) -> int:
        """Failing tests past the bound, not quarantined."""
        return self.total - len(self.ids)


def failed_tests(
    stdout: str, stderr: str, junit: bytes | None, *, cwd: str | None = None, limit: int = MAX_TESTS
) -> FailedTests:
    """The failing tests of a pytest run, from its summary and its JUnit report (`junit`, the bytes
    the capture attached, or None): the union, sorted, cut to `limit`. `cwd` is where the run ran."""
    ids = {f.nodeid for f in parse_pytest_failures(stdout) or parse_pytest_failures(stderr)}
    notes: list[str] = []
    if junit is not None:
        try:
            ids.update(junit_failures(junit, relative=_relative_to_run(stdout, cwd)))
        except CaptureError as exc:
            notes.append(str(exc))
    ordered = sorted(ids)
    return FailedTests(ids=tuple(ordered[:limit]), total=len(ordered), notes=tuple(notes))


def _relative_to_run(stdout: str, cwd: str | None) -> Callable[[str], str] | None:
    """Turns a JUnit id (relative to pytest's rootdir) into one relative to `cwd`, as the summary
    prints them, when the run's header names a rootdir other than `cwd` (``-q`` prints none: the
    ids stay rootdir-relative, which the plugin matches too). None: the ids stay as they are."""
    found = _ROOTDIR.search(strip_ansi(stdout))
    if found is None or cwd is None or os.path.normpath(found.group("dir")) == os.path.normpath(cwd):
        return None
    rootdir = found.group("dir")

    def relative(nodeid: str) -> str:
        path, sep, rest = nodeid.partition("::")
        return os.path.relpath(os.path.join(rootdir, path), cwd).replace(os.sep, "/") + sep + rest

    return relative


def junit_failures(
    data: bytes, *, relative: Callable[[str], str] | None = None, max_bytes: int = MAX_JUNIT_BYTES
) -> list[str]:
    """The node ids of the testcases a JUnit XML report marks ``failure`` or ``error``.

    Raises `CaptureError` for a report that is too big, is not well-formed XML, or declares a
    document type (entities: nothing is expanded, nothing is fetched). `relative` maps a path
    relative to pytest's rootdir to the form the ids should have.
    """
    if len(data) > max_bytes:
        raise CaptureError(f"the JUnit report is larger than {max_bytes} bytes; its tests are not read")
    reader = _JUnitReader()
    parser = xml.parsers.expat.ParserCreate()
    parser.StartDoctypeDeclHandler = reader.refuse_doctype
    parser.EntityDeclHandler = reader.refuse_entity
    parser.StartElementHandler = reader.start
    parser.EndElementHandler = reader.end
    try:
        parser.Parse(data, True)
    except xml.parsers.expat.ExpatError as exc:
        raise CaptureError(
            f"the JUnit report is not well-formed XML ({exc}); its tests are not read"
        ) from exc
    except _Refused as exc:
        raise CaptureError(f"the JUnit report {exc}; its tests are not read") from None
    ids = [_nodeid(case) for case in reader.failed]
    return [relative(i) for i in ids] if relative is not None else ids


class _Refused(CaptureError):
    """Raised from inside the parser to stop at a construct a test report never needs (then
    raised again as a `CaptureError` that says the report's tests are not read)."""


class _JUnitReader:
    """Expat callbacks: the attributes of every failed testcase."""

    def __init__(self) -> None:
        self.failed: list[dict[str, str]] = []
        self._case: dict[str, str] | None = None
        self._bad = False
        self._seen = 0

    def refuse_doctype(self, *_: object) -> None:
        raise _Refused("declares a document type (DOCTYPE), which a test report never needs")

    def refuse_entity(self, *_: object) -> None:
        raise _Refused("declares an entity, which a test report never needs")

    def start(self, name: str, attrs: dict[str, str]) -> None:
        if name == "testcase":
            self._seen += 1
            self._case, self._bad = (attrs if self._seen <= _MAX_TESTCASES else None), False
        elif name in ("failure", "error") and self._case is not None:
            self._bad = True

    def end(self, name: str) -> None:
        if name == "testcase" and self._case is not None:
            if self._bad and self._case.get("name"):
                self.failed.append(self._case)
            self._case = None


def _nodeid(case: dict[str, str]) -> str:
    """A testcase's node id, by the rule CI history reads pytest's JUnit XML with
    (`flaketriage.results.node_ids`). A classname none of whose parts names a test module (a file
    collected under other ``python_files``) is read as the module path then its ``Test*`` classes."""
    name, classname, file = case["name"], case.get("classname", ""), case.get("file", "")
    found = pytest_node_id(classname, name, file)
    if found is not None:
        return found
    parts = [p for p in classname.split(".") if p]
    split = len(parts)
    while split > 1 and _CLASS.match(parts[split - 1]):
        split -= 1
    return "::".join(["/".join(parts[:split]) + ".py", *parts[split:], name.strip()])
