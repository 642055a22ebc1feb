"""The CI side's quarantine list: file or service, cache freshness, and fallbacks that never fail."""

from __future__ import annotations

import functools
import json
import os
import stat
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from _pytest.terminal import _format_trimmed
from hypothesis import given
from hypothesis import strategies as st

from flaketriage.ci.pytest_bundle import _trimmed
from flaketriage.ci.pytest_plugin import nodeid_relative_to
from flaketriage.ci.quarantine_list import (
    CACHE_NAME,
    Answer,
    QuarantineList,
    describe,
    fetch_url,
    load_quarantine,
)
from flaketriage.quarantine import QuarantineDocument
from flaketriage.settings import Settings

URL = "http://quarantine.invalid/v1/quarantine"
ENTRY = {
    "fingerprint": "ab" * 32,
    "test_id": "tests/test_a.py::test_x",
    "reason": "flaky",
    "evidence": {
        "verdict": "flaky",
        "decided": True,
        "replays": 7,
        "reproductions": 3,
        "passes": 4,
        "different": 0,
        "rate": {"estimate": 0.43, "low": 0.1, "high": 0.82},
    },
    "command": "pytest tests/test_a.py::test_x",
    "bundle_id": "c" * 64,
    "bundles": ["c" * 64],
    "occurrences": 1,
    "quarantined_at": "2024-05-01T12:00:00Z",
    "updated_at": "2024-05-01T12:00:00Z",
}
DOC = {"version": 1, "entries": {"ab" * 32: ENTRY}}


class Service:
    """A stand-in for the service: answers with `doc` and its ETag (304 to a request naming it), or
    fails like a network would."""

    def __init__(self, doc: Any = DOC, *, etags: bool = True) -> None:
        self.doc = doc
        self.etags = etags
        self.down = False
        self.asked: list[str | None] = []
        """The ETag each request named."""

    @property
    def etag(self) -> str | None:
        return f'"{hash(json.dumps(self.doc, sort_keys=True)) & 0xFFFFFFFF:x}"' if self.etags else None

    def __call__(self, url: str, timeout_s: float, etag: str | None) -> Answer:
        self.asked.append(etag)
        if self.down:
            raise OSError("connection refused")
        if etag is not None and etag == self.etag:
            return Answer(None, self.etag)
        return Answer(json.dumps(self.doc).encode(), self.etag)


def _settings(tmp_path: Path, **fields: Any) -> Settings:
    return Settings(store=str(tmp_path), **fields)


def test_matches_by_test_id_or_fingerprint() -> None:
    qlist = QuarantineList(QuarantineDocument.from_json(json.dumps(DOC)))
    entry = qlist.entries["ab" * 32]
    assert qlist.match({"tests/test_a.py::test_x"}) == entry
    assert qlist.match({"other"}, fingerprint="ab" * 32) == entry
    assert qlist.match({"other"}, fingerprint="cd" * 32) is None


def test_the_summary_names_the_reason_and_the_link() -> None:
    entry = QuarantineDocument.from_json(json.dumps(DOC)).entries["ab" * 32]
    assert describe(entry) == "flaky"
    assert describe(entry.model_copy(update={"issue_url": "https://x/1"})) == "flaky (https://x/1)"


def test_file_missing_is_an_empty_list_and_damaged_is_a_note(tmp_path: Path) -> None:
    qlist, notes = load_quarantine(_settings(tmp_path), tmp_path)
    assert not qlist.entries and notes == []
    (tmp_path / "quarantine.json").write_text("{not json")
    qlist, notes = load_quarantine(_settings(tmp_path), tmp_path)
    assert not qlist.entries and "not valid JSON" in notes[0]
    (tmp_path / "quarantine.json").write_text(json.dumps({"version": 2, "entries": {}}))
    assert "version 2" in load_quarantine(_settings(tmp_path), tmp_path)[1][0]


def test_every_session_asks_the_service_so_a_quarantine_made_since_the_last_run_holds(
    tmp_path: Path,
) -> None:
    service = Service(doc={"version": 1, "entries": {}})
    settings = _settings(tmp_path, quarantine_url=URL)
    qlist, _ = load_quarantine(settings, tmp_path, fetch=service)
    assert not qlist.entries

    service.doc = DOC  # the failure is quarantined between two runs, a minute apart
    qlist, notes = load_quarantine(settings, tmp_path, fetch=service)

    assert list(qlist.entries) == ["ab" * 32] and notes == [] and qlist.source == URL
    assert len(service.asked) == 2


