"""What a triage cost (CPU, GPU and wall seconds of its replays, by phase) and the budget that caps it."""

from __future__ import annotations

import json
import sys
import threading
from pathlib import Path

import pytest

from flaketriage.capture.record import CaptureRequest, run_and_capture
from flaketriage.capture.source import SourceLimits
from flaketriage.errors import BudgetSpentError
from flaketriage.process.child import ProcessResult, run_command
from flaketriage.store import LocalStore
from flaketriage.workers.cost import CostMeter, PhaseCost, RunCost, TriageCost
from flaketriage.workers.replay import ReplayContext
from flaketriage.workers.report import MemoryIssueSink
from flaketriage.workers.sandbox import MemorySandbox, ProcessSandbox, SandboxSpec
from flaketriage.workers.triage import TriageResult, triage
from flaketriage.workers.verdict import SequentialTest, Verdict, VerdictPolicy

BURN = "import time\nt = time.process_time()\nwhile time.process_time() - t < {s}:\n    pass\n"
"""A program that burns `s` seconds of CPU."""


def _burning_bundle(tmp_path: Path, seconds: float = 0.15) -> tuple[LocalStore, str]:
    """A captured job that burns CPU, then fails the same way every time."""
    root = tmp_path / "proj"
    root.mkdir()
    (root / "job.py").write_text(BURN.format(s=seconds) + "raise ValueError('burnt')\n")
    store = LocalStore(tmp_path / "store")
    request = CaptureRequest(
        argv=[sys.executable, "job.py"], cwd=root, limits=SourceLimits(1 << 20, 1 << 24), echo=False
    )
    result = run_and_capture(store, request)
    assert result.bundle_id, result.process.stderr
    return store, result.bundle_id


def _triage(
    tmp_path: Path, store: LocalStore, bundle: str, **options: object
) -> tuple[TriageResult, MemoryIssueSink]:
    sink = MemoryIssueSink()
    context = ReplayContext.from_process()
    context = ReplayContext(base_env=context.base_env, temp_root=tmp_path / "tmp", git=context.git)
    result = triage(
        store,
        bundle,
        sandbox=ProcessSandbox(),
        policy=VerdictPolicy(),
        sink=sink,
        quarantine=None,
        context=context,
        **options,  # type: ignore[arg-type]
    )
    return result, sink


def test_a_replayed_program_that_burns_cpu_records_its_cpu_seconds(tmp_path: Path) -> None:
    store, bundle = _burning_bundle(tmp_path)
    result, sink = _triage(tmp_path, store, bundle)

    assert result.verdict.verdict is Verdict.DETERMINISTIC and result.verdict.replays == 5
    cost = result.cost
    assert cost is not None
    verdict = cost.phases["verdict"]
    assert verdict.runs == 5 and cost.runs == 5 and verdict.unmeasured == 0
    assert 5 * 0.15 <= verdict.cpu_s < 5 * 0.15 + 5.0  # the loop's CPU, plus the interpreters' start
    assert verdict.wall_s >= 0.5 * verdict.cpu_s  # one core each: wall time cannot be far below CPU time
    assert cost.gpus == 0 and cost.gpu_s == 0.0  # captured without GPUs: none given
    assert cost.budget_s is None and not cost.budget_spent
    # It survives JSON, shows in --json's object, and the issue says it.
    data = json.loads(json.dumps(result.to_json()))
    assert data["cost"]["cpu_s"] == pytest.approx(cost.cpu_s) and data["cost"]["runs"] == 5
    assert data["cost"]["phases"]["verdict"]["runs"] == 5
    assert TriageResult.from_json(data).cost == cost
    body = next(iter(sink.issues.values())).body
    assert "## What the triage cost" in body and f"{cost.cpu_s:.1f} CPU s" in body
    assert "| verdict | 5 |" in body and "0 GPU s (no GPU given)" in body


def test_a_spent_budget_ends_undecided_with_the_counts_so_far_and_reports_nothing(tmp_path: Path) -> None:
    store, bundle = _burning_bundle(tmp_path, seconds=1.0)
    # Each replay burns 1 CPU s (and a little to start): the first leaves some of the 1.5 s budget,
    # the second spends it, so no third starts and the deterministic verdict (5 of 5) is never reached.
    result, sink = _triage(tmp_path, store, bundle, budget_s=1.5, minimize=True)

    v = result.verdict
    assert not v.decided and v.replays == 2 and v.reproductions == 2 and v.passes == 0
    assert result.budget_spent and result.cost is not None and result.cost.runs == 2
    assert result.cost.paid_s >= 1.5 and result.cost.budget_s == 1.5
    assert result.report is None and sink.issues == {}  # a guess is never reported
    assert result.minimized is None  # nothing minimized on a guess
    data = result.to_json()
    assert data["decided"] is False and data["cost"]["budget_spent"] is True
    assert TriageResult.from_json(json.loads(json.dumps(data))).budget_spent


