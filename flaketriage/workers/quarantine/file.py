"""The quarantine list as the workers keep it: one JSON file of `flaketriage.quarantine.QuarantineDocument`.

Changes are read-modify-write under a lock beside the file (`flaketriage.files.lock`) and land by
atomic rename, so concurrent reporters never lose an entry; a file that cannot be parsed is
reported, never overwritten. What an entry says of a flaky verdict (`evidence_of`, `quarantined_reason`)
and which tests a whole test run's entry quarantines (`failed_tests_of`) are written here for both
writers, the file and the service's records.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import Protocol

from flaketriage.bundle.manifest import BlobRef, Manifest
from flaketriage.errors import FlaketriageError, QuarantineError, ReportError
from flaketriage.failure.runner_results import (
    JUNIT_ATTACHMENT,
    MAX_JUNIT_BYTES,
    FailedTests,
    failed_tests,
    is_test_runner,
)
from flaketriage.files.atomic import write_atomic
from flaketriage.files.modes import OWNER_ONLY, FileModes
from flaketriage.quarantine import (
    DEFAULT_SCOPE,
    MAX_TESTS,
    EntryScope,
    FailureRate,
    QuarantineDocument,
    QuarantineEntry,
    QuarantineEvidence,
    refreshed_entry,
)
from flaketriage.store import Store
from flaketriage.workers.report.base import ReportRef, check_fingerprint, report_lock, utc_now
from flaketriage.workers.verdict import VerdictResult


def failed_tests_of(store: Store, manifest: Manifest) -> FailedTests | None:
    """The tests a bundle captured as a whole test run failed (`flaketriage.failure.runner_results`): read
    from its stdout and stderr logs and the JUnit report it attached. None for a bundle the pytest
    plugin captured (its one test is ``failure.test_id``) and for a command that is not a test run
    (not pytest by its arguments, no pytest summary in its output, no JUnit report)."""
    if manifest.pytest is not None:
        return None
    junit_ref = manifest.attachments.get(JUNIT_ATTACHMENT)
    runner = is_test_runner(manifest.command.argv) or manifest.failure.kind == "test"
    if not runner and junit_ref is None:
        return None
    notes: list[str] = []
    stdout, stderr = (_text(store, manifest.logs.get(name), name, notes) for name in ("stdout", "stderr"))
    junit = _blob(store, junit_ref, "JUnit report", notes) if junit_ref is not None else None
    found = failed_tests(stdout, stderr, junit, cwd=manifest.command.cwd)
    return dataclasses.replace(found, notes=(*notes, *found.notes))


def _blob(store: Store, ref: BlobRef | None, what: str, notes: list[str]) -> bytes | None:
    if ref is None:
        return None
    try:
        return store.get_bytes(ref.sha256, max_size=min(ref.size, MAX_JUNIT_BYTES * 4), why=f"its {what}")
    except FlaketriageError as exc:  # the verdict still stands: say what could not be read
        notes.append(f"its {what} could not be read ({exc})")
        return None


def _text(store: Store, ref: BlobRef | None, what: str, notes: list[str]) -> str:
    data = _blob(store, ref, what, notes)
    return data.decode("utf-8", "replace") if data is not None else ""


def quarantined_reason(verdict: VerdictResult, tests: FailedTests | None) -> str:
    """An entry's reason for a flaky verdict: the counts, and for a whole test run, which tests
    it quarantines (how many were left out past `MAX_TESTS`, what could not be read)."""
    reason = f"flaky: reproduced {verdict.reproductions} of {verdict.replays} replays"
    if tests is None:
        return reason
    if tests.ids:
        reason += f"; quarantines the {len(tests.ids)} test(s) the captured run failed"
    else:
        reason += "; the captured test run names no failing test, so CI matches it by fingerprint only"
    if tests.left_out:
        reason += f" ({tests.left_out} more failed and are not quarantined: at most {MAX_TESTS})"
    return reason + "".join(f"; {note}" for note in tests.notes)


def evidence_of(result: VerdictResult) -> QuarantineEvidence:
    """The verdict evidence a quarantine entry keeps: counts and the reproduction-rate interval."""
    return QuarantineEvidence(
        verdict=str(result.verdict),
        decided=result.decided,
        replays=result.replays,
        reproductions=result.reproductions,
        passes=result.passes,
        different=result.different,
        rate=FailureRate(estimate=result.rate.estimate, low=result.rate.low, high=result.rate.high),
    )


class QuarantineWriter(Protocol):
    """Where quarantine entries go: the JSON file (`Quarantine`), or the service's records.

    `order_dependent` (``FLAKETRIAGE_QUARANTINE_ORDER_DEPENDENT``) says whether an order-dependent
    test is quarantined too, with its polluters named, beside its issue (else only the issue).
    Each writer limits an entry to what its `EntryScope` (the settings') keeps of the failure's
    `variant` (`flaketriage.bundle.variant`) and of its fingerprint.
    """

    order_dependent: bool

    def add(
        self,
        fingerprint: str,
        *,
        test_id: str | None,
        command: str,
        bundle_id: str,
        evidence: QuarantineEvidence,
        reason: str,
        issue_url: str | None = None,
        polluters: Sequence[str] = (),
        tests: Sequence[str] = (),
        variant: Mapping[str, str] | None = None,
    ) -> ReportRef: ...

    def remove(self, fingerprint: str) -> bool: ...


class Quarantine:
    """The quarantine list in the JSON file at `path` (created on the first `add`)."""

    def __init__(
        self,
        path: Path | str,
        *,
        clock: Callable[[], datetime] = utc_now,
        modes: FileModes = OWNER_ONLY,
        order_dependent: bool = True,
        scope: EntryScope = DEFAULT_SCOPE,
    ) -> None:
        self.path = Path(path)
        self.order_dependent = order_dependent
        """Quarantine order-dependent tests too (``FLAKETRIAGE_QUARANTINE_ORDER_DEPENDENT``)."""
        self.scope = scope
        """What of a failure's variant and fingerprint its entry is limited to (`EntryScope`)."""
        self._clock = clock
        self.modes = modes
        """The store's (`FileModes.of`): owner-only unless the store is shared."""

    @property
    def lock_path(self) -> Path:
        return self.path.with_name(f".{self.path.name}.lock")

    # -- changes --------------------------------------------------------------------------------
    def add(
        self,
        fingerprint: str,
        *,
        test_id: str | None,
        command: str,
        bundle_id: str,
        evidence: QuarantineEvidence,
        reason: str,
        issue_url: str | None = None,
        polluters: Sequence[str] = (),
        tests: Sequence[str] = (),
        variant: Mapping[str, str] | None = None,
    ) -> ReportRef:
        """Quarantine a failure, or refresh its entry: new evidence and reason, the bundle added.

        `issue_url` links the issue or report that explains it; None keeps the entry's link.
        `polluters` name the tests an order-dependent failure needs to run first; `tests` the tests
        a whole test run failed (`failed_tests_of`), each quarantined by this entry. `variant` is
        the one the failure was captured on (None: not known); the entry covers what `scope` keeps
        of it.
        """
        check_fingerprint(fingerprint)
        with self._locked():
            doc = self._load()
            old = doc.entries.get(fingerprint)
            entry = refreshed_entry(
                old,
                fingerprint=fingerprint,
                test_id=test_id,
                command=command,
                bundle_id=bundle_id,
                evidence=evidence,
                reason=reason,
                issue_url=issue_url,
                polluters=polluters,
                tests=tests,
                variant=self.scope.variant_of(variant),
                signatures=self.scope.signatures_of(fingerprint, tests),
                now=self._clock(),
            )
            self._save(doc.with_entry(entry))
        return ReportRef(kind="quarantine", location=str(self.path), created=old is None)

    def remove(self, fingerprint: str) -> bool:
        """Lift a quarantine; False when the fingerprint was not quarantined."""
        with self._locked():
            doc = self._load()
            if fingerprint not in doc.entries:
                return False
            self._save(doc.without(fingerprint))
        return True

    # -- queries --------------------------------------------------------------------------------
    def get(self, fingerprint: str) -> QuarantineEntry | None:
        """The entry for this fingerprint, or None."""
        return self._load().entries.get(fingerprint)

    def entries(self) -> dict[str, QuarantineEntry]:
        """Every entry, by fingerprint."""
        return dict(self._load().entries)

    def is_quarantined(self, test_id_or_fingerprint: str) -> bool:
        """Whether a fingerprint, or a test id of any entry, is quarantined (on any variant, for any
        failure: `QuarantineDocument.find` says whether one failure is forgiven)."""
        return bool(self._load().naming({test_id_or_fingerprint}, test_id_or_fingerprint))

    # -- the file -------------------------------------------------------------------------------
    @contextmanager
    def _locked(self) -> Iterator[None]:
        try:
            self.modes.make_dirs(self.path.parent)
        except OSError as exc:
            raise ReportError(
                f"cannot create {self.path.parent} for the quarantine list ({exc.strerror or exc}); set "
                "FLAKETRIAGE_QUARANTINE_FILE to a writable path"
            ) from exc
        with report_lock(self.lock_path, self.modes.file):
            yield

    def _load(self) -> QuarantineDocument:
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return QuarantineDocument()
        except OSError as exc:
            raise ReportError(
                f"cannot read the quarantine list {self.path} ({exc}); fix its permissions"
            ) from exc
        try:
            return QuarantineDocument.from_json(raw, where=f"the quarantine list {self.path}")
        except QuarantineError as exc:
            if not exc.damaged:  # another flaketriage's version: never overwritten, never deleted
                raise ReportError(str(exc)) from exc
            raise ReportError(
                f"{exc}. It was left untouched; fix it by hand, or delete it to start an empty list "
                "(every quarantine in it is then lifted)"
            ) from exc

    def _save(self, doc: QuarantineDocument) -> None:
        try:
            write_atomic(self.path, doc.to_json(), mode=self.modes.file)
        except OSError as exc:
            raise ReportError(
                f"cannot write {self.path} ({exc.strerror or exc}); make {self.path.parent} writable "
                "and check free space"
            ) from exc
