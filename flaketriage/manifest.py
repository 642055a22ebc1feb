"""The bundle manifest: the versioned contract between capture, store, replay and report.

A manifest names every blob by SHA-256; its canonical JSON (sorted keys, no spaces, UTF-8) hashes
to the bundle id. Unknown fields are refused, so a manifest from a newer schema fails loudly, and
``schema_version`` changes with any change that re-encodes an existing manifest differently (its
id would no longer match). Version 2 added `PytestContext` (the ``pytest`` field). The command's
arguments, directory and environment are `OsStr`: bytes that are not UTF-8 survive as marked escapes.
"""

from __future__ import annotations

import hashlib
import json
from datetime import UTC, datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from flaketriage.errors import BundleError
from flaketriage.os_strings import OsStr

SCHEMA_VERSION = 2
MAX_NESTING = 64
"""The deepest a manifest's JSON may nest: real ones nest a few levels (annotations a few more)."""


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class BlobRef(_Model):
    """A blob in the store: its SHA-256 (of the raw bytes) and its size."""

    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    size: int = Field(ge=0)


class FileEntry(_Model):
    """One file of a tree: a POSIX path relative to the tree's root, its blob and mode.

    A symbolic link is kept as a link when it points inside the workspace: `link` is its target
    and the blob holds the target's text, as git stores links. Paths keep bytes that are not UTF-8
    (`OsStr`), so a file is restored under exactly the name it had.
    """

    path: OsStr
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    size: int = Field(ge=0)
    executable: bool = False
    link: OsStr | None = None
    """For a symbolic link: its target, a relative path that never leaves the workspace (restore
    refuses any other)."""


class ExcludedFile(_Model):
    """A file left out of the bundle on purpose (a credential file, a link out of the workspace)."""

    path: OsStr
    reason: str


class Source(_Model):
    """The code that ran: a git commit plus uncommitted work, or a snapshot of the directory."""

    kind: Literal["git", "snapshot", "none"] = "none"
    commit: str | None = None
    branch: str | None = None
    remote: str | None = None
    repo_path: OsStr | None = None
    """Absolute path of the repository (or snapshot) root on the capturing machine."""
    subdir: OsStr = "."
    """The command's working directory, relative to the root."""
    diff: BlobRef | None = None
    """``git diff --binary HEAD``: tracked changes that were not committed (credential files left
    out, secrets in added lines masked)."""
    files: tuple[FileEntry, ...] = ()
    """Untracked, non-ignored files (git) or every file of the snapshot."""
    skipped: tuple[OsStr, ...] = ()
    """Files left out because they passed the size cap."""
    excluded: tuple[ExcludedFile, ...] = ()
    """Files never captured: credential files and links that point out of the workspace."""
    masked: tuple[OsStr, ...] = ()
    """Files stored (or diffed) with secret values replaced by ``[REDACTED]``: a replay runs the
    masked copy, which may be why it fails differently."""


class Command(_Model):
    """What ran, where, and with which (redacted) environment."""

    argv: tuple[OsStr, ...]
    cwd: OsStr
    env: dict[OsStr, OsStr] = Field(default_factory=dict)
    """Arguments, the directory and environment keep bytes that are not UTF-8 (`OsStr`), so a
    replay passes the exact bytes the original run got."""
    timeout_s: float | None = None


class Seeds(_Model):
    """Every seed in force. ``PYTHONHASHSEED`` is chosen by flaketriage when the run left it unset."""

    python_hash_seed: OsStr | None = None
    python_hash_seed_chosen: bool = False
    env: dict[OsStr, OsStr] = Field(default_factory=dict)
    """Seeds passed through environment variables named with ``--seed-env``."""
    values: dict[str, int | str] = Field(default_factory=dict)
    """Seeds reported by the program itself (pytest-randomly, guards: python, numpy, torch, cuda)."""


class MetricBound(_Model):
    """A metric that must stay within bounds: crossing one is a failure even without a crash."""

    name: str
    above: float | None = None
    below: float | None = None


