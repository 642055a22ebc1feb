"""The quarantine list as the CI side reads it: the file, or the service's current list.

Both are a `flaketriage.quarantine.QuarantineDocument`, the document the workers write. The
service's list (``GET <quarantine_url>``, standard library client) is asked for in every session that
needs it, conditionally: the copy cached in the store as ``quarantine-cache.json`` is named by its
ETag (``If-None-Match``), and the service answers ``304 Not Modified`` while it is current, so a
test quarantined since the last run is quarantined in this one. The cache is used only when the
service does not answer (within ``quarantine_fetch_timeout_s``) or answers with a list it cannot
use, and then only if the service confirmed it within ``quarantine_cache_ttl_s``: reading the list
never fails a CI run, it only adds a note.

An entry limited to a variant is matched against the run's (`run_variant`), read once per session
and only when a failing test's entry is limited to one. An entry past its expiry (one made by hand)
forgives nothing, and the session summary says it expired (`QuarantineEntry.refusal`).
"""

from __future__ import annotations

import functools
import json
import time
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC
from pathlib import Path

from flaketriage import __version__
from flaketriage.errors import QuarantineError
from flaketriage.files.atomic import write_atomic
from flaketriage.files.modes import FileModes
from flaketriage.quarantine import QuarantineDocument, QuarantineEntry
from flaketriage.settings import Settings
from flaketriage.variant import GPU_VARIABLE, Variant, current_variant, gpu_model_of

CACHE_NAME = "quarantine-cache.json"


@dataclass(frozen=True)
class Answer:
    """What the service said: its list (200) with the list's ETag, or (``body`` None: 304) that the
    copy whose ETag was sent is current."""

    body: bytes | None
    etag: str | None = None


Fetch = Callable[[str, float, str | None], Answer]
"""``fetch(url, timeout_s, etag)``: the service's `Answer`, asked with ``If-None-Match: etag`` when
`etag` is given; OSError for anything else, an answer not complete within `timeout_s` included."""


@dataclass(frozen=True)
class QuarantineList:
    """Quarantined failures by fingerprint; a test matches by its id or its failure's fingerprint."""

    document: QuarantineDocument = field(default_factory=QuarantineDocument)
    source: str = "none"
    """Where the list came from, in words: ``file PATH``, the service's URL (``URL (unchanged)``
    after a 304), ``cached copy of URL from TIME`` when the service did not answer, or ``none``."""

    @property
    def entries(self) -> Mapping[str, QuarantineEntry]:
        return self.document.entries

    def match(
        self,
        test_ids: Collection[str],
        fingerprint: str | None = None,
        *,
        variant: Mapping[str, str] | None = None,
    ) -> QuarantineEntry | None:
        """The entry that forgives this failure of this test in a run of this variant, or None
        (`QuarantineDocument.find`; `variant` None: not known, and only entries for every variant
        forgive)."""
        return self.document.find(test_ids, fingerprint, variant=variant)

    def refused(
        self,
        test_ids: Collection[str],
        fingerprint: str | None = None,
        *,
        variant: Mapping[str, str] | None = None,
    ) -> str | None:
        """Why the entries naming this test (or failure) do not forgive it, in words for the
        session summary; None when one does, or none names it."""
        named = self.document.naming(test_ids, fingerprint)
        reasons = [e.refusal(fingerprint, variant) for e in named]
        if not named or None in reasons:
            return None
        return "; ".join(dict.fromkeys(r for r in reasons if r is not None))


def run_variant(env: Mapping[str, str], gpu_names: Callable[[], Iterable[str]] | None = None) -> Variant:
    """The variant this CI run is (`flaketriage.variant.current_variant`), with its GPU model:
    ``FLAKETRIAGE_GPU`` when set, else the GPUs the machine reports exactly as a capture reads
    them (`flaketriage.process.nvidia.read_gpus`: NVML if ``pynvml`` imports, else ``nvidia-smi``
    if it is on the PATH, else none), so that an entry written from a bundle captured here covers
    this run. Neither NVML nor nvidia-smi: ``gpu=none``, as the capture records it; a runner whose
    GPU neither can see states it with ``FLAKETRIAGE_GPU``.

    `gpu_names` reads the machine's (for tests). Raises `ConfigError` for a bad
    ``FLAKETRIAGE_VARIANT``."""
    stated = env.get(GPU_VARIABLE)
    if stated is not None:
        return current_variant(env, stated)
    return current_variant(env, gpu_model_of((gpu_names or _machine_gpu_names)()))


def _machine_gpu_names() -> list[str]:
    from flaketriage.process.nvidia import import_nvml, read_gpus

    gpus, _, _ = read_gpus(import_nvml())
    return [gpu.name for gpu in gpus]


def describe(entry: QuarantineEntry) -> str:
    """What the session summary says about a quarantined test: the reason, and the link if any; for
    an entry made by hand, its owner and when it ends."""
    reason = entry.reason or "quarantined"
    if entry.owner:
        reason += f", owner {entry.owner}"
    if entry.expires_at is not None:
        reason += f", until {entry.expires_at.astimezone(UTC):%Y-%m-%d %H:%M} UTC"
    return f"{reason} ({entry.issue_url})" if entry.issue_url else reason


