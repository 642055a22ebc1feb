"""The flaketriage pytest plugin (registered under ``pytest11``; off unless enabled).

Enabled by ``--flaketriage``, the ini option ``flaketriage = true`` or ``FLAKETRIAGE_PYTEST=1``, and
never inside a replay (``FLAKETRIAGE_REPLAY=1``). Then every failing test becomes a bundle (the
command that reruns it alone, seeds, output, traceback, and the tests that ran before it in this
process, and the data it declared: `flaketriage.ci.pytest_data`); a failing test on the quarantine
list (fetched at session start when it comes from the service) is reported as quarantined and does
not fail the session, unless its entry is limited to another variant (``gpu=...``: the session's is
read once, when first needed, `flaketriage.ci.quarantine_list.run_variant`; the results sent share it)
or to another failure (its signatures), when it fails as usual and the summary says why; and the
session ends with one summary line.

Only pytest, the standard library, `flaketriage.process.replay_env` and `flaketriage.ci.pytest_data`
(standard library only) are imported here. The capture code (pydantic, the store) is imported
at the first failure, so a passing suite pays one list append per test.
"""

from __future__ import annotations

import inspect
import os
import shlex
import sys
import time
from collections.abc import Callable, Generator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import _pytest
import pluggy
import pytest

from flaketriage.ci.pytest_data import INI, MARKER, MARKER_HELP, BuiltData
from flaketriage.ci.pytest_results import SessionResults
from flaketriage.process.replay_env import in_replay

if TYPE_CHECKING:
    from flaketriage.bundle.manifest import DataInput
    from flaketriage.ci.pytest_bundle import SessionCapture
    from flaketriage.ci.quarantine_list import QuarantineList
    from flaketriage.settings import Settings
    from flaketriage.variant import Variant

ENABLE_ENV = "FLAKETRIAGE_PYTEST"
QUARANTINE_URL_ENV = "FLAKETRIAGE_QUARANTINE_URL"
QUARANTINED = "quarantined"
BUILT_DATA = pytest.StashKey[BuiltData]()


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("flaketriage", "flaketriage: capture failing tests, enforce the quarantine")
    group.addoption(
        "--flaketriage",
        action="store_true",
        default=False,
        help="Capture every failing test into a flaketriage bundle and enforce the quarantine list.",
    )
    group.addoption(
        "--flaketriage-store",
        default=None,
        metavar="PATH|URL",
        help="Store for the bundles: a directory or a store URL (default: FLAKETRIAGE_STORE, or "
        "./.flaketriage).",
    )
    parser.addini("flaketriage", type="bool", default=False, help="Enable the flaketriage plugin.")
    parser.addini(
        INI,
        type="linelist",
        default=[],
        help="Data files, directories or globs (relative to the rootdir) every test reads: stored in "
        "the bundle of each failure and minimized, as `flaketriage capture --data` does.",
    )


def enabled(config: pytest.Config, environ: Mapping[str, str] = os.environ) -> bool:
    """Whether this session captures: asked for, and not itself a flaketriage replay."""
    if in_replay(environ):
        return False
    asked = environ.get(ENABLE_ENV, "").strip().lower() in ("1", "true", "yes", "on")
    return bool(config.getoption("flaketriage") or config.getini("flaketriage") or asked)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", MARKER_HELP)  # also on when off: --strict-markers suites
    if enabled(config):
        config.pluginmanager.register(FlaketriageSession(config), "flaketriage-session")


@pytest.fixture
def flaketriage_data(request: pytest.FixtureRequest) -> BuiltData:
    """Declare data the test builds: ``path = flaketriage_data.add(written)``, then read ``path``
    (inside a replay, the captured and maybe minimized copy)."""
    built = BuiltData(request.node.nodeid, request.config.invocation_params.dir)
    request.node.stash[BUILT_DATA] = built
    return built


@dataclass(frozen=True)
class Captured:
    nodeid: str
    bundle_id: str
    quarantined: bool


