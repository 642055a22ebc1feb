"""A case's title, made from the failure a sighting reports."""

from __future__ import annotations

from flaketriage.orchestrator.sightings import title_of


def test_a_bare_assert_case_is_titled_with_its_exception_type() -> None:
    title = title_of("t.py::test_total", ["pytest"], "test", "AssertionError", "assert 16.99 == 17.0")
    assert title == "t.py::test_total: AssertionError: assert 16.99 == 17.0"


def test_a_long_message_is_cut_between_words() -> None:
    message = "bad price for SKU-0137: -4.99 is below zero; " + "prices must be positive " * 10
    title = title_of("t.py::test_price", ["pytest"], "test", "ValueError", message + "\nsecond line")
    kept = title.removeprefix("t.py::test_price: ValueError: ")
    assert kept.endswith("…") and len(kept) <= 160
    assert message.startswith(kept[:-1]) and message[len(kept) - 1] == " "
