"""Text as the records can hold it and the API can answer it, whatever a sender put in its JSON.

JSON carries what no column can: a lone surrogate (``"\\ud800"``: JSON allows the escape, UTF-8 has no
encoding for it, so PostgreSQL refuses it and an answer that shows it cannot be written), a NUL (which
PostgreSQL text cannot hold) and, as Python reads it, ``NaN`` and the infinities (not JSON numbers:
PostgreSQL's json refuses them, a JSON answer writes null). `storable_text` and `storable_json` make
such input storable, replacing rather than refusing (a failure report with one odd byte is still a
failure to record): the receiver runs every payload it parses through `storable_json`, the intake every
sighting (its columns through `storable_text`, its provenance through `storable_json`: a command's
undecodable bytes reach a case's title), and the case reads their stored JSON through `storable_json`
again, for rows written before.
"""

from __future__ import annotations

import math
import re
from typing import Any

REPLACEMENT = "\ufffd"
"""What stands where a character was that could not be kept: U+FFFD, as a decoder writes it."""

_UNENCODABLE = re.compile("[\ud800-\udfff]")
"""What UTF-8 cannot encode: a lone surrogate (a pair is one character in a Python string)."""
_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")
"""What a text column cannot hold: that, and NUL (PostgreSQL)."""


def storable_text(text: str) -> str:
    """`text` as a text column holds it: NUL and lone surrogates each become U+FFFD."""
    return _UNSTORABLE.sub(REPLACEMENT, text)


def storable_json(value: Any) -> Any:
    """A JSON document (as `json.loads` gives it) as a JSON column holds it and an answer shows it:
    lone surrogates in strings and keys become U+FFFD, NaN and the infinities null. A NUL stays (a
    json column keeps it as ``\\u0000``, an answer writes it so)."""
    if isinstance(value, str):
        return _UNENCODABLE.sub(REPLACEMENT, value)
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {storable_json(key): storable_json(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [storable_json(item) for item in value]
    return value
