"""bench/dashboard.py at a tiny scale: the rows its seeder writes in PostgreSQL, and every page it
times answering over them through its app (`bench/dashboard_app.py`), with its statement count."""

from __future__ import annotations

import random
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from flaketriage.orchestrator.service import Service
from flaketriage.records import Database
from flaketriage.records.history import test_key
from flaketriage.settings import load_settings
from flaketriage.work.dispatch import MemorySender
from tests.conftest import new_postgres_database

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))

import dashboard  # noqa: E402
import dashboard_app  # noqa: E402
import dashboard_data  # noqa: E402

SCALE = dashboard_data.Scale(cases=50, occurrences=500, results=5_000, quarantined=5)


@pytest.fixture(scope="module")
def seeded() -> Iterator[tuple[str, dict[str, int]]]:
    with new_postgres_database("ft_bench") as url:
        counts = dashboard_data.seed(url, SCALE, say=lambda _: None)
        dashboard_data.upkeep(url, say=lambda _: None)
        yield url, counts


def rows(url: str, query: str) -> list[tuple[Any, ...]]:
    import psycopg

    with psycopg.connect(dashboard_data.libpq(url)) as conn:
        return conn.execute(query).fetchall()


def test_the_seeder_writes_the_rows_of_its_scale(seeded: tuple[str, dict[str, int]]) -> None:
    url, counts = seeded
    history = SCALE.history()
    assert history.results == 5_000  # 8 suites of 25 tests, 25 runs each
    assert counts["cases"] == 50
    assert counts["occurrences"] == 500
    assert counts["runners"] == 24
    assert counts["quarantine"] == 5
    assert counts["result_uploads"] == history.uploads == 200
    assert counts["tests"] == history.test_rows == 200
    assert counts["test_results"] == 5_000
    assert rows(
        url, "SELECT min(n), max(n) FROM (SELECT count(*) AS n FROM test_results GROUP BY test_pk) t"
    ) == [(25, 25)]
    # Every status and verdict, and each case's count of occurrences is its rows'.
    pairs = set(rows(url, "SELECT DISTINCT status, verdict FROM cases"))
    assert pairs == {(status, verdict) for status, verdict, _ in dashboard_data.STATUS_VERDICTS}
    assert rows(
        url,
        "SELECT count(*) FROM cases c WHERE c.occurrences < 1"
        " OR c.occurrences <> (SELECT count(*) FROM occurrences o WHERE o.case_id = c.id)",
    ) == [(0,)]


def test_the_seeded_rows_join_as_the_services_do(seeded: tuple[str, dict[str, int]]) -> None:
    url, _ = seeded
    repository, test_id, variant, key = rows(
        url, "SELECT repository, test_id, variant_key, key FROM tests LIMIT 1"
    )[0]
    assert key == test_key(repository, test_id, variant)
    # Each triage ran the replays its verdict takes; a case being triaged has a triage waiting.
    per_triage = rows(
        url,
        "SELECT c.verdict, count(r.id) FROM work w JOIN cases c ON c.id = w.case_id"
        " JOIN replays r ON r.work_id = w.id WHERE w.step = 'triage' GROUP BY w.id, c.verdict",
    )
    assert per_triage and all(n == dashboard_data.REPLAYS.get(verdict or "", 8) for verdict, n in per_triage)
    assert rows(url, "SELECT count(*) FROM work WHERE status = 'waiting'") == [(3,)]
    # Beat's roll-up of the overview's failures per day, as beat would have run it.
    assert rows(url, "SELECT sum(failures) > 0 FROM failure_days") == [(True,)]
    # Some occurrences name a run that uploaded results, by the same URL.
    assert rows(
        url,
        "SELECT count(*) > 0 FROM occurrences o"
        " JOIN result_uploads u ON u.run_url = o.provenance->>'run_url'",
    ) == [(True,)]
    # The quarantine names flaky cases by their fingerprints.
    assert rows(
        url,
        "SELECT count(*) FROM quarantine q JOIN cases c ON c.id = q.case_id AND c.fingerprint = q.fingerprint"
        " WHERE c.verdict = 'flaky'",
    ) == [(5,)]
    # Each entry's isolation reruns, 6 hours apart, some since it began, of its case and fingerprint.
    reruns = rows(
        url,
        "SELECT count(*), count(*) FILTER (WHERE w.created_at >= (q.entry->>'quarantined_at')::timestamptz),"
        " count(*) FILTER (WHERE w.options->>'fingerprint' = q.fingerprint AND w.status = 'done')"
        " FROM quarantine q JOIN work w ON w.case_id = q.case_id AND w.step = 'rerun' GROUP BY q.fingerprint",
    )
    assert len(reruns) == 5
    assert all(total >= 40 and since >= 1 and same == total for total, since, same in reruns)


