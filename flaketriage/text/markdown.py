"""Captured text made safe in Markdown: code spans and fenced blocks that no backtick inside the
text can close, prose in which it makes no HTML, link, image, code span or mention.

Captured text (messages, paths, output, commands) is hostile until shown otherwise. Issues and
replies (`flaketriage.workers.report.render`) show it with `code_span`, `fenced` and `inert`; an
exported reproduction's README (`flaketriage.workers.export`) with `escaped` prose and the same
spans and blocks of its `printable` form.
"""

from __future__ import annotations

import re

_TICKS = re.compile(r"`+")
_MENTION_RE = re.compile(r"@(?=[A-Za-z0-9_])")
_PLAIN_ESCAPES = {"\\": "\\\\", "&": "&amp;", "<": "&lt;", ">": "&gt;", "[": "\\[", "]": "\\]", "`": "\\`"}
_PLAIN_RE = re.compile("|".join(re.escape(c) for c in _PLAIN_ESCAPES))
_SPECIAL = re.compile(r"([\\`*_\[\]<>|~&])")


def _longest_ticks(text: str) -> int:
    return max((len(run) for run in _TICKS.findall(text)), default=0)


def code_span(text: str) -> str:
    """`text` (one line) as one code span, whatever backticks it holds."""
    ticks = "`" * (_longest_ticks(text) + 1)
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{ticks}{pad}{text}{pad}{ticks}"


def fenced(text: str, lang: str = "") -> str:
    """A fenced code block of `text` whose fence no line of it can close."""
    fence = "`" * max(3, _longest_ticks(text) + 1)
    return f"{fence}{lang}\n{text}\n{fence}"


def unmention(text: str, breaker: str = "&#8203;") -> str:
    """`text` with a zero-width space after every ``@`` that could start a mention or team name."""
    return _MENTION_RE.sub("@" + breaker, text)


def inert(text: str) -> str:
    """Captured text as inert Markdown: no HTML, links, images or code spans, and no mentions."""
    return unmention(_PLAIN_RE.sub(lambda m: _PLAIN_ESCAPES[m.group(0)], text))


def escaped(text: str) -> str:
    """`text` as Markdown prose with every character that makes code, emphasis, links or HTML
    backslash-escaped (`text` is one line already: `flaketriage.text.printable`)."""
    return _SPECIAL.sub(r"\\\1", text)
