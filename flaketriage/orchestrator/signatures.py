"""Webhook signatures of the two outside senders: GitHub's ``X-Hub-Signature-256`` and Sentry's
``Sentry-Hook-Signature``. Our own events use `flaketriage.signing` (timestamped, like Stripe's).

Both are HMAC-SHA256 of the exact body bytes, keyed with a shared secret, compared in constant time.
An unset secret refuses everything: nothing is ever accepted unsigned. What needs no body (the
secret unset, the header missing) is checked on its own first, so the receiver refuses it unread.
"""

from __future__ import annotations

import hashlib
import hmac

from pydantic import SecretStr

from flaketriage.errors import SignatureError

GITHUB_HEADER = "X-Hub-Signature-256"
SENTRY_HEADER = "Sentry-Hook-Signature"


def _secret(secret: SecretStr | None, variable: str) -> bytes:
    if secret is None or not secret.get_secret_value():
        raise SignatureError(f"this source is not configured: set {variable} to accept its deliveries")
    return secret.get_secret_value().encode("utf-8")


def check_github_headers(secret: SecretStr | None, header: str | None) -> bytes:
    """GitHub's key, or `SignatureError` when the secret is unset or the signature header missing."""
    key = _secret(secret, "FLAKETRIAGE_GITHUB_WEBHOOK_SECRET")
    if not header:
        raise SignatureError(f"the delivery has no {GITHUB_HEADER} header")
    return key


def check_sentry_headers(secret: SecretStr | None, header: str | None) -> bytes:
    """Sentry's key, or `SignatureError` when the secret is unset or the signature header missing."""
    key = _secret(secret, "FLAKETRIAGE_SENTRY_CLIENT_SECRET")
    if not header:
        raise SignatureError(f"the delivery has no {SENTRY_HEADER} header")
    return key


def verify_github(secret: SecretStr | None, body: bytes, header: str | None) -> None:
    """GitHub: ``sha256=<hex HMAC-SHA256(secret, body)>``."""
    key = check_github_headers(secret, header)
    header = header or ""  # not empty: checked
    if not header.startswith("sha256="):
        raise SignatureError(f"the {GITHUB_HEADER} header must start with 'sha256='")
    expected = "sha256=" + hmac.new(key, body, hashlib.sha256).hexdigest()
    if not hmac.compare_digest(expected.encode("ascii"), header.encode("utf-8", "replace")):
        raise SignatureError(
            f"the {GITHUB_HEADER} signature does not match the body (check the webhook's secret)"
        )


def verify_sentry(secret: SecretStr | None, body: bytes, header: str | None) -> None:
    """Sentry: ``<hex HMAC-SHA256(client secret, body)>``."""
    key = check_sentry_headers(secret, header)
    header = header or ""  # not empty: checked
    expected = hmac.new(key, body, hashlib.sha256).hexdigest()
    if not hmac.compare_digest(expected.encode("ascii"), header.strip().encode("utf-8", "replace")):
        raise SignatureError(
            f"the {SENTRY_HEADER} signature does not match the body (check the integration's client secret)"
        )
