"""The environment cache: one built environment per key, shared by the workers of a machine, bounded.

Layout under the cache directory, for each key's digest ``D``: ``D/`` the virtualenv, ``D.json`` the
record that says it is complete (its size, its Python), ``D.lock`` the key's lock. A virtualenv
cannot be moved once built (its scripts name their interpreter by absolute path), so it is built in
place under the key's exclusive lock and what is renamed into place atomically is its record: a
directory without one is a build that died, removed by the next builder.

Several workers may use the cache at once: a builder holds the key's lock exclusively (a second
builder of the same key waits, then uses the first one's build), a user holds it shared for as long
as replays run in it, and eviction only takes entries whose lock it can get exclusively at once.
Eviction is by last use (the record's modification time, touched by every `acquire`) until the
environments fit the size bound; it runs after each build. A cache hit opens and locks one file
and touches another: no installer runs and nothing is hashed.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import shutil
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from flaketriage.errors import ReplayEnvironmentError
from flaketriage.files.atomic import write_atomic
from flaketriage.files.lock import locked
from flaketriage.workers.environment.build import EnvironmentBuilder
from flaketriage.workers.environment.interpreter import interpreter_paths
from flaketriage.workers.environment.key import EnvironmentKey

_DIGEST = re.compile(r"[0-9a-f]{64}")


@dataclass(frozen=True)
class BuiltEnvironment:
    """A complete environment in the cache."""

    key: EnvironmentKey
    root: Path
    python_version: str
    """The ``X.Y.Z`` of the interpreter it was built on."""
    size_bytes: int
    build_s: float
    """How long building it took (0 when this process found it built)."""
    paths: tuple[str, ...] = ()
    """What its interpreter reads at start-up and import time (its prefix, the base interpreter's,
    ``sys.path``): asked once, when it was built, so a cache hit starts no process."""

    @property
    def bin_dir(self) -> Path:
        return self.root / "bin"

    @property
    def python(self) -> Path:
        return self.bin_dir / "python"


class EnvironmentLease:
    """A built environment in use: the cache never evicts it until `release` (or the block ends)."""

    def __init__(self, environment: BuiltEnvironment, fd: int, *, built: bool) -> None:
        self.environment = environment
        self.built = built
        """Whether this acquisition built it (a cache miss)."""
        self._fd: int | None = fd

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the descriptor releases the shared lock
            self._fd = None

    def __enter__(self) -> EnvironmentLease:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


@dataclass(frozen=True)
class CacheEntry:
    """A complete environment as the cache lists it."""

    digest: str
    size_bytes: int
    last_used: float


class EnvironmentCache:
    """Built environments under `root`, at most `max_bytes` of them beyond those in use."""

    def __init__(self, root: Path, *, max_bytes: int, builder: EnvironmentBuilder) -> None:
        self.root = Path(root).absolute()
        self.max_bytes = max_bytes
        self.builder = builder

    def _paths(self, digest: str) -> tuple[Path, Path, Path]:
        return self.root / digest, self.root / f"{digest}.json", self.root / f"{digest}.lock"

    def acquire(self, key: EnvironmentKey) -> EnvironmentLease:
        """The environment of `key`, built first when the cache has none; hold it while replays run.

        Raises `ReplayEnvironmentError` when it cannot be built.
        """
        _, _, lock = self._paths(key.digest)
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as exc:
            raise ReplayEnvironmentError(
                f"cannot use the environment cache {self.root}: {exc.strerror or exc}; set "
                "FLAKETRIAGE_ENVIRONMENT_CACHE_DIR to a writable directory"
            ) from exc
        try:
            # Shared for as long as the lease lasts: evictors (which try it exclusively, without
            # waiting) leave the environment alone, built or being built.
            fcntl.flock(fd, fcntl.LOCK_SH)
            found = self._complete(key)
            if found is not None:
                return EnvironmentLease(found, fd, built=False)
            # Not built yet: one builder per key at a time. The others wait for that build alone, on
            # a lock of its own; waiting to upgrade the shared lock would wait for the builder's
            # whole lease instead.
            with locked(self.root / f"{key.digest}.build.lock"):
                found = self._complete(key)
                if found is not None:
                    return EnvironmentLease(found, fd, built=False)
                built = self._build(key)
            lease = EnvironmentLease(built, fd, built=True)
            self.evict()
            return lease
        except BaseException:
            os.close(fd)
            raise

    def _complete(self, key: EnvironmentKey) -> BuiltEnvironment | None:
        """The entry of `key` if its record exists (its last use touched now), else None."""
        root, record, _ = self._paths(key.digest)
        try:
            os.utime(record)
            data = json.loads(record.read_bytes())
        except (OSError, ValueError):
            return None
        return BuiltEnvironment(
            key=key,
            root=root,
            python_version=str(data.get("python_version", "")),
            size_bytes=int(data.get("size_bytes", 0)),
            build_s=0.0,
            paths=tuple(str(p) for p in data.get("paths", ())),
        )

    def _build(self, key: EnvironmentKey) -> BuiltEnvironment:
        root, record, _ = self._paths(key.digest)
        shutil.rmtree(root, ignore_errors=True)  # what a build that died left
        started = time.monotonic()
        try:
            version = self.builder.build(key, root)
        except BaseException:
            shutil.rmtree(root, ignore_errors=True)
            raise
        size = _tree_size(root)
        with tempfile.TemporaryDirectory(prefix="flaketriage-probe-") as neutral:
            paths = [str(p) for p in interpreter_paths(str(root / "bin" / "python"), {}, Path(neutral))]
        data = {
            "python": key.python,
            "implementation": key.implementation,
            "python_version": version,
            "requirements": list(key.requirements),
            "size_bytes": size,
            "build_s": round(time.monotonic() - started, 3),
            "paths": paths,
        }
        write_atomic(record, json.dumps(data, indent=1).encode("utf-8"))
        return BuiltEnvironment(key, root, version, size, max(time.monotonic() - started, 1e-9), tuple(paths))

    def entries(self) -> list[CacheEntry]:
        """The complete environments, least recently used first."""
        out: list[CacheEntry] = []
        for record in self.root.glob("*.json"):
            if not _DIGEST.fullmatch(record.stem):
                continue  # not an environment's record (the worker's own freeze, say)
            try:
                stat = record.stat()
                size = int(json.loads(record.read_bytes()).get("size_bytes", 0))
            except (OSError, ValueError):
                continue
            out.append(CacheEntry(record.name.removesuffix(".json"), size, stat.st_mtime))
        return sorted(out, key=lambda e: e.last_used)

    def evict(self) -> list[str]:
        """Remove least recently used environments not in use until the rest fit `max_bytes`, and
        the remains of builds that died; the digests removed."""
        removed: list[str] = []
        with locked(self.root / ".evict.lock"):
            self._sweep_remains()
            entries = self.entries()
            total = sum(e.size_bytes for e in entries)
            for entry in entries:
                if total <= self.max_bytes:
                    break
                if self._remove(entry.digest):
                    total -= entry.size_bytes
                    removed.append(entry.digest)
        return removed

    def _remove(self, digest: str) -> bool:
        """Remove one environment unless someone holds it (in use, or being built)."""
        root, record, lock = self._paths(digest)
        fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return False
            with contextlib.suppress(FileNotFoundError):
                record.unlink()  # first: from now on nobody takes it for complete
            trash = self.root / f".trash-{digest}-{uuid.uuid4().hex[:8]}"
            with contextlib.suppress(FileNotFoundError):
                os.rename(root, trash)
            shutil.rmtree(trash, ignore_errors=True)
            return True
        finally:
            os.close(fd)

    def _sweep_remains(self) -> None:
        for path in self.root.iterdir():
            if path.name.startswith(".trash-"):
                shutil.rmtree(path, ignore_errors=True)
            elif (
                path.is_dir()
                and _DIGEST.fullmatch(path.name)
                and not (self.root / f"{path.name}.json").exists()
            ):
                self._remove(path.name)  # a build that died (one still running holds its lock)


def _tree_size(root: Path) -> int:
    """Bytes of the files under `root` (each hard-linked file once)."""
    seen: set[tuple[int, int]] = set()
    total = 0
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            with contextlib.suppress(OSError):
                st = os.lstat(os.path.join(dirpath, name))
                if (st.st_dev, st.st_ino) not in seen:
                    seen.add((st.st_dev, st.st_ino))
                    total += st.st_size
    return total
