"""Text that came from a program or a manifest, made safe to show: `printable` writes every control
character (an ANSI escape, a carriage return, a bidi override, a line break where one line is
expected) as a visible escape, so such text never drives a terminal or starts a line of its own.

The CLI prints captured messages through it, and exports write it into comments and Markdown.
"""

from __future__ import annotations

import re
import unicodedata

_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}
_UNSAFE_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Zl", "Zp"})
_SAFE = re.compile(r"[ -~]*")


def _escape(char: str) -> str:
    if char in _NAMED:
        return _NAMED[char]
    code = ord(char)
    if 0xDC80 <= code <= 0xDCFF:  # a byte that was not UTF-8 (PEP 383): show the byte
        return f"\\x{code - 0xDC00:02x}"
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def printable(text: str, *, keep_newlines: bool = False) -> str:
    """`text` with control and format characters escaped (``\\x1b``, ``\\n``, ``\\u202e``); with
    `keep_newlines` line breaks (``\\n``) and tabs stay, for multi-line text such as a traceback."""
    if _SAFE.fullmatch(text):
        return text  # plain ASCII: the common case, nothing to look at
    kept = {"\n", "\t"} if keep_newlines else set()
    return "".join(
        _escape(c) if c not in kept and unicodedata.category(c) in _UNSAFE_CATEGORIES else c for c in text
    )
