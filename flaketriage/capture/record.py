"""Capture: run a command, decide whether it failed, and write a bundle of everything it needs.

The command's output is streamed live and its exit code passed through; on failure the bundle is
written blobs first, manifest last, so an interrupted capture leaves no half-written bundle.
Declared data is checked and stored before the command runs (it may rewrite or delete its input),
and once the command has run its failure is either in a bundle or in `CaptureResult.error`.
"""

from __future__ import annotations

import os
import secrets
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from flaketriage.bundle.files import relative_to_cwd, store_data_input
from flaketriage.bundle.io import write_bundle
from flaketriage.bundle.manifest import (
    BlobRef,
    Command,
    DataInput,
    Failure,
    FailureCriteria,
    Manifest,
    PytestContext,
    Seeds,
)
from flaketriage.bundle.redaction import Redactor
from flaketriage.capture.probes import probe_environment, probe_hardware
from flaketriage.capture.provenance import detect_provenance
from flaketriage.capture.sentry import after_capture
from flaketriage.capture.source import CAPTURE_GIT, SourceLimits, SourcePlan, capture_source, plan_source
from flaketriage.errors import CaptureError, DatasetError, FlaketriageError
from flaketriage.failure.fingerprint import FailureInfo, fingerprint_failure
from flaketriage.failure.runner_results import JUNIT_ATTACHMENT, junit_argument, read_junit_file
from flaketriage.process.child import ProcessResult, run_command
from flaketriage.process.hangs import HANG_DUMP_ENV, sitecustomize_dir
from flaketriage.process.replay_env import DETERMINISTIC_ENV
from flaketriage.settings import load_settings
from flaketriage.store import Store

if TYPE_CHECKING:
    from flaketriage.bundle.datasets import DataFormat

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
    error: str | None = None
    """Why the run has no bundle although it ran: writing the bundle (or judging the run) failed.
    None when the bundle was written or the run passed."""

    @property
    def failed(self) -> bool:
        return self.failure is not None


@dataclass(frozen=True)
class CheckedData:
    """A ``--data`` input that was read through once before the run: its format and item count."""

    path: Path
    rel: str
    format: DataFormat
    items: int


def validate_data(request: CaptureRequest) -> list[CheckedData]:
    """Read every ``--data`` input through before the command runs (format, readability, items),
    so a typo or a broken file costs nothing. Raises `DatasetError`."""
    return [check_data(raw, request.cwd) for raw in request.data]


def check_data(raw: Path, cwd: Path, rel: str | None = None) -> CheckedData:
    """Read one declared input through (format, readability, items); `rel` is where a replay
    restores it, relative to `cwd` (default: where it is). Raises `DatasetError`."""
    from flaketriage.bundle.datasets import count_items, detect_format

    path = raw if raw.is_absolute() else cwd / raw
    if not path.exists():
        raise DatasetError(f"--data {raw}: no such file or directory (looked in {cwd})")
    rel = relative_to_cwd(path, cwd) if rel is None else rel
    fmt = detect_format(path)
    return CheckedData(path, rel, fmt, count_items(path, fmt))


def _warn_on_stderr(message: str) -> None:
    print(f"flaketriage: warning: {message}", file=sys.stderr, flush=True)


def run_and_capture(
    store: Store,
    request: CaptureRequest,
    redactor: Redactor | None = None,
    warn: Callable[[str], None] = _warn_on_stderr,
) -> CaptureResult:
    """Run the command; on failure write a bundle and return its id.

    Raises before the command runs (bad data, a store that cannot take the data); once it has run,
    nothing raises: a bundle that cannot be written is `CaptureResult.error`, so the caller can
    say why and still exit with the command's status. `warn` hears about inputs with no items.
    """
    from flaketriage.bundle.datasets import empty_note

    data = validate_data(request)
    for checked in data:
        note = empty_note(checked.rel, checked.format, checked.items)
        if note is not None:
            warn(note)
    env = dict(os.environ if request.env is None else request.env)
    seeds = _choose_seeds(env, request.seed_env)
    plan = plan_source(request.cwd, snapshot=request.snapshot)
    # Stored now, as the command is about to read them: one that rewrites or deletes its input
    # still leaves a bundle holding what it read. Streamed, so memory does not grow with the data.
    inputs = _store_inputs(store, data, request.cwd)
    result = run_command(
        request.argv, request.cwd, _run_env(env, request.timeout_s), request.timeout_s, echo=request.echo
    )
    info: FailureInfo | None = None
    try:
        info = _judge(request, result)
        if info is None:
            return CaptureResult(process=result, failure=None, bundle_id=None)
        pieces = _Pieces(
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
            inputs=inputs,
            annotations=dict(request.annotations),
            hang=result.hang.text() if result.hang is not None and info.kind == "timeout" else None,
            attachments=_runner_report(store, request, warn, redactor or Redactor()),
        )
        _put_back_collected(store, data, inputs)
        bundle_id = write_bundle(store, _build_manifest(store, pieces, redactor or Redactor()))
    except Exception as exc:  # the command has run: say why there is no bundle, never lose its status
        why = str(exc) if isinstance(exc, FlaketriageError) else f"{type(exc).__name__}: {exc}"
        return CaptureResult(process=result, failure=info, bundle_id=None, error=why)
    return CaptureResult(process=result, failure=info, bundle_id=bundle_id)


