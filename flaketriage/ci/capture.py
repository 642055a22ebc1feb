"""Capture: run a command, decide whether it failed, and write a bundle of everything it needs.

The command's output is streamed live and its exit code passed through; on failure the bundle is
written blobs first, manifest last, so an interrupted capture leaves no half-written bundle.
"""

from __future__ import annotations

import os
import secrets
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from flaketriage.bundle import write_bundle
from flaketriage.child_process import ProcessResult, run_command
from flaketriage.ci.probes import probe_environment, probe_hardware
from flaketriage.ci.provenance import detect_provenance
from flaketriage.ci.sentry import after_capture
from flaketriage.ci.source import CAPTURE_GIT, SourceLimits, SourcePlan, capture_source, plan_source
from flaketriage.errors import DatasetError
from flaketriage.fingerprint import FailureInfo, fingerprint_failure
from flaketriage.manifest import (
    BlobRef,
    Command,
    DataInput,
    Failure,
    FailureCriteria,
    Manifest,
    PytestContext,
    Seeds,
)
from flaketriage.metrics import read_metrics
from flaketriage.redaction import Redactor
from flaketriage.settings import load_settings
from flaketriage.store import Store
from flaketriage.stored_files import relative_to_cwd, store_data_input

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
    repo = CAPTURE_GIT.root(request.cwd)
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
    manifest = _build_manifest(
        store,
        _Pieces(
            argv=request.argv,
            cwd=request.cwd,
            kind=request.kind,
            plan=plan,
            limits=request.limits,
            env=env,
            seeds=seeds,
            criteria=request.criteria,
            info=info,
            exit_code=result.exit_code,
            stdout=result.stdout,
            stderr=result.stderr,
            duration_s=result.duration_s,
            timeout_s=request.timeout_s or max(60.0, 10 * result.duration_s),
            inputs=tuple(store_data_input(store, path, rel) for path, rel in data),
            annotations=dict(request.annotations),
        ),
        redactor,
    )
    return CaptureResult(process=result, failure=info, bundle_id=write_bundle(store, manifest))


def record_failure(
    store: Store,
    info: FailureInfo,
    *,
    argv: Sequence[str] | None = None,
    cwd: Path | None = None,
    kind: Literal["command", "test", "training"] = "training",
    limits: SourceLimits | None = None,
    snapshot: bool = False,
    data: Sequence[DataInput] = (),
    seed_values: Mapping[str, int | str] | None = None,
    stdout: str = "",
    stderr: str = "",
    attachments: Mapping[str, bytes] | None = None,
    checkpoint: bytes | Path | None = None,
    annotations: Mapping[str, object] | None = None,
    pytest: PytestContext | None = None,
    timeout_s: float | None = None,
    env: Mapping[str, str] | None = None,
    plan: SourcePlan | None = None,
) -> str:
    """Write a bundle for a failure seen inside this process (a guard trip, a test hook).

    The command that reruns it defaults to this interpreter with this process's arguments; data
    inputs are already stored (`trees.store_data_input`). `env` is the environment the rerun gets
    (default: this process's); `plan` lists the source files as they were before the failing work
    started (default: listed now, which counts files the process wrote as inputs). Returns the
    bundle id.
    """
    cwd = (cwd or Path.cwd()).resolve()
    env = dict(os.environ if env is None else env)
    redactor = Redactor()
    refs = {name: store.put_bytes(blob) for name, blob in (attachments or {}).items()}
    ckpt = None
    if checkpoint is not None:
        ckpt = store.put_file(checkpoint) if isinstance(checkpoint, Path) else store.put_bytes(checkpoint)
    manifest = _build_manifest(
        store,
        _Pieces(
            argv=list(argv) if argv is not None else [sys.executable, *sys.argv],
            cwd=cwd,
            kind=kind,
            plan=plan if plan is not None else plan_source(cwd, snapshot=snapshot),
            limits=limits or SourceLimits.from_settings(load_settings()),
            env=env,
            # This process's hash seed is only known when it was set before it started.
            seeds=Seeds(python_hash_seed=env.get(HASH_SEED_VAR), values=dict(seed_values or {})),
            criteria=FailureCriteria(),
            info=info,
            exit_code=info.exit_code,
            stdout=stdout,
            stderr=stderr,
            duration_s=0.0,
            timeout_s=timeout_s,
            inputs=tuple(data),
            annotations=dict(annotations or {}),
            pytest=pytest,
            attachments=refs,
            checkpoint=ckpt,
        ),
        redactor,
    )
    return after_capture(write_bundle(store, manifest))


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


@dataclass(frozen=True)
class _Pieces:
    """Everything a manifest is built from, however the failure was seen."""

    argv: Sequence[str]
    cwd: Path
    kind: Literal["command", "test", "training"]
    plan: SourcePlan
    limits: SourceLimits
    env: dict[str, str]
    seeds: Seeds
    criteria: FailureCriteria
    info: FailureInfo
    exit_code: int | None
    stdout: str
    stderr: str
    duration_s: float
    timeout_s: float | None
    inputs: tuple[DataInput, ...]
    annotations: dict[str, object]
    pytest: PytestContext | None = None
    attachments: Mapping[str, BlobRef] = field(default_factory=dict)
    checkpoint: BlobRef | None = None


def _build_manifest(store: Store, p: _Pieces, redactor: Redactor) -> Manifest:
    redacted_env = redactor.redact_env(p.env)
    source = capture_source(
        store,
        p.plan,
        p.limits,
        exclude=[Path(store.location)] if not store.location.startswith("memory:") else [],
    )
    logs: dict[str, BlobRef] = {
        "stdout": store.put_bytes(redactor.redact_text(p.stdout).encode()),
        "stderr": store.put_bytes(redactor.redact_text(p.stderr).encode()),
    }
    info = p.info
    return Manifest(
        kind=p.kind,
        command=Command(
            argv=redactor.redact_argv(p.argv),
            cwd=str(p.cwd.resolve()),
            env=redacted_env,
            timeout_s=p.timeout_s,
        ),
        source=source,
        seeds=p.seeds,
        criteria=p.criteria,
        failure=Failure(
            kind=info.kind,
            exit_code=p.exit_code,
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
            duration_s=round(p.duration_s, 3),
        ),
        data=p.inputs,
        environment=probe_environment(),
        hardware=probe_hardware(),
        logs=logs,
        checkpoint=p.checkpoint,
        attachments=dict(p.attachments),
        pytest=p.pytest,
        annotations=dict(p.annotations, captured_at_unix=round(time.time(), 3)),
        provenance=detect_provenance(p.env),
    )