class FailureCriteria(_Model):
    """What counts as failure for this command, on capture and on every replay."""

    nonzero_exit: bool = True
    fail_patterns: tuple[str, ...] = ()
    metrics: tuple[MetricBound, ...] = ()
    metrics_file: str | None = None


class Failure(_Model):
    """How the run failed, and its fingerprint."""

    kind: Literal["exception", "exit", "signal", "pattern", "metric", "timeout", "test"]
    exit_code: int | None = None
    signal: str | None = None
    exception_type: str | None = None
    message: str | None = None
    traceback: str | None = None
    test_id: str | None = None
    detail: str | None = None
    fingerprint: str
    signature: str
    """The normalized text the fingerprint hashes, kept so people can read what matched."""
    duration_s: float = 0.0


class DataInput(_Model):
    """A declared, reducible input restored at the same path (relative to the cwd) on replay."""

    path: OsStr
    format: Literal["csv", "jsonl", "npy", "dir"]
    items: int = Field(ge=0)
    """How many reducible units it holds: rows, lines, first-axis entries or directory entries."""
    reducible: bool = True
    blob: BlobRef | None = None
    files: tuple[FileEntry, ...] = ()
    """For a directory: its files, paths relative to the directory."""
    excluded: tuple[ExcludedFile, ...] = ()
    """For a directory: files never captured (credential files, links out of the working
    directory), paths relative to the directory."""


class GPU(_Model):
    index: int
    name: str
    uuid: str | None = None
    memory_total_mb: float | None = None
    memory_used_mb: float | None = None
    utilization_pct: float | None = None
    power_w: float | None = None
    temperature_c: float | None = None


class Hardware(_Model):
    """The machine at the time of failure."""

    host: str | None = None
    cpu_model: str | None = None
    cpu_count: int | None = None
    memory_total_mb: float | None = None
    memory_available_mb: float | None = None
    load_avg: tuple[float, ...] = ()
    gpus: tuple[GPU, ...] = ()
    driver_version: str | None = None
    cuda_version: str | None = None
    cudnn_version: str | None = None


class Environment(_Model):
    """The software the run used."""

    python: str
    implementation: str
    executable: str | None = None
    platform: str
    machine: str
    packages: tuple[str, ...] = ()
    """``name==version`` for every installed distribution, sorted."""


class Provenance(_Model):
    """Where the failure came from."""

    ci_provider: str | None = None
    run_url: str | None = None
    job: str | None = None
    attempt: str | None = None
    runner: str | None = None
    host: str | None = None


class PytestContext(_Model):
    """A failing pytest test as the plugin saw it in its session: what the polluter search needs.

    Node ids are written as the rerun command (``command.argv``) names them: relative to the
    directory pytest was invoked in.
    """

    node_id: str
    preceding: tuple[str, ...] = ()
    """The tests that ran before it in the same process, in order: the polluter candidates."""
    rootdir: str
    invocation_dir: str
    duration_s: float = 0.0
    """The test's own setup, call and teardown."""
    elapsed_s: float = 0.0
    """From the session's start to the end of this test: what replaying every preceding test costs."""


class Minimization(_Model):
    """How a minimized bundle was derived from its parent."""

    data: dict[str, tuple[int, int]] = Field(default_factory=dict)
    """path → (kept, of)."""
    args: dict[str, tuple[str, str]] = Field(default_factory=dict)
    """flag → (original value, minimized value)."""
    oracle_calls: int = 0


