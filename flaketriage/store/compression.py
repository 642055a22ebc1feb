"""When a blob is worth compressing: decided from its first bytes, before the rest is read.

Data that is already compressed (zstd, gzip, zip and the formats built on it: ``.npz``, ``.whl``,
``.jar``, ``.docx``; PNG, JPEG, GIF, WebP, bzip2, xz, 7z, lz4, Ogg, FLAC, MP4, Matroska) is
recognised by its magic number and stored as it is. Anything else is compressed only when a sample
of its start shrinks to at most `PAYS` of its size: a checkpoint of float weights (a few percent
at best) is copied, logs, CSV and JSON (a fraction of their size) are compressed.
"""

from __future__ import annotations

import threading
from typing import Any

MIN_SIZE = 512
"""Below this the frame overhead eats any saving."""
SAMPLE = 256 << 10
"""How much of a blob's start the decision compresses."""
PAYS = 0.9
"""Compression is kept when it saves at least a tenth."""
LEVEL = 3

_MAGIC: tuple[tuple[int, bytes], ...] = (
    (0, b"\x28\xb5\x2f\xfd"),  # zstd
    (0, b"\x1f\x8b"),  # gzip
    (0, b"PK\x03\x04"),  # zip: npz, whl, jar, docx, xlsx
    (0, b"PK\x05\x06"),  # an empty zip
    (0, b"\x89PNG\r\n\x1a\n"),
    (0, b"\xff\xd8\xff"),  # JPEG
    (0, b"GIF87a"),
    (0, b"GIF89a"),
    (0, b"BZh"),  # bzip2
    (0, b"\xfd7zXZ\x00"),  # xz
    (0, b"7z\xbc\xaf\x27\x1c"),
    (0, b"\x04\x22\x4d\x18"),  # lz4 frame
    (0, b"OggS"),
    (0, b"fLaC"),
    (0, b"\x1a\x45\xdf\xa3"),  # Matroska, WebM
    (4, b"ftyp"),  # MP4, MOV, HEIC
    (8, b"WEBP"),
)


def already_compressed(head: bytes) -> bool:
    """Whether a blob starting with `head` is in a compressed format (by its magic number)."""
    return any(head[offset : offset + len(magic)] == magic for offset, magic in _MAGIC)


def pays(head: bytes) -> bool:
    """Whether compressing a blob that starts with `head` (its first `SAMPLE` bytes, or all of it)
    is worth it: not too small, not already compressed, and the sample shrinks enough."""
    return packed_sample(head) is not None


def packed_sample(head: bytes) -> bytes | None:
    """`head[:SAMPLE]` compressed, when that shrinks it to at most `PAYS` of its size; else None."""
    sample = head[:SAMPLE]
    if len(sample) < MIN_SIZE or already_compressed(sample):
        return None
    packed: bytes = compressor().compress(sample)
    return packed if len(packed) <= len(sample) * PAYS else None


_local = threading.local()


def compressor() -> Any:
    """This thread's zstd compressor at `LEVEL` (one-shot ``compress``): made once, as making one
    costs more than compressing a small file with it."""
    found = getattr(_local, "compressor", None)
    if found is None:
        import zstandard

        found = _local.compressor = zstandard.ZstdCompressor(level=LEVEL)
    return found
