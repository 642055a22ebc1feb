"""The environment variables a replay runs under, named once for the replayer and the replayed.

The replayer sets them (`flaketriage.workers.replay`, and ``run.sh`` of an export); the code inside
the replayed program reads them: the pytest plugin captures nothing, the numeric guards raise on
every trip, ``sitecustomize`` turns on PyTorch determinism. Standard library only: the pytest plugin
imports this at start-up, before any failure.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from types import MappingProxyType

REPLAY_ENV = "FLAKETRIAGE_REPLAY"
"""``1`` inside every flaketriage replay."""

DETERMINISTIC_ENV = "FLAKETRIAGE_DETERMINISTIC"
"""``0`` keeps ``sitecustomize`` from turning on PyTorch deterministic algorithms (default ``1``)."""

DETERMINISTIC_SETTINGS: Mapping[str, str] = MappingProxyType({"CUBLAS_WORKSPACE_CONFIG": ":4096:8"})
"""Library settings that make GPU kernels repeatable: what an exported ``run.sh`` exports too."""

REPLAY_SETTINGS: Mapping[str, str] = MappingProxyType({**DETERMINISTIC_SETTINGS, REPLAY_ENV: "1"})
"""What every replay adds to the recorded environment (unless the recording set it)."""


def in_replay(environ: Mapping[str, str] = os.environ) -> bool:
    """Whether this process runs inside a flaketriage replay."""
    return environ.get(REPLAY_ENV) == "1"
