"""``flaketriage cases show ID`` says how far a triage under way is and names the cases of the same
CI run, read from the embedded database as the API serves them."""

from __future__ import annotations

from pathlib import Path

from flaketriage.records import Case, Database, Occurrence, ReplayRow, Work
from flaketriage.settings import load_settings
from tests.cli.conftest import Run

RUN = "https://github.com/acme/app/actions/runs/4242"


def _records(database: Database) -> tuple[int, int]:
    with database.session() as s:
        captured = Case(
            fingerprint="f" * 64,
            kind="bundle",
            title="tests/test_io.py::test_read: OSError",
            status="triaging",
        )
        run = Case(fingerprint="e" * 64, kind="workflow", title="acme/app: workflow CI failed", status="open")
        s.add_all([captured, run])
        s.flush()
        s.add(Occurrence(case_id=captured.id, source="events", delivery_id="d1", provenance={"run_url": RUN}))
        s.add(Occurrence(case_id=run.id, source="github", delivery_id="d2", provenance={"run_url": RUN}))
        work = Work(
            key="triage:1",
            case_id=captured.id,
            bundle_id="1" * 64,
            step="triage",
            queue="cpu",
            status="running",
            result={"progress": {"step": "order search", "done": 7, "planned": 59}},
        )
        s.add(work)
        s.flush()
        s.add_all(ReplayRow(work_id=work.id, idx=i, outcome="passed") for i in range(7))
        return captured.id, run.id


def test_show_gives_the_step_the_replays_done_and_planned_and_the_linked_run(
    cli: Run, tmp_path: Path
) -> None:
    store = tmp_path / "store"
    store.mkdir()
    database = Database(load_settings(store=str(store)).resolved_database_url())
    database.upgrade()
    captured, run = _records(database)
    database.dispose()

    shown = cli("cases", "show", str(captured), "--store", str(store))
    assert shown.returncode == 0, shown.stderr
    text = " ".join(shown.stdout.split())  # a long value is folded onto the next lines
    assert "progress order search: 7 of 59 replays done" in text
    assert f"linked case {run} (workflow) acme/app: workflow CI failed, run" in text
    assert RUN in shown.stdout.replace("\n", "").replace(" ", "")

    back = cli("cases", "show", str(run), "--store", str(store))
    assert back.returncode == 0, back.stderr
    assert f"linked case {captured} (bundle) tests/test_io.py::test_read: OSError, run" in " ".join(
        back.stdout.split()
    )
    assert "progress" not in back.stdout  # nothing under way on the run's case
