"""The bundle of one failing pytest test: the command that reruns it alone, and its fingerprint.

The fingerprint must be the one a replay computes from the rerun's own output, so it is computed
from the short-summary lines that rerun prints (``FAILED nodeid - Type: message``), written here
the way pytest writes them under the rerun's settings: no colour, ``COLUMNS`` fixed in the recorded
environment, the original verbosity. Imported by the pytest plugin at the first failure only.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, TypeGuard

from flaketriage.bundle.manifest import DataInput, PytestContext
from flaketriage.capture.record import record_failure
from flaketriage.capture.source import SourceLimits, SourcePlan, plan_source
from flaketriage.failure.fingerprint import FailureInfo, exception_identity, fingerprint_failure
from flaketriage.settings import Settings
from flaketriage.store import open_store

SUMMARY_WIDTH = 1000
"""``COLUMNS`` of every rerun: pytest cuts summary messages to the terminal width, and a fixed,
wide one makes the cut (when there is one) the same in the capture and in every replay."""

SUMMARY_HEADER = "=========================== short test summary info ============================"

# Set by pytest (or pytest-xdist) for the running test or worker; a rerun must not inherit them.
_PROCESS_VARS = (
    "PYTEST_CURRENT_TEST",
    "PYTEST_XDIST_WORKER",
    "PYTEST_XDIST_WORKER_COUNT",
    "PYTEST_XDIST_TESTRUNUID",
)


class FailedReport(Protocol):
    """What the capture reads from a pytest ``TestReport`` (a protocol, so pytest stays unimported)."""

    @property
    def when(self) -> str | None: ...
    @property
    def duration(self) -> float: ...
    @property
    def longrepr(self) -> Any: ...
    @property
    def sections(self) -> list[tuple[str, str]]: ...
    @property
    def longreprtext(self) -> str: ...


@dataclass(frozen=True)
class SessionFacts:
    """What every bundle of one pytest session shares."""

    invocation_dir: Path
    rootdir: Path
    verbose: int
    force_short_summary: bool
    started_ns: int
    """When the session started: files modified since are outputs of the tests, not source."""
    randomly_seed: int | None = None
    """pytest-randomly's seed when that plugin shuffled the session."""
    randomly_seed_pinned: bool = False
    """Whether the session's own options set that seed (else pytest-randomly drew it)."""
    plugins: tuple[str, ...] = ()
    """Plugins the command line loaded by name (``-p NAME``): with autoloading off
    (``PYTEST_DISABLE_PLUGIN_AUTOLOAD``) the rerun loads them the same way."""
    repeat: tuple[int, str] | None = None
    """pytest-repeat's ``--count`` and ``--repeat-scope`` when it repeated the tests: its ids
    (``test_x[2-3]``) exist only under the same options."""
    xdist: bool = False
    """pytest-xdist was loaded: the rerun runs in one process (``-n 0``) whatever ``addopts`` say."""

    def plugin_options(self) -> list[str]:
        """The options that give the rerun the session's plugins and their ids."""
        options: list[str] = []
        for name in self.plugins:
            options += ["-p", name]
        if self.repeat is not None:
            count, scope = self.repeat
            options += [*(() if "repeat" in self.plugins else ("-p", "repeat")), f"--count={count}"]
            options.append(f"--repeat-scope={scope}")
        if self.xdist:
            options += ["-n", "0"]
        return options


@dataclass(frozen=True)
class FailedTest:
    """One failing test, as the plugin saw it."""

    nodeid: str
    """The id as the rerun command names it: relative to the invocation directory."""
    reports: Sequence[FailedReport]
    preceding: Sequence[str]
    """Ids (same form) of the tests that ran before it in this process, in order."""
    following: Sequence[str] = ()
    """Ids (same form) of the tests the session was still to run after it, in order."""
    elapsed_s: float = 0.0
    """Seconds from the session's start to the end of this test."""
    annotations: Mapping[str, Any] = field(default_factory=dict)
    """Free-form extras for the manifest's ``annotations``."""
    data: Sequence[DataInput] = ()
    """The data the test declared, already stored (`flaketriage.ci.pytest_data`)."""