def test_the_cached_copy_is_named_by_its_etag_and_a_304_keeps_it(tmp_path: Path) -> None:
    service = Service()
    settings = _settings(tmp_path, quarantine_url=URL)
    clock = iter([1000.0, 2000.0])
    load_quarantine(settings, tmp_path, fetch=service, now=lambda: next(clock))
    cache = json.loads((tmp_path / CACHE_NAME).read_text())
    assert cache["url"] == URL and cache["etag"] == service.etag and cache["checked_at"] == 1000.0

    qlist, notes = load_quarantine(settings, tmp_path, fetch=service, now=lambda: next(clock))

    assert service.asked == [None, service.etag]  # the second session asked conditionally
    assert list(qlist.entries) == ["ab" * 32] and notes == [] and qlist.source == f"{URL} (unchanged)"
    assert json.loads((tmp_path / CACHE_NAME).read_text())["checked_at"] == 2000.0  # confirmed now


def test_a_service_without_etags_is_asked_for_the_whole_list_each_time(tmp_path: Path) -> None:
    service = Service(etags=False)
    settings = _settings(tmp_path, quarantine_url=URL)
    for _ in range(2):
        qlist, notes = load_quarantine(settings, tmp_path, fetch=service)
        assert list(qlist.entries) == ["ab" * 32] and notes == []
    assert service.asked == [None, None]


def test_a_304_without_a_cached_copy_is_a_note_not_a_list(tmp_path: Path) -> None:
    def confused(url: str, timeout_s: float, etag: str | None) -> Answer:
        return Answer(None, '"x"')

    qlist, notes = load_quarantine(_settings(tmp_path, quarantine_url=URL), tmp_path, fetch=confused)

    assert not qlist.entries
    assert (
        "answered with a list it cannot use (304 Not Modified to a request that named no cached copy)"
        in (notes[0])
    )


def test_unreachable_service_falls_back_to_a_cache_within_its_ttl_then_to_nothing(tmp_path: Path) -> None:
    service = Service()
    settings = _settings(tmp_path, quarantine_url=URL, quarantine_cache_ttl_s=3600)
    load_quarantine(settings, tmp_path, fetch=service, now=lambda: 1000.0)
    service.down = True

    qlist, notes = load_quarantine(settings, tmp_path, fetch=service, now=lambda: 1000.0 + 3600)

    assert list(qlist.entries) == ["ab" * 32]
    assert qlist.source == f"cached copy of {URL} from 1970-01-01 00:16:40 UTC"
    assert notes == [
        f"quarantine service {URL} unreachable (connection refused); "
        "using the cached list from 1970-01-01 00:16:40 UTC (60 min old)"
    ]

    qlist, notes = load_quarantine(settings, tmp_path, fetch=service, now=lambda: 1000.0 + 3601)

    assert not qlist.entries
    assert notes == [
        f"quarantine service {URL} unreachable (connection refused), and the cached list from "
        "1970-01-01 00:16:40 UTC is 60 min old, older than FLAKETRIAGE_QUARANTINE_CACHE_TTL_S (3600 s); "
        "running without a quarantine list"
    ]
    (tmp_path / CACHE_NAME).unlink()
    qlist, notes = load_quarantine(settings, tmp_path, fetch=service)
    assert not qlist.entries
    assert "no cached list; running without a quarantine list" in notes[0]


def test_a_ttl_of_zero_never_stands_the_cache_in(tmp_path: Path) -> None:
    service = Service()
    settings = _settings(tmp_path, quarantine_url=URL, quarantine_cache_ttl_s=0)
    load_quarantine(settings, tmp_path, fetch=service, now=lambda: 1000.0)
    service.down = True

    qlist, notes = load_quarantine(settings, tmp_path, fetch=service, now=lambda: 1000.5)

    assert not qlist.entries and "older than FLAKETRIAGE_QUARANTINE_CACHE_TTL_S (0 s)" in notes[0]