def _runner_report(
    store: Store, request: CaptureRequest, warn: Callable[[str], None], redactor: Redactor
) -> dict[str, BlobRef]:
    """The JUnit XML report a pytest command wrote (``--junitxml``), redacted like its output and
    attached so that a flaky verdict can quarantine the tests it names (`flaketriage.failure.runner_results`);
    one outside the workspace, a link, too big or unreadable is left out with a warning, never
    failing the capture."""
    path = junit_argument(request.argv)
    if path is None:
        return {}
    workspace = CAPTURE_GIT.root(request.cwd) or request.cwd
    try:
        report = read_junit_file(request.cwd, path, workspace)
    except CaptureError as exc:
        warn(str(exc))
        return {}
    redacted = redactor.redact_text(report.decode("utf-8", "replace")).encode()
    return {JUNIT_ATTACHMENT: store.put_bytes(redacted)}


def _run_env(env: Mapping[str, str], timeout_s: float | None) -> dict[str, str]:
    """The environment the command runs in: the recorded one, plus, under a time limit, what lets a
    hang be located (`flaketriage.process.hangs`): the ``sitecustomize`` that dumps stacks on SIGUSR1, with
    the replay's torch determinism left off. None of it is recorded: replays add their own."""
    if timeout_s is None:
        return dict(env)
    run_env = dict(env)
    run_env["PYTHONPATH"] = os.pathsep.join(p for p in (sitecustomize_dir(), env.get("PYTHONPATH")) if p)
    run_env[HANG_DUMP_ENV] = "1"
    run_env.setdefault(DETERMINISTIC_ENV, "0")
    return run_env


def _store_inputs(store: Store, data: Sequence[CheckedData], cwd: Path) -> tuple[DataInput, ...]:
    return tuple(store_checked(store, checked, cwd) for checked in data)


def store_checked(store: Store, checked: CheckedData, workspace: Path) -> DataInput:
    """Store an input `check_data` read through (streamed); links in a directory may point
    anywhere inside `workspace`. Raises `DatasetError`."""
    try:
        return store_data_input(store, checked.path, checked.rel, items=checked.items, workspace=workspace)
    except OSError as exc:
        raise DatasetError(
            f"cannot store data input {checked.path} before running the command "
            f"({exc.strerror or exc}{f': {exc.filename}' if exc.filename else ''}); make it "
            "readable and the store writable, or leave it out of --data"
        ) from exc


def _put_back_collected(store: Store, data: Sequence[CheckedData], inputs: tuple[DataInput, ...]) -> None:
    """Store again the inputs whose blobs a garbage collection removed while a long command ran
    (nothing referenced them yet); only from files that still hold exactly the bytes stored."""
    for checked, stored in zip(data, inputs, strict=True):
        refs = [stored.blob.sha256] if stored.blob else [f.sha256 for f in stored.files]
        if all(store.has(ref) for ref in refs):
            continue
        if store_data_input(store, checked.path, checked.rel, items=checked.items) != stored:
            raise DatasetError(
                f"the copy of --data {checked.rel} stored before the run was removed from the store "
                "during it (garbage collection of unreferenced objects), and the file has changed "
                "since; capture again, or collect garbage with a grace period longer than the run"
            )


def _judge(request: CaptureRequest, result: ProcessResult) -> FailureInfo | None:
    roots = [str(request.cwd.resolve())]
    repo = CAPTURE_GIT.root(request.cwd)
    if repo is not None:
        roots.append(str(repo))
    return fingerprint_failure(
        exit_code=result.unwrapped_exit_code,  # a shell's 128 + N is death by signal N
        stdout=result.stdout,
        stderr=result.stderr,
        roots=roots,
        criteria=request.criteria,
        timed_out=result.timed_out,
        metrics_dir=request.cwd,
        hang=result.hang,
    )


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
    seeds_drawn: Sequence[str] = (),
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
            seeds=Seeds(
                python_hash_seed=env.get(HASH_SEED_VAR),
                values=dict(seed_values or {}),
                drawn=tuple(seeds_drawn),
            ),
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
    hang: str | None = None
    """The stacks dumped from a run that hung (`flaketriage.process.hangs`), kept as the ``hang`` log."""


def _build_manifest(store: Store, p: _Pieces, redactor: Redactor) -> Manifest:
    redacted_env = redactor.redact_env(p.env)
    source = capture_source(
        store,
        p.plan,
        p.limits,
        exclude=[Path(store.location)] if not store.location.startswith("memory:") else [],
        redactor=redactor,
    )
    logs: dict[str, BlobRef] = {
        "stdout": store.put_bytes(redactor.redact_text(p.stdout).encode()),
        "stderr": store.put_bytes(redactor.redact_text(p.stderr).encode()),
    }
    if p.hang:
        logs["hang"] = store.put_bytes(redactor.redact_text(p.hang).encode())
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
            identity=info.identity,
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
