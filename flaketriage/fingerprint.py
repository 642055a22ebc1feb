"""Failure fingerprints: the normalized signature of how a run failed, and its SHA-256.

A replay runs in another directory, at other addresses, with other temp names and timings; the
signature keeps what identifies a failure (exception type, message shape, code path) and masks
what varies, so "same fingerprint" means "same failure".
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import signal as signals
import unicodedata
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from flaketriage.errors import ConfigError
from flaketriage.manifest import Failure, FailureCriteria, MetricBound

MAX_MESSAGE_CHARS = 500
"""Normalized messages are cut here: the start of a message identifies it, the rest is noise."""

# Normalizing is superlinear in the worst case; nothing past this can survive the cut anyway
# unless it is masked away, and a 20k-character message is not worth more precision.
_MAX_INPUT_CHARS = 20_000

FailureKind = Literal["exception", "exit", "signal", "pattern", "metric", "timeout", "test"]

# --- text cleaning and masking ------------------------------------------------------------------

_ANSI = re.compile(
    r"\x1b\[[0-?]*[ -/]*[@-~]"  # CSI: colours, cursor movement
    r"|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?"  # OSC: titles, hyperlinks
    r"|\x1b[ -/]+[0-~]"  # nF: character set selection
    r"|\x1b[@-Z\\-_]"  # other two-byte escapes
    r"|\x9b[0-?]*[ -/]*[@-~]"  # 8-bit CSI
)
_WHITESPACE = re.compile(r"\s+")
_C0_C1 = re.compile(r"[\x00-\x1f\x7f-\x9f]")
_CONTROL_CATEGORIES = frozenset({"Cc", "Cf", "Cs"})

# Characters of a path component. A path may only start where no such character precedes it, which
# keeps the masks from starting mid-token (both for correctness and to keep matching linear).
_PC = r"[\w.\-+@~%$]"
_NOT_AFTER_PATH_CHAR = r"(?<![\w.\-+@~%$/\\])"
_MASKS: tuple[tuple[re.Pattern[str], str], ...] = (
    # Windows drive paths first, or the POSIX rule would eat the part after "C:".
    (re.compile(rf"{_NOT_AFTER_PATH_CHAR}[A-Za-z]:[\\/](?:{_PC}+(?:[\\/]{_PC}+)*[\\/]?)?"), "<path>"),
    (re.compile(rf"{_NOT_AFTER_PATH_CHAR}/(?:{_PC}+/)*{_PC}+/?"), "<path>"),
    (re.compile(rf"{_NOT_AFTER_PATH_CHAR}(?:\.\.?|~)[\\/](?:{_PC}+[\\/])*{_PC}*"), "<path>"),
    # A relative path without "./" is only recognized by its file extension: "a/b" may be a ratio.
    (
        re.compile(rf"{_NOT_AFTER_PATH_CHAR}(?:{_PC}+/)+{_PC}*\.[A-Za-z][A-Za-z0-9]{{0,7}}(?![\w.\-/])"),
        "<path>",
    ),
    (
        re.compile(
            r"(?<![0-9A-Za-z])[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"
            r"(?![0-9A-Za-z])"
        ),
        "<id>",
    ),
    (re.compile(r"(?<![0-9A-Za-z])0[xX][0-9a-fA-F]+(?![0-9A-Za-z])"), "<hex>"),
    # Hashes and ids: at least one digit and one letter, so long plain numbers stay numbers and
    # long words made of a-f stay words.
    (
        re.compile(
            r"(?<![0-9A-Za-z])(?=[0-9a-fA-F]*[0-9])(?=[0-9a-fA-F]*[a-fA-F])[0-9a-fA-F]{12,}(?![0-9A-Za-z])"
        ),
        "<id>",
    ),
    # tempfile.mkstemp/mkdtemp names: "tmp" and 8 random characters.
    (re.compile(r"(?<![0-9A-Za-z_])tmp[a-z0-9_]{8}(?![0-9A-Za-z_])"), "<tmp>"),
    # Numbers that stand alone (not the 32 of float32); "nan" and "inf" are words and stay, since a
    # NaN loss and a large loss are different failures. A version "1.2.3" is one number.
    (re.compile(r"(?<![\w.])[-+]?(?:\d+(?:\.\d+)*|\.\d+)(?:[eE][-+]?\d+)?(?!\.?\d)"), "<n>"),
)


def strip_ansi(text: str) -> str:
    """``text`` without ANSI escape sequences (colours, cursor movement, hyperlinks)."""
    return _ANSI.sub("", text)


def _clean(text: str) -> str:
    """One line of plain printable text: no escapes, no control characters, single spaces."""
    text = _WHITESPACE.sub(" ", strip_ansi(text))
    text = _C0_C1.sub("", text)
    if not text.isascii():
        text = "".join(ch for ch in text if unicodedata.category(ch) not in _CONTROL_CATEGORIES)
    return _WHITESPACE.sub(" ", text).strip()


def _normalize_once(text: str) -> str:
    text = _clean(text)
    for pattern, placeholder in _MASKS:
        text = pattern.sub(placeholder, text)
    return text[:MAX_MESSAGE_CHARS].rstrip()


def normalize_message(text: str) -> str:
    """Mask what varies between runs of the same failure: paths, addresses, ids, temp names, numbers.

    Escape sequences and control characters are removed, whitespace collapsed to single spaces,
    and the result cut at `MAX_MESSAGE_CHARS`. ``nan`` and ``inf`` are kept. Idempotent.
    """
    current = text[:_MAX_INPUT_CHARS]
    # A mask can expose a new match to an earlier one ("5/tmp/x" only reads as a path once the
    # "5" is masked), so repeat to a fixed point. Every change removes a digit, a slash or a dash,
    # or shortens the text without adding any, so this ends.
    for _ in range(100):
        following = _normalize_once(current)
        if following == current:
            break
        current = following
    return current


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


_SUMMARY_HEADER = re.compile(r"^=+ short test summary info =+[ \t\r]*$", re.MULTILINE)
_SUMMARY_LINE = re.compile(r"^(?P<outcome>FAILED|ERROR) (?P<rest>\S.*?)[ \t]*$")
_IDENTIFIER_PREFIX = re.compile(r"^(?P<type>[A-Za-z_][\w.]*):[ \t]*(?P<msg>.*)$", re.DOTALL)


def parse_pytest_failures(text: str) -> list[PytestFailure]:
    """The ``FAILED``/``ERROR`` lines of pytest's short test summary (``-rfE``, pytest's default).

    Only lines after the last ``short test summary info`` header count when there is one; without
    it, a line counts when its node id looks like one (has ``::`` or a file suffix).
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
        typed = _IDENTIFIER_PREFIX.match(reason)
        if typed:
            failures.append(PytestFailure(nodeid, outcome, typed.group("type"), typed.group("msg")))
        else:
            failures.append(PytestFailure(nodeid, outcome, None, reason))
    return failures


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