def test_a_database_seeded_at_the_same_scale_is_reused_and_another_scale_seeded_again(
    seeded: tuple[str, dict[str, int]],
) -> None:
    from tests.conftest import POSTGRES_ADMIN

    name = f"ft_bench_reuse_{random.randrange(16**8):08x}"
    said: list[str] = []
    tiny = dashboard_data.Scale(cases=20, occurrences=40, results=400, quarantined=1, runners=3)
    try:
        url = dashboard_data.ensure_seeded(POSTGRES_ADMIN, name, tiny, reseed=False, say=said.append)
        assert any(line.startswith("seeded in") for line in said)
        said.clear()
        assert dashboard_data.ensure_seeded(POSTGRES_ADMIN, name, tiny, reseed=False, say=said.append) == url
        assert said and said[0].startswith("reusing database")
        said.clear()
        bigger = dashboard_data.Scale(cases=30, occurrences=40, results=400, quarantined=1, runners=3)
        dashboard_data.ensure_seeded(POSTGRES_ADMIN, name, bigger, reseed=False, say=said.append)
        assert rows(url, "SELECT count(*) FROM cases") == [(30,)]
    finally:
        dashboard_data.drop(POSTGRES_ADMIN, name)
    with pytest.raises(SystemExit, match="a database of its own"):
        dashboard_data.ensure_seeded(POSTGRES_ADMIN, "postgres", tiny, reseed=False)


BEING_BUILT = {"tests", "tests, filtered", "test", "grid", "quarantine", "runners"}
"""Pages whose routes may not be mounted yet (issue 26's history pages): the bench reports them
"missing"; once mounted, they must answer like every other."""


def test_every_page_the_bench_times_answers_with_its_statements_counted(
    seeded: tuple[str, dict[str, int]], tmp_path: Path
) -> None:
    url, _ = seeded
    database = Database(url)
    service = Service.assemble(load_settings(store=str(tmp_path / "store")), database, MemorySender())
    about = dashboard.subjects(url, SCALE)
    assert len(about.heavy_cases) == 20 and len(about.tests) == 200
    missing = set()
    try:
        with TestClient(dashboard_app.bench_app(service)) as client:
            for name, path in dashboard.pages(about, random.Random(1)).items():
                state = dashboard.probe(client, name, path())
                if state == "missing":
                    missing.add(name)
                    continue
                assert state == "ok", f"{name}: {path()}: {state}"
                answer = client.get(path(), headers={dashboard_app.PAGE: name})
                statements = int(answer.headers[dashboard_app.STATEMENTS])
                assert statements == 1 if path().startswith("/bench/") else 1 <= statements <= 30, name
                assert float(answer.headers[dashboard_app.SQL_MS]) > 0
            slowest = client.get("/bench/slowest").json()
            assert {dashboard.BASELINE, "overview", "case"} <= set(slowest)
            plan = client.get("/bench/explain", params={"page": "case"}).text
            assert "Execution Time" in plan and "-- parameters:" in plan
    finally:
        database.dispose()
    assert missing <= BEING_BUILT
