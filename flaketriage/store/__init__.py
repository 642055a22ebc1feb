"""Content-addressed stores: the `Store` base, a local directory and an in-memory backend.

`open_store` is the one way to get a store from a location (a path or a URL): see
`flaketriage.store.registry`.
"""

from __future__ import annotations

from flaketriage.store.base import Store
from flaketriage.store.local import LocalStore
from flaketriage.store.memory import MemoryStore
from flaketriage.store.registry import local_path, open_store, register_backend, store_url

__all__ = [
    "LocalStore",
    "MemoryStore",
    "Store",
    "local_path",
    "open_store",
    "register_backend",
    "store_url",
]
