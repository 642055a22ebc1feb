"""Capture: run a command, decide whether it failed, and write a bundle of everything it needs.

The command's output is streamed live and its exit code passed through; on failure the bundle is
written blobs first, manifest last, so an interrupted capture leaves no half-written bundle.
"""

from __future__ import annotations

import os
import secrets
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from flaketriage.bundle import write_bundle
from flaketriage.ci.probes import probe_environment, probe_hardware
from flaketriage.ci.provenance import detect_provenance
from flaketriage.ci.source import SourceLimits, SourcePlan, capture_source, git_root, plan_source
from flaketriage.errors import DatasetError
from flaketriage.fingerprint import FailureInfo, fingerprint_failure, read_metrics
from flaketriage.manifest import BlobRef, Command, Failure, FailureCriteria, Manifest, Seeds
from flaketriage.process import ProcessResult, run_command
from flaketriage.redaction import Redactor
from flaketriage.store import Store
from flaketriage.trees import relative_to_cwd, store_data_input

HASH_SEED_VAR = "PYTHONHASHSEED"


@dataclass(frozen=True)
class CaptureRequest:
    """One command to run and capture."""

    argv: Sequence[str]
    cwd: Path
    limits: SourceLimits
    criteria: FailureCriteria = field(default_factory=FailureCriteria)
    data: Sequence[Path] = ()
    seed_env: Sequence[str] = ()
    snapshot: bool = False
    timeout_s: float | None = None
    kind: Literal["command", "test", "training"] = "command"
    echo: bool = True
    env: Mapping[str, str] | None = None
    annotations: Mapping[str, object] = field(default_factory=dict)


@dataclass(frozen=True)
class CaptureResult:
    """The run's outcome and, when it failed, the bundle that records it."""

    process: ProcessResult
    failure: FailureInfo | None
    bundle_id: str | None

    @property
    def failed(self) -> bool:
        return self.failure is not None


def validate_data(request: CaptureRequest) -> list[tuple[Path, str]]:
    """Check every ``--data`` path before the command runs, so a typo costs nothing."""
    from flaketriage.datasets import detect_format

    checked: list[tuple[Path, str]] = []
    for raw in request.data:
        path = raw if raw.is_absolute() else request.cwd / raw
        if not path.exists():
            raise DatasetError(f"--data {raw}: no such file or directory (looked in {request.cwd})")
        detect_format(path)
        checked.append((path, relative_to_cwd(path, request.cwd)))
    return checked


def run_and_capture(store: Store, request: CaptureRequest, redactor: Redactor | None = None) -> CaptureResult:
    """Run the command; on failure write a bundle and return its id."""
    data = validate_data(request)
    env = dict(os.environ if request.env is None else request.env)
    seeds = _choose_seeds(env, request.seed_env)
    plan = plan_source(request.cwd, snapshot=request.snapshot)
    result = run_command(request.argv, request.cwd, env, request.timeout_s, echo=request.echo)
    roots = [str(request.cwd.resolve())]
    repo = git_root(request.cwd)
    if repo is not None:
        roots.append(str(repo))
    metrics = None
    if request.criteria.metrics:
        metrics_file = request.cwd / request.criteria.metrics_file if request.criteria.metrics_file else None
        metrics = read_metrics(result.stdout, [m.name for m in request.criteria.metrics], metrics_file)
    info = fingerprint_failure(
        exit_code=result.exit_code,
        stdout=result.stdout,
        stderr=result.stderr,
        roots=roots,
        criteria=request.criteria,
        metrics=metrics,
        timed_out=result.timed_out,
    )
    if info is None:
        return CaptureResult(process=result, failure=None, bundle_id=None)
    redactor = redactor or Redactor()
    manifest = _build_manifest(store, request, plan, redactor, env, seeds, result, info, data)
    return CaptureResult(process=result, failure=info, bundle_id=write_bundle(store, manifest))


def _choose_seeds(env: dict[str, str], seed_env: Sequence[str]) -> Seeds:
    chosen = HASH_SEED_VAR not in env
    if chosen:
        # Python cannot report its random hash seed afterwards, so pick one and record it.
        env[HASH_SEED_VAR] = str(secrets.randbelow(4294967295) + 1)
    return Seeds(
        python_hash_seed=env[HASH_SEED_VAR],
        python_hash_seed_chosen=chosen,
        env={name: env[name] for name in seed_env if name in env},
    )


def _build_manifest(
    store: Store,
    request: CaptureRequest,
    plan: SourcePlan,
    redactor: Redactor,
    env: dict[str, str],
    seeds: Seeds,
    result: ProcessResult,
    info: FailureInfo,
    data: list[tuple[Path, str]],
) -> Manifest:
    redacted_env = redactor.redact_env(env)
    source = capture_source(
        store,
        plan,
        request.limits,
        exclude=[Path(store.location)] if not store.location.startswith("memory:") else [],
    )
    logs: dict[str, BlobRef] = {
        "stdout": store.put_bytes(redactor.redact_text(result.stdout).encode()),
        "stderr": store.put_bytes(redactor.redact_text(result.stderr).encode()),
    }
    inputs = tuple(store_data_input(store, path, rel) for path, rel in data)
    timeout = request.timeout_s or max(60.0, 10 * result.duration_s)
    return Manifest(
        kind=request.kind,
        command=Command(
            argv=redactor.redact_argv(request.argv),
            cwd=str(request.cwd.resolve()),
            env=redacted_env,
            timeout_s=timeout,
        ),
        source=source,
        seeds=seeds,
        criteria=request.criteria,
        failure=Failure(
            kind=info.kind,
            exit_code=result.exit_code,
            signal=info.signal,
            exception_type=info.exception_type,
            message=redactor.redact_text(info.message) if info.message else None,
            traceback=redactor.redact_text(info.traceback) if info.traceback else None,
            test_id=info.test_id,
            detail=redactor.redact_text(info.detail) if info.detail else None,
            fingerprint=info.fingerprint,
            # The fingerprint hashes the unredacted signature, so replays (whose output is not
            # redacted) still match it; only the stored, readable copy is masked.
            signature=redactor.redact_text(info.signature),
            duration_s=round(result.duration_s, 3),
        ),
        data=inputs,
        environment=probe_environment(),
        hardware=probe_hardware(),
        logs=logs,
        annotations=dict(request.annotations, captured_at_unix=round(time.time(), 3)),
        provenance=detect_provenance(env),
    )
