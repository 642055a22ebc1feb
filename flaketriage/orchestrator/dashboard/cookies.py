"""`Signer`: the dashboard's signed cookie values (the session, the browser's id, a result message,
the GitHub login's state) and the form tokens derived from them.

A value is ``base64url(JSON) "." base64url(HMAC-SHA256(key, purpose NUL JSON))``. The purpose keeps
a value signed for one cookie from passing for another's, every value carries its expiry (``exp``,
Unix seconds) and is read back only before it, and anything that does not verify reads as nothing:
a tampered or expired session is an anonymous reader, never an error.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import time
from typing import Any

MAX_VALUE = 3000
"""The longest cookie value read (browsers keep 4 KiB per cookie): a longer one is not ours."""


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


class Signer:
    """Signs and reads values with one key; `mac` gives a value's keyed digest (form tokens)."""

    def __init__(self, key: bytes) -> None:
        self._key = key

    def mac(self, purpose: str, text: str) -> str:
        """The keyed digest of `text` for `purpose`, URL-safe."""
        message = purpose.encode() + b"\0" + text.encode("utf-8", "surrogatepass")
        return _b64(hmac.new(self._key, message, hashlib.sha256).digest())

    def sign(self, purpose: str, data: dict[str, Any], *, max_age_s: float, now: float | None = None) -> str:
        """`data` with its expiry, signed for `purpose`."""
        body = dict(data, exp=int((time.time() if now is None else now) + max_age_s))
        text = json.dumps(body, separators=(",", ":"), sort_keys=True, ensure_ascii=True)
        return f"{_b64(text.encode('ascii'))}.{self.mac(purpose, text)}"

    def unsign(self, purpose: str, value: str | None, *, now: float | None = None) -> dict[str, Any] | None:
        """What `value` holds, when it was signed for `purpose` with this key and has not expired;
        None for anything else (absent, malformed, tampered with, expired, another purpose's)."""
        if not value or len(value) > MAX_VALUE or value.count(".") != 1:
            return None
        encoded, mac = value.split(".")
        try:
            text = _unb64(encoded).decode("ascii")
        except (binascii.Error, ValueError):
            return None
        if not hmac.compare_digest(mac.encode("ascii", "replace"), self.mac(purpose, text).encode("ascii")):
            return None
        try:
            data = json.loads(text)
        except ValueError:
            return None
        if not isinstance(data, dict) or not isinstance(data.get("exp"), int):
            return None
        if data["exp"] <= (time.time() if now is None else now):
            return None
        return data
