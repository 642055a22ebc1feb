"""The issue the service files says the failure was seen as many times as its case counts: one
number, whichever page a reader looks at (the Markdown issue said 2 where the case said 15)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from flaketriage.orchestrator.cases import CaseQuery
from flaketriage.orchestrator.intake import Sighting
from flaketriage.workers.attribution import RunnerIdentity
from flaketriage.workers.report import MarkdownIssueSink
from flaketriage.workers.report.base import IssueDraft, IssueRecord
from tests.workers.service_world import World, make_world

DETERMINISTIC = "def main():\n    raise ZeroDivisionError('boom')\n\nmain()\n"


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    world = make_world(tmp_path, [RunnerIdentity(host="ci-1")])
    sink = MarkdownIssueSink(tmp_path / "issues")
    for env in world.envs:
        env.sink = sink
    yield world
    world.close()


def _seen(world: World, bundle_id: str, times: int) -> int:
    manifest = json.loads(world.store.get_bytes(bundle_id))
    sighting = Sighting(
        fingerprint=manifest["failure"]["fingerprint"],
        kind="bundle",
        title="t",
        bundle_id=bundle_id,
        store_url=world.store.url,
    )
    cases = {
        world.intake.record("events", f"delivery-{i}", "failure.captured", [sighting]).cases[0]
        for i in range(times)
    }
    (case_id,) = cases
    return case_id


def test_an_issue_says_the_failure_was_seen_as_often_as_its_case_counts(world: World, tmp_path: Path) -> None:
    case_id = _seen(world, world.capture(DETERMINISTIC), 15)
    world.drive()

    detail = CaseQuery(world.database).get(case_id)
    assert detail is not None and detail.status == "reported" and detail.occurrences == 15
    (issue,) = (tmp_path / "issues").glob("*.md")
    text = issue.read_text()
    assert "seen 15 times" in text
    assert detail.report_url == str(issue)


def _draft(key: str, occurrences: int | None) -> IssueDraft:
    return IssueDraft(
        fingerprint="ab" * 32,
        title="t",
        body="b",
        labels=("flaketriage",),
        bundle_id="1" * 64,
        minimal_bundle_id=None,
        verdict="deterministic",
        key=key,
        occurrences=occurrences,
    )


def test_a_draft_that_carries_the_case_count_sets_it_and_one_without_counts_one_more() -> None:
    now = datetime(2026, 1, 1, tzinfo=UTC)
    record = IssueRecord.new(_draft("a", 15), now)
    assert record.occurrences == 15
    assert record.recur(_draft("b", 17), now).occurrences == 17
    assert record.recur(_draft("b", None), now).occurrences == 16  # the CLI: one more per report
    assert record.recur(_draft("a", 40), now).occurrences == 15  # a retried report changes nothing
    assert IssueRecord.new(_draft("c", 0), now).occurrences == 1
