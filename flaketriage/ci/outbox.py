"""The outbox: events that could not be sent, one JSON file each, waiting for the next run to flush.

A file is named ``<event_id>.json`` and holds the event's canonical body, written through a temp
file and a rename (`flaketriage.files.atomic`), so a crash never leaves half an event and concurrent
writers (pytest-xdist workers) never collide. Two processes flushing at once may both send an
event; the receiver dedupes by ``event_id``.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import ValidationError

from flaketriage.errors import EventRefusedError, NotifyError, StoreNotWritableError
from flaketriage.events import FailureEvent
from flaketriage.files.atomic import write_atomic
from flaketriage.files.modes import OWNER_ONLY, FileModes

_HOLD_FILE = ".hold-until"


@dataclass(frozen=True)
class Refusal:
    """An event refused for good (`EventRefusedError`): why, and the setting to change."""

    event: FailureEvent
    reason: str
    setting: str | None
    of_setup: bool
    """The sender's setup was refused (a wrong URL or secret), not this event: every event would be."""

    @classmethod
    def of(cls, event: FailureEvent, exc: EventRefusedError) -> Refusal:
        return cls(event, str(exc), exc.setting, of_setup=not exc.event_rejected)


@dataclass
class FlushResult:
    """What one flush did. ``unreachable``: it stopped early because the service took nothing."""

    sent: list[str] = field(default_factory=list)
    kept: list[str] = field(default_factory=list)
    errors: dict[str, str] = field(default_factory=dict)
    """event id → why it is still in the outbox."""
    unreachable: bool = False
    unreadable: list[Path] = field(default_factory=list)
    """Files that are not an event this flaketriage can read (left in place, never deleted)."""
    refused: list[Refusal] = field(default_factory=list)
    """Events refused for good, and so taken out of the outbox."""

    def to_json(self) -> dict[str, object]:
        return {
            "sent": self.sent,
            "kept": self.kept,
            "errors": self.errors,
            "refused": {r.event.event_id: r.reason for r in self.refused},
            "unreachable": self.unreachable,
            "unreadable": [str(p) for p in self.unreadable],
        }


class Outbox:
    """Pending events in one directory (created on first write)."""

    def __init__(self, directory: Path | str, *, modes: FileModes = OWNER_ONLY) -> None:
        self.directory = Path(directory)
        self.modes = modes
        """The store's (`FileModes.of`): an event quotes the failure, owner-only unless shared."""

    def path_of(self, event_id: str) -> Path:
        return self.directory / f"{event_id}.json"

    def put(self, event: FailureEvent) -> Path:
        """Queue `event` (idempotent: the same event id is one file)."""
        final = self.path_of(event.event_id)
        try:
            self.modes.make_dirs(self.directory)
            write_atomic(final, event.body(), mode=self.modes.file)
        except OSError as exc:
            raise StoreNotWritableError(
                f"cannot queue event {event.event_id} in the outbox {self.directory} "
                f"({exc.strerror or exc}); set FLAKETRIAGE_OUTBOX_DIR to a writable directory"
            ) from exc
        return final

    def remove(self, event_id: str) -> None:
        self.path_of(event_id).unlink(missing_ok=True)

    def pending(self) -> list[FailureEvent]:
        """Queued events, oldest first."""
        return self._scan()[0]

    def _scan(self) -> tuple[list[FailureEvent], list[Path]]:
        if not self.directory.is_dir():
            return [], []
        events: list[FailureEvent] = []
        unreadable: list[Path] = []
        for path in sorted(self.directory.glob("*.json")):
            if path.name.startswith("."):
                continue
            try:
                event = FailureEvent.model_validate_json(path.read_bytes())
            except FileNotFoundError:
                continue  # another process flushed it meanwhile
            except (OSError, ValidationError):
                unreadable.append(path)
                continue
            if path.name != f"{event.event_id}.json":
                unreadable.append(path)
                continue
            events.append(event)
        events.sort(key=lambda e: (e.created_at, e.event_id))
        return events, unreadable

    def flush(self, send: Callable[[FailureEvent], None]) -> FlushResult:
        """Send queued events oldest first, deleting each once sent.

        An event refused for good (`EventRefusedError`) is deleted too, and the flush goes on; when
        it was the sender's setup that was refused (a wrong URL or secret) the rest are deleted
        as refused alike, unsent. Any other failure (the service down, timing out, answering 5xx)
        stops the flush, keeping the rest, since they would fail the same way.
        """
        events, unreadable = self._scan()
        result = FlushResult(unreadable=unreadable)
        for i, event in enumerate(events):
            try:
                send(event)
            except EventRefusedError as exc:
                refusal = Refusal.of(event, exc)
                rest = events[i:] if refusal.of_setup else [event]
                for refused in rest:
                    self.remove(refused.event_id)
                    result.refused.append(Refusal(refused, refusal.reason, refusal.setting, refusal.of_setup))
                if refusal.of_setup:
                    break
            except NotifyError as exc:
                result.kept.append(event.event_id)
                result.errors[event.event_id] = str(exc)
                result.unreachable = True
                result.kept.extend(e.event_id for e in events[i + 1 :])
                break
            else:
                self.remove(event.event_id)
                result.sent.append(event.event_id)
        return result

    # -- a short pause after the service was unreachable ------------------------------------------
    # Automatic sends (one per failing test) would each wait through every retry while the
    # service is down; after one such failure they queue directly until the pause ends.
    def held(self, now: float | None = None) -> bool:
        try:
            until = float((self.directory / _HOLD_FILE).read_text())
        except (OSError, ValueError):
            return False
        return (time.time() if now is None else now) < until

    def hold(self, seconds: float, now: float | None = None) -> None:
        until = (time.time() if now is None else now) + seconds
        with contextlib.suppress(OSError):
            self.modes.make_dirs(self.directory)
            write_atomic(self.directory / _HOLD_FILE, repr(until).encode(), mode=self.modes.file)

    def release(self) -> None:
        with contextlib.suppress(OSError):
            (self.directory / _HOLD_FILE).unlink(missing_ok=True)
