"""How the receiver is served: the uvicorn options and the interpreter setting the receiver runs with,
shared by ``flaketriage serve`` and the ingest benchmark (which times what the user runs).

The receiver is one process with two busy threads: the event loop, which parses, checks and answers
requests, and the intake thread, which records them (`flaketriage.orchestrator.intake_queue`) and
spends most of its time waiting for the database. Each time an answer comes back from the database
the intake thread needs the GIL, and by default CPython lets the thread holding it run on for up to
5 ms before it must hand it over: a batch of about ten round trips could wait 50 ms for a busy
event loop. A switch interval of 0.5 ms bounds that wait, for a few more hand-overs per second.
"""

from __future__ import annotations

import sys
from typing import Any

SWITCH_INTERVAL_S = 0.0005
"""``sys.setswitchinterval`` for the receiver's process (CPython's default: 0.005)."""


def run(app: Any, *, host: str, port: int, log_level: str = "info") -> None:
    """Serve `app` with uvicorn until the process is stopped."""
    import uvicorn

    sys.setswitchinterval(SWITCH_INTERVAL_S)
    uvicorn.run(app, host=host, port=port, log_level=log_level, access_log=False)
