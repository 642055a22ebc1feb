"""`storable_text` and `storable_json` (`flaketriage.records.text`): text no column holds (lone
surrogates, NUL, NaN and infinities) made storable. tests/orchestrator/test_text.py sends such text
through every write route of the receiver."""

from __future__ import annotations

import math

from flaketriage.records.text import storable_json, storable_text


def test_storable_text_replaces_what_no_column_holds() -> None:
    assert storable_text("plain é \U0001f4a5") == "plain é \U0001f4a5"
    assert storable_text("a\x00b\ud800c\udcffd") == "a\ufffdb\ufffdc\ufffdd"


def test_storable_json_keeps_structure_and_replaces_only_what_cannot_be_held() -> None:
    document = {"k\ud800": ["a\udfff", 1, 2.5, math.nan, math.inf, None, True, {"n": "x\x00"}]}

    assert storable_json(document) == {"k\ufffd": ["a\ufffd", 1, 2.5, None, None, None, True, {"n": "x\x00"}]}
