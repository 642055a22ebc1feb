"""bench/results.py's seeding, at a small scale: the history figure is only worth what its seeded
records are (a seed the schema refuses leaves the bench unable to run at all)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

from sqlalchemy import func, select

from flaketriage.orchestrator.history import TestQuery
from flaketriage.records import Database
from flaketriage.records.models import ResultRow, TestRow, UploadRow

BENCH = Path(__file__).parents[2] / "bench"


def bench_module(name: str) -> ModuleType:
    """A module of bench/, loaded under ``bench_<name>`` (its siblings importable as it expects)."""
    if str(BENCH) not in sys.path:
        sys.path.append(str(BENCH))
    spec = importlib.util.spec_from_file_location(f"bench_{name}", BENCH / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_history_bench_seeds_a_hundred_results_per_test(
    postgres_url: str, postgres_database: Database
) -> None:
    tests = bench_module("results").seed(postgres_url, 2_000)
    assert tests == 20
    with postgres_database.session() as session:
        assert session.scalar(select(func.count()).select_from(ResultRow)) == 2_000
        assert session.scalar(select(func.count()).select_from(TestRow)) == 20
        uploads = session.scalars(select(UploadRow)).all()
        assert len(uploads) == 100 and all(u.totals_added for u in uploads)
        first = session.scalars(select(TestRow.id).order_by(TestRow.id)).first()
    assert first is not None
    detail = TestQuery(postgres_database).get(first)
    assert detail is not None and detail.runs == 100 and len(detail.recent) == 50