def test_a_cache_written_before_etags_still_stands_in(tmp_path: Path) -> None:
    (tmp_path / CACHE_NAME).write_text(json.dumps({"url": URL, "fetched_at": 1000.0, "list": DOC}))
    service = Service()
    settings = _settings(tmp_path, quarantine_url=URL)
    service.down = True

    qlist, notes = load_quarantine(settings, tmp_path, fetch=service, now=lambda: 1100.0)

    assert list(qlist.entries) == ["ab" * 32] and "using the cached list" in notes[0]
    service.down = False
    load_quarantine(settings, tmp_path, fetch=service, now=lambda: 1200.0)
    assert service.asked == [None, None]  # no tag to name: the whole list, then cached with its tag
    assert json.loads((tmp_path / CACHE_NAME).read_text())["etag"] == service.etag


@pytest.mark.parametrize(
    "damage",
    [b"{not json", b"[]", b'{"url": 1}', json.dumps({"url": URL, "etag": 7, "checked_at": "x", "list": DOC})],
    ids=["not-json", "not-an-object", "wrong-url-type", "wrong-field-types"],
)
def test_a_damaged_cache_is_no_cache(tmp_path: Path, damage: bytes | str) -> None:
    path = tmp_path / CACHE_NAME
    path.write_bytes(damage if isinstance(damage, bytes) else damage.encode())
    service = Service()

    qlist, notes = load_quarantine(_settings(tmp_path, quarantine_url=URL), tmp_path, fetch=service)

    assert list(qlist.entries) == ["ab" * 32] and notes == [] and service.asked == [None]
    assert json.loads(path.read_text())["etag"] == service.etag  # replaced by the service's list


def test_cache_of_another_url_is_not_used(tmp_path: Path) -> None:
    load_quarantine(_settings(tmp_path, quarantine_url=URL), tmp_path, fetch=Service())
    other = Service()
    other.down = True
    elsewhere = _settings(tmp_path, quarantine_url="http://elsewhere.invalid/q")
    qlist, notes = load_quarantine(elsewhere, tmp_path, fetch=other)
    assert not qlist.entries and "no cached list" in notes[0]


def test_a_garbled_answer_is_treated_like_an_unreachable_service(tmp_path: Path) -> None:
    qlist, notes = load_quarantine(
        _settings(tmp_path, quarantine_url=URL), tmp_path, fetch=Service(doc=["not", "a", "list"])
    )
    assert not qlist.entries and "expected an object" in notes[0]


def test_an_answer_of_another_version_is_a_note(tmp_path: Path) -> None:
    qlist, notes = load_quarantine(
        _settings(tmp_path, quarantine_url=URL), tmp_path, fetch=Service(doc={"version": 2, "entries": {}})
    )
    assert not qlist.entries and "version 2" in notes[0] and "upgrade flaketriage" in notes[0]


# -- fetching over HTTP, against a real server -----------------------------------------------------
class _Answer(BaseHTTPRequestHandler):
    """``/v1/quarantine`` with an ETag (304 when ``If-None-Match`` names it); ``/trickle`` sends
    a valid list a byte every 50 ms; anything else is a 404."""

    seen: list[dict[str, str]]
    status = 200
    etag = '"v1"'

    def do_GET(self) -> None:
        self.seen.append(dict(self.headers))
        body = json.dumps(DOC).encode() if self.path in ("/v1/quarantine", "/trickle") else b"{}"
        if self.path == "/v1/quarantine" and self.headers.get("If-None-Match") == self.etag:
            self.send_response(304)
            self.send_header("ETag", self.etag)
            self.end_headers()
            return
        self.send_response(self.status if self.path in ("/v1/quarantine", "/trickle") else 404)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("ETag", self.etag)
        self.end_headers()
        if self.path == "/trickle":
            for byte in body:
                self.wfile.write(bytes([byte]))
                self.wfile.flush()
                time.sleep(0.05)
            return
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def service(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[str, list[dict[str, str]]]]:
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    seen: list[dict[str, str]] = []
    handler = type("Answer", (_Answer,), {"seen": seen})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", seen
    server.shutdown()
    server.server_close()
    thread.join()


