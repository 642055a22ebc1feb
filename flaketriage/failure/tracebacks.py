"""Reading failures out of output: Python tracebacks and pytest's short test summary."""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Literal

from flaketriage.failure.normalize import strip_ansi

# --- Python tracebacks --------------------------------------------------------------------------


@dataclass(frozen=True)
class Frame:
    """One ``File "...", line N, in f`` line of a traceback."""

    filename: str
    """The file as printed (absolute, relative, or ``<stdin>``-like)."""
    function: str
    """The function, ``<module>``; empty for the frame of a SyntaxError, which names no function."""
    lineno: int


@dataclass(frozen=True)
class PythonError:
    """The exception a Python traceback ends with."""

    exception_type: str
    message: str
    frames: tuple[Frame, ...]
    text: str
    """The traceback block, escape sequences removed."""


_TB_HEADER = re.compile(
    r"^(?P<prefix>[ \t]*(?:[+|][ \t]*)*)(?:Exception Group )?Traceback \(most recent call last\):[ \t\r]*$",
    re.MULTILINE,
)
_FRAME = re.compile(r'^[ \t]*File "(?P<file>.*)", line (?P<line>\d+)(?:, in (?P<func>.+?))?[ \t]*$')
_EXCEPTION_LINE = re.compile(r"^(?P<type>[A-Za-z_][\w.<>]*)(?::[ \t]?(?P<msg>.*))?$")
_SYNTAX_ERROR_LINE = re.compile(r"^(?:SyntaxError|IndentationError|TabError)\b", re.MULTILINE)
_MAX_MESSAGE_LINES = 50


def parse_python_traceback(text: str) -> PythonError | None:
    """The last Python traceback in ``text``, or None when there is none (or it is cut off).

    For chained exceptions this is the final one, which is the exception that ended the program.
    An exception group is reported as the group itself (``ExceptionGroup: msg (n sub-exceptions)``);
    its sub-exceptions are not parsed. A script that does not compile prints no ``Traceback`` header,
    only the ``File`` line and the SyntaxError; that form is recognized too.
    """
    text = strip_ansi(text)
    headers = list(_TB_HEADER.finditer(text))
    if not headers:
        return _parse_bare_syntax_error(text)
    # Tracebacks nested in an exception group are drawn behind "|"; the last one at the top
    # level is the exception that escaped.
    top = [h for h in headers if "|" not in h.group("prefix")] or headers
    header = top[-1]
    # An exception group's lines are decorated like its header ("  + " becomes "  | ").
    deco = header.group("prefix").replace("+", "|")
    body: list[str] = []
    for line in text[header.end() :].splitlines()[1:]:
        if line.startswith(deco):
            body.append(line[len(deco) :])
        elif line.rstrip() == deco.rstrip():
            body.append("")
        else:
            break
    found = _parse_body(body)
    if found is None:
        return None
    exception_type, message, frames, used = found
    block = "\n".join([header.group(0).strip(), *body[:used]])
    return PythonError(exception_type, message, frames, block)


def _parse_bare_syntax_error(text: str) -> PythonError | None:
    last = _last_match(_SYNTAX_ERROR_LINE, text)
    if last is None:
        return None
    before = text[: last.start()].splitlines()[-6:]
    for i in range(len(before) - 1, -1, -1):
        if _FRAME.match(before[i]):
            lines = [*before[i:], *text[last.start() :].splitlines()]
            found = _parse_body(lines)
            if found is None:
                return None
            exception_type, message, frames, used = found
            return PythonError(exception_type, message, frames, "\n".join(lines[:used]))
    return None


def _last_match(pattern: re.Pattern[str], text: str) -> re.Match[str] | None:
    matches = list(pattern.finditer(text))
    return matches[-1] if matches else None


def _parse_body(lines: list[str]) -> tuple[str, str, tuple[Frame, ...], int] | None:
    """Frames and the exception line of a traceback body; the last item is how many lines it used."""
    frames: list[Frame] = []
    for i, line in enumerate(lines):
        frame = _FRAME.match(line)
        if frame:
            frames.append(Frame(frame.group("file"), frame.group("func") or "", int(frame.group("line"))))
            continue
        # Source lines, ^^^^ markers and "[Previous line repeated N more times]" are indented.
        if not line.strip() or line[0] in " \t":
            continue
        exception = _EXCEPTION_LINE.match(line.rstrip())
        if exception is None:
            continue
        message = [exception.group("msg") or ""]
        end = i + 1
        # A message may span lines; it ends at a blank line or where the output ends.
        while end < len(lines) and lines[end].strip() and len(message) < _MAX_MESSAGE_LINES:
            message.append(lines[end])
            end += 1
        return exception.group("type"), "\n".join(message).strip(), tuple(frames), end
    return None


# --- pytest summaries ---------------------------------------------------------------------------


@dataclass(frozen=True)
class PytestFailure:
    """One ``FAILED``/``ERROR`` line of pytest's short test summary."""

    nodeid: str
    outcome: Literal["failed", "error"]
    exception_type: str | None
    message: str
    printed_type: bool = True
    """Whether the line printed the type before a colon. pytest prints a rewritten bare ``assert``
    as its text alone (``assert 16.99 == 17.0``, an AssertionError) and an exception without a
    message as its name alone (``KeyError``). Earlier releases read both as untyped; `untyped` gives
    that reading back, for the signature of a bundle captured then."""
    whole_message: str | None = None
    """The message uncut, where pytest cut the line to the terminal's width (``...``): from the
    ``E`` lines of the test's section of the report above the summary. None when the line holds it
    all, or the report does not show it. For people to read; the signature uses `message`."""

    def untyped(self) -> PytestFailure:
        """This failure as a parser that read only ``Type: message`` saw it: the line's text whole,
        no type. Itself when the line printed its type."""
        if self.printed_type:
            return self
        reason = self.message if self.message else self.exception_type or ""
        return PytestFailure(self.nodeid, self.outcome, None, reason, whole_message=self.whole_message)


