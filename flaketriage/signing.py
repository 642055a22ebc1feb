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


MAX_TIMESTAMP_DIGITS = 12
"""Unix seconds have 10 digits until the year 2286; a longer header is not a time (and past 4,300
digits `int()` refuses it with a ValueError), so it is refused before it is read as a number."""


def check_headers(
    timestamp: str | None,
    signature: str | None,
    *,
    now: float,
    tolerance_s: float = DEFAULT_TOLERANCE_S,
) -> int:
    """The signed time, or `SignatureError` when the headers alone condemn the request: one missing,
    a timestamp that is not Unix seconds or is more than `tolerance_s` from `now`, a signature that
    is not ``sha256=`` and 64 hex digits. It needs no body, so the receiver refuses such a request
    before reading one."""
    if timestamp is None or signature is None:
        missing = TIMESTAMP_HEADER if timestamp is None else SIGNATURE_HEADER
        raise SignatureError(f"the request has no {missing} header; send it with flaketriage's signer")
    ts = _parse_timestamp(timestamp)
    if not signature.startswith(PREFIX) or len(signature) != len(PREFIX) + 64:
        raise SignatureError(
            f"the {SIGNATURE_HEADER} header must start with {PREFIX!r} followed by 64 hex digits; "
            f"got {signature[:20]!r}"
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
    return ts


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
    The headers are checked first (`check_headers`: what they condemn needs no body), then the
    signature over the body.
    """
    ts = check_headers(
        None if timestamp is None else str(timestamp), signature, now=now, tolerance_s=tolerance_s
    )
    expected = sign(secret, ts, body).encode("ascii")
    if not hmac.compare_digest(expected, str(signature).encode("utf-8", "replace")):
        raise SignatureError(
            "the signature does not match the body: the body was changed in transit, or sender and "
            "receiver use different secrets (check FLAKETRIAGE_WEBHOOK_SECRET on both)"
        )


def _parse_timestamp(value: str) -> int:
    text = value.strip()
    if len(text) > MAX_TIMESTAMP_DIGITS:
        raise SignatureError(
            f"the {TIMESTAMP_HEADER} header must be Unix seconds (at most {MAX_TIMESTAMP_DIGITS} "
            f"digits); got {MAX_TIMESTAMP_DIGITS + 1} or more characters, starting {value[:20]!r}"
        )
    if not text.isascii() or not text.isdigit():
        raise SignatureError(f"the {TIMESTAMP_HEADER} header must be Unix seconds; got {value[:20]!r}")
    return int(text)
