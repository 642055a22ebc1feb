"""Content-addressed stores: the `Store` base, a local directory and an in-memory backend."""

from __future__ import annotations

from pathlib import Path

from flaketriage.store.base import Store
from flaketriage.store.local import LocalStore
from flaketriage.store.memory import MemoryStore

__all__ = ["LocalStore", "MemoryStore", "Store", "open_store"]


def open_store(location: str | Path, readonly: bool = False) -> Store:
    """The store at `location`: a directory path (``s3://`` arrives with the S3 backend)."""
    return LocalStore(location, readonly=readonly)