def rerun_argv(nodeid: str, facts: SessionFacts) -> list[str]:
    """``python -m pytest OPTIONS -- NODEID``: the settings every replay runs it under, then the test.

    pytest puts ini ``addopts`` and ``PYTEST_ADDOPTS`` in front of the command line, so whatever
    follows them is read as their continuation: after an option whose value is optional (``--cov``)
    a node id right behind them would be taken as its value, and the rerun would run every test.
    Options come first, and ``--`` ends them: the node ids after it are only ever node ids. The
    polluter search puts earlier tests just before NODEID (after the ``--``)."""
    argv = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-rfE", "--color=no"]
    if facts.randomly_seed is not None:
        # The same seed reseeds `random` (and numpy, faker...) for each test the same way; keeping
        # the order as given lets the polluter search choose it.
        argv += [f"--randomly-seed={facts.randomly_seed}", "--randomly-dont-reorganize"]
    else:
        argv += ["-p", "no:randomly"]
    if facts.verbose:
        # Verbosity changes assertion messages (how much of a long value they show).
        argv.append("-" + ("v" if facts.verbose > 0 else "q") * abs(facts.verbose))
    if facts.force_short_summary:
        argv.append("--force-short-summary")
    argv += facts.plugin_options()
    return [*argv, "--", nodeid]


def rerun_env(environ: Mapping[str, str]) -> dict[str, str]:
    """The environment recorded for the rerun: this one, less pytest's per-process variables."""
    env = {k: v for k, v in environ.items() if k not in _PROCESS_VARS}
    env["COLUMNS"] = str(SUMMARY_WIDTH)
    return env


def _on_ci(env: Mapping[str, str]) -> bool:
    # pytest never cuts summary messages on CI (its `running_on_ci`): the same variables, read from
    # the environment the rerun gets.
    return any(env.get(name) for name in ("CI", "BUILD_NUMBER"))


def _width(text: str) -> int:
    try:
        from _pytest._io.wcwidth import wcswidth
    except ImportError:  # pragma: no cover - pytest moved it; ASCII messages measure the same
        return len(text)
    return wcswidth(text)


def _trimmed(msg: str, available: int) -> str | None:
    """pytest's ``_format_trimmed(" - {}", msg, available)``: the first line, cut with "..."."""
    msg = msg.split("\n", 1)[0]
    if available < 3 + 3:
        return None
    if 3 + _width(msg) > available:
        available -= 3
        msg = msg[:available]
        while 3 + _width(msg) > available:
            msg = msg[:-1]
        msg += "..."
    return f" - {msg}"


def summary_line(report: FailedReport, nodeid: str, env: Mapping[str, str], facts: SessionFacts) -> str:
    """The line the rerun prints for this report in its short test summary."""
    word = "FAILED" if report.when == "call" else "ERROR"
    line = f"{word} {nodeid}"
    longrepr = report.longrepr
    if isinstance(longrepr, str):
        msg: str | None = longrepr
    else:
        msg = getattr(getattr(longrepr, "reprcrash", None), "message", None)
    if msg is None:
        return line
    if (_on_ci(env) or facts.verbose >= 2) and not facts.force_short_summary:
        return f"{line} - {msg}"
    tail = _trimmed(msg, SUMMARY_WIDTH - _width(line))
    return line + (tail or "")


def summary_lines(failure: FailedTest, env: Mapping[str, str], facts: SessionFacts) -> list[str]:
    """The rerun's short test summary for this test: failures first, then errors (``-rfE``)."""
    lines = [summary_line(r, failure.nodeid, env, facts) for r in failure.reports]
    return sorted(lines, key=lambda line: not line.startswith("FAILED"))


def failure_info(failure: FailedTest, env: Mapping[str, str], facts: SessionFacts) -> FailureInfo:
    """The failure a replay of the rerun command sees: parsed from the same summary text."""
    summary = "\n".join([SUMMARY_HEADER, *summary_lines(failure, env, facts)]) + "\n"
    info = fingerprint_failure(exit_code=1, stdout=summary, stderr="")
    if info is None:  # pragma: no cover - the summary always names the test
        raise AssertionError(f"no failure parsed from {summary!r}")
    traceback = "\n\n".join(r.longreprtext for r in failure.reports if r.longreprtext)
    return dataclasses.replace(info, traceback=traceback or None, identity=case_identity(failure, facts))


