"""The service's pipeline on real programs: batches of replays, the verdict, minimization, the report,
reruns, leases and lost messages, driven in-process through an in-memory broker.

`Drive` runs what the pipeline sends, in the order it was sent (or shuffled, or twice each), with the
real sandbox and a real SQLite database; the Celery plumbing around it is tested end to end in
tests/e2e/test_service.py.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import select

from flaketriage.bundle.io import load_manifest
from flaketriage.bundle.variant import variant_of_manifest
from flaketriage.orchestrator.cases import CaseQuery
from flaketriage.quarantine import QuarantineEntry
from flaketriage.records import QuarantineRow, Work
from flaketriage.work.messages import Step
from flaketriage.workers.comments import MarkdownCommenter
from flaketriage.workers.leases import claim
from flaketriage.workers.replay import ReplayContext
from tests.workers.service_world import World, make_world


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    made = make_world(tmp_path, commenter=MarkdownCommenter(tmp_path / "comments"))
    yield made
    made.close()


DETERMINISTIC = "def main():\n    raise ZeroDivisionError('boom')\n\nmain()\n"
# Fails when the replay's index-derived seed says so: half of the replays of any batch.
FLAKY = (
    "import os, random, sys\nrandom.seed()\nif random.random() < 0.5:\n    raise RuntimeError('flaky boom')\n"
)


def test_a_deterministic_failure_is_decided_in_batches_minimized_and_reported_once(world: World) -> None:
    bundle = world.capture(DETERMINISTIC)
    case_id = world.announce(bundle)
    assert world.case(case_id).status == "queued"
    world.drive()
    case = world.case(case_id)
    assert (case.status, case.verdict) == ("reported", "deterministic")
    steps = [(w.step, w.status) for w in world.works(case_id)]
    assert steps == [("triage", "done"), ("minimize", "done"), ("report", "done")]
    triage = world.works(case_id)[0]
    replays = world.replays(triage.id)
    # Batches of 4 (replay_batch): 5 reproductions in a row decide, so two batches ran.
    assert len(replays) == 8 and {r.batch for r in replays} == {1, 2}
    assert all(r.outcome == "reproduced" and r.runner and r.duration_s is not None for r in replays)
    assert len(world.sink.issues) == 1
    issue = next(iter(world.sink.issues.values()))
    assert issue.occurrences == 1
    assert case.report_url and case.evidence and case.evidence["verdict"] == "deterministic"
    # What it cost adds up across the steps: the 8 replays of the verdict's batches, then minimization's.
    assert all(r.cpu_s is not None and r.cpu_s > 0 and r.gpu_s == 0 for r in replays)
    cost = CaseQuery(world.database).get(case_id).cost  # type: ignore[union-attr]
    assert cost is not None and cost.phases["verdict"].runs == 8 and not cost.budget_spent
    assert cost.runs == 8 + cost.phases["minimize"].runs and cost.cpu_s >= sum(r.cpu_s or 0 for r in replays)
    assert "## What the triage cost" in issue.body


def test_a_spent_budget_stops_the_service_s_triage_after_a_batch_undecided_and_unreported(
    world: World,
) -> None:
    world.env.settings = world.env.settings.model_copy(update={"triage_budget_s": 0.01})
    case_id = world.announce(world.capture(DETERMINISTIC))
    world.drive()
    case = world.case(case_id)
    # One batch of 4 spent the budget: no second batch, no verdict (5 in a row were needed), no issue.
    assert (case.status, case.verdict) == ("reported", None)
    assert [w.step for w in world.works(case_id)] == ["triage", "report"]
    assert len(world.replays(world.works(case_id)[0].id)) == 4 and world.sink.issues == {}
    assert case.evidence and case.evidence["decided"] is False and case.evidence["failures"] == 4
    assert case.evidence["cost"]["budget_spent"] is True and case.evidence["cost"]["runs"] == 4


# Fails under the seed its session drew (1234) and under even seeds; passes under any other.
SEEDED = (
    "import sys\n"
    "seed = int(next(a for a in sys.argv if a.startswith('--randomly-seed=')).split('=', 1)[1])\n"
    "if seed == 1234 or seed % 2 == 0:\n"
    "    raise RuntimeError('seeded boom')\n"
)


def test_a_failure_under_the_seed_its_session_drew_is_asked_under_fresh_seeds_by_the_service(
    world: World,
) -> None:
    from flaketriage.bundle.io import load_manifest, write_bundle
    from flaketriage.bundle.manifest import Seeds

    captured = load_manifest(world.store, world.capture(SEEDED, "--randomly-seed=1234"))
    drawn = Seeds(values={"pytest-randomly": 1234}, drawn=("pytest-randomly",))
    bundle = write_bundle(world.store, captured.model_copy(update={"seeds": drawn}))
    case_id = world.announce(bundle)
    world.drive()
    case = world.case(case_id)
    # Every replay under 1234 fails; under fresh seeds about half pass: flaky, as CI sees it.
    assert case.verdict == "flaky", case.evidence
    assert case.evidence is not None
    assert [f["kind"] for f in case.evidence["findings"]] == ["seed"]
    assert "--randomly-seed=1234" in case.evidence["findings"][0]["summary"]


def test_a_bundle_whose_python_the_runner_lacks_gets_the_environment_verdict(world: World) -> None:
    from flaketriage.bundle.io import load_manifest, write_bundle
    from flaketriage.workers.environment.build import EnvironmentBuilder
    from flaketriage.workers.environment.cache import EnvironmentCache

    captured = load_manifest(world.store, world.capture(DETERMINISTIC))
    recorded = captured.environment.model_copy(update={"python": "3.4.10", "packages": ("six==1.16.0",)})
    bundle = write_bundle(world.store, captured.model_copy(update={"environment": recorded}))
    cache = EnvironmentCache(world.tmp / "environments", max_bytes=1 << 30, builder=EnvironmentBuilder({}))
    world.env.context = ReplayContext.from_process(environment_mode="auto", environment_cache=cache)
    case_id = world.announce(bundle)
    world.drive()
    case = world.case(case_id)
    assert case.verdict == "environment"
    triage = world.works(case_id)[0]
    assert triage.result is not None
    (finding,) = triage.result["findings"]
    assert finding["kind"] == "environment" and "this runner has no CPython 3.4" in finding["summary"]
    rows = world.replays(triage.id)
    assert rows and all(r.outcome == "environment" and r.summary == finding["summary"] for r in rows)


def test_tasks_delivered_twice_and_out_of_order_do_no_work_twice(world: World) -> None:
    bundle = world.capture(DETERMINISTIC)
    case_id = world.announce(bundle)
    world.drive(order="shuffle", twice=True)
    case = world.case(case_id)
    assert (case.status, case.verdict) == ("reported", "deterministic")
    assert [w.step for w in world.works(case_id)] == ["triage", "minimize", "report"]
    assert len(world.replays(world.works(case_id)[0].id)) == 8
    assert next(iter(world.sink.issues.values())).occurrences == 1


def test_a_flaky_failure_is_quarantined_with_its_rate(world: World) -> None:
    settings = {"quarantine_variant_keys": "gpu,os", "quarantine_match_signature": True}
    world.env.settings = world.env.settings.model_copy(update=settings)
    bundle = None
    for _ in range(20):  # the capture itself must fail
        project = world.tmp / "project"
        project.mkdir(exist_ok=True)
        try:
            bundle = world.capture(FLAKY)
            break
        except AssertionError:
            continue
    assert bundle is not None
    case_id = world.announce(bundle)
    world.drive()
    case = world.case(case_id)
    assert case.verdict == "flaky", case.evidence
    with world.database.session() as s:
        row = s.get(QuarantineRow, case.fingerprint)
        assert row is not None
        entry = QuarantineEntry.model_validate(row.entry)
    assert entry.bundle_id == bundle and 0 < entry.evidence.rate.estimate < 1
    assert entry.evidence.replays >= 20  # flaky_rate_replays: the rate is sampled, not guessed from 2
    # Limited to the bundle's GPU model and OS (the settings' keys), and to this failure.
    variant = variant_of_manifest(load_manifest(world.store, bundle))
    assert entry.variant == {"gpu": variant["gpu"], "os": variant["os"]}
    assert entry.signatures == (case.fingerprint,)


def test_a_requested_triage_comments_its_result_on_the_issue(world: World) -> None:
    bundle = world.capture(DETERMINISTIC)
    world.announce(bundle, trigger="always", reply_to={"repository": "acme/models", "issue": 12})
    world.drive()
    comment = (world.tmp / "comments" / "acme__models__12.md").read_text()
    assert "deterministic" in comment and bundle[:12] in comment


def test_a_lost_message_is_sent_again_by_the_sweep(world: World) -> None:
    bundle = world.capture(DETERMINISTIC)
    case_id = world.announce(bundle)
    lost = world.sender.take()  # the broker restarted: every message it held is gone
    assert len(lost) == 1
    assert world.env.dispatcher.sweep() == 0  # not yet due
    world.env.dispatcher.sweep_after = world.env.dispatcher.sweep_after * 0
    assert world.env.dispatcher.sweep() == 1
    world.drive()
    assert world.case(case_id).status == "reported"


def test_a_broker_that_restarted_empty_gets_all_waiting_work_at_the_next_sweep(world: World) -> None:
    bundle = world.capture(DETERMINISTIC)
    case_id = world.announce(bundle)
    first = world.sender.take()
    world.pipeline.triage(first[0][1].work_id)
    assert len(world.sender.take()) == 4  # the replays were in the broker when it restarted
    assert world.env.dispatcher.sweep() == 0  # not due: a message may still be on its way
    assert world.env.dispatcher.sweep(broker_emptied=True) == 4  # none is: all of them at once
    world.drive()
    assert world.case(case_id).status == "reported"


def test_lost_replays_and_a_lost_triage_step_are_sent_again(world: World) -> None:
    bundle = world.capture(DETERMINISTIC)
    case_id = world.announce(bundle)
    first = world.sender.take()
    world.pipeline.triage(first[0][1].work_id)  # sends the first batch of replays ...
    assert len(world.sender.take()) == 4  # ... which the broker then loses
    dispatcher = world.env.dispatcher
    dispatcher.sweep_after = dispatcher.sweep_after * 0
    dispatcher.replay_grace = dispatcher.replay_grace * 0
    assert dispatcher.sweep() == 4
    world.drive()
    assert world.case(case_id).status == "reported"


def test_a_step_is_held_by_one_worker_until_its_lease_runs_out(world: World) -> None:
    bundle = world.capture(DETERMINISTIC)
    world.announce(bundle)
    work_id = world.sender.take()[0][1].work_id
    assert claim(world.database, work_id)
    assert not claim(world.database, work_id)  # a second delivery while the first runs
    assert world.pipeline.triage(work_id) == "busy-or-done"
    with world.database.session() as s:
        row = s.get(Work, work_id)
        assert row is not None
        row.heartbeat_at = row.heartbeat_at.replace(year=2000)  # type: ignore[union-attr]
    assert claim(world.database, work_id)  # its worker died: another takes over


def test_a_bundle_that_vanished_fails_the_case_with_the_reason(world: World) -> None:
    bundle = world.capture(DETERMINISTIC)
    case_id = world.announce(bundle)
    world.store.delete(bundle)
    world.drive()
    case = world.case(case_id)
    assert case.status == "failed" and case.error and bundle[:12] in case.error


def _quarantine(world: World, case_id: int, bundle: str) -> str:
    fingerprint = world.case(case_id).fingerprint
    entry = QuarantineEntry.model_validate(
        {
            "fingerprint": fingerprint,
            "reason": "flaky",
            "evidence": {
                "replays": 20,
                "reproductions": 4,
                "rate": {"estimate": 0.2, "low": 0.05, "high": 0.4},
            },
            "command": "python job.py",
            "bundle_id": bundle,
            "bundles": [bundle],
            "occurrences": 1,
            "quarantined_at": "2026-01-01T00:00:00Z",
            "updated_at": "2026-01-01T00:00:00Z",
        }
    )
    with world.database.session() as s:
        s.add(QuarantineRow(fingerprint=fingerprint, case_id=case_id, entry=entry.model_dump(mode="json")))
    return fingerprint


def test_isolation_reruns_run_the_branch_as_it_is_now_and_lift_the_quarantine_once_fixed(
    world: World,
) -> None:
    from flaketriage.process.git import Git
    from flaketriage.workers.upkeep import Upkeep

    project = world.tmp / "project"
    project.mkdir()
    git, author = Git(), ["-c", "user.name=t", "-c", "user.email=t@example.invalid"]
    git.run(["init", "-q", "-b", "main"], project)
    (project / "job.py").write_text(DETERMINISTIC)
    git.run([*author, "add", "job.py"], project)
    git.run([*author, "commit", "-qm", "job"], project)
    bundle = world.capture(DETERMINISTIC)
    case_id = world.announce(bundle)
    world.drive()
    fingerprint = _quarantine(world, case_id, bundle)
    upkeep = Upkeep(world.env)

    assert upkeep.schedule_reruns() == 1
    assert upkeep.schedule_reruns() == 0  # once per period, however often beat fires
    world.drive()
    with world.database.session() as s:
        assert s.get(QuarantineRow, fingerprint) is not None  # the branch still fails: kept

    (project / "job.py").write_text("def main():\n    return 0\n\nmain()\n")
    git.run([*author, "commit", "-qam", "fix"], project)
    world.env.settings = world.env.settings.model_copy(update={"rerun_every_s": 1e-3})  # the next period
    assert upkeep.schedule_reruns() == 1
    world.drive()
    with world.database.session() as s:
        assert s.get(QuarantineRow, fingerprint) is None
        reruns = s.scalars(select(Work).where(Work.step == "rerun").order_by(Work.id)).all()
        assert [w.result["state"] for w in reruns if w.result] == [
            "still deterministic",
            "fixed: quarantine lifted",
        ]
        # Lifted by the sequential test: every replay of the fixed branch passed, enough of them.
        assert reruns[-1].result is not None and reruns[-1].result["replays"] >= 59
    assert world.case(case_id).status == "fixed"
    # The issue is closed through the sink, with the reruns' evidence.
    issue = world.sink.get(fingerprint)
    assert issue is not None and issue.state == "closed"
    assert issue.note is not None and "**Fixed**: the quarantine is lifted" in issue.note


def test_garbage_collection_keeps_the_bundles_of_open_cases_and_quarantined_failures(world: World) -> None:
    from flaketriage.bundle.io import list_bundles
    from flaketriage.workers.upkeep import Upkeep

    opened = world.capture(DETERMINISTIC)
    case_id = world.announce(opened)
    quarantined = world.capture(DETERMINISTIC, "quarantined")
    _quarantine(world, case_id, quarantined)
    loose = world.capture(DETERMINISTIC, "nobody's")
    world.env.settings = world.env.settings.model_copy(update={"gc_older_than_days": 1e-9})  # all old
    assert Upkeep(world.env).collect_garbage() == {"bundles": 1, "objects": 0}  # its blobs are young
    listed = {s.id for s in list_bundles(world.store)}
    assert listed == {opened, quarantined} and loose not in listed


def test_a_gpu_bundles_triage_decides_on_the_gpu_queue_where_its_replays_ran(world: World) -> None:
    from flaketriage.bundle.io import load_manifest, write_bundle
    from flaketriage.bundle.manifest import GPU, Hardware

    captured = load_manifest(world.store, world.capture("raise SystemExit(3)\n"))
    on_gpu = captured.model_copy(
        update={"hardware": Hardware(host="gpu-box", gpus=(GPU(index=0, name="H100"),))}
    )
    case_id = world.announce(write_bundle(world.store, on_gpu))
    # The intake cannot read the bundle: its first step is asked of the cpu queue...
    [(name, order, queue)] = world.sender.take()
    assert (name.split(".", 1)[1], queue) == ("triage", "cpu")
    assert world.pipeline.triage(order.work_id) == "moved to the gpu queue"
    # ...and from there on every step of the triage runs on the gpu queue, the decision included.
    steps: list[tuple[str, str]] = []
    while world.sender.sent:
        for name, work_order, queue in world.sender.take():
            step = name.split(".", 1)[1]
            steps.append((step, str(queue)))
            if step == Step.REPLAY:
                world.pipeline.replay(work_order.work_id, int(work_order.replay or 0))
            else:
                getattr(world.pipeline, step)(work_order.work_id)
    triage_steps = [queue for step, queue in steps if step in ("triage", "replay")]
    assert triage_steps and set(triage_steps) == {"gpu"}
    assert steps[-1] == ("report", "report")
    triage_work = world.works(case_id)[0]
    assert triage_work.queue == "gpu" and triage_work.status == "done"
    assert world.case(case_id).verdict == "deterministic"


def test_a_workers_log_line_names_the_case_the_step_and_the_verdict(world: World) -> None:
    case_id = world.announce(world.capture(DETERMINISTIC))
    [(_, order, _)] = world.sender.take()
    assert world.pipeline.log_line(Step.TRIAGE, order.work_id, "queued") == (
        f"case {case_id}: triage (work {order.work_id}): queued"  # not decided yet: no verdict
    )
    world.sender.send("flaketriage.triage", order, "cpu")
    world.drive()
    triage_id = world.works(case_id)[0].id
    assert world.pipeline.log_line(Step.TRIAGE, triage_id, "decided") == (
        f"case {case_id}: triage (work {triage_id}): decided; verdict deterministic"
    )
    assert world.pipeline.log_line(Step.REPLAY, triage_id, "fail", replay=2) == (
        f"case {case_id}: replay 2 (work {triage_id}): fail"
    )
    assert (
        world.pipeline.log_line(Step.TRIAGE, 10_000, "busy-or-done")
        == "case -: triage (work 10000): busy-or-done"
    )
