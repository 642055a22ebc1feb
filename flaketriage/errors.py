"""The flaketriage error tree: every error the package raises on purpose.

::

    FlaketriageError                  catch this for "any flaketriage error"
    ├── ConfigError                   a setting or option has a value that cannot work
    ├── StoreError                    the content-addressed store
    │   ├── StoreNotWritableError     the store path cannot be created or written
    │   ├── StoreUnreachableError     the store's server (an S3 endpoint) cannot be reached
    │   ├── StoreCredentialsError     no credentials for the store, or it rejects them
    │   ├── StorePermissionError      the credentials work but may not do this (403, AccessDenied)
    │   ├── StoreNotFoundError        the store itself (an S3 bucket) does not exist
    │   ├── ObjectNotFoundError       a blob or manifest the caller named is not there
    │   ├── CorruptObjectError        a blob's bytes do not hash to its key (or it is empty, undecodable)
    │   └── ObjectTooLargeError       a blob inflates past the size its manifest records (or a read's cap)
    ├── BundleError                   a bundle manifest, its id, or its export
    │   └── BundleNotFoundError       no bundle has that id (or prefix)
    ├── DatasetError                  a declared ``--data`` input: missing, or of an unknown format
    ├── CaptureError                  running and recording the failing command
    │   └── MetricsFileError          a declared metrics file is missing, unreadable or holds no metrics
    │                                 after the run (recorded as a ``metric`` failure, never a pass)
    ├── SandboxError                  materializing a workspace or running a replay in isolation
    ├── ReplayEnvironmentError        the bundle's Python environment cannot be had on this runner (a
    │                                 package that will not install, a missing Python): an
    │                                 ``environment`` outcome, never a crash
    ├── GitError                      a git command failed or timed out, or git is not installed
    ├── MinimizeError                 reducing a failing bundle
    ├── BudgetSpentError              a triage's budget (FLAKETRIAGE_TRIAGE_BUDGET_S) ran out before a replay
    ├── ReportError                   writing an issue, a check run or a quarantine entry
    │   └── IssueTrackerError         GitHub refused or failed a call (``status``: its HTTP status)
    ├── QuarantineError               a quarantine document that cannot be read (damaged, another version)
    ├── ResultsError                  a CI results file that cannot be read (not JUnit XML, a DTD or
    │                                 entities, too large, too many tests)
    ├── NotifyError                   sending an event to the service (the event waits in the outbox)
    │   └── EventRefusedError         a refusal retrying cannot fix (a wrong URL or secret, a store the
    │                                 service does not read): reported, not queued; ``setting`` says what
    │                                 to change
    ├── RecordsError                  the service's database: unreachable, or a write refused
    │   └── RecordsDataError          a value the database refuses as data (text it cannot encode, JSON
    │                                 it cannot read): the request's fault, not an outage
    ├── BrokerError                   the task broker cannot take work (it stays recorded, re-sent later)
    ├── EmbeddedServiceError          a process of the embedded service one command runs (the demo's
    │                                 receiver, worker or beat) would not start, or stopped
    ├── SignatureError                a signed request's signature is missing, wrong, or stale
    ├── RequestRefusedError           the receiver refuses a request as sent (a 4xx answer): the
    │   │                             sender's to fix, never an outage
    │   ├── BodyRefused               a body too large (413) or too slow to arrive whole (408)
    │   ├── PayloadError              a payload lacks a field its event must have, or is no ping
    │   └── StoreNotAllowed           an event names a store the service does not read (or it reads none)
    ├── MissingDependencyError        an optional library is not installed (also an ImportError); names
    │                                 the ``pip install 'flaketriage[extra]'`` that fixes it
    ├── GuardError                    a numeric guard is set up wrongly: a check or policy it cannot honour
    └── NumericFault                  a guard check tripped in training (non-finite loss, a spike, ...):
                                      a fault in the training, not a misconfiguration, so
                                      ``except GuardError`` never swallows one

Messages say what was expected, what was seen, and what to do next, because they reach
people through the CLI without a traceback.
"""

from __future__ import annotations


class FlaketriageError(Exception):
    """Base of every error flaketriage raises on purpose."""


class ConfigError(FlaketriageError):
    """A setting or command-line option has a value that cannot work."""


