"""`MarkdownIssueSink`: issues as Markdown files, one per fingerprint, in a directory.

Updates are read-modify-write under a lock on a lock file in the directory (`flaketriage.files.lock`),
and every write goes to a temp file renamed into place (`flaketriage.files.atomic`), so concurrent
reporters never lose an occurrence and a crash never leaves a half-written issue.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from pathlib import Path

from flaketriage.errors import ReportError
from flaketriage.files import atomic
from flaketriage.files.modes import OWNER_ONLY, FileModes
from flaketriage.workers.report.base import (
    IssueDraft,
    IssueRecord,
    IssueSink,
    ReportRef,
    check_fingerprint,
    report_lock,
    utc_now,
)

LOCK_NAME = ".flaketriage-issues.lock"


def _write_text(path: Path, text: str, mode: int) -> None:
    """Write `text` to a temp file beside `path`, fsync it, and rename it over `path`."""
    try:
        # A name captured as bytes that are not UTF-8 is shown as its escape (\udcfe), not lost.
        atomic.write_atomic(path, text.encode("utf-8", "backslashreplace"), mode=mode)
    except OSError as exc:
        raise ReportError(
            f"cannot write {path} ({exc.strerror or exc}); make {path.parent} writable and check free space"
        ) from exc


class MarkdownIssueSink(IssueSink):
    """Issues as ``<directory>/<fingerprint[:16]>.md``; the directory is created on first write.

    An issue holds what its bundle does (source lines, logs), so files and directories are made
    with `modes`: the store's (`FileModes.of`), owner-only unless the store is shared.
    """

    kind = "markdown"

    def __init__(
        self,
        directory: Path | str,
        *,
        clock: Callable[[], datetime] = utc_now,
        modes: FileModes = OWNER_ONLY,
    ) -> None:
        self.directory = Path(directory)
        self._clock = clock
        self.modes = modes

    def path_for(self, fingerprint: str) -> Path:
        return self.directory / f"{check_fingerprint(fingerprint)[:16]}.md"

    def upsert(self, draft: IssueDraft) -> ReportRef:
        path = self.path_for(draft.fingerprint)
        try:
            self.modes.make_dirs(self.directory)
        except OSError as exc:
            raise ReportError(
                f"cannot create the issues directory {self.directory} ({exc.strerror or exc}); set "
                "FLAKETRIAGE_ISSUES_DIR to a writable directory"
            ) from exc
        with report_lock(self.directory / LOCK_NAME, self.modes.file):
            existing = self._read(path, draft.fingerprint)
            if existing is not None and existing.counted(draft):
                return ReportRef(kind="markdown", location=str(path), created=False)  # a retry
            now = self._clock()
            record = IssueRecord.new(draft, now) if existing is None else existing.recur(draft, now)
            self._write(path, record)
        return ReportRef(kind="markdown", location=str(path), created=existing is None)

    def close(self, fingerprint: str, comment: str) -> ReportRef | None:
        path = self.path_for(fingerprint)
        if not path.is_file():
            return None
        with report_lock(self.directory / LOCK_NAME, self.modes.file):
            record = self._read(path, fingerprint)
            if record is None:
                return None
            if record.state != "closed":
                self._write(path, record.closed(comment, self._clock()))
        return ReportRef(kind="markdown", location=str(path), created=False)

    def _write(self, path: Path, record: IssueRecord) -> None:
        _write_text(path, f"# {record.title}\n\n{record.body_text()}", self.modes.file)

    def find(self, fingerprint: str) -> ReportRef | None:
        path = self.path_for(fingerprint)
        return ReportRef(kind="markdown", location=str(path), created=False) if path.is_file() else None

    def get(self, fingerprint: str) -> IssueRecord | None:
        return self._read(self.path_for(fingerprint), fingerprint)

    def _read(self, path: Path, fingerprint: str) -> IssueRecord | None:
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return None
        except (OSError, UnicodeDecodeError) as exc:
            raise ReportError(
                f"cannot read the issue {path} ({exc}); fix its permissions or move it away to let "
                "flaketriage open a new one"
            ) from exc
        record = IssueRecord.parse(text, where=f"the issue file {path}")
        if record.fingerprint != fingerprint:
            raise ReportError(
                f"the issue file {path} belongs to fingerprint {record.fingerprint}, not {fingerprint} "
                "(their first 16 characters collide); move it away, or keep issues for the two "
                "failures in different directories"
            )
        return record
