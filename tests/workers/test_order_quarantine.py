"""The service's quarantine of order-dependent tests: rows that name the polluters, and no isolation
reruns for them (a victim passes alone whether or not it is fixed, so a rerun would lift it wrongly)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from flaketriage.dispatch import Dispatcher, MemorySender
from flaketriage.quarantine import FailureRate, QuarantineEntry, QuarantineEvidence
from flaketriage.records import Database, QuarantineRow
from flaketriage.settings import load_settings
from flaketriage.workers.pipeline import WorkerEnv
from flaketriage.workers.records_quarantine import RecordsQuarantine
from flaketriage.workers.replay import ReplayContext
from flaketriage.workers.sandbox import ProcessSandbox
from flaketriage.workers.upkeep import Upkeep

POLLUTER = "tests/test_warm.py::test_fills_cache"


def evidence(verdict: str) -> QuarantineEvidence:
    return QuarantineEvidence(
        verdict=verdict,
        decided=True,
        replays=5,
        reproductions=0,
        rate=FailureRate(estimate=0, low=0, high=0.52),
    )


@pytest.fixture
def database(tmp_path: Path) -> Iterator[Database]:
    db = Database(f"sqlite:///{tmp_path / 'service.db'}")
    db.upgrade()
    yield db
    db.dispose()


def test_records_keep_the_polluters_and_reruns_skip_order_dependent_entries(
    tmp_path: Path, database: Database
) -> None:
    quarantine = RecordsQuarantine(database)
    assert quarantine.order_dependent  # FLAKETRIAGE_QUARANTINE_ORDER_DEPENDENT's default
    common = {"command": "pytest", "issue_url": "https://github.com/acme/repo/issues/7"}
    quarantine.add(
        "ab" * 32,
        test_id="tests/test_cache.py::test_reads_empty",
        bundle_id="1" * 64,
        evidence=evidence("order_dependent"),
        reason=f"order_dependent: passes alone; fails after {POLLUTER}",
        polluters=[POLLUTER],
        **common,  # type: ignore[arg-type]
    )
    quarantine.add(
        "cd" * 32,
        test_id="t.py::test_flaky",
        bundle_id="2" * 64,
        evidence=evidence("flaky"),
        reason="flaky",
        **common,
    )  # type: ignore[arg-type]
    with database.session() as session:
        row = session.get(QuarantineRow, "ab" * 32)
        assert row is not None and QuarantineEntry.model_validate(row.entry).polluters == (POLLUTER,)
    settings = load_settings(store=str(tmp_path / "store"))
    env = WorkerEnv(
        settings=settings,
        database=database,
        dispatcher=Dispatcher(database, MemorySender(), sweep_after_s=60),
        sandbox=ProcessSandbox(),
        sink=None,
        commenter=None,
        context=ReplayContext.from_process(),
    )
    try:
        assert Upkeep(env).schedule_reruns() == 1  # the flaky one only
    finally:
        env.close()