class FlaketriageSession:
    """The enabled plugin for one session: tracks the run order and captures each failing test."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.started_ns = time.time_ns()
        self.started = time.monotonic()
        self.ran: list[str] = []
        """Ids (relative to the invocation directory) of the tests finished so far, in order."""
        self._items: Sequence[pytest.Item] = ()
        self._collected: list[str] | None = None
        self.captured: list[Captured] = []
        self.quarantined: dict[str, str] = {}
        """node id → what the summary says about its quarantine."""
        self.unforgiven: dict[str, str] = {}
        """node id → why the quarantine entries naming it did not forgive its failure."""
        self._variant: Variant | None = None
        self._variant_read = False
        self.notes: list[str] = []
        self.sent: dict[str, str] = {}
        self.errors: list[str] = []
        """Refusals that retrying cannot fix, each naming the setting to change: the last lines."""
        self._failed: dict[str, list[pytest.TestReport]] = {}
        self.results = SessionResults()
        """Every test's outcome, sent to the service's CI history at the end (not by an xdist worker:
        its controller sees every report)."""
        self._worker = hasattr(config, "workerinput")
        self.results_sent: str | None = None
        self._data: dict[str, tuple[DataInput, ...]] = {}
        """node id → the data it declared, stored at its first failing report."""
        self._by_id: dict[str, pytest.Item] | None = None
        self._settings: Settings | None = None
        self._capture: SessionCapture | None = None
        self._quarantine: QuarantineList | None = None
        self._store_option: str | None = config.getoption("flaketriage_store") or None
        self.relative = nodeid_relative_to(config.invocation_params.dir, config.rootpath)

    # -- lazily built, at the first failure -----------------------------------------------------
    @property
    def settings(self) -> Settings:
        if self._settings is None:
            from flaketriage.settings import load_settings

            self._settings = load_settings()
        return self._settings

    @property
    def store_url(self) -> str:
        """The store's URL (``--flaketriage-store``, else ``FLAKETRIAGE_STORE``); a relative path is
        taken relative to the directory pytest was started in."""
        from flaketriage.store import store_url

        where = self._store_option or self.settings.store
        return store_url(where, relative_to=self.config.invocation_params.dir)

    def _quarantine_dir(self) -> Path:
        """Where the quarantine file and the cached service list live: in a local store, else beside
        ``FLAKETRIAGE_QUARANTINE_FILE`` (a `ConfigError` when that is not set)."""
        from flaketriage.store import local_path

        local = local_path(self.store_url)
        return local if local is not None else self.settings.resolved_quarantine_file().parent

    def _quarantine_list(self) -> QuarantineList:
        if self._quarantine is None:
            from flaketriage.ci.quarantine_list import load_quarantine

            self._quarantine, notes = load_quarantine(self.settings, self._quarantine_dir())
            self.notes += notes
        return self._quarantine

    def _run_variant(self) -> Variant | None:
        """The session's variant, read once; None when it cannot be told (a note says why)."""
        if not self._variant_read:
            self._variant_read = True
            try:
                from flaketriage.ci.quarantine_list import run_variant

                self._variant = run_variant(os.environ)
            except Exception as exc:  # the quarantine list must never fail the run
                self.notes.append(
                    f"cannot tell this run's variant ({exc}); quarantine entries limited to one do not apply"
                )
        return self._variant

    def _capturer(self) -> SessionCapture:
        if self._capture is None:
            from flaketriage.ci.pytest_bundle import SessionCapture, SessionFacts

            config = self.config
            randomly = config.pluginmanager.hasplugin("randomly")
            seed = config.getoption("randomly_seed", None) if randomly else None
            facts = SessionFacts(
                invocation_dir=config.invocation_params.dir,
                rootdir=config.rootpath,
                verbose=int(config.getoption("verbose") or 0),
                force_short_summary=bool(config.getoption("force_short_summary", False)),
                started_ns=self.started_ns,
                randomly_seed=seed if isinstance(seed, int) else None,
                randomly_seed_pinned=seed_pinned(_all_args(config)),
                plugins=named_plugins(config.invocation_params.args),
                repeat=_repeat(config),
                xdist=config.pluginmanager.hasplugin("xdist"),
            )
            self._capture = SessionCapture(self.store_url, facts, self.settings)
        return self._capture

    # -- hooks ----------------------------------------------------------------------------------
    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(
        self, item: pytest.Item, call: pytest.CallInfo[None]
    ) -> Generator[None, pytest.TestReport, pytest.TestReport]:
        # The exception itself is here only: the report keeps its text. What identifies it (type,
        # message, frames) goes along for the failure's case identity (`flaketriage.ci.pytest_bundle`).
        report = yield
        if report.failed and call.excinfo is not None:
            try:
                report.flaketriage_exception = raised(item, call.excinfo)  # type: ignore[attr-defined]
            except Exception as exc:  # the identity falls back to the fingerprint; the run goes on
                self.notes.append(f"cannot read the exception of {item.nodeid}: {type(exc).__name__}: {exc}")
        return report

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        # tryfirst: a quarantined failure is marked before the session counts it as failed.
        if not self._worker:
            self.results.add(self.relative(report.nodeid), report)
        if getattr(report, "node", None) is not None:
            return  # a pytest-xdist worker's report, already handled in that worker
        if report.failed:
            if report.nodeid not in self._failed:
                # Before its fixtures are torn down: a test's own temporary data is still there.
                self._store_data(report.nodeid)
            self._failed.setdefault(report.nodeid, []).append(report)
            self._check_quarantine(report)
        if report.when == "teardown":
            failed = self._failed.pop(report.nodeid, None)
            rel = self.relative(report.nodeid)
            if failed:
                self._record(rel, failed)
            self.ran.append(rel)

    def pytest_sessionstart(self, session: pytest.Session) -> None:
        # The service's list is asked for once, at the start, whether or not a test fails: a
        # conditional request (ETag), so an unchanged list costs a 304 (`quarantine_list`).
        if os.environ.get(QUARANTINE_URL_ENV, "").strip():
            try:
                self._quarantine_list()
            except Exception as exc:  # the quarantine list must never fail the run
                self.notes.append(f"cannot load the quarantine list: {type(exc).__name__}: {exc}")

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        self._items = session.items  # their ids are written out at the first failure, not here

    @property
    def collected(self) -> list[str]:
        """Ids (relative to the invocation directory) of the tests the session is to run, in order."""
        if self._collected is None:
            self._collected = [self.relative(item.nodeid) for item in self._items]
        return self._collected

    def _following(self, rel: str) -> list[str]:
        """The tests still to run after ``rel``: the rest of the collection when it runs in order,
        else (a pytest-xdist worker runs what it is handed) every collected test not run yet."""
        collected, here = self.collected, len(self.ran)
        if here < len(collected) and collected[here] == rel:
            return collected[here + 1 :]
        done = {*self.ran, rel}
        return [t for t in collected if t not in done]

    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_sessionfinish(self, session: pytest.Session) -> Generator[None]:
        # The outermost wrapper: events are sent first (the summary says how they went), and a
        # refusal that retrying cannot fix is written after pytest's stats line, as the last line.
        self._send()
        self._send_results()
        try:
            return (yield)
        finally:
            self._write_errors()

    def _send(self) -> None:
        if not self.captured:
            return
        try:
            send = self._sender()
        except Exception as exc:  # a broken sender must never fail the run
            self.notes.append(f"cannot load the event sender: {type(exc).__name__}: {exc}")
            send = None
        ids = [c.bundle_id for c in self.captured]
        if send is None:
            self.sent.update(dict.fromkeys(ids, "off"))
            return
        try:
            sending = send(self.settings, self._capturer().store, ids)
        except Exception as exc:  # sending must never fail the run
            self.sent.update(dict.fromkeys(ids, "error"))
            self.notes.append(f"could not send the events: {type(exc).__name__}: {exc}")
            return
        if sending is None:  # no FLAKETRIAGE_NOTIFY_URL
            self.sent.update(dict.fromkeys(ids, "off"))
            return
        self.sent.update({d.bundle_id: d.status for d in sending.deliveries})
        self.notes += sending.queued_lines()
        self.errors += sending.error_lines()

    def _send_results(self) -> None:
        """Every test's outcome to the service's CI history; never fails the run."""
        if self._worker or not self.results.tests:
            return
        if not any(
            os.environ.get(f"FLAKETRIAGE_{name}", "").strip() for name in ("NOTIFY_URL", "SERVICE_URL")
        ):
            return  # no service: the settings (pydantic) are not even loaded
        try:
            settings = self.settings
            if not settings.send_results or not settings.resolved_service_url():
                return
            from flaketriage.ci.pytest_results import send_results

            # The variant the quarantine is matched with, so that history and quarantine agree.
            upload = self.results.upload(
                settings,
                set(self.quarantined),
                cwd=self.config.invocation_params.dir,
                variant=self._run_variant(),
            )
            if upload is None:
                self.notes.append(
                    "the results were not sent: which repository is this? set FLAKETRIAGE_REPOSITORY"
                )
                return
            self.results_sent = send_results(upload, settings)
        except Exception as exc:  # sending must never fail the run
            self.notes.append(f"could not send the results: {type(exc).__name__}: {exc}")

    def _write_errors(self) -> None:
        if not self.errors:
            return
        lines = [f"flaketriage: error: {line}" for line in dict.fromkeys(self.errors)]
        reporter = self.config.pluginmanager.get_plugin("terminalreporter")
        for line in lines:
            if reporter is not None:
                reporter.write_line(line, red=True, bold=True)
            else:
                print(line, file=sys.stderr)

    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_terminal_summary(self, terminalreporter: Any) -> Generator[None]:
        # The outermost wrapper: written after pytest's short summary, just above the stats line.
        try:
            return (yield)
        finally:
            self._write_summary(terminalreporter)

    def _write_summary(self, terminalreporter: Any) -> None:
        write = terminalreporter.write_line
        for nodeid, what in self.quarantined.items():
            write(f"flaketriage: QUARANTINED {nodeid} - {what}", yellow=True)
        for nodeid, why in self.unforgiven.items():
            write(f"flaketriage: NOT QUARANTINED {nodeid} - {why}", red=True)
        for note in dict.fromkeys(self.notes):
            write(f"flaketriage: warning: {note}", yellow=True)
        if self.results_sent:
            write(f"flaketriage: CI history: {self.results_sent}")
        write(summary(self.captured, self.sent))

    # -- work -----------------------------------------------------------------------------------
    def _check_quarantine(self, report: pytest.TestReport) -> None:
        if getattr(report, "wasxfail", None) is not None:
            return  # an xfail that failed strictly, or already marked
        try:
            from flaketriage.ci.quarantine_list import describe

            rel = self.relative(report.nodeid)
            quarantine, ids = self._quarantine_list(), {report.nodeid, rel}
            fingerprint = self._fingerprint(report, rel)
            named = quarantine.document.naming(ids, fingerprint)
            if not named:
                return
            # The variant is read only for an entry limited to one: it may cost an nvidia-smi run.
            variant = self._run_variant() if any(e.variant for e in named) else None
            entry = quarantine.match(ids, fingerprint, variant=variant)
            if entry is None:
                self.unforgiven[rel] = quarantine.refused(ids, fingerprint, variant=variant) or "not covered"
                return
        except Exception as exc:  # the quarantine list must never fail the run
            self.notes.append(f"cannot check the quarantine list: {exc}")
            return
        what = describe(entry)
        # With `wasxfail` set the session does not count the failure (nor -x, nor --pdb), and the
        # teststatus hook above reports it as quarantined.
        report.wasxfail = f"quarantined: {what}"
        report.flaketriage_quarantined = what  # type: ignore[attr-defined]
        self.quarantined[rel] = what
        if not self.config.pluginmanager.has_plugin(QuarantineStatus.name):
            # Registered at the first quarantined failure, so a suite without one pays nothing.
            self.config.pluginmanager.register(QuarantineStatus(), QuarantineStatus.name)

    def _fingerprint(self, report: pytest.TestReport, rel: str) -> str | None:
        if not self._quarantine_list().entries:
            return None
        from flaketriage.ci.pytest_bundle import FailedTest, failure_info, rerun_env

        failure = FailedTest(nodeid=rel, reports=[report], preceding=())
        return failure_info(failure, rerun_env(os.environ), self._capturer().facts).fingerprint

    def _record(self, rel: str, reports: list[pytest.TestReport]) -> None:
        quarantined = any(getattr(r, "flaketriage_quarantined", None) for r in reports)
        annotations: dict[str, Any] = {}
        if quarantined:
            annotations["quarantined"] = self.quarantined.get(rel, True)
        try:
            from flaketriage.ci.pytest_bundle import FailedTest

            failure = FailedTest(
                nodeid=rel,
                reports=reports,
                preceding=list(dict.fromkeys(self.ran)),
                following=self._following(rel),
                elapsed_s=time.monotonic() - self.started,
                annotations=annotations,
                data=self._data.pop(reports[0].nodeid, ()),
            )
            bundle_id = self._capturer().capture(failure)
        except Exception as exc:  # a capture problem must never fail the run
            self.notes.append(f"could not capture {rel}: {type(exc).__name__}: {exc}")
            return
        self.captured.append(Captured(rel, bundle_id, quarantined))

    def _store_data(self, nodeid: str) -> None:
        """Store the data the test declared (marker, ini option, fixture), as ``capture --data``
        stores its inputs; what cannot be taken is a warning, never a failed run."""
        try:
            from flaketriage.ci.pytest_data import declared_data, store_declared

            if self._by_id is None:
                self._by_id = {item.nodeid: item for item in self._items}
            item = self._by_id.get(nodeid)
            built = item.stash.get(BUILT_DATA, None) if item is not None else None
            declared, notes = declared_data(
                marker_paths=[a for m in item.iter_markers(MARKER) for a in m.args] if item else [],
                ini_patterns=self.config.getini(INI),
                added=built.added if built is not None else (),
                rootdir=self.config.rootpath,
                invocation_dir=self.config.invocation_params.dir,
            )
            if declared:
                stored, more = store_declared(
                    self._capturer().store, declared, self.config.invocation_params.dir
                )
                self._data[nodeid], notes = stored, notes + more
        except Exception as exc:  # declared data must never fail the run
            notes = [f"could not store the data of {self.relative(nodeid)}: {type(exc).__name__}: {exc}"]
        self.notes += notes

    @staticmethod
    def _sender() -> Any:
        try:
            from flaketriage.ci import notify
        except ModuleNotFoundError as exc:
            if exc.name in ("flaketriage.ci.notify", "flaketriage.ci"):
                return None
            raise
        return getattr(notify, "send_bundles", None)