# --- frame keys ---------------------------------------------------------------------------------

_STDLIB = re.compile(r"/lib/python\d+(?:\.\d+)?t?/|/python\d*/lib/", re.IGNORECASE)


def frame_key(filename: str, function: str, roots: Sequence[str]) -> str:
    """``file:function`` for one frame, the file written so that it is the same in every workspace.

    A file under one of ``roots`` (the capture's cwd and the replay's temporary workspace differ)
    is made relative to the longest such root; one in ``site-packages``/``dist-packages`` keeps what
    follows that; one in the standard library keeps what follows ``lib/pythonX.Y/``; anything else
    is reduced to its base name. Line numbers are never part of it.
    """
    path = filename.replace("\\", "/")
    file = None
    for root in sorted((r.replace("\\", "/").rstrip("/") for r in roots if r), key=len, reverse=True):
        if path.startswith(root + "/"):
            file = path[len(root) + 1 :]
            break
    if file is None:
        packages = max(path.rfind("site-packages/"), path.rfind("dist-packages/"))
        stdlib = list(_STDLIB.finditer(path))
        if packages >= 0:
            file = path[packages:].split("/", 1)[1]
        elif stdlib:
            file = path[stdlib[-1].end() :]
        else:
            file = path.rsplit("/", 1)[-1]
    return f"{file}:{function}"


