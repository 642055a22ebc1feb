"""The quarantine list as the CI side reads it: the JSON file, or the service's copy with a local cache.

Both have the shape ``workers/quarantine.py`` writes: ``{"version": 1, "entries": {fingerprint:
{"test_id": ..., ...}}}``. The service's list (``GET <quarantine_url>``) is cached in the store as
``quarantine-cache.json``, trusted for ``quarantine_cache_ttl_s``, and used even when stale while
the service is unreachable: reading the list never fails a CI run, it only adds a note.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from flaketriage.atomic import write_atomic
from flaketriage.settings import Settings

CACHE_NAME = "quarantine-cache.json"
VERSION = 1

Entry = Mapping[str, Any]
Fetch = Callable[[str, float], bytes]


class QuarantineListError(ValueError):
    """A quarantine list that cannot be read; the caller turns it into a note and goes on."""


@dataclass(frozen=True)
class QuarantineList:
    """Quarantined failures by fingerprint; a test matches by its id or its failure's fingerprint."""

    entries: Mapping[str, Entry] = field(default_factory=dict)
    source: str = "none"

    def match(self, test_ids: Collection[str], fingerprint: str | None = None) -> Entry | None:
        """The entry that quarantines this test (or this failure), or None."""
        if fingerprint is not None and fingerprint in self.entries:
            return self.entries[fingerprint]
        for entry in self.entries.values():
            if entry.get("test_id") in test_ids:
                return entry
        return None


def entry_link(entry: Entry) -> str | None:
    """Where people read about the quarantine: the issue, else the report, if the entry names one."""
    for key in ("issue_url", "report", "url"):
        value = entry.get(key)
        if isinstance(value, str) and value:
            return value
        if isinstance(value, Mapping) and isinstance(value.get("location"), str):
            return str(value["location"])
    return None


def entry_reason(entry: Entry) -> str:
    reason = entry.get("reason")
    return str(reason) if reason else "quarantined"


def parse_list(raw: bytes | str, where: str) -> dict[str, Entry]:
    """The entries of a quarantine list document."""
    try:
        doc = json.loads(raw)
    except ValueError as exc:
        raise QuarantineListError(f"{where} is not valid JSON ({exc})") from exc
    entries = doc.get("entries") if isinstance(doc, dict) else None
    if isinstance(doc, dict) and doc.get("version", VERSION) != VERSION:
        raise QuarantineListError(
            f"{where} has version {doc.get('version')!r}; this flaketriage reads version {VERSION}"
        )
    if isinstance(entries, list):  # a service may list entries instead of keying them
        entries = {str(e.get("fingerprint", i)): e for i, e in enumerate(entries) if isinstance(e, dict)}
    if not isinstance(entries, dict):
        raise QuarantineListError(f'{where}: expected an object {{"version": 1, "entries": {{...}}}}')
    return {str(k): v for k, v in entries.items() if isinstance(v, dict)}


def fetch_url(url: str, timeout_s: float) -> bytes:
    """``GET url`` (JSON), raising OSError for anything that is not a 2xx answer in time."""
    request = urllib.request.Request(url, headers={"Accept": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            body: bytes = response.read()
    except urllib.error.HTTPError as exc:
        raise OSError(f"HTTP {exc.code}") from exc
    except (urllib.error.URLError, TimeoutError, ValueError) as exc:
        raise OSError(str(getattr(exc, "reason", exc))) from exc
    return body


def load_quarantine(
    settings: Settings,
    store_dir: Path,
    *,
    fetch: Fetch = fetch_url,
    now: Callable[[], float] = time.time,
) -> tuple[QuarantineList, list[str]]:
    """The quarantine list to enforce, and notes for the session summary (never raises)."""
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
        return QuarantineList(parse_list(raw, str(path)), f"file {path}"), []
    except QuarantineListError as exc:
        return QuarantineList(), [f"{exc}; running without a quarantine list"]


def _from_service(
    settings: Settings, store_dir: Path, fetch: Fetch, now: Callable[[], float]
) -> tuple[QuarantineList, list[str]]:
    url = settings.quarantine_url or ""
    cache_path = store_dir / CACHE_NAME
    cached = _read_cache(cache_path, url)
    if cached is not None and now() - cached[1] < settings.quarantine_cache_ttl_s:
        return QuarantineList(cached[0], f"cache of {url}"), []
    try:
        entries = parse_list(fetch(url, settings.quarantine_fetch_timeout_s), url)
    except (OSError, QuarantineListError) as exc:
        if cached is None:
            return QuarantineList(), [
                f"quarantine service {url} unreachable ({exc}) and no cached list; "
                "running without a quarantine list"
            ]
        age = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(cached[1]))
        note = f"quarantine service {url} unreachable ({exc}); using the cached list from {age}"
        return QuarantineList(cached[0], f"stale cache of {url}"), [note]
    notes: list[str] = []
    try:
        _write_cache(cache_path, url, entries, now())
    except OSError as exc:
        notes.append(f"cannot cache the quarantine list in {cache_path} ({exc})")
    return QuarantineList(entries, url), notes


def _read_cache(path: Path, url: str) -> tuple[dict[str, Entry], float] | None:
    try:
        doc = json.loads(path.read_bytes())
        if doc.get("url") != url:
            return None
        return parse_list(json.dumps(doc["list"]), str(path)), float(doc["fetched_at"])
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None  # no usable cache is the same as none


def _write_cache(path: Path, url: str, entries: Mapping[str, Entry], fetched_at: float) -> None:
    doc = {"url": url, "fetched_at": fetched_at, "list": {"version": VERSION, "entries": dict(entries)}}
    write_atomic(path, json.dumps(doc, sort_keys=True).encode())