class QuarantineStatus:
    """Reports a quarantined failure as its own outcome: ``Q`` / ``QUARANTINED`` / "1 quarantined"."""

    name = "flaketriage-quarantine-status"

    @pytest.hookimpl(tryfirst=True)
    def pytest_report_teststatus(
        self, report: pytest.TestReport, config: pytest.Config
    ) -> tuple[str, str, tuple[str, Mapping[str, bool]]] | None:
        if report.failed and getattr(report, "flaketriage_quarantined", None):
            return QUARANTINED, "Q", ("QUARANTINED", {"yellow": True})
        return None


def named_plugins(args: Sequence[str]) -> tuple[str, ...]:
    """The plugins a command line loads with ``-p NAME`` / ``-pNAME`` (not the ``no:`` ones)."""
    names: list[str] = []
    for i, arg in enumerate(args):
        if arg == "-p":
            name = args[i + 1] if i + 1 < len(args) else ""
        elif arg.startswith("-p"):
            name = arg[2:]
        else:
            continue
        if name and not name.startswith("no:"):
            names.append(name)
    return tuple(dict.fromkeys(names))


def seed_pinned(args: Sequence[str]) -> bool:
    """Whether options set pytest-randomly's seed to a number (``--randomly-seed=N`` or
    ``--randomly-seed N``); ``last`` and ``default`` leave it drawn."""
    for i, arg in enumerate(args):
        value = None
        if arg.startswith("--randomly-seed="):
            value = arg.split("=", 1)[1]
        elif arg == "--randomly-seed" and i + 1 < len(args):
            value = args[i + 1]
        if value is not None and value.strip().isdigit():
            return True
    return False


