"""Atomic writes: a target is the old file or the new one, and a failed write leaves no temp file."""

from __future__ import annotations

import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from flaketriage.files.atomic import staged_file, write_atomic


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_replaces_the_target_with_chunks_streamed_in_order(tmp_path: Path) -> None:
    target = tmp_path / "sub" / "out.txt"
    assert write_atomic(target, b"old") is True
    assert write_atomic(target, iter([b"n", b"e", b"w"])) is True
    assert target.read_bytes() == b"new" and _mode(target) == 0o644
    assert sorted(p.name for p in target.parent.iterdir()) == ["out.txt"]


def test_a_failing_source_leaves_the_old_target_and_no_temp_file(tmp_path: Path) -> None:
    target = tmp_path / "out.txt"
    target.write_bytes(b"old")

    def chunks() -> Iterator[bytes]:
        yield b"half of it"
        raise ValueError("the source changed")

    with pytest.raises(ValueError, match="source changed"):
        write_atomic(target, chunks())
    assert target.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["out.txt"]


def test_without_overwrite_an_existing_target_is_kept(tmp_path: Path) -> None:
    target = tmp_path / "objects" / "ab" / "cdef"
    assert write_atomic(target, b"first", overwrite=False) is True
    assert write_atomic(target, b"second", overwrite=False) is False
    assert target.read_bytes() == b"first"
    assert [p.name for p in target.parent.iterdir()] == ["cdef"]


def test_a_staged_file_is_named_when_committed_and_gone_when_not(tmp_path: Path) -> None:
    staging = tmp_path / "tmp"
    with staged_file(staging, prefix="put-") as staged:
        staged.file.write(b"content")
        assert staged.path.parent == staging and staged.path.name.startswith("put-")
        assert staged.commit(tmp_path / "named" / "by-hash", mode=0o600) is True
    assert (tmp_path / "named" / "by-hash").read_bytes() == b"content"
    assert _mode(tmp_path / "named" / "by-hash") == 0o600
    with pytest.raises(RuntimeError), staged_file(staging) as staged:
        staged.file.write(b"abandoned")
        raise RuntimeError("failed before the commit")
    with staged_file(staging) as staged:
        staged.file.write(b"not needed")  # left without a commit: a no-op
    assert list(staging.iterdir()) == []
