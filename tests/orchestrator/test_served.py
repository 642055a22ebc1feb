"""The receiver under fire, as served: a real ``flaketriage serve`` process (SQLite, the local broker)
and clients on raw sockets that send what a hostile or broken client sends: headers a byte at a
time, bodies that trickle in, condemned requests declaring big bodies, hang-ups mid-body, HEAD
probes. The server's log and its memory are read from outside, as an operator would."""

from __future__ import annotations

import contextlib
import os
import selectors
import socket
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tests.conftest import free_port, wait_for

SECRET = "served-secret"
GITHUB_SECRET = "served-github-secret"
TOKEN = "served-token"
HEADER_TIMEOUT_S = 2
BODY_TIMEOUT_S = 2
CUT_WITHIN_S = 20
"""A generous bound on how soon a timed-out connection is closed (its timeout is 2 s): a loaded
machine is late, not 18 s late; a server without the timeout never closes it."""
MIB = 1024 * 1024
ZEROS = "sha256=" + "0" * 64
"""A signature of the right form (that signs nothing)."""


@dataclass
class Served:
    proc: subprocess.Popen[bytes]
    port: int
    store: Path
    log: Path

    def connect(self) -> socket.socket:
        return socket.create_connection(("127.0.0.1", self.port), timeout=60)

    def log_text(self, since: int = 0) -> str:
        return self.log.read_bytes()[since:].decode(errors="replace")

    def log_size(self) -> int:
        return self.log.stat().st_size

    def memory_kib(self) -> dict[str, int]:
        """VmRSS (now) and VmHWM (the peak so far) of the server process, in KiB."""
        lines = Path(f"/proc/{self.proc.pid}/status").read_text().splitlines()
        return {
            name: int(line.split()[1])
            for line in lines
            for name in ("VmRSS", "VmHWM")
            if line.startswith(name + ":")
        }


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """``flaketriage serve`` under the usual umask (0o022), with GitHub's secret set and Sentry's not."""
    root = tmp_path_factory.mktemp("served")
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLAKETRIAGE_")}
    env.update(
        FLAKETRIAGE_STORE=str(root / "store"),
        FLAKETRIAGE_WEBHOOK_SECRET=SECRET,
        FLAKETRIAGE_GITHUB_WEBHOOK_SECRET=GITHUB_SECRET,
        FLAKETRIAGE_API_TOKEN=TOKEN,
        FLAKETRIAGE_HEADER_TIMEOUT_S=str(HEADER_TIMEOUT_S),
        FLAKETRIAGE_BODY_TIMEOUT_S=str(BODY_TIMEOUT_S),
        PYTHONUNBUFFERED="1",
    )
    log = root / "serve.log"
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "flaketriage", "serve", "--port", str(port)],
            cwd=root,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=lambda: os.umask(0o022),
        )
    served = Served(proc, port, root / "store", log)
    try:
        wait_for(
            lambda: httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=5).status_code == 200,
            120,
            "flaketriage serve",
        )
        yield served
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _head(path: str, headers: dict[str, str], length: int | None) -> bytes:
    lines = [f"POST {path} HTTP/1.1", "Host: 127.0.0.1", "Content-Type: application/json"]
    lines += [f"{name}: {value}" for name, value in headers.items()]
    if length is not None:
        lines.append(f"Content-Length: {length}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def _answer_kept(sock: socket.socket) -> tuple[int, bytes, bool]:
    """`_answer`, the connection left open (whether the server closed it is not asked)."""
    return _answer(sock, wait_for_close=False)


def _answer(sock: socket.socket, *, wait_for_close: bool = True) -> tuple[int, bytes, bool]:
    """The status and body of the answer on `sock`, and whether the server closed the connection
    after it (an EOF within the socket's timeout); a reset counts as closed."""
    data = b""
    closed = False
    try:
        while b"\r\n\r\n" not in data:
            chunk = sock.recv(65536)
            if not chunk:
                raise AssertionError(f"the connection closed before an answer; got {data!r}")
            data += chunk
        head, _, body = data.partition(b"\r\n\r\n")
        length = next(
            int(line.split(b":", 1)[1])
            for line in head.split(b"\r\n")
            if line.lower().startswith(b"content-length:")
        )
        while len(body) < length:
            chunk = sock.recv(65536)
            if not chunk:
                break
            body += chunk
        closed = wait_for_close and sock.recv(65536) == b""
    except ConnectionResetError:
        closed = True
    return int(head.split()[1]), body, closed


def _trickle(sock: socket.socket, data: bytes, every_s: float, stop: threading.Event) -> threading.Thread:
    """Send `data` a byte every `every_s` seconds from a thread, until it is sent, `stop` is set or
    the server hangs up."""

    def send() -> None:
        for byte in data:
            if stop.wait(every_s):
                return
            try:
                sock.send(bytes([byte]))
            except OSError:
                return

    thread = threading.Thread(target=send, daemon=True)
    thread.start()
    return thread


def _fresh() -> dict[str, str]:
    return {"X-Flaketriage-Timestamp": str(int(time.time())), "X-Flaketriage-Signature": ZEROS}


# -- a timestamp too long for int() ---------------------------------------------------------------
def test_a_timestamp_of_thousands_of_digits_is_a_401(served: Served) -> None:
    response = httpx.post(
        f"http://127.0.0.1:{served.port}/v1/events",
        content=b"{}",
        headers={"X-Flaketriage-Timestamp": "9" * 4301, "X-Flaketriage-Signature": ZEROS},
        timeout=30,
    )
    assert response.status_code == 401, response.text
    assert "Unix seconds" in response.json()["detail"]


# -- slow clients ---------------------------------------------------------------------------------
def test_headers_sent_a_byte_at_a_time_are_cut_off(served: Served) -> None:
    sock = served.connect()
    stop = threading.Event()
    started = time.monotonic()
    sock.sendall(b"POST /v1/events HTTP/1.1\r\nHost: 127.0.0.1\r\n")
    _trickle(sock, b"X-Slow: " + b"a" * 10_000, 0.2, stop)
    try:
        with contextlib.suppress(ConnectionResetError):
            while sock.recv(65536):  # a 408, then the end; or the end at once
                pass
        elapsed = time.monotonic() - started
    finally:
        stop.set()
        sock.close()
    assert HEADER_TIMEOUT_S - 0.5 < elapsed < CUT_WITHIN_S


def test_the_next_requests_headers_on_a_kept_connection_are_timed_too(served: Served) -> None:
    """After an answer, a kept-alive connection waits for the next request's headers under the same
    bound: uvicorn's keep-alive timeout stops counting at the first byte that comes."""
    sock = served.connect()
    stop = threading.Event()
    sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
    status, _, _ = _answer_kept(sock)
    assert status == 200
    started = time.monotonic()
    _trickle(sock, b"GET /healthz HTTP/1.1\r\nX-Slow: " + b"a" * 10_000, 0.2, stop)
    try:
        with contextlib.suppress(ConnectionResetError):
            while sock.recv(65536):
                pass
        elapsed = time.monotonic() - started
    finally:
        stop.set()
        sock.close()
    assert elapsed < CUT_WITHIN_S


def test_a_slow_first_request_byte_is_cut_off_too(served: Served) -> None:
    """A connection that sends nothing at all holds a place as long as one that trickles."""
    with served.connect() as sock:
        started = time.monotonic()
        with contextlib.suppress(ConnectionResetError):
            while sock.recv(65536):
                pass
        assert time.monotonic() - started < CUT_WITHIN_S


@pytest.mark.parametrize(
    ("path", "headers"),
    [
        ("/v1/events", {}),
        ("/webhooks/github", {"X-GitHub-Event": "ping", "X-Hub-Signature-256": ZEROS}),
    ],
    ids=["events", "github"],
)  # fmt: skip
def test_a_body_that_trickles_in_is_a_408_and_the_connection_closed(
    served: Served, path: str, headers: dict[str, str]
) -> None:
    sock = served.connect()
    stop = threading.Event()
    started = time.monotonic()
    sock.sendall(_head(path, _fresh() | headers, 4096))
    _trickle(sock, b"{" * 4096, 0.2, stop)
    try:
        status, body, closed = _answer(sock)
        elapsed = time.monotonic() - started
    finally:
        stop.set()
        sock.close()
    assert status == 408, body
    assert b"FLAKETRIAGE_BODY_TIMEOUT_S" in body
    assert closed
    assert BODY_TIMEOUT_S - 0.5 < elapsed < CUT_WITHIN_S


# -- refused before the body is read --------------------------------------------------------------
CONDEMNED = {
    "events without a timestamp": ("/v1/events", {"X-Flaketriage-Signature": ZEROS}),
    "events without a signature": ("/v1/events", {"X-Flaketriage-Timestamp": str(int(time.time()))}),
    "events signed an hour ago": (
        "/v1/events",
        {"X-Flaketriage-Timestamp": str(int(time.time()) - 3600), "X-Flaketriage-Signature": ZEROS},
    ),
    "events with a malformed timestamp": (
        "/v1/events",
        {"X-Flaketriage-Timestamp": "9" * 5000, "X-Flaketriage-Signature": ZEROS},
    ),
    "github without a signature": ("/webhooks/github", {"X-GitHub-Event": "ping", "X-GitHub-Delivery": "d"}),
    "sentry, whose secret is unset": (
        "/webhooks/sentry",
        {"Sentry-Hook-Resource": "event_alert", "Sentry-Hook-Signature": "0" * 64},
    ),
}  # fmt: skip


@pytest.mark.parametrize(("path", "headers"), CONDEMNED.values(), ids=CONDEMNED.keys())
def test_what_the_headers_condemn_is_refused_before_the_body_is_read(
    served: Served, path: str, headers: dict[str, str]
) -> None:
    # The body (1 MiB, as declared) is never sent: an answer proves it was not waited for.
    with served.connect() as sock:
        sock.settimeout(CUT_WITHIN_S)
        sock.sendall(_head(path, headers, MIB))
        status, body, closed = _answer(sock)
    assert status == 401, body
    assert closed  # the body it declared is not read afterwards either


def test_condemned_requests_declaring_big_bodies_do_not_grow_the_server(served: Served) -> None:
    """200 connections at once, each declaring and sending 1 MiB with no timestamp: refused from
    their headers, they cost the server what it buffers before it answers (64 KiB each at most), not
    the 195 MiB a server that read each body whole grew by."""
    before = served.memory_kib()
    head = _head("/v1/events", {"X-Flaketriage-Signature": ZEROS}, MIB)
    chunk = b"x" * 65536
    selector = selectors.DefaultSelector()
    left: dict[socket.socket, int] = {}
    for _ in range(200):
        sock = socket.create_connection(("127.0.0.1", served.port), timeout=60)
        sock.sendall(head)
        sock.setblocking(False)
        left[sock] = MIB
        selector.register(sock, selectors.EVENT_READ | selectors.EVENT_WRITE)
    deadline = time.monotonic() + 120
    try:
        while left and time.monotonic() < deadline:
            for key, events in selector.select(timeout=1):
                sock = key.fileobj
                assert isinstance(sock, socket.socket)
                try:
                    if events & selectors.EVENT_READ and not sock.recv(65536):
                        raise ConnectionResetError  # answered and closed
                    if events & selectors.EVENT_WRITE and left[sock]:
                        left[sock] -= sock.send(chunk[: left[sock]])
                        if not left[sock]:
                            selector.modify(sock, selectors.EVENT_READ)
                except (BlockingIOError, InterruptedError):
                    continue
                except OSError:  # reset or broken pipe: the server closed it
                    selector.unregister(sock)
                    sock.close()
                    del left[sock]
    finally:
        for sock in left:
            sock.close()
        selector.close()
    assert not left, f"{len(left)} connections still open after 120 s"
    after = served.memory_kib()
    # What it may hold at once: 200 connections' read buffers (uvicorn stops reading one at 64 KiB)
    # and their copies, 25 MiB, with room for a loaded machine's timing (measured 11 to 21 MiB).
    # A server that read each body whole grew by 195 MiB. What it keeps is within its peak.
    grown_peak_mib = (after["VmHWM"] - before["VmRSS"]) / 1024
    assert grown_peak_mib < 64, (before, after)


# -- hang-ups -------------------------------------------------------------------------------------
def test_a_client_hanging_up_mid_body_is_one_short_line_in_the_log(served: Served) -> None:
    since = served.log_size()
    with served.connect() as sock:
        sock.sendall(_head("/v1/events", _fresh(), 100_000) + b"{" * 1000)
    wait_for(
        lambda: any(mark in served.log_text(since) for mark in ("hung up", "Exception in ASGI application")),
        CUT_WITHIN_S,
        "the hang-up in the log",
    )
    httpx.get(f"http://127.0.0.1:{served.port}/healthz", timeout=10)  # anything more is written by now
    lines = served.log_text(since).splitlines()
    assert "Traceback" not in served.log_text(since)
    assert len(lines) == 1 and len(lines[0]) < 200, lines
    assert lines[0].startswith(("INFO", "WARNING")), lines


# -- health probes --------------------------------------------------------------------------------
@pytest.mark.parametrize("path", ["/healthz", "/readyz"])
def test_a_head_probe_is_a_200_without_a_body(served: Served, path: str) -> None:
    response = httpx.head(f"http://127.0.0.1:{served.port}{path}", timeout=10)
    assert response.status_code == 200
    assert response.content == b""


# -- what it writes -------------------------------------------------------------------------------
def test_what_the_service_writes_beside_its_store_is_its_owners(served: Served) -> None:
    modes = {
        str(path.relative_to(served.store)): stat.S_IMODE(path.stat().st_mode)
        for path in [served.store, *served.store.rglob("*")]
    }
    assert {"service.db", "service.db-wal"} <= set(modes)
    assert {name: mode for name, mode in modes.items() if mode not in (0o600, 0o700)} == {}
