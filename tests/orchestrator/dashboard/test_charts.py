"""The server-drawn SVG charts: well-formed XML (parsed here), one shape per value, sizes in
proportion, an accessible title and description, and every label escaped (``<&">`` included)."""

from __future__ import annotations

import math
import xml.etree.ElementTree as ET

import pytest
from markupsafe import Markup

from flaketriage.orchestrator.dashboard.charts import Cell, Series, rate_interval, stacked_bars, strip

SVG = "{http://www.w3.org/2000/svg}"
HOSTILE = "<b>&amp; \"quoted\" 'single' </svg><script>x</script>"


def parsed(markup: Markup) -> ET.Element:
    assert isinstance(markup, Markup)
    root = ET.fromstring(str(markup))
    assert root.tag == f"{SVG}svg"
    return root


def bars_of(root: ET.Element) -> list[ET.Element]:
    return root.findall(f".//{SVG}g[@class]/{SVG}rect")


def test_stacked_bars_draw_one_bar_per_nonzero_value_with_heights_in_proportion() -> None:
    root = parsed(
        stacked_bars(
            ["mon", "tue", "wed"],
            [
                Series("flaky", [1, 0, 4], "verdict-flaky"),
                Series("deterministic", [2, 3, 0], "verdict-deterministic"),
            ],
            title="Failures",
            description="Five days",
            height=220,
        )
    )
    bars = bars_of(root)
    assert len(bars) == 4
    heights = {bar.findtext(f"{SVG}title"): float(bar.get("height", "0")) for bar in bars}
    assert set(heights) == {"mon: flaky 1", "wed: flaky 4", "mon: deterministic 2", "tue: deterministic 3"}
    unit = heights["mon: flaky 1"]
    for tip, height in heights.items():
        assert height == pytest.approx(unit * int(tip.rsplit(" ", 1)[1]), abs=0.02)
    # The tallest stack (4) fills the plot: 220 high, less 8 above and 22 below.
    assert heights["wed: flaky 4"] == pytest.approx(190, abs=0.02)
    # Stacked: monday's deterministic bar sits right on top of its flaky one.
    mon = {
        bar.findtext(f"{SVG}title"): bar
        for bar in bars
        if (bar.findtext(f"{SVG}title") or "").startswith("mon")
    }
    flaky, det = mon["mon: flaky 1"], mon["mon: deterministic 2"]
    assert float(det.get("y", "0")) + float(det.get("height", "0")) == pytest.approx(
        float(flaky.get("y", "0")), abs=0.02
    )
    assert flaky.get("x") == det.get("x")
    assert [g.get("class") for g in root.findall(f"{SVG}g")][1:3] == [
        "series verdict-flaky",
        "series verdict-deterministic",
    ]


def test_a_chart_is_titled_and_described_for_a_screen_reader() -> None:
    root = parsed(
        stacked_bars(["a"], [Series("s", [1])], title="Failures per day", description="1 failure", ident="f")
    )
    assert root.get("role") == "img"
    assert root.get("aria-labelledby") == "f-title f-desc"
    assert root.find(f"{SVG}title[@id='f-title']") is not None
    assert root.findtext(f"{SVG}title") == "Failures per day"
    assert root.findtext(f"{SVG}desc") == "1 failure"
    assert "style" not in str(
        stacked_bars(["a"], [Series("s", [1])], title="t", description="d")
    )  # CSP: no inline style


def test_labels_titles_names_and_classes_are_escaped() -> None:
    markup = stacked_bars(
        [HOSTILE, "b"],
        [Series(HOSTILE, [1, 2], css_class='x" onload="alert(1)')],
        title=HOSTILE,
        description=HOSTILE,
        ident='i"d',
        label_every=1,
    )
    assert "<script>" not in markup and 'onload="' not in markup
    root = parsed(markup)
    assert root.findtext(f"{SVG}title") == HOSTILE
    assert root.findtext(f"{SVG}desc") == HOSTILE
    assert bars_of(root)[0].findtext(f"{SVG}title") == f"{HOSTILE}: {HOSTILE} 1"
    assert [t.text for t in root.findall(f"{SVG}g[@class='labels']/{SVG}text")] == [HOSTILE, "b"]
    assert root.find(f"{SVG}g[@class='series x\" onload=\"alert(1)']") is not None  # one attribute, as given


