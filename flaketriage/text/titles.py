"""Short text made from long text: a title or a table cell cut at a word, with an ellipsis.

A message cut mid-value (``bad price for SKU-0137: -4``) reads as a different value; cut between
words, the ``…`` says that more follows, and whoever shows the short text shows the whole elsewhere.
"""

from __future__ import annotations

ELLIPSIS = "…"
_LEAST_KEPT = 0.6
"""A cut goes back to the last space only while that keeps this share of the room: a long token (a
path, a URL, a hash) is cut inside rather than dropped whole."""


def clip(text: str, limit: int) -> str:
    """`text` when it has at most `limit` characters, else its longest start that ends between
    words and, with ``…``, fits in `limit` (cut inside a word only when no space comes late enough).
    """
    if len(text) <= limit:
        return text
    room = max(0, limit - len(ELLIPSIS))
    head = text[:room]
    if not text[room : room + 1].isspace():
        space = max(head.rfind(" "), head.rfind("\t"))
        if space >= _LEAST_KEPT * room:
            head = head[:space]
    return head.rstrip(" \t,;:") + ELLIPSIS
