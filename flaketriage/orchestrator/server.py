"""How the receiver is served: the uvicorn options and the interpreter setting the receiver runs with,
shared by ``flaketriage serve`` and the ingest benchmark (which times what the user runs).

The event loop parses, checks and answers requests; deliveries are recorded beside it, by a writer
thread on SQLite (`flaketriage.orchestrator.intake_queue`) and by a child process of the receiver's
on PostgreSQL (`flaketriage.orchestrator.intake_process`). Before serving, the objects that live
as long as the process (the app, its routes and models, the ORM, the Celery app) are frozen out of
the garbage collector's generations (`gc.freeze`), as long-running CPython servers do: a full
collection no longer walks them and no longer stops every request for tens of milliseconds (the
receiver's p99 latency was those pauses).
"""

from __future__ import annotations

import copy
import gc
from typing import Any


def log_config(log_level: str = "info") -> dict[str, Any]:
    """uvicorn's logging configuration with flaketriage's own loggers (the receiver's line per
    request) written beside uvicorn's, at `log_level`."""
    from uvicorn.config import LOGGING_CONFIG

    config = copy.deepcopy(LOGGING_CONFIG)
    config["loggers"]["flaketriage"] = {
        "handlers": ["default"],
        "level": log_level.upper(),
        "propagate": False,
    }
    return config


def run(app: Any, *, host: str, port: int, log_level: str = "info", header_timeout_s: float = 10.0) -> None:
    """Serve `app` with uvicorn until the process is stopped; a connection's request headers must
    be complete within `header_timeout_s` (`flaketriage.orchestrator.http_protocol`)."""
    import uvicorn

    from flaketriage.orchestrator.http_protocol import with_header_timeout

    gc.collect()
    gc.freeze()
    uvicorn.run(
        app,
        host=host,
        port=port,
        http=with_header_timeout(header_timeout_s),
        log_level=log_level,
        access_log=False,
        log_config=log_config(log_level),
    )
