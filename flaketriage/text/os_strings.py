"""Strings from the operating system (arguments, environment values, paths) that may hold bytes
which are not UTF-8: their lossless form in JSON, and how to write them as one shell word.

Python hands such bytes over as lone surrogates (``b"\\xff"`` → ``"\\udcff"``, PEP 383), and gives
them back byte for byte when the string goes to the OS again (``subprocess``, ``os.environ``). JSON
cannot hold lone surrogates in UTF-8, so `OsStr` writes a string that has any as a marked escape:
a NUL (which no argument, environment value or path can contain, so no real string is ever
mistaken for one) followed by the text with each undecodable byte as ``\\xNN``, any other lone
surrogate as ``\\uNNNN``, and a backslash as ``\\\\``. ``["bad\\udcff"]`` is stored as
``["\\u0000bad\\\\xff"]``; every other string is stored as it is, so manifests without such bytes
encode exactly as before.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterable
from typing import Annotated

from pydantic import BeforeValidator, PlainSerializer

MARK = "\x00"
_SURROGATE = re.compile("[\ud800-\udfff]")
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")
"""Characters that would break a line or drive a terminal inside a quoted word (``$'...'`` instead)."""
_ESCAPE = re.compile(r"\\(\\|x[0-9a-f]{2}|u[0-9a-f]{4})")
_PLAIN_BYTES = frozenset(range(0x20, 0x7F)) - {ord("'"), ord("\\")}


def has_undecodable(text: str) -> bool:
    """Whether `text` holds lone surrogates (bytes that were not UTF-8)."""
    return _SURROGATE.search(text) is not None


def to_json_text(text: str) -> str:
    """`text` as JSON can hold it: unchanged, unless it has lone surrogates (then marked, escaped)."""
    if not has_undecodable(text):
        return text
    out = []
    for char in text:
        code = ord(char)
        if char == "\\":
            out.append("\\\\")
        elif 0xDC80 <= code <= 0xDCFF:
            out.append(f"\\x{code - 0xDC00:02x}")
        elif 0xD800 <= code <= 0xDFFF:
            out.append(f"\\u{code:04x}")
        else:
            out.append(char)
    return MARK + "".join(out)


def from_json_text(value: object) -> object:
    """The string `to_json_text` was given; anything that is not a marked string passes unchanged."""
    if not isinstance(value, str) or not value.startswith(MARK):
        return value

    def unescape(match: re.Match[str]) -> str:
        token = match.group(1)
        if token == "\\":
            return "\\"
        if token[0] == "x":
            return chr(0xDC00 + int(token[1:], 16))
        return chr(int(token[1:], 16))

    return _ESCAPE.sub(unescape, value[len(MARK) :])


OsStr = Annotated[str, BeforeValidator(from_json_text), PlainSerializer(to_json_text, when_used="json")]
"""A `str` field that keeps undecodable bytes: lone surrogates in Python, marked escapes in JSON."""


def shell_word(text: str) -> str:
    """`text` as one POSIX shell word: `shlex.quote`, or, when it holds bytes that are not UTF-8 or
    control characters (a newline, an escape), bash's ``$'...'`` with ``\\xNN`` escapes: plain ASCII
    on one line that the shell turns back into the exact original bytes."""
    if not has_undecodable(text) and not _CONTROL.search(text):
        return shlex.quote(text)
    raw = text.encode("utf-8", "surrogateescape")
    return "$'" + "".join(_ansi_c(byte) for byte in raw) + "'"


def _ansi_c(byte: int) -> str:
    """One byte inside bash's ``$'...'``."""
    if byte in _PLAIN_BYTES:
        return chr(byte)
    if chr(byte) in "'\\":
        return "\\" + chr(byte)
    return f"\\x{byte:02x}"


def shell_join(argv: Iterable[str]) -> str:
    """A command line for people and shells: `shlex.join`, with `shell_word` for each word."""
    return " ".join(shell_word(arg) for arg in argv)
