"""Reading failures out of output: Python tracebacks and pytest's short test summary."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from flaketriage.normalize import strip_ansi

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

    def untyped(self) -> PytestFailure:
        """This failure as a parser that read only ``Type: message`` saw it: the line's text whole,
        no type. Itself when the line printed its type."""
        if self.printed_type:
            return self
        reason = self.message if self.message else self.exception_type or ""
        return PytestFailure(self.nodeid, self.outcome, None, reason)


_SUMMARY_HEADER = re.compile(r"^=+ short test summary info =+[ \t\r]*$", re.MULTILINE)
_SUMMARY_LINE = re.compile(r"^(?P<outcome>FAILED|ERROR) (?P<rest>\S.*?)[ \t]*$")
_IDENTIFIER_PREFIX = re.compile(r"^(?P<type>[A-Za-z_][\w.]*):[ \t]*(?P<msg>.*)$", re.DOTALL)
# An exception raised without a message is printed as its (qualified) class name alone.
_CLASS_NAME = re.compile(r"^(?:[A-Za-z_]\w*\.)*[A-Z]\w*$")
# pytest writes a rewritten assertion's AssertionError without its "AssertionError: " prefix
# (`ExceptionInfo._striptext`): the message starts with the assert statement.
_REWRITTEN_ASSERT = re.compile(r"^assert\b")


def parse_pytest_failures(text: str) -> list[PytestFailure]:
    """The ``FAILED``/``ERROR`` lines of pytest's short test summary (``-rfE``, pytest's default).

    Only lines after the last ``short test summary info`` header count when there is one; without
    it, a line counts when its node id looks like one (has ``::`` or a file suffix). The type is
    the one the line names (``ValueError: bad``), else the one pytest leaves out: AssertionError for
    a rewritten assertion's ``assert ...``, the class for a bare ``KeyError`` or ``pkg.MyError``.
    """
    text = strip_ansi(text)
    headers = list(_SUMMARY_HEADER.finditer(text))
    if headers:
        text = text[headers[-1].end() :]
    failures: list[PytestFailure] = []
    for line in text.splitlines():
        match = _SUMMARY_LINE.match(line)
        if not match:
            continue
        nodeid, reason = _split_summary(match.group("rest"))
        if not ("::" in nodeid or re.search(r"\.\w+$", nodeid)):
            continue
        outcome: Literal["failed", "error"] = "failed" if match.group("outcome") == "FAILED" else "error"
        failures.append(_summary_failure(nodeid, outcome, reason))
    return failures


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
