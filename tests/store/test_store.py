from __future__ import annotations

import hashlib
import multiprocessing
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from flaketriage.errors import CorruptObjectError, ObjectNotFoundError, StoreError, StoreNotWritableError
from flaketriage.store import LocalStore, MemoryStore, Store


def test_round_trip_keys_by_sha256_of_raw_bytes(store: Store) -> None:
    data = b"hello " * 1000
    ref = store.put_bytes(data)
    assert ref.sha256 == hashlib.sha256(data).hexdigest()
    assert ref.size == len(data)
    assert store.get_bytes(ref.sha256) == data
    assert store.has(ref.sha256)


def test_identical_content_is_stored_once(store: Store) -> None:
    a = store.put_bytes(b"x" * 5000)
    b = store.put_bytes(b"x" * 5000)
    assert a == b
    assert list(store.keys()) == [a.sha256]


def test_missing_object_is_a_clear_error(store: Store) -> None:
    with pytest.raises(ObjectNotFoundError, match=r"0{64}"):
        store.get_bytes("0" * 64)


def test_bad_key_is_refused(store: Store) -> None:
    with pytest.raises(StoreError, match="64 lowercase hex"):
        store.get_bytes("not-a-key")


def test_compressible_blob_takes_less_disk_space_same_key(tmp_path: Path) -> None:
    st = LocalStore(tmp_path)
    data = b"loss=0.1234\n" * 100_000
    ref = st.put_bytes(data)
    on_disk = st._object_path(ref.sha256).stat().st_size
    assert on_disk < len(data) / 10
    assert ref.sha256 == hashlib.sha256(data).hexdigest()


def test_incompressible_blob_stays_raw(tmp_path: Path) -> None:
    st = LocalStore(tmp_path)
    data = os.urandom(200_000)
    ref = st.put_bytes(data)
    assert st._object_path(ref.sha256).stat().st_size == len(data) + 1


@pytest.mark.parametrize("payload", [b"", b"small", b"a" * 3_000_000, os.urandom(3_000_000)])
def test_put_file_and_get_file_stream(tmp_path: Path, payload: bytes) -> None:
    st = LocalStore(tmp_path / "s")
    src = tmp_path / "src.bin"
    src.write_bytes(payload)
    ref = st.put_file(src)
    assert ref.sha256 == hashlib.sha256(payload).hexdigest()
    dest = tmp_path / "out" / "copy.bin"
    st.get_file(ref.sha256, dest)
    assert dest.read_bytes() == payload
    assert st.get_bytes(ref.sha256) == payload
    assert not list((tmp_path / "s" / "tmp").iterdir())


def test_corrupt_object_is_detected_and_never_used(tmp_path: Path) -> None:
    st = LocalStore(tmp_path)
    ref = st.put_bytes(b"precious checkpoint bytes" * 10)
    path = st._object_path(ref.sha256)
    raw = bytearray(path.read_bytes())
    raw[-1] ^= 0xFF
    path.write_bytes(bytes(raw))
    with pytest.raises(CorruptObjectError, match=ref.sha256):
        st.get_bytes(ref.sha256)
    dest = tmp_path / "restored"
    with pytest.raises(CorruptObjectError):
        st.get_file(ref.sha256, dest)
    assert not dest.exists()
    assert st.check() == [ref.sha256]
    assert st.check(drop=True) == [ref.sha256]
    assert not st.has(ref.sha256)


def test_corrupt_zstd_frame_is_reported_as_corruption(tmp_path: Path) -> None:
    st = LocalStore(tmp_path)
    ref = st.put_bytes(b"abc" * 10_000)
    path = st._object_path(ref.sha256)
    path.write_bytes(path.read_bytes()[:20])
    with pytest.raises(CorruptObjectError):
        st.get_bytes(ref.sha256)


def test_partial_write_leaves_no_object(tmp_path: Path) -> None:
    """A writer killed mid-write leaves only a temp file, never a half object under its key."""
    big = tmp_path / "big.bin"
    big.write_bytes(os.urandom(1 << 20) * 40)
    code = textwrap.dedent(
        f"""
        import os
        import sys
        from pathlib import Path
        from flaketriage.store import LocalStore
        import time
        real = os.replace
        def slow_replace(a, b):  # the rename that would name the object (flaketriage.files.atomic)
            print("ready", flush=True)
            time.sleep(60)
            real(a, b)
        os.replace = slow_replace
        LocalStore({str(tmp_path / "s")!r}).put_file(Path({str(big)!r}))
        """
    )
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "ready"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    proc.stdout.close()
    st = LocalStore(tmp_path / "s")
    assert list(st.keys()) == []
    key = hashlib.sha256(big.read_bytes()).hexdigest()
    assert not st.has(key)
    st.put_file(big)
    assert st.get_bytes(key) == big.read_bytes()


def _writer(root: str, worker: int, results: multiprocessing.Queue) -> None:  # type: ignore[type-arg]
    st = LocalStore(root)
    keys = []
    for i in range(40):
        keys.append(st.put_bytes(f"shared blob {i}".encode() * 200).sha256)
        keys.append(st.put_bytes(f"worker {worker} blob {i}".encode() * 200).sha256)
        st.put_ref(f"bundles/{worker:02d}{i:02d}", b"{}")
    results.put(keys)


def test_concurrent_writers_are_safe(tmp_path: Path) -> None:
    root = str(tmp_path / "shared")
    ctx = multiprocessing.get_context("fork")
    results: multiprocessing.Queue = ctx.Queue()  # type: ignore[type-arg]
    procs = [ctx.Process(target=_writer, args=(root, w, results)) for w in range(4)]
    for p in procs:
        p.start()
    keys = [k for _ in procs for k in results.get(timeout=60)]
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    st = LocalStore(root)
    assert set(st.keys()) == set(keys)
    assert len(set(keys)) == 40 + 4 * 40
    assert st.check() == []
    assert len(st.list_refs("bundles/")) == 160


def test_unwritable_store_path_is_a_clear_error(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    with pytest.raises(StoreNotWritableError, match="FLAKETRIAGE_STORE"):
        LocalStore(blocker / "store")


def test_readonly_store_refuses_writes(tmp_path: Path) -> None:
    LocalStore(tmp_path).put_bytes(b"x")
    ro = LocalStore(tmp_path, readonly=True)
    with pytest.raises(StoreError, match="read-only"):
        ro.put_bytes(b"y")
    with pytest.raises(StoreError, match="does not exist"):
        LocalStore(tmp_path / "nowhere", readonly=True)


def test_refs_list_by_prefix(store: Store) -> None:
    store.put_ref("bundles/aaa", b"1")
    store.put_ref("bundles/bbb", b"2")
    store.put_ref("other/ccc", b"3")
    assert sorted(store.list_refs("bundles/")) == ["bundles/aaa", "bundles/bbb"]
    assert store.get_ref("bundles/aaa") == b"1"
    assert store.get_ref("bundles/zzz") is None


def test_ref_names_cannot_escape(tmp_path: Path) -> None:
    with pytest.raises(StoreError, match=r"\.\."):
        LocalStore(tmp_path).put_ref("../escape", b"x")


def test_copy_between_backends(tmp_path: Path) -> None:
    src = LocalStore(tmp_path)
    dst = MemoryStore()
    ref = src.put_bytes(b"move me" * 100)
    src.copy_to(dst, ref.sha256)
    assert dst.get_bytes(ref.sha256) == b"move me" * 100
