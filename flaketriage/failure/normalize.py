"""Message normalization: mask what varies between runs of one failure (paths, addresses, ids, numbers).

A replay runs in another directory, at other addresses, with other temp names and timings; these
masks keep what identifies a failure and drop the rest, idempotently.
"""

from __future__ import annotations

import re
import unicodedata
from typing import Literal

MAX_MESSAGE_CHARS = 500
"""Normalized messages are cut here: the start of a message identifies it, the rest is noise."""

# Normalizing is superlinear in the worst case; nothing past this can survive the cut anyway
# unless it is masked away, and a 20k-character message is not worth more precision.
_MAX_INPUT_CHARS = 20_000

FailureKind = Literal["exception", "exit", "signal", "pattern", "metric", "timeout", "test"]

# --- text cleaning and masking ------------------------------------------------------------------

_ANSI = re.compile(
    r"\x1b\[[0-?]*[ -/]*[@-~]"  # CSI: colours, cursor movement
    r"|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?"  # OSC: titles, hyperlinks
    r"|\x1b[ -/]+[0-~]"  # nF: character set selection
    r"|\x1b[@-Z\\-_]"  # other two-byte escapes
    r"|\x9b[0-?]*[ -/]*[@-~]"  # 8-bit CSI
)
_WHITESPACE = re.compile(r"\s+")
_C0_C1 = re.compile(r"[\x00-\x1f\x7f-\x9f]")
_CONTROL_CATEGORIES = frozenset({"Cc", "Cf", "Cs"})

# Characters of a path component. A path may only start where no such character precedes it, which
# keeps the masks from starting mid-token (both for correctness and to keep matching linear).
_PC = r"[\w.\-+@~%$]"
_NOT_AFTER_PATH_CHAR = r"(?<![\w.\-+@~%$/\\])"
_MASKS: tuple[tuple[re.Pattern[str], str], ...] = (
    # Windows drive paths first, or the POSIX rule would eat the part after "C:".
    (re.compile(rf"{_NOT_AFTER_PATH_CHAR}[A-Za-z]:[\\/](?:{_PC}+(?:[\\/]{_PC}+)*[\\/]?)?"), "<path>"),
    (re.compile(rf"{_NOT_AFTER_PATH_CHAR}/(?:{_PC}+/)*{_PC}+/?"), "<path>"),
    (re.compile(rf"{_NOT_AFTER_PATH_CHAR}(?:\.\.?|~)[\\/](?:{_PC}+[\\/])*{_PC}*"), "<path>"),
    # A relative path without "./" is only recognized by its file extension: "a/b" may be a ratio.
    (
        re.compile(rf"{_NOT_AFTER_PATH_CHAR}(?:{_PC}+/)+{_PC}*\.[A-Za-z][A-Za-z0-9]{{0,7}}(?![\w.\-/])"),
        "<path>",
    ),
    (
        re.compile(
            r"(?<![0-9A-Za-z])[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"
            r"(?![0-9A-Za-z])"
        ),
        "<id>",
    ),
    (re.compile(r"(?<![0-9A-Za-z])0[xX][0-9a-fA-F]+(?![0-9A-Za-z])"), "<hex>"),
    # Hashes and ids: at least one digit and one letter, so long plain numbers stay numbers and
    # long words made of a-f stay words.
    (
        re.compile(
            r"(?<![0-9A-Za-z])(?=[0-9a-fA-F]*[0-9])(?=[0-9a-fA-F]*[a-fA-F])[0-9a-fA-F]{12,}(?![0-9A-Za-z])"
        ),
        "<id>",
    ),
    # tempfile.mkstemp/mkdtemp names: "tmp" and 8 random characters.
    (re.compile(r"(?<![0-9A-Za-z_])tmp[a-z0-9_]{8}(?![0-9A-Za-z_])"), "<tmp>"),
    # Numbers that stand alone (not the 32 of float32); "nan" and "inf" are words and stay, since a
    # NaN loss and a large loss are different failures. A version "1.2.3" is one number.
    (re.compile(r"(?<![\w.])[-+]?(?:\d+(?:\.\d+)*|\.\d+)(?:[eE][-+]?\d+)?(?!\.?\d)"), "<n>"),
)


