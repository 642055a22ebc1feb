"""Reading a request's body within bounds: at most so many bytes (413), received whole within so
many seconds (408). A body refused is not read further, so its answer closes the connection."""

from __future__ import annotations

import anyio
from fastapi import Request

from flaketriage.errors import BodyRefused


async def read_body(request: Request, *, limit: int, timeout_s: float, too_large: str) -> bytes:
    """The body of `request`, or `BodyRefused`: 413 (with `too_large`) when it declares or sends
    more than `limit` bytes, 408 when it is not received whole within `timeout_s` seconds, however
    steadily it trickles in. A client that hangs up raises Starlette's ``ClientDisconnect``."""
    declared = request.headers.get("content-length")
    if declared is not None and (not declared.isdigit() or len(declared) > 20 or int(declared) > limit):
        raise BodyRefused(413, too_large)
    chunks: list[bytes] = []
    size = 0
    try:
        with anyio.fail_after(timeout_s):
            async for chunk in request.stream():
                size += len(chunk)
                if size > limit:
                    raise BodyRefused(413, too_large)
                chunks.append(chunk)
    except TimeoutError:
        raise BodyRefused(
            408,
            f"the body did not arrive whole within {timeout_s:g} s (FLAKETRIAGE_BODY_TIMEOUT_S): "
            f"{size} bytes came",
        ) from None
    return b"".join(chunks)
