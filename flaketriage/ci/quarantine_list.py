"""The quarantine list as the CI side reads it: the file, or the service's copy with a local cache.

Both are a `flaketriage.quarantine.QuarantineDocument`, the document the workers write. The
service's list (``GET <quarantine_url>``, fetched with httpx) is cached in the store as
``quarantine-cache.json``, trusted for ``quarantine_cache_ttl_s``, and used even when stale while
the service is unreachable: reading the list never fails a CI run, it only adds a note.
"""

from __future__ import annotations

import functools
import json
import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from flaketriage import __version__
from flaketriage.atomic import write_atomic
from flaketriage.errors import QuarantineError
from flaketriage.quarantine import QuarantineDocument, QuarantineEntry
from flaketriage.settings import Settings

CACHE_NAME = "quarantine-cache.json"

Fetch = Callable[[str, float], bytes]
"""``fetch(url, timeout_s)``: the body of a 2xx answer; OSError for anything else."""


@dataclass(frozen=True)
class QuarantineList:
    """Quarantined failures by fingerprint; a test matches by its id or its failure's fingerprint."""

    document: QuarantineDocument = field(default_factory=QuarantineDocument)
    source: str = "none"

    @property
    def entries(self) -> Mapping[str, QuarantineEntry]:
        return self.document.entries

    def match(self, test_ids: Collection[str], fingerprint: str | None = None) -> QuarantineEntry | None:
        """The entry that quarantines this test (or this failure), or None."""
        return self.document.find(test_ids, fingerprint)


def describe(entry: QuarantineEntry) -> str:
    """What the session summary says about a quarantined test: the reason, and the link if any."""
    reason = entry.reason or "quarantined"
    return f"{reason} ({entry.issue_url})" if entry.issue_url else reason


def fetch_url(url: str, timeout_s: float, *, headers: Mapping[str, str] | None = None) -> bytes:
    """``GET url`` (JSON), raising OSError for anything that is not a 2xx answer in time.

    `headers` go with the request (credentials, say): pass ``functools.partial(fetch_url,
    headers=...)`` as `load_quarantine`'s ``fetch``.
    """
    import httpx  # only when the service is asked: a file-based or cached list never pays for it

    sent = {"Accept": "application/json", "User-Agent": f"flaketriage/{__version__}", **(headers or {})}
    try:
        response = httpx.get(url, headers=sent, timeout=timeout_s, follow_redirects=True)
    except (httpx.HTTPError, httpx.InvalidURL) as exc:
        raise OSError(f"{type(exc).__name__}: {exc or 'no detail'}") from exc
    if not response.is_success:
        raise OSError(f"HTTP {response.status_code}")
    return response.content


def load_quarantine(
    settings: Settings,
    store_dir: Path,
    *,
    fetch: Fetch | None = None,
    now: Callable[[], float] = time.time,
) -> tuple[QuarantineList, list[str]]:
    """The quarantine list to enforce, and notes for the session summary (never raises).

    The service's list is fetched with ``Authorization: Bearer <FLAKETRIAGE_API_TOKEN>`` when that
    setting is set (the service then requires it).
    """
    if fetch is None:
        token = settings.api_token.get_secret_value() if settings.api_token else ""
        fetch = functools.partial(fetch_url, headers={"Authorization": f"Bearer {token}"} if token else None)
    if settings.quarantine_url:
        return _from_service(settings, store_dir, fetch, now)
    path = settings.quarantine_file or store_dir / "quarantine.json"
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return QuarantineList(), []
    except OSError as exc:
        return QuarantineList(), [f"cannot read the quarantine list {path} ({exc}); running without it"]
    try:
        document = QuarantineDocument.from_json(raw, where=f"the quarantine list {path}")
    except QuarantineError as exc:
        return QuarantineList(), [f"{exc}; running without a quarantine list"]
    return QuarantineList(document, f"file {path}"), []


def _from_service(
    settings: Settings, store_dir: Path, fetch: Fetch, now: Callable[[], float]
) -> tuple[QuarantineList, list[str]]:
    url = settings.quarantine_url or ""
    cache_path = store_dir / CACHE_NAME
    cached = _read_cache(cache_path, url)
    if cached is not None and now() - cached[1] < settings.quarantine_cache_ttl_s:
        return QuarantineList(cached[0], f"cache of {url}"), []
    try:
        raw = fetch(url, settings.quarantine_fetch_timeout_s)
        document = QuarantineDocument.from_json(raw, where=f"the quarantine list from {url}")
    except (OSError, QuarantineError) as exc:
        problem = "unreachable" if isinstance(exc, OSError) else "answered with a list it cannot use"
        if cached is None:
            return QuarantineList(), [
                f"quarantine service {url} {problem} ({exc}) and no cached list; "
                "running without a quarantine list"
            ]
        age = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(cached[1]))
        note = f"quarantine service {url} {problem} ({exc}); using the cached list from {age}"
        return QuarantineList(cached[0], f"stale cache of {url}"), [note]
    notes: list[str] = []
    try:
        _write_cache(cache_path, url, document, now())
    except OSError as exc:
        notes.append(f"cannot cache the quarantine list in {cache_path} ({exc})")
    return QuarantineList(document, url), notes


def _read_cache(path: Path, url: str) -> tuple[QuarantineDocument, float] | None:
    try:
        doc = json.loads(path.read_bytes())
        if doc.get("url") != url:
            return None
        return QuarantineDocument.from_json(json.dumps(doc["list"]), str(path)), float(doc["fetched_at"])
    except (OSError, ValueError, KeyError, TypeError, AttributeError, QuarantineError):
        return None  # no usable cache is the same as none


def _write_cache(path: Path, url: str, document: QuarantineDocument, fetched_at: float) -> None:
    doc = {"url": url, "fetched_at": fetched_at, "list": document.model_dump(mode="json")}
    write_atomic(path, json.dumps(doc, sort_keys=True).encode())