def _all_args(config: pytest.Config) -> list[str]:
    """The session's options from the ini's addopts, PYTEST_ADDOPTS and the command line."""
    addopts = config.getini("addopts")
    args = list(addopts) if isinstance(addopts, list) else shlex.split(str(addopts or ""))
    args += shlex.split(os.environ.get("PYTEST_ADDOPTS", ""))
    return args + [str(a) for a in config.invocation_params.args]


def _repeat(config: pytest.Config) -> tuple[int, str] | None:
    """pytest-repeat's ``--count`` and scope when it repeats this session's tests."""
    if not config.pluginmanager.hasplugin("repeat"):
        return None
    count = config.getoption("count", 1)
    if not isinstance(count, int) or count <= 1:
        return None
    return count, str(config.getoption("repeat_scope", "function"))


Raised = tuple[str, str, tuple[tuple[str, str], ...]]
"""A failing test's exception type, message and ``(file, function)`` frames (`raised`): plain
tuples, so a pytest-xdist worker can send its report on."""
_UNQUALIFIED = ("builtins", "__main__")
_PYTEST_DIRS = tuple(os.path.dirname(m.__file__ or "") + os.sep for m in (_pytest, pluggy))


def raised(item: pytest.Item, excinfo: pytest.ExceptionInfo[BaseException]) -> Raised:
    """A failing test's exception as a traceback names it: the type (qualified as Python prints it),
    the message, and the ``(file, function)`` frames from the test function on (oldest first, a
    recursion's repeats as one); without the test function among them (a fixture's error), every
    frame but pytest's and pluggy's own."""
    kind = excinfo.type
    module = getattr(kind, "__module__", None)
    name = getattr(kind, "__qualname__", None) or kind.__name__
    qualified = name if not module or module in _UNQUALIFIED else f"{module}.{name}"
    try:
        message = str(excinfo.value)
    except Exception:  # a __str__ that raises: what the traceback module prints for it
        message = "<exception str() failed>"
    entries = list(excinfo.traceback)
    code = getattr(inspect.unwrap(getattr(item, "obj", None) or (lambda: None)), "__code__", None)
    starts = [i for i, entry in enumerate(entries) if entry.frame.code.raw is code]
    frames: list[tuple[str, str]] = []
    for entry in entries[starts[0] :] if starts else entries:
        path = str(entry.path)
        if not starts and path.startswith(_PYTEST_DIRS):
            continue
        frame = (path, entry.name)
        if not frames or frames[-1] != frame:
            frames.append(frame)
    return qualified, message, tuple(frames)


def nodeid_relative_to(invocation_dir: Path, rootdir: Path) -> Callable[[str], str]:
    """Node ids (relative to the root directory) as pytest prints them: relative to where it ran."""
    if invocation_dir == rootdir:
        return str

    def relative(nodeid: str) -> str:
        path, sep, rest = nodeid.partition("::")
        rel = os.path.relpath(rootdir / path, invocation_dir).replace(os.sep, "/")
        return rel + sep + rest

    return relative


def summary(captured: list[Captured], sent: Mapping[str, str]) -> str:
    """``flaketriage: captured N failure(s): <ids> (sent: yes/no/queued/refused)``."""
    if not captured:
        return "flaketriage: captured 0 failures"
    ids = " ".join(c.bundle_id[:12] for c in captured)
    words = {"sent": "yes", "queued": "queued", "refused": "refused", "off": "no", "error": "no"}
    states = [words.get(sent.get(c.bundle_id, "off"), "no") for c in captured]
    distinct = dict.fromkeys(states)
    how = states[0] if len(distinct) == 1 else ", ".join(f"{states.count(s)} {s}" for s in distinct)
    return f"flaketriage: captured {len(captured)} failure(s): {ids} (sent: {how})"