def test_fetch_url_gets_the_list_with_the_headers_given(
    service: tuple[str, list[dict[str, str]]], tmp_path: Path
) -> None:
    base, seen = service
    fetch = functools.partial(fetch_url, headers={"Authorization": "Bearer t0ken"})
    qlist, notes = load_quarantine(
        _settings(tmp_path, quarantine_url=f"{base}/v1/quarantine"), tmp_path, fetch=fetch
    )
    assert list(qlist.entries) == ["ab" * 32] and notes == []
    assert seen[0]["Authorization"] == "Bearer t0ken" and seen[0]["Accept"] == "application/json"


def test_fetch_url_asks_conditionally_and_reads_a_304(
    service: tuple[str, list[dict[str, str]]], tmp_path: Path
) -> None:
    base, seen = service
    url = f"{base}/v1/quarantine"
    assert fetch_url(url, 5.0) == Answer(json.dumps(DOC).encode(), '"v1"')
    assert fetch_url(url, 5.0, '"v1"') == Answer(None, '"v1"')
    assert fetch_url(url, 5.0, '"v0"').body == json.dumps(DOC).encode()
    assert "If-None-Match" not in seen[0] and seen[1]["If-None-Match"] == '"v1"'

    settings = _settings(tmp_path, quarantine_url=url)
    load_quarantine(settings, tmp_path, fetch=fetch_url)
    qlist, notes = load_quarantine(settings, tmp_path, fetch=fetch_url)
    assert list(qlist.entries) == ["ab" * 32] and notes == [] and qlist.source == f"{url} (unchanged)"


def test_a_trickling_answer_is_given_up_on_at_the_fetch_timeout(
    service: tuple[str, list[dict[str, str]]], tmp_path: Path
) -> None:
    base, _ = service
    started = time.monotonic()
    with pytest.raises(OSError, match=r"the answer took longer than 0\.5 s"):
        fetch_url(f"{base}/trickle", 0.5)
    assert time.monotonic() - started < 1.5  # each byte came well within the timeout: a total deadline


def test_fetch_url_turns_http_errors_and_refusals_into_oserror(
    service: tuple[str, list[dict[str, str]]],
) -> None:
    base, _ = service
    with pytest.raises(OSError, match="HTTP 404"):
        fetch_url(f"{base}/elsewhere", 5.0)
    dead = ThreadingHTTPServer(("127.0.0.1", 0), BaseHTTPRequestHandler)
    port = dead.server_address[1]
    dead.server_close()
    with pytest.raises(OSError, match="Connection refused"):
        fetch_url(f"http://127.0.0.1:{port}/v1/quarantine", 5.0)
    with pytest.raises(OSError, match="not an http"):
        fetch_url("ftp://example.invalid/q", 5.0)


# -- the summary line the rerun prints: written here as pytest writes it --------------------------
@given(msg=st.text(min_size=0, max_size=300), available=st.integers(min_value=0, max_value=400))
def test_message_cut_matches_pytest(msg: str, available: int) -> None:
    assert _trimmed(msg, available) == _format_trimmed(" - {}", msg, available)


@pytest.mark.parametrize(
    ("invocation", "nodeid", "expected"),
    [
        ("/r", "tests/test_a.py::test_x[a::b]", "tests/test_a.py::test_x[a::b]"),
        ("/r/tests", "tests/test_a.py::test_x", "test_a.py::test_x"),
        ("/r/sub", "tests/test_a.py::C::test_x", "../tests/test_a.py::C::test_x"),
    ],
)
def test_node_ids_are_written_relative_to_where_pytest_ran(
    invocation: str, nodeid: str, expected: str
) -> None:
    assert nodeid_relative_to(Path(invocation), Path("/r"))(nodeid) == expected


@pytest.mark.parametrize(("shared", "file_mode", "dir_mode"), [(False, 0o600, 0o700), (True, 0o640, 0o2770)])
def test_the_cache_has_the_stores_modes_whatever_the_umask(
    tmp_path: Path, shared: bool, file_mode: int, dir_mode: int
) -> None:
    old = os.umask(0o022)  # the usual one: it would let the list and its URL be read by anyone
    try:
        store = tmp_path / "store"
        load_quarantine(_settings(store, quarantine_url=URL, store_shared=shared), store, fetch=Service())
    finally:
        os.umask(old)
    assert stat.S_IMODE((store / CACHE_NAME).stat().st_mode) == file_mode
    assert stat.S_IMODE(store.stat().st_mode) == dir_mode