class Manifest(_Model):
    """Everything needed to reproduce one failure."""

    schema_version: Literal[2] = 2
    created_at: datetime = Field(default_factory=lambda: datetime.now(UTC))
    kind: Literal["command", "test", "training"] = "command"
    command: Command
    source: Source = Source()
    seeds: Seeds = Seeds()
    criteria: FailureCriteria = FailureCriteria()
    failure: Failure
    data: tuple[DataInput, ...] = ()
    environment: Environment
    hardware: Hardware = Hardware()
    logs: dict[str, BlobRef] = Field(default_factory=dict)
    """Named logs: ``stdout``, ``stderr`` (full output, redacted) and any attached log files."""
    checkpoint: BlobRef | None = None
    attachments: dict[str, BlobRef] = Field(default_factory=dict)
    pytest: PytestContext | None = None
    """Set for a test captured by the pytest plugin (``kind == "test"``)."""
    annotations: dict[str, Any] = Field(default_factory=dict)
    """Free-form extras (a guard's step, a quarantine note); nothing reads them back as a contract."""
    provenance: Provenance = Provenance()
    parent: str | None = None
    minimization: Minimization | None = None

    def canonical_json(self) -> bytes:
        """The bytes the bundle id hashes: sorted keys, no whitespace, UTF-8."""
        return json.dumps(
            self.model_dump(mode="json"), sort_keys=True, separators=(",", ":"), ensure_ascii=False
        ).encode("utf-8")

    @property
    def bundle_id(self) -> str:
        return hashlib.sha256(self.canonical_json()).hexdigest()

    def blobs(self) -> list[BlobRef]:
        """Every blob the manifest names, each once."""
        refs: dict[str, BlobRef] = {}

        def add(sha: str, size: int) -> None:
            refs.setdefault(sha, BlobRef(sha256=sha, size=size))

        if self.source.diff:
            add(self.source.diff.sha256, self.source.diff.size)
        for f in self.source.files:
            add(f.sha256, f.size)
        for d in self.data:
            if d.blob:
                add(d.blob.sha256, d.blob.size)
            for f in d.files:
                add(f.sha256, f.size)
        for ref in [*self.logs.values(), *self.attachments.values()]:
            add(ref.sha256, ref.size)
        if self.checkpoint:
            add(self.checkpoint.sha256, self.checkpoint.size)
        return list(refs.values())

    def excluded_files(self) -> list[ExcludedFile]:
        """Every file left out on purpose: the source's, then each data directory's (named by its
        path under the working directory)."""
        out = list(self.source.excluded)
        for d in self.data:
            out += [e.model_copy(update={"path": f"{d.path}/{e.path}"}) for e in d.excluded]
        return out

    @classmethod
    def from_json(cls, raw: bytes, where: str = "manifest") -> Manifest:
        """Parse a manifest, with an error that says which field was wrong."""
        try:
            data = json.loads(raw)
        except ValueError as exc:
            raise BundleError(f"{where} is not valid JSON ({exc}); the store may be damaged") from exc
        except RecursionError as exc:
            raise BundleError(
                f"{where} is nested too deeply to read; the store is damaged or hostile"
            ) from exc
        if _nested_deeper_than(data, MAX_NESTING):
            raise BundleError(
                f"{where} nests its JSON more than {MAX_NESTING} levels deep (a real one is a few levels "
                "deep); the store is damaged or hostile, re-capture the failure"
            )
        version = data.get("schema_version") if isinstance(data, dict) else None
        if version is not None and version != SCHEMA_VERSION:
            older = isinstance(version, int) and version < SCHEMA_VERSION
            advice = (
                "it was written by an older flaketriage; capture the failure again with this one"
                if older
                else "upgrade flaketriage to read it"
            )
            raise BundleError(
                f"{where} has schema_version {version!r:.40}, this flaketriage reads {SCHEMA_VERSION}; "
                f"{advice}"
            )
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            raise BundleError(f"{where} is not a valid bundle manifest: {_one_line(exc)}") from exc


def _one_line(exc: ValidationError) -> str:
    """The first problems of a validation error, on one line, without the (perhaps huge) input."""
    errors = exc.errors(include_url=False, include_input=False)
    shown = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'manifest'}: {e['msg']}" for e in errors[:3])
    return shown + (f" (and {len(errors) - 3} more)" if len(errors) > 3 else "")


def _nested_deeper_than(data: object, limit: int) -> bool:
    """Whether parsed JSON nests lists and objects more than `limit` levels (checked without recursion)."""
    stack: list[tuple[object, int]] = [(data, 1)]
    while stack:
        item, depth = stack.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else None
        if children is None:
            continue
        if depth > limit:
            return True
        stack.extend((child, depth + 1) for child in children)
    return False
