"""`triage` as a worker runs it: several at once in one process, and results that survive JSON."""

from __future__ import annotations

import json
import os
import shutil
import sys
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, get_args

import pytest
from hypothesis import given
from hypothesis import strategies as st

from flaketriage.capture.record import CaptureRequest, run_and_capture
from flaketriage.capture.source import SourceLimits
from flaketriage.process.child import ProcessResult
from flaketriage.process.git import Git
from flaketriage.store import LocalStore
from flaketriage.workers.cost import PHASES, PhaseCost, TriageCost
from flaketriage.workers.findings import Finding
from flaketriage.workers.minimize.minimizer import MinimizeResult
from flaketriage.workers.polluters import PolluterSearch
from flaketriage.workers.replay import ReplayContext
from flaketriage.workers.report import MemoryIssueSink, ReportKind, ReportRef
from flaketriage.workers.sandbox import MemorySandbox, SandboxSpec
from flaketriage.workers.triage import TriageResult, triage
from flaketriage.workers.verdict import RateInterval, Verdict, VerdictPolicy, VerdictResult

AUTHOR = ["-c", "user.name=t", "-c", "user.email=t@example.invalid"]


@dataclass(frozen=True)
class RecordingGit(Git):
    """A `Git` that remembers where it ran, to tell which triage's git did the work."""

    cwds: list[Path] = field(default_factory=list, compare=False, hash=False)

    def run(
        self, args: Sequence[str], cwd: Path, *, stdin: bytes | None = None, hint: str | None = None
    ) -> bytes:
        self.cwds.append(Path(cwd))
        return super().run(args, cwd, stdin=stdin, hint=hint)


def _git_bundle(tmp_path: Path) -> tuple[LocalStore, str]:
    """A failing job captured in a git repository, with uncommitted work (so replays clone and apply)."""
    root = tmp_path / "proj"
    root.mkdir()
    git = Git()
    (root / "job.py").write_text("raise SystemExit(0)\n")
    git.run(["init", "-q"], root)
    git.run([*AUTHOR, "add", "job.py"], root)
    git.run([*AUTHOR, "commit", "-qm", "job"], root)
    (root / "job.py").write_text("raise ValueError('boom 17')\n")
    store = LocalStore(tmp_path / "store")
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "API_TOKEN": "captured-token-value"}
    request = CaptureRequest(
        argv=[sys.executable, "job.py"], cwd=root, limits=SourceLimits(1 << 20, 1 << 24), echo=False, env=env
    )
    result = run_and_capture(store, request)
    assert result.bundle_id
    return store, result.bundle_id


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_two_triages_run_at_once_in_one_process_without_touching_each_other(tmp_path: Path) -> None:
    store, bundle = _git_bundle(tmp_path)
    both_replaying = threading.Barrier(2, timeout=60)
    seen: dict[str, list[tuple[str | None, Path, str]]] = {"a": [], "b": []}

    def sandbox_for(name: str) -> MemorySandbox:
        def respond(spec: SandboxSpec) -> ProcessResult:
            if not seen[name]:
                both_replaying.wait()  # neither triage replays until both have materialized
            seen[name].append((spec.env.get("API_TOKEN"), spec.workspace, (spec.cwd / "job.py").read_text()))
            tb = f'Traceback (most recent call last):\n  File "{spec.cwd}/job.py", line 1, in <module>\n'
            return ProcessResult(
                exit_code=1, stdout="", stderr=tb + "ValueError: boom 99\n", timed_out=False, duration_s=0.01
            )

        return MemorySandbox(respond=respond)

    contexts = {
        name: ReplayContext(
            base_env={"API_TOKEN": f"token-of-{name}"}, temp_root=tmp_path / f"tmp-{name}", git=RecordingGit()
        )
        for name in seen
    }
    sink = MemoryIssueSink()
    environ, cwd = dict(os.environ), os.getcwd()

    def run(name: str) -> TriageResult:
        return triage(
            store,
            bundle,
            sandbox=sandbox_for(name),
            policy=VerdictPolicy(),
            sink=sink,
            quarantine=None,
            context=contexts[name],
            minimize=True,
        )

    with ThreadPoolExecutor(max_workers=2) as pool:
        results = dict(zip(seen, pool.map(run, seen), strict=True))

    for name, result in results.items():
        assert result.verdict.verdict is Verdict.DETERMINISTIC and result.verdict.replays == 5
        assert result.minimized is not None and result.minimize_error is None
        temp_root = contexts[name].temp_root
        # Each replay saw its own triage's environment, workspace and the bundle's (patched) source.
        assert {token for token, _, _ in seen[name]} == {f"token-of-{name}"}
        assert all(temp_root in ws.parents for _, ws, _ in seen[name])
        assert {source for _, _, source in seen[name]} == {"raise ValueError('boom 17')\n"}
        # Its own git did the checkout, inside its own temp root; and everything there is gone.
        git = contexts[name].git
        assert isinstance(git, RecordingGit) and git.cwds
        assert all(temp_root in cwd.parents for cwd in git.cwds)
        assert list(temp_root.iterdir()) == []
        assert TriageResult.from_json(json.loads(json.dumps(result.to_json()))) == result
    # One issue for the one fingerprint: created by one triage, updated by the other.
    assert sorted(r.report.created for r in results.values() if r.report) == [False, True]
    assert len(sink.issues) == 1
    assert dict(os.environ) == environ and os.getcwd() == cwd


# -- JSON round trips ------------------------------------------------------------------------------
counts = st.integers(min_value=0, max_value=10**9)
rates = st.floats(min_value=0.0, max_value=1.0, allow_nan=False)
texts = st.text(max_size=40)