_SUMMARY_HEADER = re.compile(r"^=+ short test summary info =+[ \t\r]*$", re.MULTILINE)
_SUMMARY_LINE = re.compile(r"^(?P<outcome>FAILED|ERROR) (?P<rest>\S.*?)[ \t]*$")
_IDENTIFIER_PREFIX = re.compile(r"^(?P<type>[A-Za-z_][\w.]*):[ \t]*(?P<msg>.*)$", re.DOTALL)
# An exception raised without a message is printed as its (qualified) class name alone.
_CLASS_NAME = re.compile(r"^(?:[A-Za-z_]\w*\.)*[A-Z]\w*$")
# pytest writes a rewritten assertion's AssertionError without its "AssertionError: " prefix
# (`ExceptionInfo._striptext`): the message starts with the assert statement.
_REWRITTEN_ASSERT = re.compile(r"^assert\b")
# A test's part of the report: "____ test_x[a] ____", "____ ERROR at setup of TestC.test_y ____".
_SECTION = re.compile(r"^_{3,} (?P<name>.+?) _{3,}[ \t\r]*$", re.MULTILINE)


def parse_pytest_failures(text: str) -> list[PytestFailure]:
    """The ``FAILED``/``ERROR`` lines of pytest's short test summary (``-rfE``, pytest's default).

    Only lines after the last ``short test summary info`` header count when there is one; without
    it, a line counts when its node id looks like one (has ``::`` or a file suffix). The type is
    the one the line names (``ValueError: bad``), else the one pytest leaves out: AssertionError for
    a rewritten assertion's ``assert ...``, the class for a bare ``KeyError`` or ``pkg.MyError``.
    """
    text = strip_ansi(text)
    report = ""
    headers = list(_SUMMARY_HEADER.finditer(text))
    if headers:
        report, text = text[: headers[-1].start()], text[headers[-1].end() :]
    failures: list[PytestFailure] = []
    for line in text.splitlines():
        match = _SUMMARY_LINE.match(line)
        if not match:
            continue
        nodeid, reason = _split_summary(match.group("rest"))
        if not ("::" in nodeid or re.search(r"\.\w+$", nodeid)):
            continue
        outcome: Literal["failed", "error"] = "failed" if match.group("outcome") == "FAILED" else "error"
        failure = _summary_failure(nodeid, outcome, reason)
        whole = _whole_reason(report, nodeid, reason) if reason.endswith("...") else None
        if whole is not None:
            failure = replace(failure, whole_message=_summary_failure(nodeid, outcome, whole).message)
        failures.append(failure)
    return failures


def _whole_reason(report: str, nodeid: str, reason: str) -> str | None:
    """The text pytest cut to `reason` (``...`` at the end), from the ``E`` lines of the test's
    section of `report`: the first block of them that starts with what the summary kept."""
    kept = reason[:-3]
    file, _, rest = nodeid.partition("::")
    domain = rest.replace("::", ".") if rest else file
    sections = list(_SECTION.finditer(report))
    for i, section in enumerate(sections):
        name = section.group("name")
        if name != domain and not name.endswith(" " + domain):
            continue
        end = sections[i + 1].start() if i + 1 < len(sections) else len(report)
        for block in _e_blocks(report[section.end() : end].splitlines()):
            if block[0].startswith(kept):
                return "\n".join(block[:_MAX_MESSAGE_LINES])
    return None


def _e_blocks(lines: list[str]) -> list[list[str]]:
    """The runs of pytest's ``E   text`` lines, each dedented by its first line's indentation."""
    blocks: list[list[str]] = []
    run: list[str] = []
    for line in [*lines, ""]:
        if line.startswith("E ") or line.rstrip() == "E":
            run.append(line[1:].rstrip())
            continue
        if run:
            indent = len(run[0]) - len(run[0].lstrip())
            blocks.append([part[indent:] if part[:indent].isspace() else part.strip() for part in run])
            run = []
    return blocks


def _summary_failure(nodeid: str, outcome: Literal["failed", "error"], reason: str) -> PytestFailure:
    typed = _IDENTIFIER_PREFIX.match(reason)
    if typed:
        return PytestFailure(nodeid, outcome, typed.group("type"), typed.group("msg"))
    if _REWRITTEN_ASSERT.match(reason):
        return PytestFailure(nodeid, outcome, "AssertionError", reason, printed_type=False)
    if _CLASS_NAME.match(reason):
        return PytestFailure(nodeid, outcome, reason, "", printed_type=False)
    return PytestFailure(nodeid, outcome, None, reason)


def _split_summary(rest: str) -> tuple[str, str]:
    """Split ``nodeid - reason`` at the first " - " outside the parameter brackets."""
    depth = 0
    for i, ch in enumerate(rest):
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth = max(depth - 1, 0)
        elif depth == 0 and rest.startswith(" - ", i):
            return rest[:i], rest[i + 3 :]
    return rest, ""
