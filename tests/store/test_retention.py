"""`retained_bundles`: what garbage collection keeps, from the quarantine file and the service's
records (a real SQLite database, migrated), for ``flaketriage gc`` and the service alike."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from flaketriage.errors import QuarantineError
from flaketriage.quarantine import FailureRate, QuarantineDocument, QuarantineEntry, QuarantineEvidence
from flaketriage.records import Case, CaseStatus, Database, Occurrence, QuarantineRow
from flaketriage.settings import load_settings
from flaketriage.store.retention import recorded_bundles, retained_bundles, service_database

WHEN = datetime(2024, 5, 1, tzinfo=UTC)


def _entry(fingerprint: str, latest: str, every: tuple[str, ...]) -> QuarantineEntry:
    return QuarantineEntry(
        fingerprint=fingerprint,
        reason="flaky",
        evidence=QuarantineEvidence(
            replays=20, reproductions=3, rate=FailureRate(estimate=0.15, low=0.03, high=0.38)
        ),
        command="python train.py",
        bundle_id=latest,
        bundles=every,
        occurrences=len(every) or 1,
        quarantined_at=WHEN,
        updated_at=WHEN,
    )


def _database(path: Path) -> Database:
    database = Database(f"sqlite:///{path}")
    database.upgrade()
    return database


def test_open_cases_and_quarantine_rows_are_kept(tmp_path: Path) -> None:
    database = _database(tmp_path / "service.db")
    with database.session() as session:
        for n, status in enumerate([CaseStatus.TRIAGING, CaseStatus.REPORTED, CaseStatus.FIXED]):
            case = Case(fingerprint=f"{n}" * 16, kind="bundle", status=status.value)
            session.add(case)
            session.flush()
            session.add(
                Occurrence(case_id=case.id, source="event", delivery_id=f"d{n}", bundle_id=f"{n}" * 64)
            )
            session.add(Occurrence(case_id=case.id, source="github", delivery_id=f"w{n}", bundle_id=None))
        session.add(
            QuarantineRow(
                fingerprint="q" * 16, entry=_entry("ab" * 8, "a" * 64, ("b" * 64,)).model_dump(mode="json")
            )
        )
        session.add(
            QuarantineRow(fingerprint="r" * 16, entry={"bundle_id": "c" * 64, "bundles": 7, "new": True})
        )
    assert recorded_bundles(database) == {
        "0" * 64,
        "1" * 64,
        "a" * 64,
        "b" * 64,
        "c" * 64,
    }  # not the fixed one
    database.dispose()


def test_the_quarantine_file_and_the_embedded_database_are_found_beside_the_store(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("FLAKETRIAGE_DATABASE_URL", "FLAKETRIAGE_QUARANTINE_FILE"):
        monkeypatch.delenv(name, raising=False)
    store = tmp_path / "store"
    store.mkdir()
    settings = load_settings(store=str(store))
    assert service_database(settings) is None and retained_bundles(settings, None) == set()
    doc = QuarantineDocument().with_entry(_entry("cd" * 8, "d" * 64, ("e" * 64, "d" * 64)))
    (store / "quarantine.json").write_bytes(doc.to_json())
    database = _database(store / "service.db")
    database.dispose()
    found = service_database(settings)
    assert found is not None
    assert retained_bundles(settings, found) == {"d" * 64, "e" * 64}
    found.dispose()
    (store / "quarantine.json").write_text("{not json")
    with pytest.raises(QuarantineError, match=r"quarantine file .* is damaged"):
        retained_bundles(settings, None)


def test_a_store_elsewhere_reads_the_quarantine_file_only_when_set(tmp_path: Path) -> None:
    settings = load_settings(store="memory://retention")
    assert retained_bundles(settings, None) == set()
    doc = QuarantineDocument().with_entry(_entry("ef" * 8, "f" * 64, ()))
    (tmp_path / "q.json").write_bytes(doc.to_json())
    settings = load_settings(store="memory://retention", quarantine_file=tmp_path / "q.json")
    assert retained_bundles(settings, None) == {"f" * 64}
