"""Metrics a run reports (``loss=3.2`` lines, JSON files) and the bounds that make them failures."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Literal

from flaketriage.bundle.manifest import MetricBound
from flaketriage.errors import MetricsFileError
from flaketriage.failure.normalize import strip_ansi

# --- metrics ------------------------------------------------------------------------------------

_METRIC_VALUE = r"[-+]?(?:(?i:nan|inf(?:inity)?)|\d+(?:\.\d*)?(?:[eE][-+]?\d+)?|\.\d+(?:[eE][-+]?\d+)?)"


def read_metrics(
    stdout: str, names: Iterable[str], metrics_file: str | Path | None = None
) -> dict[str, float]:
    """The last value of each named metric in the output and/or a JSON metrics file.

    Output lines may read ``loss=3.2``, ``loss: 3.2``, ``step 5 loss=inf``, ``{'loss': 0.5}`` or
    ``loss=tensor(0.5)``; ``val_loss`` and ``train/loss`` are not ``loss``. The file is one JSON
    object of name → number, or JSON Lines of such objects; an unreadable line (a run killed
    mid-write) is skipped. Where both have a value, the file wins.

    Raises `MetricsFileError` when the file is missing, is not a readable file (a directory, no
    permission), or holds no JSON object at all: its criteria cannot be evaluated, and an
    unevaluated criterion must never read as a pass.
    """
    wanted = list(dict.fromkeys(names))
    text = strip_ansi(stdout)
    values: dict[str, float] = {}
    for name in wanted:
        pattern = re.compile(
            rf"(?<![\w./-]){re.escape(name)}['\"]?\s*[=:]\s*(?:[A-Za-z_][\w.]*\()?(?P<v>{_METRIC_VALUE})(?!\w)"
        )
        last = None
        for last in pattern.finditer(text):  # noqa: B007  (the last one wins)
            pass
        if last is not None:
            values[name] = float(last.group("v"))
    if metrics_file is not None:
        for record in _metric_records(Path(metrics_file)):
            for name in wanted:
                value = _as_float(record.get(name))
                if value is not None:
                    values[name] = value
    return values


def _metric_records(path: Path) -> list[dict[str, Any]]:
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError as exc:
        raise MetricsFileError(str(path), "missing", "no such file") from exc
    except OSError as exc:
        raise MetricsFileError(str(path), "unreadable", exc.strerror or str(exc)) from exc
    if not text.strip():
        raise MetricsFileError(str(path), "empty", "the file is empty")
    try:
        docs = [json.loads(text)]
    except ValueError:
        docs = []
        for line in text.splitlines():
            try:
                docs.append(json.loads(line))
            except ValueError:
                continue
    if len(docs) == 1 and isinstance(docs[0], list):
        docs = docs[0]
    records = [doc for doc in docs if isinstance(doc, dict)]
    if not records:
        raise MetricsFileError(str(path), "not-json", "no line of it is a JSON object")
    return records


def _as_float(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        return None
    try:
        return float(value)
    except ValueError:
        return None


def bound_violation(bound: MetricBound, value: float) -> Literal["above", "below", "nan"] | None:
    """How ``value`` breaks ``bound``, or None. NaN always breaks a declared metric, bounds or not:
    every comparison with NaN is false, so without this rule a NaN loss would pass."""
    if math.isnan(value):
        return "nan"
    if bound.above is not None and value > bound.above:
        return "above"
    if bound.below is not None and value < bound.below:
        return "below"
    return None