class MissingDependencyError(FlaketriageError, ImportError):
    """An optional library a feature needs is not installed; the message names the extra to install.

    Raised by `flaketriage.dependencies.require`. ``module`` is the top-level module that is missing,
    ``extra`` the flaketriage extra that installs it and ``install`` the whole command.
    """

    def __init__(self, module: str, extra: str, needed_for: str) -> None:
        self.module = module
        self.extra = extra
        self.install = f"pip install 'flaketriage[{extra}]'"
        super().__init__(
            f"{needed_for} needs {module}, which is not installed; install it with {self.install}"
        )


class StoreError(FlaketriageError):
    """The content-addressed store failed."""


class StoreNotWritableError(StoreError):
    """The store path cannot be created or written."""


class StoreUnreachableError(StoreError):
    """The store's server (an S3 endpoint) cannot be reached: refused, timed out, unknown host."""


class StoreCredentialsError(StoreError):
    """There are no credentials for the store, or the store rejects them (an unknown key, a wrong
    secret, an expired token)."""


class StorePermissionError(StoreError):
    """The store accepts the credentials but refuses this operation (HTTP 403, ``AccessDenied``)."""


class StoreNotFoundError(StoreError):
    """The store itself does not exist (an S3 bucket), as opposed to one object in it."""


class ObjectNotFoundError(StoreError):
    """A blob or manifest named by its key is not in the store."""

    def __init__(self, key: str, where: str) -> None:
        super().__init__(
            f"object {key} is not in the store at {where}; the bundle that names it is incomplete "
            "or comes from another store (pass --store or set FLAKETRIAGE_STORE)"
        )
        self.key = key


class CorruptObjectError(StoreError):
    """A blob's bytes no longer hash to its key."""

    def __init__(self, key: str, actual: str, where: str, *, detail: str | None = None) -> None:
        super().__init__(
            f"object {key} in {where} is corrupt: {detail or f'its content hashes to {actual}'}; "
            "it was not used. Re-capture the failure, or restore the object from a copy of the store"
        )
        self.key = key
        self.actual = actual


class ObjectTooLargeError(StoreError):
    """A blob holds more bytes than the reader allows: the size its manifest records, or a fixed cap
    (a manifest, a blob read into memory), or the free space where it was to be written.

    Raised while streaming, before anything lands at the destination. ``limit`` is the bound in bytes.
    """

    def __init__(self, key: str, where: str, limit: int, why: str, todo: str) -> None:
        super().__init__(f"object {key} in {where} is refused: {why}; it was not used. {todo}")
        self.key = key
        self.limit = limit


class BundleError(FlaketriageError):
    """A bundle manifest, its id, or its export is wrong."""


class BundleNotFoundError(BundleError):
    """No bundle in the store has the given id or id prefix."""


class DatasetError(FlaketriageError):
    """A declared data input is missing or of a format flaketriage cannot reduce."""


class CaptureError(FlaketriageError):
    """Running or recording the failing command failed."""


class MetricsFileError(CaptureError):
    """A ``--metrics-file`` could not be read after the run, so its metric criteria could not be
    evaluated. Capture and replay record it as a failure of kind ``metric``: an unevaluated
    criterion never passes. ``reason`` is one stable word (``missing``, ``unreadable``, ``empty``,
    ``not-json``) that goes into the failure's fingerprint."""

    def __init__(self, path: str, reason: str, detail: str) -> None:
        super().__init__(
            f"the metrics file {path} could not be read after the run ({detail}), so its metric "
            "criteria could not be evaluated; make the command write one JSON object (or JSON Lines "
            "of them) there, or drop --metrics-file"
        )
        self.path = path
        self.reason = reason
        self.detail = detail


class SandboxError(FlaketriageError):
    """Materializing a workspace or running a replay in isolation failed."""


class ReplayEnvironmentError(FlaketriageError):
    """The bundle's environment (its Python version and package freeze) cannot be built here.

    Replays report it as `Outcome.ENVIRONMENT` with the message as the reason; nothing runs against
    the wrong versions.
    """


class GitError(FlaketriageError):
    """A git command failed, timed out, or could not start (``flaketriage.process.git.Git`` raises it).

    ``command`` is the command line as run, ``returncode`` its exit status (None when it never
    finished) and ``stderr`` the tail of what it wrote to stderr.
    """

    def __init__(
        self, message: str, *, command: str = "", returncode: int | None = None, stderr: str = ""
    ) -> None:
        super().__init__(message)
        self.command = command
        self.returncode = returncode
        self.stderr = stderr


class MinimizeError(FlaketriageError):
    """Reducing a failing bundle failed."""


class BudgetSpentError(FlaketriageError):
    """A triage's budget of CPU plus GPU seconds ran out: no further replay starts
    (`flaketriage.workers.cost`)."""