def test_no_values_draw_no_bars_and_still_make_a_chart() -> None:
    root = parsed(stacked_bars(["a", "b"], [Series("s", [0, 0])], title="t", description="d"))
    assert bars_of(root) == []
    root = parsed(stacked_bars([], [], title="t", description="d"))
    assert bars_of(root) == []


@pytest.mark.parametrize(
    ("values", "problem"),
    [
        ([1.0], "has 1 values for 2 labels"),
        ([1.0, -1.0], "at least 0"),
        ([math.nan, 1.0], "finite"),
        ([math.inf, 1], "finite"),
    ],
)
def test_values_a_chart_cannot_draw_are_refused(values: list[float], problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        stacked_bars(["a", "b"], [Series("s", values)], title="t", description="d")


def test_labels_are_thinned_to_fit_unless_asked_for_each() -> None:
    labels = [f"d{i}" for i in range(30)]
    series = [Series("s", [1] * 30)]
    crowded = parsed(stacked_bars(labels, series, title="t", description="d", width=320))
    written = [t.text for t in crowded.findall(f"{SVG}g[@class='labels']/{SVG}text")]
    assert 1 < len(written) < 30 and written[0] == "d0"
    every = parsed(stacked_bars(labels, series, title="t", description="d", label_every=1))
    assert len(every.findall(f"{SVG}g[@class='labels']/{SVG}text")) == 30


def _interval(root: ET.Element) -> tuple[float, float, float]:
    rect = root.find(f"{SVG}rect[@class='interval']")
    line = root.find(f"{SVG}line[@class='estimate']")
    assert rect is not None and line is not None
    x, width = float(rect.get("x", "0")), float(rect.get("width", "0"))
    return x, x + width, float(line.get("x1", "0"))


def test_a_rate_interval_is_a_bar_on_a_zero_to_one_axis_with_its_estimate() -> None:
    root = parsed(rate_interval(0.2, 0.4, 0.7, title="Failure rate", description="40%", width=216))
    # The axis runs from x=16 to x=200 (216 less 16 each side).
    assert _interval(root) == pytest.approx((16 + 0.2 * 184, 16 + 0.7 * 184, 16 + 0.4 * 184), abs=0.01)
    ticks = [t.text for t in root.findall(f"{SVG}g[@class='axis']/{SVG}text")]
    assert ticks == ["0%", "25%", "50%", "75%", "100%"]
    assert root.find(f"{SVG}rect[@class='interval']/{SVG}title").text == "from 20.0% to 70.0%"  # type: ignore[union-attr]


def test_a_rate_out_of_range_or_out_of_order_is_drawn_within_the_axis() -> None:
    low, high, point = _interval(parsed(rate_interval(1.3, -0.2, 0.5, title="t", description="d", width=216)))
    assert (low, point, high) == pytest.approx((16, 16 + 0.5 * 184, 200), abs=0.01)
    with pytest.raises(ValueError, match="finite"):
        rate_interval(0.1, math.nan, 0.3, title="t", description="d")


def test_a_rate_chart_escapes_its_title() -> None:
    root = parsed(rate_interval(0, 0, 0, title=HOSTILE, description=HOSTILE))
    assert root.findtext(f"{SVG}title") == HOSTILE
    low, high, _ = _interval(root)
    assert high - low == pytest.approx(2.0)  # a zero-wide interval is still seen


def test_a_strip_draws_a_cell_per_item_in_order() -> None:
    cells = [Cell("passed on abc", "outcome-passed"), Cell(HOSTILE, "outcome-failed"), Cell("skipped")]
    root = parsed(strip(cells, title="Last results", description="3 results", cell_width=10, gap=2))
    rects = root.findall(f"{SVG}rect")
    assert [r.get("class") for r in rects] == ["outcome-passed", "outcome-failed", "cell"]
    assert [float(r.get("x", "0")) for r in rects] == [0, 12, 24]
    assert [r.findtext(f"{SVG}title") for r in rects] == ["passed on abc", HOSTILE, "skipped"]
    assert root.get("width") == "34"
