"""Request signatures: the HMAC-SHA256 that proves an event came from a holder of the shared secret.

The scheme follows Stripe's and GitHub's webhook signatures. The sender puts two headers on the
request::

    X-Flaketriage-Timestamp: 1718031234
    X-Flaketriage-Signature: sha256=5257a869e7ecebeda32affa62cdca3fa51cad7e77a0e56ff536d0ce8e108d8bd

where the timestamp is Unix seconds and the signature is the lowercase hex HMAC-SHA256, keyed with
the shared secret, of ``f"{timestamp}.".encode() + body`` (the exact request body bytes). The
receiver recomputes it over the bytes it received, compares in constant time, and refuses a
timestamp more than ``tolerance_s`` (5 minutes) from its own clock, so a captured request cannot be
replayed later; within the window, the event's ``event_id`` lets the receiver drop a replay as a
duplicate delivery.
"""

from __future__ import annotations

import hashlib
import hmac
import time

from flaketriage.errors import SignatureError

TIMESTAMP_HEADER = "X-Flaketriage-Timestamp"
SIGNATURE_HEADER = "X-Flaketriage-Signature"
PREFIX = "sha256="
DEFAULT_TOLERANCE_S = 300


def sign(secret: bytes, timestamp: int, body: bytes) -> str:
    """The signature header value: ``sha256=`` and the hex HMAC-SHA256 of ``"<timestamp>." + body``."""
    digest = hmac.new(secret, f"{int(timestamp)}.".encode("ascii") + body, hashlib.sha256).hexdigest()
    return PREFIX + digest


def signed_headers(secret: bytes, body: bytes, *, now: float | None = None) -> dict[str, str]:
    """The two headers that sign `body` at `now` (default: the current time)."""
    timestamp = int(time.time() if now is None else now)
    return {TIMESTAMP_HEADER: str(timestamp), SIGNATURE_HEADER: sign(secret, timestamp, body)}


def verify(
    secret: bytes,
    timestamp: int | str | None,
    body: bytes,
    signature: str | None,
    *,
    now: float,
    tolerance_s: float = DEFAULT_TOLERANCE_S,
) -> None:
    """Raise `SignatureError` unless `signature` signs `body` at `timestamp`, within `tolerance_s` of `now`.

    `timestamp` and `signature` are the header values as received (None when a header is absent).
    The signature is checked before the time, so an error about the time means the request was
    authentic and the clocks (or a replay) are the problem.
    """
    if timestamp is None or signature is None:
        missing = TIMESTAMP_HEADER if timestamp is None else SIGNATURE_HEADER
        raise SignatureError(f"the request has no {missing} header; send it with flaketriage's signer")
    ts = _parse_timestamp(timestamp)
    if not signature.startswith(PREFIX):
        raise SignatureError(
            f"the {SIGNATURE_HEADER} header must start with {PREFIX!r} followed by 64 hex digits; "
            f"got {signature[:20]!r}"
        )
    expected = sign(secret, ts, body).encode("ascii")
    if not hmac.compare_digest(expected, signature.encode("utf-8", "replace")):
        raise SignatureError(
            "the signature does not match the body: the body was changed in transit, or sender and "
            "receiver use different secrets (check FLAKETRIAGE_WEBHOOK_SECRET on both)"
        )
    skew = now - ts
    if skew > tolerance_s:
        raise SignatureError(
            f"the request was signed {skew:.0f} s ago, more than the {tolerance_s:.0f} s allowed: a "
            "replayed request, or the sender's clock is behind"
        )
    if -skew > tolerance_s:
        raise SignatureError(
            f"the request is signed {-skew:.0f} s in the future, more than the {tolerance_s:.0f} s "
            "allowed: the sender's clock is ahead (sync it with NTP)"
        )


def _parse_timestamp(value: int | str) -> int:
    if isinstance(value, int):
        return value
    text = value.strip()
    if not text.isascii() or not text.isdigit():
        raise SignatureError(f"the {TIMESTAMP_HEADER} header must be Unix seconds; got {value[:20]!r}")
    return int(text)
