"""Store URLs and the backends behind them: `open_store` is the one way to get a store.

A store location is a directory path (``.flaketriage``, ``/srv/bundles``) or a URL:
``file:///srv/bundles``, ``memory://name`` (one store per name in a process, shared by whoever
opens it: tests, an embedded service) or ``s3://bucket/prefix``. A scheme names its backend as a
``"module:Class"`` string that is imported only when a URL of that scheme is opened, so an optional
backend's library (boto3 for S3) is imported then and only then.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import re
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urlsplit

from flaketriage.errors import ConfigError, MissingDependencyError
from flaketriage.store.base import Store, StoreSettings

__all__ = ["Backend", "local_path", "open_store", "register_backend", "store_url"]

_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")
PATH_MAX = 4095
"""The longest path (bytes) the store accepts: Linux's PATH_MAX less the terminating NUL."""
NAME_MAX = 255
"""The longest name of one path component (bytes), as on every common file system."""


@dataclass(frozen=True)
class Backend:
    """A store backend: its class as ``"module:Class"``, and the extra that installs its library."""

    target: str
    extra: str | None = None


_BACKENDS: dict[str, Backend] = {
    "file": Backend("flaketriage.store.local:LocalStore"),
    "memory": Backend("flaketriage.store.memory:MemoryStore"),
    "s3": Backend("flaketriage.store.s3:S3Store", extra="s3"),
}


def register_backend(scheme: str, target: str, *, extra: str | None = None) -> None:
    """Open ``<scheme>://...`` URLs with the `Store` subclass ``target`` (``"module:Class"``),
    imported at the first such URL; ``extra`` is the flaketriage extra that installs its library."""
    module, sep, name = target.partition(":")
    if not (module and sep and name):
        raise ConfigError(f"backend {target!r} for {scheme}:// is not 'module:Class'")
    _BACKENDS[scheme.lower()] = Backend(target, extra)


def open_store(
    url: str | os.PathLike[str],
    readonly: bool = False,
    *,
    relative_to: Path | None = None,
    shared: bool = False,
    settings: StoreSettings | None = None,
) -> Store:
    """The store at `url`: a directory path or a ``file://``, ``memory://`` or ``s3://`` URL.

    A relative path is taken relative to `relative_to` (default: the current directory). A
    read-only store refuses writes, and opening one that does not exist is a `StoreError`. What a
    local store writes is readable by its owner only, or by the group too when `shared`
    (``FLAKETRIAGE_STORE_SHARED``). `settings` are the caller's (the CLI's, a worker's, the
    receiver's): what a backend reads besides the URL, such as S3's endpoint; without them a backend
    uses its defaults (it never reads the environment itself).
    Raises `ConfigError` for a URL no backend reads, `MissingDependencyError` when the backend's
    library is not installed.
    """
    canonical = store_url(url, relative_to=relative_to)
    scheme = canonical.partition("://")[0]
    return _backend_class(scheme).from_url(canonical, readonly=readonly, shared=shared, settings=settings)


def store_url(location: str | os.PathLike[str], *, relative_to: Path | None = None) -> str:
    """The canonical URL of a store location, without opening it.

    ``file:///absolute/path`` for a directory path (relative ones resolved against `relative_to`,
    default the current directory) or a ``file://`` URL; any other URL as given, less a trailing
    ``/``. Raises `ConfigError` for an empty location or a scheme no backend reads.
    """
    text = _text(location)
    path = local_path(text)
    if path is not None:
        base = relative_to if relative_to is not None else Path.cwd()
        return (base / path).absolute().as_uri()
    scheme, _, rest = text.partition("://")
    rest = rest.rstrip("/")
    if not rest:
        raise ConfigError(f"store URL {text!r} names no store: write {scheme}://NAME")
    return f"{scheme.lower()}://{rest}"


def local_path(location: str | os.PathLike[str]) -> Path | None:
    """The directory of a local store location (a path, perhaps relative, or a ``file://`` URL);
    None for a store elsewhere (``memory://``, ``s3://``). Raises `ConfigError` like `store_url`."""
    text = _text(location)
    match = _SCHEME.match(text)
    if match is None:
        return _checked_path(text)
    scheme = match.group(1).lower()
    if scheme not in _BACKENDS:
        raise ConfigError(
            f"the store {text!r} has the scheme {scheme}://, which no store backend reads; use {_supported()}"
        )
    if scheme != "file":
        return None
    parts = urlsplit(text)
    if parts.netloc not in ("", "localhost") or not parts.path.startswith("/"):
        raise ConfigError(
            f"the store {text!r} is not a file URL of an absolute path: write file:///absolute/path, "
            "or give a plain (relative) directory path"
        )
    return _checked_path(unquote(parts.path))


def _checked_path(text: str) -> Path:
    """`text` as a path, refused when no file system could hold it (rather than an OSError later)."""
    shown = text if len(text) <= 80 else f"{text[:50]}…{text[-20:]} ({len(text)} characters)"
    if "\x00" in text:
        raise ConfigError(f"the store path {shown!r} contains a NUL byte; give a directory path without one")
    size = len(os.fsencode(text))
    if size > PATH_MAX:
        raise ConfigError(
            f"the store path {shown!r} is {size} bytes long, more than the {PATH_MAX} a path may hold; "
            "pass --store (or FLAKETRIAGE_STORE) with a shorter path"
        )
    path = Path(text)
    for part in path.parts:
        if len(os.fsencode(part)) > NAME_MAX:
            name = part if len(part) <= 40 else f"{part[:30]}…"
            raise ConfigError(
                f"the store path {shown!r} has a component {name!r} of {len(os.fsencode(part))} bytes, "
                f"more than the {NAME_MAX} a file name may hold; pass --store (or FLAKETRIAGE_STORE) "
                "with shorter names"
            )
    return path


def _text(location: str | os.PathLike[str]) -> str:
    text = os.fspath(location).strip()
    if not text:
        raise ConfigError(f"the store location is empty: use {_supported()}")
    return text


def _backend_class(scheme: str) -> type[Store]:
    backend = _BACKENDS[scheme]
    module_name, _, class_name = backend.target.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name and (module_name == exc.name or module_name.startswith(exc.name + ".")):
            raise ConfigError(
                f"the {scheme}:// store is not available in this version of flaketriage "
                f"({module_name} is missing); use {_supported()}"
            ) from exc
        if backend.extra is None:
            raise
        missing = (exc.name or module_name).partition(".")[0]
        raise MissingDependencyError(missing, backend.extra, f"the {scheme}:// store") from exc
    cls = getattr(module, class_name, None)
    if not (isinstance(cls, type) and issubclass(cls, Store)):
        raise ConfigError(f"{backend.target}, registered for {scheme}:// URLs, is not a Store class")
    return cls


def _supported() -> str:
    """The locations this installation can open, for error messages."""
    urls = {"file": "file:///absolute/path", "memory": "memory://NAME", "s3": "s3://BUCKET/PREFIX"}
    available = [urls.get(s, f"{s}://...") for s, backend in _BACKENDS.items() if _installed(backend)]
    *rest, last = ["a directory path", *available]
    return f"{', '.join(rest)} or {last}"


def _installed(backend: Backend) -> bool:
    try:
        return importlib.util.find_spec(backend.target.partition(":")[0]) is not None
    except ModuleNotFoundError:  # its parent package is missing
        return False
