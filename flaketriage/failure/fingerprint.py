"""Failure fingerprints: the normalized signature of how a run failed, and its SHA-256.

A replay runs in another directory, at other addresses, with other temp names and timings; the
signature keeps what identifies a failure (exception type, message shape, code path) and masks
what varies, so "same fingerprint" means "same failure".
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import re
import signal as signals
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from flaketriage.bundle.manifest import Failure, FailureCriteria
from flaketriage.errors import ConfigError, MetricsFileError
from flaketriage.failure.metrics import bound_violation, read_metrics
from flaketriage.failure.normalize import clean_line, collapse_long_reprs, normalize_message, strip_ansi
from flaketriage.failure.tracebacks import (
    PytestFailure,
    PythonError,
    parse_pytest_failures,
    parse_python_traceback,
)
from flaketriage.process.hangs import STUCK_FRAMES, HangDump, frame_function

FailureKind = Literal["exception", "exit", "signal", "pattern", "metric", "timeout", "test"]

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
    earlier_signatures: tuple[str, ...] = ()
    """This failure's signature as earlier releases wrote it, where that differs: a bundle captured
    by one of them still matches its replays (`as_of`)."""
    identity: str | None = None
    """The key of its case where that is not `fingerprint` (`Failure.identity`): a pytest test's
    exception through its code path (`exception_identity`)."""

    def as_of(self, fingerprint: str) -> FailureInfo | None:
        """This failure under the signature whose hash is `fingerprint` (a bundle's): itself, or
        itself with an earlier signature the bundle was captured with; None when neither matches."""
        if fingerprint == self.fingerprint:
            return self
        for signature in self.earlier_signatures:
            if hashlib.sha256(signature.encode("utf-8")).hexdigest() == fingerprint:
                return dataclasses.replace(self, signature=signature, fingerprint=fingerprint)
        return None

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
            identity=self.identity,
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
    metrics_dir: str | os.PathLike[str] | None = None,
    hang: HangDump | None = None,
) -> FailureInfo | None:
    """How the run failed under ``criteria``, or None when it did not fail.

    First match wins: a timeout (with `hang`, the stacks dumped before it was killed, the signature
    names the frames it was stuck in: `hang_info`); a metric out of bounds; a fail pattern; then, for
    a non-zero exit (when ``criteria.nonzero_exit``), pytest's summary, a Python traceback (stderr,
    else stdout), and last the exit status or signal with the last error-looking line of stderr. A negative
    ``exit_code`` is death by signal ``-exit_code``; ``None`` means no exit status is known.

    ``metrics`` are the values to check; when None they are read from stdout and stderr, and from
    ``criteria.metrics_file`` under ``metrics_dir`` (the run's directory). A metrics file that
    cannot be read is a ``metric`` failure (``metric|file|<reason>``) unless the run failed in
    another way: an unevaluated criterion never passes, but a crash is the more telling failure.
    """
    criteria = criteria or FailureCriteria()
    if timed_out:
        return hang_info(hang, _expand_roots(roots), exit_code)
    unreadable: MetricsFileError | None = None
    if criteria.metrics and metrics is None:
        try:
            metrics = _read_run_metrics(criteria, stdout, stderr, metrics_dir)
        except MetricsFileError as exc:
            unreadable = exc
            metrics = read_metrics(f"{stdout}\n{stderr}", [b.name for b in criteria.metrics])
    found = _metric_failure(criteria, metrics, stdout, stderr, exit_code)
    found = found or _pattern_failure(criteria, stdout, stderr, exit_code)
    if found is not None:
        return found
    if not criteria.nonzero_exit or not exit_code:
        return _unreadable_metrics(unreadable, criteria, exit_code)
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


def hang_info(hang: HangDump | None, roots: Sequence[str], exit_code: int | None = None) -> FailureInfo:
    """The failure of a run that passed its time limit.

    With the stacks dumped before it was killed, the signature is ``timeout|`` and the innermost
    `STUCK_FRAMES` frames its main thread was stuck in (outermost first, each as `frame_key`
    writes it), so two hangs in the same place are one failure and a hang elsewhere another; the
    dump is the traceback. Without a dump (not a Python program, nothing could trace it) it is
    plain ``timeout``.
    """
    stuck = hang.stuck() if hang is not None else ()
    if hang is None or not stuck:
        return _info("timeout", "timeout", exit_code=exit_code, detail="the run passed its time limit")
    keys: list[str] = []
    for frame in reversed(stuck[:STUCK_FRAMES]):
        key = clean_line(frame_key(frame.filename, frame_function(frame.function), roots))
        if not keys or keys[-1] != key:
            keys.append(key)
    innermost = stuck[0]
    where = f"{frame_key(innermost.filename, frame_function(innermost.function), roots)}"
    if innermost.lineno is not None:
        where += f" (line {innermost.lineno})"
    return _info(
        "timeout",
        "timeout|" + ">".join(keys),
        traceback=hang.text(),
        detail=f"the run passed its time limit, stuck in {where}",
        message=f"hung in {where}",
        exit_code=exit_code,
    )


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
            "metric",
            f"metric|{clean_line(bound.name)}|{how}",
            message=detail,
            detail=detail,
            exit_code=exit_code,
        )
    return None


def _read_run_metrics(
    criteria: FailureCriteria, stdout: str, stderr: str, metrics_dir: str | os.PathLike[str] | None
) -> dict[str, float]:
    names = [b.name for b in criteria.metrics]
    metrics_file = None
    if criteria.metrics_file is not None and metrics_dir is not None:
        metrics_file = os.path.join(metrics_dir, criteria.metrics_file)
    return read_metrics(f"{stdout}\n{stderr}", names, metrics_file)


def _unreadable_metrics(
    problem: MetricsFileError | None, criteria: FailureCriteria, exit_code: int | None
) -> FailureInfo | None:
    if problem is None:
        return None
    # Named as declared (cwd-relative), so capture and replay describe the same file the same way.
    shown = MetricsFileError(criteria.metrics_file or problem.path, problem.reason, problem.detail)
    return _info(
        "metric", f"metric|file|{problem.reason}", message=str(shown), detail=str(shown), exit_code=exit_code
    )


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
            signature = f"pattern|{clean_line(raw)}|{normalize_message(line)}"
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
    signature = _pytest_signature(tests)
    # Bundles captured by earlier releases: before the type pytest leaves out was read (a bare
    # assert's AssertionError) it was empty, and before long reprs were collapsed they stayed whole.
    untyped = [t.untyped() for t in tests]
    earlier = [
        _pytest_signature(untyped),
        _pytest_signature(untyped, collapse=False),
        _pytest_signature(tests, collapse=False),
    ]
    first = min(tests, key=lambda t: t.nodeid)
    return _info(
        "test",
        signature,
        earlier_signatures=tuple(e for e in dict.fromkeys(earlier) if e != signature),
        exception_type=first.exception_type,
        message=(first.whole_message or first.message)[:_MAX_RAW_MESSAGE],
        test_id=first.nodeid,
        detail="\n".join(f"{t.outcome.upper()} {t.nodeid}" for t in tests),
        exit_code=exit_code,
    )


def _pytest_signature(tests: Sequence[PytestFailure], *, collapse: bool = True) -> str:
    return "pytest|" + " ; ".join(sorted({_pytest_entry(t, collapse=collapse) for t in tests}))


def _pytest_entry(test: PytestFailure, *, collapse: bool = True) -> str:
    message = test.message
    # pytest cuts summary messages to the terminal width with "..."; the cut itself is not the failure.
    if message.endswith("..."):
        message = message[:-3]
    if collapse:  # what an assertion prints of the state it compares varies with the tests before
        message = collapse_long_reprs(message)
    return f"{clean_line(test.nodeid)}|{clean_line(test.exception_type or '')}|{normalize_message(message)}"


def _python_info(
    error: PythonError, roots: Sequence[str], exit_code: int, signal_name: str | None
) -> FailureInfo:
    keys: list[str] = []
    for frame in error.frames:
        key = clean_line(frame_key(frame.filename, frame.function, roots))
        # Recursion prints a varying number of identical frames; one stands for all.
        if not keys or keys[-1] != key:
            keys.append(key)
    signature = (
        f"python|{clean_line(error.exception_type)}|{normalize_message(error.message)}|{'>'.join(keys)}"
    )
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
        detail=_pytest_refusal(exit_code, stdout, stderr) or status,
        exit_code=exit_code,
        signal=signal_name,
    )


# pytest's exit statuses for a run that tested nothing (`ExitCode.USAGE_ERROR`, `NO_TESTS_COLLECTED`).
_PYTEST_REFUSALS = {4: "pytest usage error", 5: "pytest collected no tests"}
# pytest writes each usage error as "ERROR: <why>" (`ERROR: not found: t.py::test_x`); for an
# unknown option the why follows on argparse's "<prog>: error: <why>" line, not its "usage:" line.
_PYTEST_USAGE = re.compile(r"^(?:ERROR: (?!usage: )\S.*|\S.*?: error: \S.*)$", re.MULTILINE)
# The closing line of a session that ran nothing: "=== no tests ran in 0.10s ===", "=== 2 deselected ... ===".
_PYTEST_NOTHING = re.compile(
    r"^=+ (?P<what>(?:no tests ran|\d+ deselected)\b.*?)(?: in [\d.]+s\b.*?)? =+\s*$", re.MULTILINE
)
_MAX_REFUSAL_LINES = 5


def _pytest_refusal(exit_code: int, stdout: str, stderr: str) -> str | None:
    """``exit:4 (pytest usage error): ERROR: not found: ...`` for a pytest run that tested nothing,
    with pytest's own reasons; None for any other exit (or output pytest did not write)."""
    what = _PYTEST_REFUSALS.get(exit_code)
    if what is None:
        return None
    texts = [strip_ansi(stderr), strip_ansi(stdout)]
    reasons = [m.group(0).strip() for text in texts for m in _PYTEST_USAGE.finditer(text)]
    if not reasons:
        ends = [m.group("what").strip() for text in texts for m in _PYTEST_NOTHING.finditer(text)]
        reasons = ends[-1:]
    if not reasons:
        return None
    return (f"exit:{exit_code} ({what}): " + "; ".join(reasons[:_MAX_REFUSAL_LINES]))[:_MAX_RAW_MESSAGE]


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


def fingerprint_exception(
    exception_type: str, message: str, frames: Sequence[tuple[str, str]], roots: Sequence[str] = ()
) -> FailureInfo:
    """The fingerprint of a Python exception reported by something other than its output (a Sentry
    event): `frames` are ``(filename, function)`` pairs, oldest first, as a traceback prints them.

    The same exception through the same code path gets the same fingerprint as a captured run's
    traceback, so a production error and a CI failure of one bug land on one case.
    """
    from flaketriage.failure.tracebacks import Frame

    error = PythonError(
        exception_type=exception_type,
        message=message,
        frames=tuple(Frame(filename=f, function=fn, lineno=0) for f, fn in frames),
        text="",
    )
    info = _python_info(error, [r for r in roots if r], 1, None)
    return dataclasses.replace(info, traceback=None, exit_code=None)


def exception_identity(
    exception_type: str, message: str, frames: Sequence[tuple[str, str]], roots: Sequence[str]
) -> str | None:
    """The case identity of a failing test: the fingerprint `fingerprint_exception` gives its
    exception through `frames` (the test function's on), so the failure is one case with a Sentry
    event or a captured program that raised it the same way. None when nothing identifies it
    (no exception type, no frames): then the fingerprint stands for it."""
    if not exception_type or not frames:
        return None
    return fingerprint_exception(exception_type, message, frames, _expand_roots(roots)).fingerprint
