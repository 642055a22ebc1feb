"""The replay loop's decisions, driven by the in-memory sandbox: fast and exactly scripted."""

from __future__ import annotations

import itertools
import sys
from collections.abc import Iterator
from pathlib import Path

from flaketriage.bundle.io import load_manifest
from flaketriage.bundle.manifest import Manifest
from flaketriage.capture.record import CaptureRequest, run_and_capture
from flaketriage.capture.source import SourceLimits
from flaketriage.process.child import ProcessResult
from flaketriage.store import LocalStore
from flaketriage.workers.replay import ReplayContext, Replayer
from flaketriage.workers.sandbox import MemorySandbox, SandboxSpec
from flaketriage.workers.triage import decide
from flaketriage.workers.verdict import Verdict, VerdictPolicy


def _bundle(tmp_path: Path) -> tuple[LocalStore, Manifest]:
    root = tmp_path / "proj"
    root.mkdir(parents=True)
    (root / "job.py").write_text("raise ValueError('boom 17')\n")
    store = LocalStore(tmp_path / "store")
    request = CaptureRequest(
        argv=[sys.executable, "job.py"], cwd=root, limits=SourceLimits(1 << 20, 1 << 24), echo=False
    )
    result = run_and_capture(store, request)
    assert result.bundle_id
    return store, load_manifest(store, result.bundle_id)


def _script(outcomes: str) -> MemorySandbox:
    """R = reproduce (same exception, other numbers), P = pass, D = a different failure."""
    steps: Iterator[str] = itertools.chain(outcomes, itertools.repeat(outcomes[-1]))

    def respond(spec: SandboxSpec) -> ProcessResult:
        step = next(steps)
        tb = f'Traceback (most recent call last):\n  File "{spec.cwd}/job.py", line 1, in <module>\n'
        stderr = {"R": tb + "ValueError: boom 99\n", "P": "", "D": tb + "KeyError: 'cfg'\n"}[step]
        return ProcessResult(
            exit_code=0 if step == "P" else 1, stdout="", stderr=stderr, timed_out=False, duration_s=0.01
        )

    return MemorySandbox(respond=respond)


def _decide(tmp_path: Path, outcomes: str, **policy: object) -> tuple[object, list[object], MemorySandbox]:
    store, manifest = _bundle(tmp_path)
    sandbox = _script(outcomes)
    with Replayer(store, manifest, sandbox, context=ReplayContext.from_process()) as replayer:
        verdict, findings = decide(replayer, VerdictPolicy(**policy))  # type: ignore[arg-type]
    return verdict, findings, sandbox  # type: ignore[return-value]


def test_deterministic_after_five(tmp_path: Path) -> None:
    verdict, findings, sandbox = _decide(tmp_path, "R")
    assert verdict.verdict is Verdict.DETERMINISTIC and verdict.replays == 5  # type: ignore[attr-defined]
    assert findings == [] and len(sandbox.runs) == 5


def test_flaky_samples_the_rate_after_deciding(tmp_path: Path) -> None:
    verdict, _, _ = _decide(tmp_path, "RP" * 20)
    assert verdict.verdict is Verdict.FLAKY  # type: ignore[attr-defined]
    assert verdict.replays == 20 and verdict.reproductions == 10  # type: ignore[attr-defined]
    verdict0, _, _ = _decide(tmp_path / "b", "RP", flaky_rate_replays=0)
    assert verdict0.replays == 2  # type: ignore[attr-defined]


def test_different_failures_are_findings_not_reproductions(tmp_path: Path) -> None:
    verdict, findings, _ = _decide(tmp_path, "D")
    assert verdict.verdict is Verdict.DIFFERENT_FAILURE and verdict.reproductions == 0  # type: ignore[attr-defined]
    assert len(findings) == 1 and findings[0].count == 5 and "KeyError" in findings[0].summary  # type: ignore[attr-defined]


def test_not_reproduced_after_59_clean_replays(tmp_path: Path) -> None:
    verdict, _, sandbox = _decide(tmp_path, "P")
    assert verdict.verdict is Verdict.NOT_REPRODUCED and len(sandbox.runs) == 59  # type: ignore[attr-defined]


def test_max_replays_caps_an_undecided_run(tmp_path: Path) -> None:
    verdict, _, sandbox = _decide(tmp_path, "P", max_replays=10)
    assert not verdict.decided and len(sandbox.runs) == 10  # type: ignore[attr-defined]


def test_replay_spec_hides_the_original_workspace(tmp_path: Path) -> None:
    _, _, sandbox = _decide(tmp_path, "R")
    spec = sandbox.runs[0]
    assert str(tmp_path / "proj") in [str(h) for h in spec.host.hidden]
    assert spec.cwd != tmp_path / "proj" and (spec.env["PYTHONHASHSEED"]).isdigit()
    assert spec.argv[-1] == "job.py"