# --- metrics ------------------------------------------------------------------------------------

_METRIC_VALUE = r"[-+]?(?:(?i:nan|inf(?:inity)?)|\d+(?:\.\d*)?(?:[eE][-+]?\d+)?|\.\d+(?:[eE][-+]?\d+)?)"


def read_metrics(
    stdout: str, names: Iterable[str], metrics_file: str | Path | None = None
) -> dict[str, float]:
    """The last value of each named metric in the output and/or a JSON metrics file.

    Output lines may read ``loss=3.2``, ``loss: 3.2``, ``step 5 loss=inf``, ``{'loss': 0.5}`` or
    ``loss=tensor(0.5)``; ``val_loss`` and ``train/loss`` are not ``loss``. The file is one JSON
    object of name → number, or JSON Lines of such objects; a missing file or an unreadable line
    (a run killed mid-write) is skipped. Where both have a value, the file wins.
    """
    wanted = list(dict.fromkeys(names))
    text = strip_ansi(stdout)
    values: dict[str, float] = {}
    for name in wanted:
        pattern = re.compile(
            rf"(?<![\w./-]){re.escape(name)}['\"]?\s*[=:]\s*(?:[A-Za-z_][\w.]*\()?(?P<v>{_METRIC_VALUE})(?!\w)"
        )
        last = _last_match(pattern, text)
        if last is not None:
            values[name] = float(last.group("v"))
    if metrics_file is not None:
        for record in _metric_records(Path(metrics_file)):
            for name in wanted:
                value = _as_float(record.get(name))
                if value is not None:
                    values[name] = value
    return values


def _metric_records(path: Path) -> list[dict[str, Any]]:
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return []
    try:
        docs = [json.loads(text)]
    except ValueError:
        docs = []
        for line in text.splitlines():
            try:
                docs.append(json.loads(line))
            except ValueError:
                continue
    if len(docs) == 1 and isinstance(docs[0], list):
        docs = docs[0]
    return [doc for doc in docs if isinstance(doc, dict)]


