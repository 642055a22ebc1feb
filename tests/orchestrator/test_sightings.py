"""A case's title, made from the failure a sighting reports; the bundle lines and commands a webhook's
text names, read in time linear in the text."""

from __future__ import annotations

import time

import pytest

from flaketriage.orchestrator.github_hooks import COMMAND
from flaketriage.orchestrator.sightings import bundle_ids, title_of


def test_a_bare_assert_case_is_titled_with_its_exception_type() -> None:
    title = title_of("t.py::test_total", ["pytest"], "test", "AssertionError", "assert 16.99 == 17.0")
    assert title == "t.py::test_total: AssertionError: assert 16.99 == 17.0"


def test_a_long_message_is_cut_between_words() -> None:
    message = "bad price for SKU-0137: -4.99 is below zero; " + "prices must be positive " * 10
    title = title_of("t.py::test_price", ["pytest"], "test", "ValueError", message + "\nsecond line")
    kept = title.removeprefix("t.py::test_price: ValueError: ")
    assert kept.endswith("…") and len(kept) <= 160
    assert message.startswith(kept[:-1]) and message[len(kept) - 1] == " "


@pytest.mark.parametrize("blank", ["\n", " \n", "\r\n", "\t"], ids=repr)
def test_blank_lines_are_read_in_linear_time(blank: str) -> None:
    """A line's leading blanks matched across line ends: 40,000 empty lines took 14 s, a body of them
    (FLAKETRIAGE_MAX_BODY_KB) would take an hour."""
    text = (
        blank * 60_000 + "\nflaketriage-bundle: " + "a" * 64 + "\r\n/flaketriage triage " + "b" * 12 + "\r\n"
    )
    started = time.monotonic()

    found = bundle_ids(text)
    commands = [m.group(1) for m in COMMAND.finditer(text)]

    assert time.monotonic() - started < 2
    assert found == ["a" * 64] and commands == ["b" * 12]


def test_a_bundle_line_is_one_line() -> None:
    assert bundle_ids("flaketriage-bundle:\n" + "a" * 64) == []
    assert bundle_ids("  flaketriage-bundle:\t" + "a" * 12 + " \r") == ["a" * 12]