def case_identity(failure: FailedTest, facts: SessionFacts) -> str | None:
    """The test's case identity: its first exception (as the plugin read it at the report,
    ``flaketriage_exception``) through its frames, files relative to the rootdir as a Sentry event's
    and a captured program's are (`exception_identity`). None, so the fingerprint stands for it,
    when no report carries one: an XPASS(strict), or an exception whose frames could not be read."""
    for report in failure.reports:
        raised = getattr(report, "flaketriage_exception", None)
        if _is_raised(raised):
            kind, message, frames = raised
            return exception_identity(kind, message, [(f, fn) for f, fn in frames], [str(facts.rootdir)])
    return None


def _is_raised(value: object) -> TypeGuard[tuple[str, str, Sequence[Sequence[str]]]]:
    """Whether `value` has the shape `flaketriage.ci.pytest_plugin.raised` gives (lists, not tuples,
    once a pytest-xdist worker sent it on)."""
    if not isinstance(value, tuple | list) or len(value) != 3:
        return False
    kind, message, frames = value
    return (
        isinstance(kind, str)
        and isinstance(message, str)
        and isinstance(frames, tuple | list)
        and all(
            isinstance(f, tuple | list) and len(f) == 2 and all(isinstance(x, str) for x in f) for f in frames
        )
    )


def _logs(failure: FailedTest, summary: Sequence[str]) -> tuple[str, str]:
    """The test's output as pytest shows it: sections, the failure, the summary lines."""
    out: list[str] = []
    err: list[str] = []
    seen: set[tuple[str, str]] = set()
    for report in failure.reports:
        for title, text in report.sections:
            if (title, text) in seen:  # each phase's report repeats the earlier phases' sections
                continue
            seen.add((title, text))
            (err if "stderr" in title else out).append(f"----- {title} -----\n{text}")
    out += [r.longreprtext for r in failure.reports if r.longreprtext]
    out += [SUMMARY_HEADER, *summary]
    return "\n".join(out) + "\n", "\n".join(err) + ("\n" if err else "")


class SessionCapture:
    """Writes one bundle per failing test into the store; the source is listed once per session."""

    def __init__(self, store_url: str, facts: SessionFacts, settings: Settings) -> None:
        self.store = open_store(store_url, shared=settings.store_shared, settings=settings)
        self.facts = facts
        self.settings = settings
        self._plan: SourcePlan | None = None

    def plan(self) -> SourcePlan:
        """The session's source, without what its tests wrote: the same for every failure."""
        if self._plan is None:
            plan = plan_source(self.facts.invocation_dir)
            # Listed now, after tests ran; a file written or changed since the session started is
            # an output (a test that writes a file another reads is order-dependent, and a replay
            # that found the file already there would hide that).
            kept = {name: st for name, st in plan.files.items() if st[1] < self.facts.started_ns}
            self._plan = dataclasses.replace(plan, files=kept)
        return self._plan

    def capture(self, failure: FailedTest, environ: Mapping[str, str] | None = None) -> str:
        """Write the bundle for one failing test; returns its id."""
        env = rerun_env(os.environ if environ is None else environ)
        info = failure_info(failure, env, self.facts)
        stdout, stderr = _logs(failure, summary_lines(failure, env, self.facts))
        duration = sum(r.duration for r in failure.reports)
        seeds: dict[str, int | str] = {}
        drawn: tuple[str, ...] = ()
        if self.facts.randomly_seed is not None:
            seeds["pytest-randomly"] = self.facts.randomly_seed
            drawn = () if self.facts.randomly_seed_pinned else ("pytest-randomly",)
        context = PytestContext(
            node_id=failure.nodeid,
            preceding=tuple(failure.preceding),
            following=tuple(failure.following),
            rootdir=str(self.facts.rootdir),
            invocation_dir=str(self.facts.invocation_dir),
            duration_s=round(duration, 3),
            elapsed_s=round(failure.elapsed_s, 3),
        )
        return record_failure(
            self.store,
            info,
            argv=rerun_argv(failure.nodeid, self.facts),
            cwd=self.facts.invocation_dir,
            kind="test",
            limits=SourceLimits.from_settings(self.settings),
            seed_values=seeds,
            seeds_drawn=drawn,
            stdout=stdout,
            stderr=stderr,
            annotations=failure.annotations,
            pytest=context,
            # pytest's start-up dominates a rerun of one test.
            timeout_s=max(60.0, 10 * duration),
            env=env,
            plan=self.plan(),
            data=failure.data,
        )