def test_a_budget_left_unspent_changes_nothing(tmp_path: Path) -> None:
    store, bundle = _burning_bundle(tmp_path, seconds=0.01)
    result, sink = _triage(tmp_path, store, bundle, budget_s=1000.0)
    assert result.verdict.decided and result.verdict.verdict is Verdict.DETERMINISTIC
    assert result.cost is not None and not result.cost.budget_spent and result.cost.budget_s == 1000.0
    assert len(sink.issues) == 1


def test_a_run_counts_only_its_own_process_tree_while_other_threads_run_children() -> None:
    """Several triages share a worker's process: another thread's child must not be counted."""
    burner: list[ProcessResult] = []
    thread = threading.Thread(
        target=lambda: burner.append(run_command([sys.executable, "-c", BURN.format(s=0.4)], ".", {}))
    )
    thread.start()
    sleeper = run_command([sys.executable, "-c", "import time; time.sleep(1.0)"], ".", {})
    thread.join()
    assert burner[0].cpu_s is not None and burner[0].cpu_s >= 0.4
    assert sleeper.cpu_s is not None and sleeper.cpu_s < 0.3


def test_the_meter_refuses_a_run_past_the_budget_and_counts_runs_by_phase() -> None:
    meter = CostMeter(budget_s=1.0, gpus=2)
    meter.record(RunCost(cpu_s=0.1, gpu_s=0.2, wall_s=0.1))
    meter.check()  # 0.3 of 1.0: another run may start
    with meter.during("minimize"):
        meter.record(RunCost(cpu_s=None, gpu_s=0.8, wall_s=0.4))  # a container: CPU not measured
    with pytest.raises(BudgetSpentError, match="budget of 1 CPU\\+GPU seconds is spent"):
        meter.check()
    cost = meter.cost
    assert cost.phases["verdict"] == PhaseCost(runs=1, cpu_s=0.1, gpu_s=0.2, wall_s=0.1)
    assert cost.phases["minimize"] == PhaseCost(runs=1, cpu_s=0.0, gpu_s=0.8, wall_s=0.4, unmeasured=1)
    assert cost.budget_spent and cost.runs == 2 and cost.paid_s == pytest.approx(1.1)
    assert TriageCost.from_json(json.loads(json.dumps(cost.to_json()))) == cost
    assert "CPU not measured for 1 runs" in cost.line() and "budget 1 CPU+GPU s spent" in cost.line()


def test_results_recorded_before_costs_read_back_without_one() -> None:
    data = TriageResult(bundle_id="b", verdict=SequentialTest().result()).to_json()
    del data["cost"]
    old = TriageResult.from_json(data)
    assert old.cost is None and not old.budget_spent


def test_a_budget_spent_in_minimization_keeps_the_decided_verdict_and_gives_no_minimal_bundle(
    tmp_path: Path,
) -> None:
    """Every run costs exactly 1 CPU s here: 5 decide, the 6th (minimization's first) spends the 5.5."""
    root = tmp_path / "proj"
    root.mkdir()
    (root / "rows.csv").write_text("id\n" + "".join(f"{i}\n" for i in range(50)))
    (root / "job.py").write_text("raise ValueError('boom 17')\n")
    store = LocalStore(tmp_path / "store")
    request = CaptureRequest(
        argv=[sys.executable, "job.py"],
        cwd=root,
        limits=SourceLimits(1 << 20, 1 << 24),
        echo=False,
        data=[root / "rows.csv"],
    )
    captured = run_and_capture(store, request)
    assert captured.bundle_id

    def respond(spec: SandboxSpec) -> ProcessResult:
        tb = f'Traceback (most recent call last):\n  File "{spec.cwd}/job.py", line 1, in <module>\n'
        stderr = tb + "ValueError: boom 17\n"
        return ProcessResult(
            exit_code=1, stdout="", stderr=stderr, timed_out=False, duration_s=0.5, cpu_s=1.0
        )

    sink = MemoryIssueSink()
    context = ReplayContext.from_process()
    result = triage(
        store,
        captured.bundle_id,
        sandbox=MemorySandbox(respond=respond),
        policy=VerdictPolicy(),
        sink=sink,
        quarantine=None,
        context=ReplayContext(base_env=context.base_env, temp_root=tmp_path / "tmp", git=context.git),
        minimize=True,
        budget_s=5.5,
    )
    assert result.verdict.decided and result.verdict.verdict is Verdict.DETERMINISTIC
    assert result.minimized is None and result.minimize_error and "budget" in result.minimize_error
    cost = result.cost
    assert cost is not None and cost.budget_spent
    assert (cost.phases["verdict"].runs, cost.phases["minimize"].runs) == (5, 1)
    assert cost.cpu_s == 6.0 and cost.wall_s == 3.0
    assert len(sink.issues) == 1  # a decided verdict is reported; only the minimal bundle is missing
