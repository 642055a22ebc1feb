"""Cutting long text for titles and cells: between words, with an ellipsis."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from flaketriage.text.titles import clip


@pytest.mark.parametrize(
    ("text", "limit", "clipped"),
    [
        ("short", 10, "short"),
        ("bad price for SKU-0137: -4.99 is below zero", 29, "bad price for SKU-0137…"),
        ("bad price for SKU-0137: -4.99 is below zero", 30, "bad price for SKU-0137: -4.99…"),
        # One long token (a path, a hash) is cut inside: dropping it whole would leave too little.
        ("see /very/long/path/to/some/file.py", 20, "see /very/long/path…"),
        ("a" * 50, 10, "a" * 9 + "…"),
        ("word another", 1, "…"),
    ],
)
def test_clip_examples(text: str, limit: int, clipped: str) -> None:
    assert clip(text, limit) == clipped


@given(st.text(max_size=300), st.integers(min_value=1, max_value=200))
def test_clip_fits_and_keeps_a_start_of_the_text(text: str, limit: int) -> None:
    clipped = clip(text, limit)
    assert len(clipped) <= limit
    if clipped != text:
        assert clipped.endswith("…") and text.startswith(clipped[:-1])