class ReportError(FlaketriageError):
    """Writing an issue, a check run or a quarantine entry failed."""


class IssueTrackerError(ReportError):
    """The issue tracker (GitHub) refused a call or could not be reached; the message says which
    call, what GitHub answered and what to check (token scopes, the repository's name, issues
    disabled, ...). ``status`` is the HTTP status (None when GitHub was not reached)."""

    def __init__(self, message: str, *, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class QuarantineError(FlaketriageError):
    """A quarantine document (the file, the service's answer, the cache) is not one this flaketriage
    reads. ``damaged`` is True when it is not JSON or does not fit the model, False when it is of
    another ``version`` (written by another flaketriage: upgrade, never overwrite)."""

    def __init__(self, message: str, *, damaged: bool = True) -> None:
        super().__init__(message)
        self.damaged = damaged


class ResultsError(FlaketriageError):
    """A CI results file (JUnit XML) that is not one flaketriage reads: not XML, not JUnit, one that
    declares a DTD or entities, too large, or with too many tests. Nothing of it is sent."""


class NotifyError(FlaketriageError):
    """Sending an event to the service failed; callers queue it in the outbox instead.

    ``status`` is the HTTP status the service answered with (None when it was not reached).
    """

    def __init__(self, message: str, *, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status

    @property
    def event_rejected(self) -> bool:
        """The service refused this event itself (not the sender, the URL or its own health):
        other events may still go through."""
        return self.status in (400, 409, 413, 415, 422)


class EventRefusedError(NotifyError):
    """The event cannot be delivered as things are set up, and retrying will not change that: the
    service refused it with a 4xx other than 408/425/429 (a wrong URL, a signature made with another
    secret, a store it does not read), or there is no URL or secret to send with.

    Such an event is not queued; ``setting`` names the setting to change (None when none does).
    """

    def __init__(self, message: str, *, status: int | None = None, setting: str | None = None) -> None:
        super().__init__(message, status=status)
        self.setting = setting


class SignatureError(FlaketriageError):
    """A signed request's signature is missing, malformed, does not match, or is too old or new."""


class RequestRefusedError(FlaketriageError):
    """The receiver refuses a request as it was sent and answers it with a 4xx status saying why:
    the sender's to fix (or the service's settings), never an outage."""


class BodyRefused(RequestRefusedError):
    """A body the receiver stopped reading: too large (413) or too slow (408)."""

    def __init__(self, status: int, detail: str) -> None:
        super().__init__(detail)
        self.status = status
        self.detail = detail


class PayloadError(RequestRefusedError):
    """A payload without a field its event must have, or with one of the wrong type (a webhook is
    answered 422 naming the field), or a body that is not a ping (400)."""


class StoreNotAllowed(RequestRefusedError):
    """An event names a store the service is not configured to read (also raised when building a
    service that is configured to read none)."""


class RecordsError(FlaketriageError):
    """The service's database cannot be reached or refused a write; nothing was half-recorded."""


class RecordsDataError(RecordsError):
    """The database refused a value as data (PostgreSQL's class 22: text it cannot encode, JSON it
    cannot read, a number out of range; SQLite's encoding error): nothing was recorded, and the same
    values would be refused again, so the receiver answers 422, not "retry later"."""


class BrokerError(FlaketriageError):
    """The task broker cannot take work now; the work stays recorded and is sent again later."""


class EmbeddedServiceError(FlaketriageError):
    """A process of the embedded service one command runs (``flaketriage demo``'s receiver, worker
    or beat) would not start, was not ready in time, or stopped while it was needed."""


class GuardError(FlaketriageError):
    """A numeric guard cannot work: a check or policy is set up wrongly (a missing torch is a
    `MissingDependencyError`, a tripped check a `NumericFault`)."""


class NumericFault(FlaketriageError):
    """A numeric guard check tripped: the training step it names went non-finite or out of bounds.

    ``check`` names the check (``loss_nonfinite``, ``grad_norm``, ...), ``step`` the training step,
    ``where`` the first offending parameter or module when one was found, and ``bundle_id`` the
    bundle captured for it (None when capture was off or failed). The message carries no bundle id
    or path, so a replay that trips the same way has the same failure fingerprint.
    """

    def __init__(
        self,
        message: str,
        *,
        check: str,
        step: int,
        where: str | None = None,
        bundle_id: str | None = None,
    ) -> None:
        super().__init__(message)
        self.check = check
        self.step = step
        self.where = where
        self.bundle_id = bundle_id
