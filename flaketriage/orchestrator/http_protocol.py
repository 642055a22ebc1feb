"""The HTTP protocol the receiver is served with: uvicorn's h11 protocol with a deadline for a
request's headers.

uvicorn (0.55) times out an idle keep-alive connection, but not one whose headers never end: a
client that opens a connection, or finishes a request, and then sends header bytes one at a time
(slowloris) holds its connection, and a place in the server, for as long as it likes. Here a
connection waiting for a request's headers is given `header_timeout_s` seconds from when it began
to wait (the connection opened, or the previous answer was sent); headers not complete by then are
answered 408 and the connection closed. Bodies have their own bound (`request_body`).
"""

from __future__ import annotations

import asyncio
import logging

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

log = logging.getLogger("flaketriage.server")

_TIMED_OUT_TEXT = b"the request's headers did not arrive in time (FLAKETRIAGE_HEADER_TIMEOUT_S)\n"
_TIMED_OUT = (
    b"HTTP/1.1 408 Request Timeout\r\ncontent-type: text/plain; charset=utf-8\r\nconnection: close\r\n"
    b"content-length: %d\r\n\r\n%s" % (len(_TIMED_OUT_TEXT), _TIMED_OUT_TEXT)
)


class HeaderDeadlineProtocol(H11Protocol):
    """h11 with a deadline on each request's headers (`header_timeout_s`, set by `with_header_timeout`)."""

    header_timeout_s: float = 10.0
    _header_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._watch_headers()

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop_watching()
        super().connection_lost(exc)

    def handle_events(self) -> None:
        super().handle_events()
        self._watch_headers()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._watch_headers()

    def _watch_headers(self) -> None:
        """Time the wait for headers while h11 waits for them (their state IDLE), else stop."""
        if self.conn.their_state is not h11.IDLE or self.transport.is_closing():
            self._stop_watching()
        elif self._header_timer is None:
            self._header_timer = self.loop.call_later(self.header_timeout_s, self._headers_timed_out)

    def _stop_watching(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _headers_timed_out(self) -> None:
        self._header_timer = None
        if self.transport.is_closing() or self.conn.their_state is not h11.IDLE:
            return
        if self.conn.our_state is h11.IDLE:  # mid-response (pipelining) nothing more may be written
            self.transport.write(_TIMED_OUT)
        peer = f"{self.client[0]}:{self.client[1]}" if self.client else "a client"
        log.info(
            "%s: no complete request headers within %g s: connection closed", peer, self.header_timeout_s
        )
        self.transport.close()


def with_header_timeout(header_timeout_s: float) -> type[HeaderDeadlineProtocol]:
    """The protocol class uvicorn is given (``http=``), with `header_timeout_s`."""
    return type("HeaderDeadlineProtocol", (HeaderDeadlineProtocol,), {"header_timeout_s": header_timeout_s})
