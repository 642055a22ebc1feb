"""The CI side's quarantine list: file or service, cache freshness, and fallbacks that never fail."""

from __future__ import annotations

import functools
import json
import threading
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
from flaketriage.ci.quarantine_list import CACHE_NAME, QuarantineList, describe, fetch_url, load_quarantine
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
    """A stand-in for the service: answers with `doc`, or fails like a network would."""

    def __init__(self, doc: Any = DOC) -> None:
        self.doc = doc
        self.down = False
        self.calls = 0

    def __call__(self, url: str, timeout_s: float) -> bytes:
        self.calls += 1
        if self.down:
            raise OSError("connection refused")
        return json.dumps(self.doc).encode()


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


def test_service_list_is_cached_and_trusted_for_its_ttl(tmp_path: Path) -> None:
    service = Service()
    settings = _settings(tmp_path, quarantine_url=URL, quarantine_cache_ttl_s=60)
    clock = iter([1000.0, 1059.0, 1060.0, 1060.0])
    now = lambda: next(clock)  # noqa: E731
    for _ in range(2):
        qlist, notes = load_quarantine(settings, tmp_path, fetch=service, now=now)
        assert list(qlist.entries) == ["ab" * 32] and notes == []
    assert service.calls == 1  # the second read came from the cache
    cache = json.loads((tmp_path / CACHE_NAME).read_text())
    assert cache["url"] == URL and cache["fetched_at"] == 1000.0
    qlist, _ = load_quarantine(settings, tmp_path, fetch=service, now=now)
    assert service.calls == 2 and qlist.source == URL  # stale: asked again


def test_unreachable_service_falls_back_to_the_stale_cache_then_to_nothing(tmp_path: Path) -> None:
    service = Service()
    settings = _settings(tmp_path, quarantine_url=URL, quarantine_cache_ttl_s=0)
    load_quarantine(settings, tmp_path, fetch=service)
    service.down = True
    qlist, notes = load_quarantine(settings, tmp_path, fetch=service)
    assert list(qlist.entries) == ["ab" * 32] and qlist.source.startswith("stale cache")
    assert "unreachable (connection refused); using the cached list from" in notes[0]
    (tmp_path / CACHE_NAME).unlink()
    qlist, notes = load_quarantine(settings, tmp_path, fetch=service)
    assert not qlist.entries
    assert "no cached list; running without a quarantine list" in notes[0]


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
    seen: list[dict[str, str]]
    status = 200

    def do_GET(self) -> None:
        self.seen.append(dict(self.headers))
        body = json.dumps(DOC).encode() if self.path == "/v1/quarantine" else b"{}"
        status = self.status if self.path == "/v1/quarantine" else 404
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
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


def test_fetch_url_turns_http_errors_and_refusals_into_oserror(
    service: tuple[str, list[dict[str, str]]],
) -> None:
    base, _ = service
    with pytest.raises(OSError, match="HTTP 404"):
        fetch_url(f"{base}/elsewhere", 5.0)
    dead = ThreadingHTTPServer(("127.0.0.1", 0), BaseHTTPRequestHandler)
    port = dead.server_address[1]
    dead.server_close()
    with pytest.raises(OSError, match="ConnectError"):
        fetch_url(f"http://127.0.0.1:{port}/v1/quarantine", 5.0)
    with pytest.raises(OSError, match="UnsupportedProtocol"):
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
