"""What a list page reads from its request: its filters from the query string (`read_filters`), and
whether htmx asks for the list alone, to swap it in place (`in_place`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from fastapi import Request

from flaketriage.records.text import storable_text

MAX_FILTER = 500
"""Characters of one filter read; a longer value is a problem, not a search."""


def in_place(request: Request) -> bool:
    """Whether htmx asks for the list alone (a filter changed), not for the whole page (a history
    restore asks for the whole page too)."""
    return request.headers.get("HX-Request") == "true" and not request.headers.get(
        "HX-History-Restore-Request"
    )


def read_filters(
    params: Mapping[str, str],
    names: Sequence[str],
    choices: Mapping[str, Sequence[str]],
    *,
    most_pages: int,
    aliases: Mapping[str, Mapping[str, str]] | None = None,
) -> tuple[dict[str, Any], list[str]]:
    """The filters `names` of a query string, and what is wrong with it (each problem says what is
    allowed); a wrong value is left out. A filter in `choices` must be one of them (after its
    `aliases`, keyed by the value in lower case); ``page`` must be a whole number from 1 to
    `most_pages`. Unknown parameters are ignored; NUL and lone surrogates, which no query can hold,
    become U+FFFD (and so match nothing)."""
    problems: list[str] = []
    values: dict[str, Any] = {}
    for name in names:
        text = storable_text(params.get(name, "")).strip()
        if len(text) > MAX_FILTER:
            problems.append(f"{name} is {len(text)} characters long: at most {MAX_FILTER} are read")
        elif text:
            values[name] = text
    for name, spellings in (aliases or {}).items():
        if name in values:
            values[name] = spellings.get(values[name].lower(), values[name])
    for name, allowed in choices.items():
        if name in values and values[name] not in allowed:
            problems.append(f"{name} {values.pop(name)!r} is not one of: {', '.join(allowed)}")
    if "page" in values:
        page = values.pop("page")
        if page.isascii() and page.isdigit() and 1 <= int(page) <= most_pages:
            values["page"] = int(page)
        else:
            problems.append(
                f"page {page!r} is not a page of this list: a whole number from 1 to {most_pages} "
                "(past that, narrow the filters)"
            )
    return values, problems
