"""The runners page: each machine's host, GPUs, driver, replays and environment-specific verdicts,
whether it is suspect (in words), suspects first, and the case of its latest such verdict."""

from __future__ import annotations

from flaketriage.workers.runners import _upsert
from tests.orchestrator.dashboard.conftest import CPU_RUNNER, GPU_RUNNER, Dashboard, World
from tests.orchestrator.dashboard.reading import Page

HEADER = [
    "Host", "State", "GPUs", "Driver", "Replays run", "Environment-specific verdicts", "Last seen (UTC)",
    "Latest such verdict",
]  # fmt: skip


def test_every_runner_with_what_it_ran(seeded: World) -> None:
    page = Page(seeded.client.get("/dashboard/runners").text)
    table = page.table("runners-table")
    assert table[0] == HEADER
    rows = {row[0].split(" ")[0]: row for row in table[1:]}
    assert set(rows) == {"gpu-1", "cpu-1"}
    assert rows["gpu-1"][1:3] == ["ok", "NVIDIA H100"] and rows["gpu-1"][3:6] == ["550.54", "8", "0"]
    assert rows["cpu-1"][1:6] == ["ok", "none", "–", "10", "0"]
    assert page.text("runners-count") == "2 runners, 0 suspect."


def test_suspects_come_first_and_name_their_latest_case(seeded: World) -> None:
    env = seeded.cases["environment_specific"]
    with seeded.database.session() as session:
        for _ in range(3):
            _upsert(session, CPU_RUNNER, replays=0, environment_specific=1, case_id=env, suspect_after=3)
        _upsert(session, GPU_RUNNER, replays=1, environment_specific=0, case_id=None, suspect_after=None)
    page = Page(seeded.client.get("/dashboard/runners").text)
    table = page.table("runners-table")
    assert table[1][0].startswith("cpu-1") and table[1][1] == "suspect" and table[1][5] == "3"
    assert table[1][7] == f"case {env}"
    assert page.links("runner-1") == [(f"/dashboard/cases/{env}", f"case {env}")]
    assert table[2][0].startswith("gpu-1") and table[2][1] == "ok"
    assert page.text("runners-count") == "2 runners, 1 suspect."


def test_no_runner_yet(dashboard: Dashboard) -> None:
    page = Page(dashboard.client.get("/dashboard/runners?x=%00").text)
    assert page.text("no-runners").startswith("No replay has run yet")
