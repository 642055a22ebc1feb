"""Charts drawn on the server as inline SVG: stacked bars, a rate's interval on a 0..1 axis, and a
strip of cells (one per result, say).

Each function is pure and returns `Markup` built only from text escaped here: labels, titles and
class names may hold anything (``<&">`` included). The colours come from the style sheet, through
the class given to each series or cell (``verdict-flaky``, ``outcome-failed``: their ``color``), so
the page's Content-Security-Policy needs no inline style; every shape has a ``<title>`` (a tooltip
and what a screen reader says), and the chart a ``<title>`` and ``<desc>`` named by
``aria-labelledby``. A chart repeats what a table or its text says; it never stands alone.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from markupsafe import Markup, escape

SVG_NS = "http://www.w3.org/2000/svg"


@dataclass(frozen=True)
class Series:
    """One series of a bar chart: its name (in the legend and the tooltips), a value per label, and
    the class its bars are drawn with (``verdict-flaky``: the style sheet gives it a colour)."""

    name: str
    values: Sequence[float]
    css_class: str = ""


@dataclass(frozen=True)
class Cell:
    """One cell of a strip: what its tooltip says, and its class (``outcome-failed``)."""

    label: str
    css_class: str = ""


def _number(value: float) -> str:
    """A coordinate as SVG reads it: at most two decimals, no trailing zeros."""
    text = f"{value:.2f}".rstrip("0").rstrip(".")
    return "0" if text in ("-0", "") else text


def _count(value: float) -> str:
    return f"{value:g}" if value != int(value) else f"{int(value)}"


def _attrs(**values: str | float) -> str:
    """Attributes, each value escaped; a trailing underscore in a name is dropped (``class_``)."""
    out = []
    for name, value in values.items():
        text = _number(value) if isinstance(value, int | float) else value
        out.append(f' {name.rstrip("_").replace("_", "-")}="{escape(text)}"')
    return "".join(out)


def _open(ident: str, css_class: str, width: float, height: float, title: str, description: str) -> list[str]:
    return [
        f'<svg xmlns="{SVG_NS}"'
        + _attrs(
            class_=f"chart {css_class}",
            viewBox=f"0 0 {_number(width)} {_number(height)}",
            width=width,
            height=height,
            role="img",
            aria_labelledby=f"{ident}-title {ident}-desc",
        )
        + ">",
        f"<title{_attrs(id=f'{ident}-title')}>{escape(title)}</title>",
        f"<desc{_attrs(id=f'{ident}-desc')}>{escape(description)}</desc>",
    ]


def _finite(value: float, what: str) -> float:
    if not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
        raise ValueError(f"{what} must be a finite number of at least 0, got {value!r}")
    return float(value)


def stacked_bars(
    labels: Sequence[str],
    series: Sequence[Series],
    *,
    title: str,
    description: str,
    ident: str = "bars",
    width: int = 720,
    height: int = 220,
    unit: str = "",
    label_every: int = 0,
) -> Markup:
    """A bar per label, its series stacked bottom to top in the order given; bar heights are
    proportional to the values (the tallest stack fills the plot), a value of 0 draws nothing.

    `ident` makes the chart's element ids unique in its page; `unit` follows each value in the
    tooltips (``" min"``); every `label_every`-th label is written under its bar (0: as many as
    fit). `ValueError` when a series has not one value per label, or a value is negative or not
    finite."""
    for s in series:
        if len(s.values) != len(labels):
            raise ValueError(f"series {s.name!r} has {len(s.values)} values for {len(labels)} labels")
    values = [[_finite(v, f"a value of {s.name!r}") for v in s.values] for s in series]
    totals = [sum(column) for column in zip(*values, strict=True)] if values else [0.0] * len(labels)
    top = max(totals, default=0.0)
    left, right, above, below = 40.0, 8.0, 8.0, 22.0
    plot_w, plot_h = max(width - left - right, 1.0), max(height - above - below, 1.0)
    slot = plot_w / max(len(labels), 1)
    bar = max(slot * 0.75, 1.0)
    scale = plot_h / top if top > 0 else 0.0
    base = above + plot_h

    parts = _open(ident, "chart-bars", width, height, title, description)
    parts.append('<g class="axis">')
    parts.append(f"<line{_attrs(x1=left, y1=base, x2=left + plot_w, y2=base, stroke='currentColor')}/>")
    parts.append(f"<text{_attrs(x=left - 4, y=above + 10, text_anchor='end')}>{escape(_count(top))}</text>")
    parts.append(f"<text{_attrs(x=left - 4, y=base, text_anchor='end')}>0</text>")
    parts.append("</g>")
    for k, (s, column) in enumerate(zip(series, values, strict=True)):
        parts.append(f"<g{_attrs(class_=f'series {s.css_class}'.strip())}>")
        for i, value in enumerate(column):
            if value <= 0:
                continue
            below_it = sum(values[j][i] for j in range(k))
            y = base - (below_it + value) * scale
            tip = f"{labels[i]}: {s.name} {_count(value)}{unit}"
            parts.append(
                f"<rect{_attrs(x=left + i * slot + (slot - bar) / 2, y=y, width=bar, height=value * scale)}"
                f' fill="currentColor"><title>{escape(tip)}</title></rect>'
            )
        parts.append("</g>")
    every = label_every or max(1, math.ceil(len(labels) * 64 / plot_w))
    parts.append('<g class="labels">')
    for i, label in enumerate(labels):
        if i % every == 0:
            x = left + i * slot + slot / 2
            parts.append(f"<text{_attrs(x=x, y=height - 6, text_anchor='middle')}>{escape(label)}</text>")
    parts.append("</g></svg>")
    return Markup("".join(parts))


def rate_interval(
    low: float,
    point: float,
    high: float,
    *,
    title: str,
    description: str,
    ident: str = "rate",
    width: int = 360,
    height: int = 64,
) -> Markup:
    """A rate's interval as a bar on a 0..1 axis (ticks at 0, 25, 50, 75 and 100%) and its point
    estimate as a mark across it. Values outside 0..1 are drawn at the ends and put in order;
    `ValueError` for one that is not a finite number."""
    for name, value in (("low", low), ("point", point), ("high", high)):
        if not isinstance(value, int | float) or not math.isfinite(value):
            raise ValueError(f"{name} must be a finite number, got {value!r}")
    low, point, high = sorted(min(max(float(v), 0.0), 1.0) for v in (low, point, high))
    left, right = 16.0, 16.0
    axis_w = max(width - left - right, 1.0)
    mid = 24.0

    def x(v: float) -> float:
        return left + v * axis_w

    parts = _open(ident, "chart-rate", width, height, title, description)
    parts.append('<g class="axis">')
    parts.append(
        f"<line{_attrs(x1=left, y1=mid + 12, x2=left + axis_w, y2=mid + 12, stroke='currentColor')}/>"
    )
    for tick in (0.0, 0.25, 0.5, 0.75, 1.0):
        parts.append(
            f"<line{_attrs(x1=x(tick), y1=mid + 12, x2=x(tick), y2=mid + 16, stroke='currentColor')}/>"
        )
        parts.append(f"<text{_attrs(x=x(tick), y=height - 4, text_anchor='middle')}>{tick:.0%}</text>")
    parts.append("</g>")
    tip = f"from {low:.1%} to {high:.1%}"
    parts.append(
        f"<rect{_attrs(class_='interval', x=x(low), y=mid - 8, width=max(x(high) - x(low), 2.0), height=16)}"
        f' fill="currentColor"><title>{escape(tip)}</title></rect>'
    )
    parts.append(
        f"<line{_attrs(class_='estimate', x1=x(point), y1=mid - 14, x2=x(point), y2=mid + 14)}"
        f' stroke="currentColor" stroke-width="3"><title>{escape(f"estimate {point:.1%}")}</title></line>'
    )
    parts.append("</svg>")
    return Markup("".join(parts))


def strip(
    cells: Sequence[Cell],
    *,
    title: str,
    description: str,
    ident: str = "strip",
    cell_width: int = 10,
    height: int = 20,
    gap: int = 2,
) -> Markup:
    """A row of equal cells, left to right in the order given (oldest first, say), each drawn with
    its class's colour and titled with its label."""
    width = max(len(cells) * (cell_width + gap) - gap, 1)
    parts = _open(ident, "chart-strip", width, height, title, description)
    # Every cell has the same size: its attributes are written once (a page draws 50 strips).
    size = _attrs(y=0, width=cell_width, height=height)
    step = cell_width + gap
    classes: dict[str, str] = {}
    for i, cell in enumerate(cells):
        name = classes.get(cell.css_class)
        if name is None:
            name = classes[cell.css_class] = _attrs(class_=cell.css_class or "cell")
        x = _number(i * step)  # a number: nothing to escape
        parts.append(
            f'<rect{name} x="{x}"{size} fill="currentColor"><title>{escape(cell.label)}</title></rect>'
        )
    parts.append("</svg>")
    return Markup("".join(parts))
