"""The bundle manifest: the versioned contract between capture, store, replay and report.

A manifest names every blob by SHA-256; its canonical JSON (sorted keys, no spaces, UTF-8) hashes
to the bundle id. Unknown fields are refused, so a manifest from a newer schema fails loudly, and
``schema_version`` changes with any change that re-encodes an existing manifest differently (its
id would no longer match). Version 2 added `PytestContext` (the ``pytest`` field). Version 3 keeps
each file list (the source's, a data directory's) in an object of its own that the manifest names
(`FileListRef`): an unchanged workspace captured again shares that object, so the new manifest
stays a few kilobytes. In memory a `Manifest` holds its lists whole (``source.files``); only its
stored form splits them out, and `Manifest.from_json` puts them back. The command's arguments,
directory and environment are `OsStr`: bytes that are not UTF-8 survive as marked escapes.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, TypeAdapter, ValidationError

from flaketriage.errors import BundleError
from flaketriage.text.os_strings import OsStr

SCHEMA_VERSION = 3
ADDED_IN_SCHEMA_3: tuple[tuple[str, str], ...] = (
    ("pytest", "following"),
    ("seeds", "drawn"),
    ("failure", "identity"),
)
"""Fields added while the schema stayed at 3: the stored form leaves each out while it is empty, so
a manifest written before it existed re-encodes to its own id."""
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


class FileListRef(_Model):
    """A file list stored as an object of its own: the canonical JSON of its entries (a list, each
    entry's keys sorted, no spaces, UTF-8), whose SHA-256 is its key."""

    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    size: int = Field(ge=0)
    count: int = Field(ge=1)
    """How many entries it holds (an empty list is not stored: the field is left out)."""


_FILE_LIST: TypeAdapter[tuple[FileEntry, ...]] = TypeAdapter(tuple[FileEntry, ...])
FileListLoader = Callable[[FileListRef], bytes]
"""Reads a file list's bytes from the store (verified, bounded): what `Manifest.from_json` needs."""


def encode_file_list(files: Sequence[FileEntry]) -> bytes:
    """The stored form of a file list: its canonical JSON."""
    return json.dumps(
        _FILE_LIST.dump_python(tuple(files), mode="json"),
        sort_keys=True,
        separators=(",", ":"),
        ensure_ascii=False,
    ).encode("utf-8")


def decode_file_list(raw: bytes, ref: FileListRef, where: str) -> tuple[FileEntry, ...]:
    """The entries of a stored file list (`raw`, the bytes of the object `ref` names), refused with a
    `BundleError` unless it is exactly what `encode_file_list` writes for them."""
    what = f"the file list {ref.sha256[:12]} of {where}"
    try:
        data = json.loads(raw)
    except (ValueError, RecursionError) as exc:
        raise BundleError(f"{what} is not valid JSON ({exc!s:.80}); the store is damaged") from exc
    if not isinstance(data, list) or _nested_deeper_than(data, 3):
        raise BundleError(f"{what} is not a list of file entries; the store is damaged or hostile")
    if len(data) != ref.count:
        raise BundleError(
            f"{what} holds {len(data)} entries, the manifest says {ref.count}; the bundle is damaged, "
            "re-capture the failure"
        )
    try:
        files = _FILE_LIST.validate_python(data)
    except ValidationError as exc:
        raise BundleError(f"{what} is not a valid file list: {_one_line(exc)}") from exc
    if encode_file_list(files) != raw:
        raise BundleError(
            f"{what} does not re-encode to itself (it is not the canonical JSON flaketriage writes); "
            "it was written by an incompatible flaketriage, or tampered with: re-capture the failure"
        )
    return files


class _Listing(_Model):
    """A tree whose `files` the stored form keeps in a list object of its own."""

    files: tuple[FileEntry, ...] = ()
    _listed: tuple[tuple[FileEntry, ...], FileListRef, bytes] | None = PrivateAttr(default=None)

    def file_list(self) -> tuple[FileListRef, bytes] | None:
        """The list object for `files` (its reference and bytes); None when there are none."""
        if not self.files:
            return None
        cached = self._listed
        # Compared by identity: a copy with other files (`model_copy`) shares this cache.
        if cached is None or cached[0] is not self.files:
            raw = encode_file_list(self.files)
            ref = FileListRef(sha256=hashlib.sha256(raw).hexdigest(), size=len(raw), count=len(self.files))
            cached = self._listed = (self.files, ref, raw)
        return cached[1], cached[2]


class ExcludedFile(_Model):
    """A file left out of the bundle on purpose (a credential file, a link out of the workspace)."""

    path: OsStr
    reason: str


class Source(_Listing):
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
    drawn: tuple[str, ...] = ()
    """The names in `values` the session drew at random (pytest-randomly's seed when no one set it):
    each CI run draws another, so a failure under one of them may pass under the next."""


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
    identity: str | None = Field(default=None, pattern=r"^[0-9a-f]{64}$")
    """What makes this failure one case with the same failure from any source (`case_identity`):
    for a pytest test, the fingerprint of its exception through its code path, in the space of a
    captured program's and a Sentry event's (`flaketriage.failure.fingerprint.fingerprint_exception`).
    None where it is the fingerprint itself (every other failure, and bundles written before it)."""

    @property
    def case_identity(self) -> str:
        """The key of this failure's case: its `identity`, else its fingerprint. The fingerprint
        stays what replays are matched against (a pytest replay has only its output to go by)."""
        return self.identity or self.fingerprint


class DataInput(_Listing):
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
    sm_count: int | None = Field(default=None, exclude_if=lambda value: value is None)
    """Streaming multiprocessors (NVML's ``multiprocessorCount``, else torch's device properties).
    Left out of the JSON when unknown, so manifests written before it keep their bundle ids."""


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
    """One freeze line per installed distribution, sorted (`flaketriage.bundle.freeze.installed_packages`):
    ``name==version``, or ``name @ file:///path`` for a project installed from a local directory
    (an editable install of the checkout: replayed from the bundle's source, never an index's)."""


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
    following: tuple[str, ...] = ()
    """The tests the session had collected to run after it, in order: with ``preceding``, the
    candidates for a state-setter when the test fails alone."""


class Minimization(_Model):
    """How a minimized bundle was derived from its parent."""

    data: dict[str, tuple[int, int]] = Field(default_factory=dict)
    """path → (kept, of)."""
    args: dict[str, tuple[str, str]] = Field(default_factory=dict)
    """flag → (original value, minimized value)."""
    oracle_calls: int = 0


class Manifest(_Model):
    """Everything needed to reproduce one failure."""

    schema_version: Literal[3] = 3
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
        """The stored form, whose bytes the bundle id hashes: sorted keys, no whitespace, UTF-8, and
        each file list replaced by a reference to its object (`file_lists`)."""
        data = self.model_dump(mode="json", exclude={"source": {"files"}, "data": {"__all__": {"files"}}})
        _drop_empty_additions(data)
        for tree, owner in [(data["source"], self.source), *zip(data["data"], self.data, strict=True)]:
            listed = owner.file_list()
            if listed is not None:
                tree["file_list"] = listed[0].model_dump(mode="json")
        return json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8")

    def file_lists(self) -> list[tuple[FileListRef, bytes]]:
        """The list objects the stored form names (reference and bytes), each once: the source's,
        then each data directory's."""
        found: dict[str, tuple[FileListRef, bytes]] = {}
        for owner in [self.source, *self.data]:
            listed = owner.file_list()
            if listed is not None:
                found.setdefault(listed[0].sha256, listed)
        return list(found.values())

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
    def from_json(
        cls, raw: bytes, where: str = "manifest", load_list: FileListLoader | None = None
    ) -> Manifest:
        """Parse a stored manifest, with an error that says which field was wrong; its file lists
        are read with `load_list` (`flaketriage.bundle.io.read_manifest` passes the store's)."""
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
        if isinstance(data, dict):
            data = _with_file_lists(data, where, load_list)
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            raise BundleError(f"{where} is not a valid bundle manifest: {_one_line(exc)}") from exc


def _with_file_lists(data: dict[str, Any], where: str, load_list: FileListLoader | None) -> dict[str, Any]:
    """The manifest's JSON with each ``file_list`` reference replaced by the ``files`` it lists."""
    out = dict(data)
    source = out.get("source")
    if isinstance(source, dict):
        out["source"] = _tree_files(source, "source", where, load_list)
    trees = out.get("data")
    if isinstance(trees, list):
        out["data"] = [
            _tree_files(tree, f"data.{i}", where, load_list) if isinstance(tree, dict) else tree
            for i, tree in enumerate(trees)
        ]
    return out


def _tree_files(
    tree: dict[str, Any], field: str, where: str, load_list: FileListLoader | None
) -> dict[str, Any]:
    if "files" in tree:
        raise BundleError(
            f"{where} lists {field}.files inline, where schema {SCHEMA_VERSION} names a file-list object "
            "(file_list); the manifest is damaged or hostile: re-capture the failure"
        )
    if "file_list" not in tree:
        return tree
    rest = dict(tree)
    try:
        ref = FileListRef.model_validate(rest.pop("file_list"))
    except ValidationError as exc:
        raise BundleError(
            f"{where} is not a valid bundle manifest: {field}.file_list: {_one_line(exc)}"
        ) from exc
    if load_list is None:
        raise BundleError(f"{where} names a file list ({field}), which can only be read from its store")
    rest["files"] = decode_file_list(load_list(ref), ref, where)
    return rest


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


def _drop_empty_additions(data: dict[str, Any]) -> None:
    for owner, name in ADDED_IN_SCHEMA_3:
        parent = data.get(owner)
        if isinstance(parent, dict) and parent.get(name) in ((), [], None, {}):
            parent.pop(name, None)