def strip_ansi(text: str) -> str:
    """``text`` without ANSI escape sequences (colours, cursor movement, hyperlinks)."""
    return _ANSI.sub("", text)


def clean_line(text: str) -> str:
    """One line of plain printable text: no escapes, no control characters, single spaces."""
    text = _WHITESPACE.sub(" ", strip_ansi(text))
    text = _C0_C1.sub("", text)
    if not text.isascii():
        text = "".join(ch for ch in text if unicodedata.category(ch) not in _CONTROL_CATEGORIES)
    return _WHITESPACE.sub(" ", text).strip()


def _normalize_once(text: str) -> str:
    text = clean_line(text)
    for pattern, placeholder in _MASKS:
        text = pattern.sub(placeholder, text)
    return text[:MAX_MESSAGE_CHARS].rstrip()


LONG_REPR_CHARS = 40
"""A bracketed span (a container's repr) longer than this is one failure whatever it holds."""

_OPENERS = {"(": ")", "[": "]", "{": "}"}
_QUOTES = "'\""


def collapse_long_reprs(text: str) -> str:
    """``text`` with every outermost ``(...)``, ``[...]`` or ``{...}`` span longer than
    `LONG_REPR_CHARS` cut to its brackets around ``...``.

    pytest's assertion messages print the state they compare (``assert 'x' not in {...sys.modules}``);
    what that state holds depends on the tests that ran before, so a polluter search that drops one
    would see a "different" failure. Short spans stay: ``[1, 2] == [1, 3]`` differs from ``[1, 4]``.
    Quoted strings are skipped whole, so a bracket inside one does not count; a span the message's
    cut leaves open runs to the end and reads the same as a closed one. Linear, idempotent.
    """
    out: list[str] = []
    i, n = 0, len(text)
    while i < n:
        ch = text[i]
        if ch in _QUOTES:
            end = _quote_end(text, i)
            out.append(text[i:end])
            i = end
            continue
        if ch not in _OPENERS:
            out.append(ch)
            i += 1
            continue
        end = _span_end(text, i)
        if end - i > LONG_REPR_CHARS:
            # Closed or cut open by the message's end, a long span is the same placeholder.
            out.append(ch + "..." + _OPENERS[ch])
        else:
            out.append(text[i:end])
        i = end
    return "".join(out)


def _quote_end(text: str, start: int) -> int:
    """The index after the quote that closes the one at ``start``, or the text's end."""
    close = text.find(text[start], start + 1)
    while close != -1 and text[close - 1] == "\\":
        close = text.find(text[start], close + 1)
    return len(text) if close == -1 else close + 1


def _span_end(text: str, start: int) -> int:
    """The index after the bracket that closes the one at ``start``, or the text's end."""
    depth, i, n = 0, start, len(text)
    while i < n:
        ch = text[i]
        if ch in _QUOTES:
            i = _quote_end(text, i)
            continue
        if ch in _OPENERS:
            depth += 1
        elif ch in ")]}":
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    return n


def normalize_message(text: str) -> str:
    """Mask what varies between runs of the same failure: paths, addresses, ids, temp names, numbers.

    Escape sequences and control characters are removed, whitespace collapsed to single spaces,
    and the result cut at `MAX_MESSAGE_CHARS`. ``nan`` and ``inf`` are kept. Idempotent.
    """
    current = text[:_MAX_INPUT_CHARS]
    # A mask can expose a new match to an earlier one ("5/tmp/x" only reads as a path once the
    # "5" is masked), so repeat to a fixed point. Every change removes a digit, a slash or a dash,
    # or shortens the text without adding any, so this ends.
    for _ in range(100):
        following = _normalize_once(current)
        if following == current:
            break
        current = following
    return current
