"""`put_file` on the local and memory stores: one pass over the bytes, the stat cache that skips
unchanged files (and what invalidates it, racy files included), and compression only where it pays."""

from __future__ import annotations

import gzip
import hashlib
import io
import multiprocessing
import os
import sqlite3
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

import pytest

from flaketriage.store import LocalStore, MemoryStore, Store
from flaketriage.store.base import CHUNK, RAW, ZSTD
from flaketriage.store.compression import already_compressed, pays
from flaketriage.store.state import RACY_MARGIN_NS, FileStamp, KnownFile, SqliteFileState

MB = 1 << 20


@pytest.fixture(params=["local", "memory"])
def cached(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    """A store with a stat cache whose racy margin is 0, so a file written by the test is settled."""
    if request.param == "local":
        store: Store = LocalStore(tmp_path / "store")
    else:
        store = MemoryStore()
    store.state.margin_ns = 0
    yield store


class Reads:
    """Counts the files `put_file` streams (a miss of the stat cache reads the file)."""

    def __init__(self, store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
        self.count = 0
        self.bytes = 0
        real = store._put_stream

        def counted(stream: BinaryIO, size: int) -> KnownFile:
            self.count += 1
            self.bytes += size
            return real(stream, size)

        monkeypatch.setattr(store, "_put_stream", counted)


def _io() -> dict[str, int]:
    """This process's I/O counters: ``rchar``/``wchar`` count every byte read or written by a
    system call, page cache or not."""
    fields = dict(line.split(": ") for line in Path("/proc/self/io").read_text().splitlines())
    return {name: int(value) for name, value in fields.items()}


# -- one pass -------------------------------------------------------------------------------------
@pytest.mark.parametrize("size", [3 * MB + 17, 200_000])
def test_a_new_file_is_read_once_and_written_once(tmp_path: Path, size: int) -> None:
    src = tmp_path / "weights.bin"
    src.write_bytes(os.urandom(size))
    store = LocalStore(tmp_path / "store")
    before = _io()
    ref = store.put_file(src)
    store.flush()
    after = _io()
    read, written = after["rchar"] - before["rchar"], after["wchar"] - before["wchar"]
    assert ref.sha256 == hashlib.sha256(src.read_bytes()).hexdigest()
    # The stat cache's database (a few pages) is all that is read or written besides the bytes.
    assert size <= read < size + 256 * 1024, read
    assert size <= written < size + 256 * 1024, written
    assert store._object_path(ref.sha256).stat().st_size == size + 1  # random: kept raw


def test_a_large_file_already_stored_is_staged_then_dropped(tmp_path: Path) -> None:
    data = os.urandom(2 * CHUNK + 5)
    store = LocalStore(tmp_path / "store")
    ref = store.put_bytes(data)
    (tmp_path / "copy.bin").write_bytes(data)  # the same bytes at another path: the cache cannot know
    assert store.put_file(tmp_path / "copy.bin") == ref
    assert list(store.keys()) == [ref.sha256]
    assert not list((tmp_path / "store" / "tmp").iterdir())
    assert store.get_bytes(ref.sha256) == data


def test_a_file_that_changes_while_it_is_read_is_stored_as_read_but_not_remembered(
    cached: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    src = tmp_path / "log.txt"
    src.write_bytes(b"first version\n" * 100_000)
    real = cached._put_stream

    def and_append(stream: BinaryIO, size: int) -> KnownFile:
        stored = real(stream, size)
        with src.open("ab") as fh:
            fh.write(b"written while it was read\n")
        return stored

    monkeypatch.setattr(cached, "_put_stream", and_append)
    ref = cached.put_file(src)
    assert cached.get_bytes(ref.sha256) == b"first version\n" * 100_000
    monkeypatch.undo()
    reads = Reads(cached, monkeypatch)
    assert cached.put_file(src).sha256 == hashlib.sha256(src.read_bytes()).hexdigest()
    assert reads.count == 1


# -- the stat cache -------------------------------------------------------------------------------
def test_an_unchanged_file_is_not_read_again(
    cached: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    src = tmp_path / "checkpoint.pt"
    src.write_bytes(os.urandom(3 * MB))
    reads = Reads(cached, monkeypatch)
    first = cached.put_file(src)
    cached.flush()
    before = _io()
    assert cached.put_file(src) == first
    assert reads.count == 1
    assert _io()["rchar"] - before["rchar"] < 64 * 1024  # not one chunk of the file


def test_the_cache_survives_the_process(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    src = tmp_path / "data.csv"
    src.write_text("a,b\n" * 10_000)
    first = LocalStore(tmp_path / "store")
    first.state.margin_ns = 0
    ref = first.put_file(src)
    first.flush()
    again = LocalStore(tmp_path / "store")
    reads = Reads(again, monkeypatch)
    assert again.put_file(src) == ref and reads.count == 0
    assert (tmp_path / "store" / "state" / f"{os.getuid()}.sqlite").stat().st_mode & 0o777 == 0o600


def _stored_twice(store: Store, src: Path, change: object, monkeypatch: pytest.MonkeyPatch) -> int:
    store.put_file(src)
    store.flush()
    assert callable(change)
    change()
    reads = Reads(store, monkeypatch)
    ref = store.put_file(src)
    assert ref.sha256 == hashlib.sha256(src.read_bytes()).hexdigest()
    assert store.get_bytes(ref.sha256) == src.read_bytes()
    return reads.count


def test_touching_a_file_invalidates_its_entry(
    cached: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    src = tmp_path / "a.txt"
    src.write_bytes(b"same bytes\n" * 1000)
    assert (
        _stored_twice(cached, src, lambda: os.utime(src, ns=(0, src.stat().st_mtime_ns + 10**9)), monkeypatch)
        == 1
    )


def test_a_rewrite_of_the_same_size_and_mtime_is_seen_by_its_ctime(
    cached: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    src = tmp_path / "a.txt"
    src.write_bytes(b"A" * 5000)
    mtime = src.stat().st_mtime_ns

    def rewrite() -> None:
        src.write_bytes(b"B" * 5000)
        os.utime(src, ns=(mtime, mtime))  # size and mtime as they were: only the ctime moved

    assert _stored_twice(cached, src, rewrite, monkeypatch) == 1


def test_a_file_replaced_by_a_rename_is_seen_by_its_inode(
    cached: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    src = tmp_path / "model.bin"
    src.write_bytes(os.urandom(4096))
    st = src.stat()

    def replace() -> None:
        other = tmp_path / "new.bin"
        other.write_bytes(os.urandom(4096))
        os.utime(other, ns=(st.st_atime_ns, st.st_mtime_ns))
        os.replace(other, src)

    assert _stored_twice(cached, src, replace, monkeypatch) == 1


def test_a_deleted_object_is_written_again(
    cached: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    src = tmp_path / "a.bin"
    src.write_bytes(os.urandom(10_000))
    ref = cached.put_file(src)
    assert _stored_twice(cached, src, lambda: cached.delete(ref.sha256), monkeypatch) == 1
    assert cached.has(ref.sha256)


def test_a_racy_file_is_never_remembered(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Changed less than the margin before it was read: a write in the same timestamp tick could
    leave its stat as it was, so it is read again next time."""
    store = LocalStore(tmp_path / "store")
    assert store.state.margin_ns == RACY_MARGIN_NS
    src = tmp_path / "just-written.txt"
    src.write_bytes(b"fresh\n" * 1000)
    reads = Reads(store, monkeypatch)
    store.put_file(src)
    store.flush()
    store.put_file(src)
    assert reads.count == 2
    with sqlite3.connect(tmp_path / "store" / "state" / f"{os.getuid()}.sqlite") as db:
        assert db.execute("SELECT count(*) FROM files").fetchone() == (0,)


def test_the_racy_rule_compares_both_times_with_the_read() -> None:
    stamp = FileStamp(
        "/f", 1, 2, 3, mtime_ns=10_000_000_000, ctime_ns=10_000_000_000, taken_ns=12_000_000_000
    )
    assert stamp.settled(2_000_000_000)
    assert not stamp.settled(2_000_000_001)
    moved = FileStamp("/f", 1, 2, 3, mtime_ns=1, ctime_ns=11_000_000_000, taken_ns=12_000_000_000)
    assert not moved.settled(2_000_000_000)  # an mtime set back does not hide a recent change
    assert stamp == FileStamp("/f", 1, 2, 3, 10_000_000_000, 10_000_000_000, taken_ns=0)  # when, not what


def test_a_damaged_cache_is_replaced_and_never_fails_a_put(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = LocalStore(tmp_path / "store")
    db = tmp_path / "store" / "state" / f"{os.getuid()}.sqlite"
    db.write_bytes(b"not a database at all" * 100)
    store.state.margin_ns = 0
    src = tmp_path / "a.txt"
    src.write_bytes(b"x" * 5000)
    ref = store.put_file(src)
    store.flush()
    reads = Reads(store, monkeypatch)
    assert store.put_file(src) == ref and reads.count == 0
    assert sqlite3.connect(db).execute("SELECT count(*) FROM files").fetchone() == (1,)


def test_an_unusable_cache_reads_every_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    state = SqliteFileState(tmp_path / "a-file" / "state.sqlite")
    (tmp_path / "a-file").write_text("a file where the database's directory would be")
    store = LocalStore(tmp_path / "store")
    store.state = state
    state.margin_ns = 0
    src = tmp_path / "a.txt"
    src.write_bytes(b"x" * 5000)
    reads = Reads(store, monkeypatch)
    first = store.put_file(src)
    store.flush()  # nowhere to write the entry: it is dropped
    assert store.put_file(src) == first
    assert reads.count == 2


def _put_all(root: str, paths: list[str], out: multiprocessing.Queue) -> None:  # type: ignore[type-arg]
    store = LocalStore(root)
    store.state.margin_ns = 0
    keys = [store.put_file(Path(p)).sha256 for p in paths]
    store.flush()
    out.put(keys)


def test_concurrent_puts_share_the_cache_safely(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    paths = []
    for i in range(60):
        path = tmp_path / f"f{i}.bin"
        path.write_bytes(os.urandom(1000 + i) if i % 3 else b"same\n" * (2000 + i))
        paths.append(str(path))
    ctx = multiprocessing.get_context("fork")
    out: multiprocessing.Queue = ctx.Queue()  # type: ignore[type-arg]
    procs = [ctx.Process(target=_put_all, args=(str(tmp_path / "store"), paths, out)) for _ in range(4)]
    for proc in procs:
        proc.start()
    results = [out.get(timeout=60) for _ in procs]
    for proc in procs:
        proc.join(timeout=60)
        assert proc.exitcode == 0
    expected = [hashlib.sha256(Path(p).read_bytes()).hexdigest() for p in paths]
    assert all(keys == expected for keys in results)
    store = LocalStore(tmp_path / "store")
    assert store.check() == [] and sorted(store.keys()) == sorted(set(expected))
    reads = Reads(store, monkeypatch)
    assert [store.put_file(Path(p)).sha256 for p in paths] == expected
    assert reads.count == 0


# -- compression ----------------------------------------------------------------------------------
def _stored_form(store: LocalStore, key: str) -> bytes:
    return store._object_path(key).read_bytes()


def _zip(data: bytes) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("arr.npy", data)
    return buffer.getvalue()


@pytest.mark.parametrize(
    ("name", "make"),
    [
        ("gzip", lambda text: gzip.compress(text)),
        ("zip (npz)", _zip),
        ("zstd", lambda text: __import__("zstandard").ZstdCompressor().compress(text)),
    ],
)
def test_compressed_data_is_never_compressed_again(tmp_path: Path, name: str, make: object) -> None:
    assert callable(make)
    text = b"".join(b"step %d loss 0.%06d\n" % (i, i * 7919 % 999_983) for i in range(300_000))
    packed = make(text)
    assert already_compressed(packed[:64]), name
    store = LocalStore(tmp_path / "store")
    small = store.put_bytes(packed[: CHUNK // 2])
    src = tmp_path / "archive"
    src.write_bytes(packed)
    large = store.put_file(src)
    for ref in (small, large):
        assert _stored_form(store, ref.sha256)[:1] == RAW


def test_compression_is_decided_from_a_sample(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "store")
    text = b"".join(b'{"step": %d, "loss": 0.%06d}\n' % (i, i * 7919 % 999_983) for i in range(200_000))
    noise = os.urandom(3 * MB)
    for data, tag in ((text, ZSTD), (noise, RAW), (b"tiny", RAW)):
        src = tmp_path / "f"
        src.write_bytes(data)
        ref = store.put_file(src)
        stored = _stored_form(store, ref.sha256)
        assert stored[:1] == tag
        assert store.get_bytes(ref.sha256) == data
        if tag == ZSTD:
            assert len(stored) < len(data) / 4
    assert not pays(noise) and pays(text) and not pays(b"x" * 100)


def test_float_weights_are_copied_not_compressed(tmp_path: Path) -> None:
    """A checkpoint of float32 weights shrinks by a few percent at best: not worth the time."""
    import numpy as np

    weights = (np.random.default_rng(0).standard_normal(MB, dtype=np.float32) * 0.02).tobytes()
    assert not pays(weights)
    src = tmp_path / "model.bin"
    src.write_bytes(weights)
    store = LocalStore(tmp_path / "store")
    assert _stored_form(store, store.put_file(src).sha256)[:1] == RAW


# -- durability -----------------------------------------------------------------------------------
@pytest.mark.parametrize("size", [4500, 2 * CHUNK + 1])
def test_an_empty_object_file_counts_as_absent_and_is_replaced(tmp_path: Path, size: int) -> None:
    """What a power cut leaves of an object written but not yet synced: never reused."""
    store = LocalStore(tmp_path / "store")
    src = tmp_path / "file"
    src.write_bytes(os.urandom(size))
    ref = store.put_file(src)
    store._object_path(ref.sha256).write_bytes(b"")
    assert not store.has(ref.sha256)
    os.utime(src, ns=(0, src.stat().st_mtime_ns + 1))  # not the file the stat cache knows
    assert store.put_file(src) == ref
    assert store.has(ref.sha256) and store.get_bytes(ref.sha256) == src.read_bytes()


def test_flush_syncs_what_was_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import flaketriage.store.local as local

    synced: list[str] = []
    monkeypatch.setattr(local, "_fsync", lambda path: synced.append(str(path)))
    monkeypatch.setattr(local, "_sync_file_system", lambda root: synced.append(f"syncfs {root}"))
    store = LocalStore(tmp_path / "store")
    few = [store.put_bytes(b"blob %d" % i).sha256 for i in range(3)]
    store.flush()
    assert sorted(synced) == sorted(str(store._object_path(k)) for k in few)
    synced.clear()
    for i in range(local.SYNC_EACH_MAX + 1):
        store.put_bytes(b"many %d" % i)
    store.flush()
    assert synced == [f"syncfs {store.root}"]
    synced.clear()
    store.flush()
    assert synced == []