def fetch_url(
    url: str, timeout_s: float, etag: str | None = None, *, headers: Mapping[str, str] | None = None
) -> Answer:
    """``GET url`` (JSON), with ``If-None-Match: etag`` when `etag` is given.

    Raises OSError for anything but a 2xx or a 304 answer complete within `timeout_s` (in all:
    connecting, the headers and every byte of the body, so a server that trickles its answer
    cannot hold the session). `headers` go with the request (credentials, say): pass
    ``functools.partial(fetch_url, headers=...)`` as `load_quarantine`'s ``fetch``.
    """
    # The standard library's client: a pytest session asks this once, and importing httpx would
    # cost it more than the request (bench/quarantine_fetch.py).
    import http.client
    import urllib.error
    import urllib.request

    deadline = time.monotonic() + timeout_s
    sent = {"Accept": "application/json", "User-Agent": f"flaketriage/{__version__}", **(headers or {})}
    if etag:
        sent["If-None-Match"] = etag
    try:
        request = urllib.request.Request(url, headers=sent, method="GET")
        if request.type not in ("http", "https"):
            raise OSError(f"not an http(s) URL: {url}")
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            chunks = []
            while chunk := response.read1(65536):  # what has come: read() would wait for all
                chunks.append(chunk)
                if time.monotonic() > deadline:
                    raise OSError(f"the answer took longer than {timeout_s:g} s")
            return Answer(b"".join(chunks), response.headers.get("etag"))
    except urllib.error.HTTPError as exc:
        if exc.code == 304:  # urllib reads a 304 as an error: here it is the answer
            return Answer(None, exc.headers.get("etag") or etag)
        raise OSError(f"HTTP {exc.code}") from exc
    except (urllib.error.URLError, http.client.HTTPException, ValueError) as exc:
        raise OSError(f"{type(exc).__name__}: {exc or 'no detail'}") from exc


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


@dataclass(frozen=True)
class _Cached:
    document: QuarantineDocument
    etag: str | None
    checked_at: float
    """When the service last gave or confirmed this list (epoch seconds)."""


def _from_service(
    settings: Settings, store_dir: Path, fetch: Fetch, now: Callable[[], float]
) -> tuple[QuarantineList, list[str]]:
    url = settings.quarantine_url or ""
    cache_path = store_dir / CACHE_NAME
    cached = _read_cache(cache_path, url)
    try:
        answer = fetch(url, settings.quarantine_fetch_timeout_s, cached.etag if cached else None)
        if answer.body is None:
            if cached is None:
                raise QuarantineError("304 Not Modified to a request that named no cached copy")
            document, etag, source = cached.document, answer.etag or cached.etag, f"{url} (unchanged)"
        else:
            document = QuarantineDocument.from_json(answer.body, where=f"the quarantine list from {url}")
            etag, source = answer.etag, url
    except (OSError, QuarantineError) as exc:
        problem = "unreachable" if isinstance(exc, OSError) else "answered with a list it cannot use"
        return _fallback(settings, url, f"quarantine service {url} {problem} ({exc})", cached, now())
    notes: list[str] = []
    try:
        _write_cache(cache_path, url, _Cached(document, etag, now()), FileModes.of(settings.store_shared))
    except OSError as exc:
        notes.append(f"cannot cache the quarantine list in {cache_path} ({exc})")
    return QuarantineList(document, source), notes


def _fallback(
    settings: Settings, url: str, problem: str, cached: _Cached | None, now: float
) -> tuple[QuarantineList, list[str]]:
    """The cached copy when the service did not answer, if it is young enough to stand in."""
    if cached is None:
        return QuarantineList(), [f"{problem} and no cached list; running without a quarantine list"]
    when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(cached.checked_at))
    age = now - cached.checked_at
    if age > settings.quarantine_cache_ttl_s:
        return QuarantineList(), [
            f"{problem}, and the cached list from {when} is {_duration(age)} old, older than "
            f"FLAKETRIAGE_QUARANTINE_CACHE_TTL_S ({settings.quarantine_cache_ttl_s:g} s); "
            "running without a quarantine list"
        ]
    note = f"{problem}; using the cached list from {when} ({_duration(age)} old)"
    return QuarantineList(cached.document, f"cached copy of {url} from {when}"), [note]


def _duration(seconds: float) -> str:
    seconds = max(0.0, seconds)
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def _read_cache(path: Path, url: str) -> _Cached | None:
    try:
        doc = json.loads(path.read_bytes())
        if doc.get("url") != url:
            return None
        document = QuarantineDocument.from_json(json.dumps(doc["list"]), str(path))
        etag = doc.get("etag")
        # A cache written before ETags has ``fetched_at`` and no tag: the service then answers 200.
        checked_at = float(doc["checked_at"] if "checked_at" in doc else doc["fetched_at"])
        return _Cached(document, etag if isinstance(etag, str) and etag else None, checked_at)
    except (OSError, ValueError, KeyError, TypeError, AttributeError, QuarantineError):
        return None  # no usable cache is the same as none


def _write_cache(path: Path, url: str, cached: _Cached, modes: FileModes) -> None:
    doc = {
        "url": url,
        "etag": cached.etag,
        "checked_at": cached.checked_at,
        "list": cached.document.model_dump(mode="json"),
    }
    # Unsynced: a cache lost in a crash costs one full answer next time, and a 304 rewrites it.
    modes.make_dirs(path.parent)
    write_atomic(path, json.dumps(doc, sort_keys=True).encode(), mode=modes.file, fsync=False)
