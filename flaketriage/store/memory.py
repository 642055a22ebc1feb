"""`MemoryStore`: the in-memory backend, for tests and for in-process pipelines."""

from __future__ import annotations

import threading
from collections.abc import Iterator

from flaketriage.errors import ObjectNotFoundError
from flaketriage.store.base import Store, check_key


class MemoryStore(Store):
    """A store held in dictionaries; thread-safe."""

    def __init__(self) -> None:
        self._objects: dict[str, bytes] = {}
        self._refs: dict[str, bytes] = {}
        self._lock = threading.Lock()

    @property
    def location(self) -> str:
        return f"memory://{id(self):x}"

    def _read_object(self, key: str) -> bytes:
        try:
            return self._objects[key]
        except KeyError as exc:
            raise ObjectNotFoundError(key, self.location) from exc

    def _write_object(self, key: str, stored: bytes) -> None:
        with self._lock:
            self._objects.setdefault(key, stored)

    def has(self, key: str) -> bool:
        return check_key(key) in self._objects

    def keys(self) -> Iterator[str]:
        yield from sorted(self._objects)

    def delete(self, key: str) -> None:
        self._refuse_if_readonly()
        with self._lock:
            self._objects.pop(key, None)

    def put_ref(self, name: str, data: bytes) -> None:
        self._refuse_if_readonly()
        with self._lock:
            self._refs[name] = data

    def get_ref(self, name: str) -> bytes | None:
        return self._refs.get(name)

    def list_refs(self, prefix: str) -> list[str]:
        return [name for name in self._refs if name.startswith(prefix) and "/" not in name[len(prefix) :]]
