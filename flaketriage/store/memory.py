"""`MemoryStore`: the in-memory backend, for tests and for in-process pipelines.

Stores are named: every `MemoryStore` (or ``open_store("memory://NAME")``) with the same name in a
process shares one set of objects and refs, so a test and an embedded service can hand bundles to
each other. A named store lives as long as the process; an unnamed one as long as a store uses it.
"""

from __future__ import annotations

import threading
import time
import uuid
import weakref
from collections.abc import Iterator
from datetime import timedelta

from flaketriage.errors import ConfigError, ObjectNotFoundError, StoreError
from flaketriage.store.base import Store, StoreSettings, check_key
from flaketriage.store.state import MemoryFileState

SCHEME = "memory://"


class _Space:
    """The objects and refs of one named store."""

    def __init__(self) -> None:
        self.objects: dict[str, bytes] = {}
        self.refs: dict[str, bytes] = {}
        self.written: dict[str, float] = {}
        """When each object was written (``time.monotonic()``), for `MemoryStore.age`."""
        self.lock = threading.Lock()
        self.state = MemoryFileState()
        """The stat cache of the files stored here, shared like the objects."""


_named: dict[str, _Space] = {}
_unnamed: weakref.WeakValueDictionary[str, _Space] = weakref.WeakValueDictionary()
_spaces_lock = threading.Lock()


def _space(name: str | None, readonly: bool) -> tuple[str, _Space]:
    with _spaces_lock:
        if name is None:
            name = f"unnamed-{uuid.uuid4().hex[:16]}"
            space = _unnamed[name] = _Space()
            return name, space
        found = _named.get(name) or _unnamed.get(name)
        if found is not None:
            return name, found
        if readonly:
            raise StoreError(
                f"no store at {SCHEME}{name}: nothing in this process has opened it writable yet"
            )
        space = _named[name] = _Space()
        return name, space


class MemoryStore(Store):
    """A store held in dictionaries, shared by name within the process; thread-safe.

    ``MemoryStore()`` is a fresh store of its own (its `url` still reopens it while it is in use);
    ``MemoryStore("ci")`` is the process's store named ``ci``, created at the first writable open.
    """

    def __init__(self, name: str | None = None, readonly: bool = False) -> None:
        if name is not None and not name.strip("/"):
            raise ConfigError(f"a memory store needs a name: {SCHEME}NAME")
        self.name, self._space = _space(name.strip("/") if name else None, readonly)
        self.readonly = readonly
        self._objects = self._space.objects
        self._refs = self._space.refs
        self._lock = self._space.lock
        self.state = self._space.state

    @classmethod
    def from_url(
        cls, url: str, *, readonly: bool = False, shared: bool = False, settings: StoreSettings | None = None
    ) -> MemoryStore:
        if not url.startswith(SCHEME):
            raise ConfigError(f"{url} is not a memory store URL: write {SCHEME}NAME")
        return cls(url[len(SCHEME) :], readonly=readonly)

    @property
    def url(self) -> str:
        return f"{SCHEME}{self.name}"

    @property
    def location(self) -> str:
        return self.url

    def _read_object(self, key: str) -> bytes:
        try:
            return self._objects[key]
        except KeyError as exc:
            raise ObjectNotFoundError(key, self.location) from exc

    def _write_object(self, key: str, stored: bytes) -> None:
        with self._lock:
            if key not in self._objects:
                self._objects[key] = stored
                self._space.written[key] = time.monotonic()

    def has(self, key: str) -> bool:
        return check_key(key) in self._objects

    def keys(self) -> Iterator[str]:
        yield from sorted(self._objects)

    def delete(self, key: str) -> None:
        self._refuse_if_readonly()
        with self._lock:
            self._objects.pop(key, None)
            self._space.written.pop(key, None)

    def put_ref(self, name: str, data: bytes) -> None:
        self._refuse_if_readonly()
        with self._lock:
            self._refs[name] = data

    def get_ref(self, name: str) -> bytes | None:
        return self._refs.get(name)

    def delete_ref(self, name: str) -> None:
        self._refuse_if_readonly()
        with self._lock:
            self._refs.pop(name, None)

    def age(self, key: str) -> timedelta | None:
        written = self._space.written.get(key)
        return None if written is None else timedelta(seconds=time.monotonic() - written)

    def list_refs(self, prefix: str) -> list[str]:
        return [name for name in self._refs if name.startswith(prefix) and "/" not in name[len(prefix) :]]
