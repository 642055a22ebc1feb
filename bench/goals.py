"""The goal line every benchmark prints beside its figure, and how ``bench/all.py`` reads it back.

One line per goal, ``goal: <what> <figure> <op> <target>: ok`` (or ``MISSED``), e.g.
``goal: k=1 n=10,000 max calls 15 <= 15: ok``; a benchmark exits 1 when any of its lines says
MISSED. ``bench/ingest.py`` and ``bench/workers.py`` print the same shape without this module.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_LINE = re.compile(r"^\s*goal: (?P<text>.*): (?P<status>ok|MISSED)\s*$")
_OPERATOR = re.compile(r"\s(<=|>=|<|>|==|≤|≥)\s")


@dataclass(frozen=True)
class Goal:
    """One goal as printed: the figure measured, the target it is held to, and whether it met it."""

    figure: str
    target: str
    ok: bool


def check(what: str, figure: str, op: str, target: str, ok: bool) -> bool:
    """Print one goal line and return ``ok``, so callers can ``all(...)`` them."""
    print(f"  goal: {what} {figure} {op} {target}: {'ok' if ok else 'MISSED'}")
    return ok


def parse(line: str) -> Goal | None:
    """The goal on ``line``, or None when it is not a goal line. The target is what follows the
    last comparison operator; a line without one keeps its whole text as the figure."""
    match = _LINE.match(line)
    if match is None:
        return None
    text, ok = match["text"], match["status"] == "ok"
    operators = list(_OPERATOR.finditer(text))
    if not operators:
        return Goal(figure=text, target="", ok=ok)
    last = operators[-1]
    return Goal(figure=text[: last.start()].strip(), target=f"{last[1]} {text[last.end() :]}", ok=ok)