rate_intervals = st.builds(RateInterval, estimate=rates, low=rates, high=rates)
verdict_results = st.builds(
    VerdictResult,
    verdict=st.sampled_from(Verdict),
    decided=st.booleans(),
    replays=counts,
    reproductions=counts,
    passes=counts,
    different=counts,
    rate=rate_intervals,
)
findings = st.builds(Finding, fingerprint=texts, kind=texts, summary=texts, count=counts)
minimize_results = st.builds(
    MinimizeResult,
    bundle_id=texts,
    data=st.dictionaries(texts, st.tuples(counts, counts), max_size=4),
    args=st.dictionaries(texts, st.tuples(texts, texts), max_size=4),
    oracle_calls=counts,
    replays=counts,
)
report_refs = st.builds(
    ReportRef, kind=st.sampled_from(get_args(ReportKind)), location=texts, created=st.booleans()
)
polluter_searches = st.builds(
    PolluterSearch,
    preceding=counts,
    reproduced_in_order=st.booleans(),
    polluters=st.lists(texts, max_size=5).map(tuple),
    oracle_calls=counts,
    confirmations=counts,
    confirm_runs=counts,
    replays=counts,
)
seconds = st.floats(min_value=0, max_value=1e6, allow_nan=False)
phase_costs = st.builds(
    PhaseCost, runs=counts, cpu_s=seconds, gpu_s=seconds, wall_s=seconds, unmeasured=counts
)
triage_costs = st.builds(
    TriageCost,
    phases=st.dictionaries(st.sampled_from(PHASES), phase_costs),
    gpus=counts,
    budget_s=st.none() | seconds,
    budget_spent=st.booleans(),
)
triage_results = st.builds(
    TriageResult,
    bundle_id=texts,
    verdict=verdict_results,
    findings=st.lists(findings, max_size=4),
    minimized=st.none() | minimize_results,
    minimize_error=st.none() | texts,
    report=st.none() | report_refs,
    polluter_search=st.none() | polluter_searches,
    hardware_difference=st.none() | texts,
    environment=st.none()
    | st.fixed_dictionaries({"mode": st.just("worker")})
    | st.fixed_dictionaries(
        {"mode": st.just("bundle"), "digest": texts, "built": st.booleans(), "build_s": st.just(1.5)}
    ),
    cost=st.none() | triage_costs,
)


def _through_json(data: dict[str, Any]) -> Any:
    return json.loads(json.dumps(data, allow_nan=False))


@given(verdict_results)
def test_verdict_result_round_trips(result: VerdictResult) -> None:
    assert VerdictResult.from_json(_through_json(result.to_json())) == result


@given(findings)
def test_finding_round_trips(finding: Finding) -> None:
    assert Finding.from_json(_through_json(finding.to_json())) == finding


@given(minimize_results)
def test_minimize_result_round_trips(result: MinimizeResult) -> None:
    assert MinimizeResult.from_json(_through_json(result.to_json())) == result


@given(report_refs)
def test_report_ref_round_trips(ref: ReportRef) -> None:
    assert ReportRef.from_json(_through_json(ref.to_json())) == ref


@given(polluter_searches)
def test_polluter_search_round_trips(search: PolluterSearch) -> None:
    assert PolluterSearch.from_json(_through_json(search.to_json())) == search


@given(triage_results)
def test_triage_result_round_trips(result: TriageResult) -> None:
    assert TriageResult.from_json(_through_json(result.to_json())) == result


def test_triage_json_has_the_documented_shape() -> None:
    """The keys docs/commands/triage.md documents for ``flaketriage triage --json``."""
    result = TriageResult(
        bundle_id="b" * 64,
        verdict=VerdictResult(Verdict.DETERMINISTIC, True, 5, 5, 0, 0, RateInterval(1.0, 0.478, 1.0)),
        minimized=MinimizeResult("c" * 64, {"data/train.csv": (1, 400)}, {"--steps": ("200", "1")}, 23, 23),
        report=ReportRef(kind="markdown", location=".flaketriage/issues/x.md", created=True),
    )
    data = result.to_json()
    assert list(data) == [
        "bundle", "verdict", "decided", "replays", "failures", "passes", "different_failures",
        "sandbox_limits", "environment_failures", "failure_rate", "findings", "polluters", "order_cause",
        "polluter_search",
        "minimal_bundle", "minimal", "minimize_error", "report", "hang", "attribution", "telemetry",
        "hardware_difference", "environment", "cost",
    ]  # fmt: skip
    assert data["minimal_bundle"] == "c" * 64
    assert data["minimal"] == {
        "data": {"data/train.csv": {"kept": 1, "of": 400}},
        "args": {"--steps": {"from": "200", "to": "1"}},
        "oracle_calls": 23,
        "replays": 23,
    }
    assert data["failure_rate"] == {"estimate": 1.0, "low": 0.478, "high": 1.0}
    no_report = TriageResult.from_json(
        {**data, "report": {"kind": "none", "location": None, "created": False}}
    )
    assert no_report.report is None and no_report.to_json()["report"]["kind"] == "none"


def test_unknown_values_are_refused() -> None:
    data = TriageResult(
        bundle_id="b", verdict=VerdictResult(Verdict.FLAKY, True, 2, 1, 1, 0, RateInterval(0.5, 0.01, 0.99))
    ).to_json()
    with pytest.raises(ValueError):
        TriageResult.from_json({**data, "verdict": "maybe"})
    with pytest.raises(ValueError):
        TriageResult.from_json({**data, "report": {"kind": "fax", "location": "x", "created": True}})
    with pytest.raises(KeyError):
        TriageResult.from_json({k: v for k, v in data.items() if k != "failure_rate"})