def _as_float(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        return None
    try:
        return float(value)
    except ValueError:
        return None


def bound_violation(bound: MetricBound, value: float) -> Literal["above", "below", "nan"] | None:
    """How ``value`` breaks ``bound``, or None. NaN always breaks a declared metric, bounds or not:
    every comparison with NaN is false, so without this rule a NaN loss would pass."""
    if math.isnan(value):
        return "nan"
    if bound.above is not None and value > bound.above:
        return "above"
    if bound.below is not None and value < bound.below:
        return "below"
    return None


# --- fingerprints -------------------------------------------------------------------------------


@dataclass(frozen=True)
class FailureInfo:
    """How a run failed: the readable parts, the normalized signature, and its SHA-256."""

    kind: FailureKind
    exception_type: str | None
    message: str | None
    traceback: str | None
    test_id: str | None
    detail: str | None
    signature: str
    fingerprint: str
    exit_code: int | None = None
    signal: str | None = None

    def to_failure(self, duration_s: float = 0.0) -> Failure:
        """The manifest's record of this failure."""
        return Failure(
            kind=self.kind,
            exit_code=self.exit_code,
            signal=self.signal,
            exception_type=self.exception_type,
            message=self.message,
            traceback=self.traceback,
            test_id=self.test_id,
            detail=self.detail,
            fingerprint=self.fingerprint,
            signature=self.signature,
            duration_s=duration_s,
        )


def _info(kind: FailureKind, signature: str, **fields: Any) -> FailureInfo:
    digest = hashlib.sha256(signature.encode("utf-8")).hexdigest()
    defaults: dict[str, Any] = dict.fromkeys(("exception_type", "message", "traceback", "test_id", "detail"))
    return FailureInfo(kind=kind, signature=signature, fingerprint=digest, **{**defaults, **fields})


_ERROR_WORDS = ("error", "fatal", "failed", "abort", "exception", "panic")
_ASCII_LOWER = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")
# Kept in the manifest for people to read, not hashed: long enough for any real message.
_MAX_RAW_MESSAGE = 4_000


def fingerprint_failure(
    *,
    exit_code: int | None,
    stdout: str,
    stderr: str,
    roots: Sequence[str] = (),
    criteria: FailureCriteria | None = None,
    metrics: Mapping[str, float] | None = None,
    timed_out: bool = False,
) -> FailureInfo | None:
    """How the run failed under ``criteria``, or None when it did not fail.

    First match wins: a timeout; a metric out of bounds; a fail pattern; then, for a non-zero exit
    (when ``criteria.nonzero_exit``), pytest's summary, a Python traceback (stderr, else stdout), and
    last the exit status or signal with the last error-looking line of stderr. A negative
    ``exit_code`` is death by signal ``-exit_code``; ``None`` means no exit status is known.

    ``metrics`` are the values to check; when None they are read from stdout and stderr (the
    caller reads ``criteria.metrics_file``, since only it knows the run's directory).
    """
    criteria = criteria or FailureCriteria()
    if timed_out:
        return _info("timeout", "timeout", exit_code=exit_code, detail="the run passed its time limit")
    found = _metric_failure(criteria, metrics, stdout, stderr, exit_code)
    found = found or _pattern_failure(criteria, stdout, stderr, exit_code)
    if found is not None:
        return found
    if not criteria.nonzero_exit or not exit_code:
        return None
    signal_name = _signal_name(-exit_code) if exit_code < 0 else None
    # A Python exception that escapes exits with status 1; a process killed by a signal (SIGSEGV,
    # the OOM killer's SIGKILL) failed in that way, and a traceback in its output was handled
    # earlier. KeyboardInterrupt is the exception: Python prints it, then dies by SIGINT.
    if signal_name in (None, "SIGINT"):
        tests = parse_pytest_failures(stdout) or parse_pytest_failures(stderr)
        if tests:
            return _pytest_info(tests, exit_code)
        error = parse_python_traceback(stderr) or parse_python_traceback(stdout)
        if error is not None:
            return _python_info(error, _expand_roots(roots), exit_code, signal_name)
    return _exit_info(exit_code, signal_name, stdout, stderr)


def _metric_failure(
    criteria: FailureCriteria,
    metrics: Mapping[str, float] | None,
    stdout: str,
    stderr: str,
    exit_code: int | None,
) -> FailureInfo | None:
    if not criteria.metrics:
        return None
    if metrics is None:
        metrics = read_metrics(f"{stdout}\n{stderr}", [b.name for b in criteria.metrics])
    for bound in criteria.metrics:
        value = metrics.get(bound.name)
        how = None if value is None else bound_violation(bound, value)
        if value is None or how is None:
            continue
        limit = {"above": bound.above, "below": bound.below, "nan": None}[how]
        detail = f"{bound.name}={value}" + ("" if limit is None else f" ({how} the bound {limit})")
        return _info(
            "metric", f"metric|{_clean(bound.name)}|{how}", message=detail, detail=detail, exit_code=exit_code
        )
    return None


def _pattern_failure(
    criteria: FailureCriteria, stdout: str, stderr: str, exit_code: int | None
) -> FailureInfo | None:
    for raw in criteria.fail_patterns:
        try:
            pattern = re.compile(raw, re.MULTILINE)
        except re.error as exc:
            raise ConfigError(
                f"fail pattern {raw!r} is not a valid regular expression ({exc}); "
                "fix it or escape it with re.escape"
            ) from exc
        for text in (strip_ansi(stdout), strip_ansi(stderr)):
            match = pattern.search(text)
            if match is None:
                continue
            start = text.rfind("\n", 0, match.start()) + 1
            end = text.find("\n", match.start())
            line = text[start : end if end >= 0 else len(text)]
            signature = f"pattern|{_clean(raw)}|{normalize_message(line)}"
            return _info(
                "pattern", signature, message=line.strip()[:_MAX_RAW_MESSAGE], detail=raw, exit_code=exit_code
            )
    return None


def pytest_failure_info(tests: Sequence[PytestFailure], exit_code: int = 1) -> FailureInfo:
    """The failure of a pytest run whose short summary listed ``tests``, as `fingerprint_failure`
    sees it. Filter the list first to fingerprint one test of a run where several failed."""
    if not tests:
        raise ConfigError("a pytest failure needs at least one FAILED/ERROR summary line")
    return _pytest_info(list(tests), exit_code)


def _pytest_info(tests: list[PytestFailure], exit_code: int) -> FailureInfo:
    entries = sorted({_pytest_entry(t) for t in tests})
    first = min(tests, key=lambda t: t.nodeid)
    return _info(
        "test",
        "pytest|" + " ; ".join(entries),
        exception_type=first.exception_type,
        message=first.message[:_MAX_RAW_MESSAGE],
        test_id=first.nodeid,
        detail="\n".join(f"{t.outcome.upper()} {t.nodeid}" for t in tests),
        exit_code=exit_code,
    )


def _pytest_entry(test: PytestFailure) -> str:
    message = test.message
    # pytest cuts summary messages to the terminal width with "..."; the cut itself is not the failure.
    if message.endswith("..."):
        message = message[:-3]
    return f"{_clean(test.nodeid)}|{_clean(test.exception_type or '')}|{normalize_message(message)}"


def _python_info(
    error: PythonError, roots: Sequence[str], exit_code: int, signal_name: str | None
) -> FailureInfo:
    keys: list[str] = []
    for frame in error.frames:
        key = _clean(frame_key(frame.filename, frame.function, roots))
        # Recursion prints a varying number of identical frames; one stands for all.
        if not keys or keys[-1] != key:
            keys.append(key)
    signature = f"python|{_clean(error.exception_type)}|{normalize_message(error.message)}|{'>'.join(keys)}"
    return _info(
        "exception",
        signature,
        exception_type=error.exception_type,
        message=error.message[:_MAX_RAW_MESSAGE],
        traceback=error.text,
        exit_code=exit_code,
        signal=signal_name,
    )


def _exit_info(exit_code: int, signal_name: str | None, stdout: str, stderr: str) -> FailureInfo:
    line = _last_error_line(stderr) if stderr.strip() else _last_error_line(stdout)
    status = f"signal:{signal_name}" if signal_name else f"exit:{exit_code}"
    return _info(
        "signal" if signal_name else "exit",
        f"{status}|{normalize_message(line)}",
        message=line.strip()[:_MAX_RAW_MESSAGE] or None,
        detail=status,
        exit_code=exit_code,
        signal=signal_name,
    )


def _last_error_line(text: str) -> str:
    text = strip_ansi(text)
    # str.rfind on the lowered text instead of a regex per line: logs of training runs can be
    # tens of megabytes, and this runs on every replay.
    lowered = text.translate(_ASCII_LOWER)  # str.lower() may change the length ("İ")
    at = max(lowered.rfind(word) for word in _ERROR_WORDS)
    if at < 0:
        at = len(text.rstrip()) - 1
    start = max(text.rfind("\n", 0, at), text.rfind("\r", 0, at)) + 1
    ends = [i for i in (text.find("\n", at), text.find("\r", at)) if i >= 0]
    return text[start : min(ends, default=len(text))].strip()


def _signal_name(number: int) -> str:
    try:
        return signals.Signals(number).name
    except ValueError:
        return f"SIG{number}"


def _expand_roots(roots: Sequence[str]) -> list[str]:
    # A traceback prints the path the program was started with, which may be a symlinked spelling
    # of the workspace (/tmp vs /private/tmp); accept both.
    expanded: list[str] = []
    for root in roots:
        expanded.append(root)
        real = os.path.realpath(root)
        if real != root:
            expanded.append(real)
    return expanded
