"""Signatures: a known answer, verification, tampering, wrong secrets, and replay windows."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flaketriage.errors import SignatureError
from flaketriage.signing import (
    SIGNATURE_HEADER,
    TIMESTAMP_HEADER,
    check_headers,
    sign,
    signed_headers,
    verify,
)

SECRET = b"whsec_test"
NOW = 1_700_000_000
BODY = b'{"a":1}'


def test_known_answer_matches_openssl() -> None:
    # printf '1700000000.{"a":1}' | openssl dgst -sha256 -hmac whsec_test
    expected = "sha256=38877139021993b830af32feea6e18a8da83eb2f6e49ee50bd9e4cf4ca4d3789"
    assert sign(SECRET, NOW, BODY) == expected


def test_signed_headers_verify() -> None:
    headers = signed_headers(SECRET, BODY, now=NOW + 0.9)
    assert headers[TIMESTAMP_HEADER] == str(NOW)
    verify(SECRET, headers[TIMESTAMP_HEADER], BODY, headers[SIGNATURE_HEADER], now=NOW + 3)


def test_wrong_secret_is_rejected() -> None:
    with pytest.raises(SignatureError, match="different secrets"):
        verify(b"other", NOW, BODY, sign(SECRET, NOW, BODY), now=NOW)


def test_tampered_body_is_rejected() -> None:
    with pytest.raises(SignatureError, match="does not match"):
        verify(SECRET, NOW, b'{"a":2}', sign(SECRET, NOW, BODY), now=NOW)


def test_a_signature_is_bound_to_its_timestamp() -> None:
    # Re-dating a captured request (to get past the window) breaks the signature.
    with pytest.raises(SignatureError, match="does not match"):
        verify(SECRET, NOW + 600, BODY, sign(SECRET, NOW, BODY), now=NOW + 600)


def test_stale_and_future_timestamps_are_rejected() -> None:
    sig = sign(SECRET, NOW, BODY)
    verify(SECRET, NOW, BODY, sig, now=NOW + 300)
    verify(SECRET, NOW, BODY, sig, now=NOW - 300)
    with pytest.raises(SignatureError, match="ago"):
        verify(SECRET, NOW, BODY, sig, now=NOW + 301)
    with pytest.raises(SignatureError, match="future"):
        verify(SECRET, NOW, BODY, sig, now=NOW - 301)
    with pytest.raises(SignatureError, match="ago"):
        verify(SECRET, NOW, BODY, sig, now=NOW + 31, tolerance_s=30)


@pytest.mark.parametrize(
    ("timestamp", "signature", "match"),
    [
        (None, "sha256=" + "0" * 64, "no X-Flaketriage-Timestamp"),
        (str(NOW), None, "no X-Flaketriage-Signature"),
        ("yesterday", "sha256=" + "0" * 64, "Unix seconds"),
        ("-5", "sha256=" + "0" * 64, "Unix seconds"),
        (str(NOW), "sha1=" + "0" * 40, "must start with 'sha256='"),
        (str(NOW), "sha256=" + "0" * 64, "does not match"),
        (str(NOW), "sha256=é", "64 hex digits"),
    ],
)
def test_malformed_headers_are_rejected(timestamp: str | None, signature: str | None, match: str) -> None:
    with pytest.raises(SignatureError, match=match):
        verify(SECRET, timestamp, BODY, signature, now=NOW)


def test_uppercase_hex_is_not_accepted() -> None:
    # One canonical form: the hex is lowercase, as the signer writes it.
    with pytest.raises(SignatureError):
        verify(SECRET, NOW, BODY, sign(SECRET, NOW, BODY).upper().replace("SHA256=", "sha256="), now=NOW)


@settings(max_examples=200, deadline=None)
@given(body=st.binary(min_size=1, max_size=256), data=st.data())
def test_any_single_byte_change_breaks_verification(body: bytes, data: st.DataObject) -> None:
    signature = sign(SECRET, NOW, body)
    verify(SECRET, NOW, body, signature, now=NOW)
    index = data.draw(st.integers(0, len(body) - 1), label="index")
    new = data.draw(st.integers(0, 255).filter(lambda b: b != body[index]), label="byte")
    tampered = body[:index] + bytes([new]) + body[index + 1 :]
    with pytest.raises(SignatureError):
        verify(SECRET, NOW, tampered, signature, now=NOW)


@settings(max_examples=100, deadline=None)
@given(secret=st.binary(min_size=1, max_size=64), other=st.binary(min_size=1, max_size=64))
def test_only_the_signing_secret_verifies(secret: bytes, other: bytes) -> None:
    signature = sign(secret, NOW, BODY)
    verify(secret, NOW, BODY, signature, now=NOW)
    if other != secret:
        with pytest.raises(SignatureError):
            verify(other, NOW, BODY, signature, now=NOW)


@pytest.mark.parametrize("digits", [13, 4301, 100_000])
def test_a_timestamp_too_long_to_be_a_time_is_refused_before_it_is_read(digits: int) -> None:
    # 4,301 digits and more is past Python's int-string limit: int() would raise ValueError (a 500).
    with pytest.raises(
        SignatureError, match=r"Unix seconds \(at most 12 digits\); got 13 or more characters"
    ):
        verify(SECRET, "9" * digits, BODY, sign(SECRET, NOW, BODY), now=NOW)


def test_the_headers_alone_are_checked_before_the_body() -> None:
    """What the headers condemn (missing, malformed, outside the window) is known without the body."""
    sig = sign(SECRET, NOW, BODY)
    assert check_headers(str(NOW), sig, now=NOW + 300) == NOW
    for timestamp, signature, match in [
        (None, sig, "no X-Flaketriage-Timestamp"),
        (str(NOW), None, "no X-Flaketriage-Signature"),
        ("9" * 5000, sig, "Unix seconds"),
        (str(NOW), "sha1=" + "0" * 40, "must start with 'sha256='"),
        (str(NOW), "sha256=" + "0" * 5000, "64 hex digits"),
        (str(NOW - 301), sig, "ago"),
        (str(NOW + 301), sig, "future"),
    ]:
        with pytest.raises(SignatureError, match=match):
            check_headers(timestamp, signature, now=NOW)
