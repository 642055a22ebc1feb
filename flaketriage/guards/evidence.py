"""What a guard records when it trips: a bundle the core loop can replay to the same failure.

The failure is fingerprinted from the traceback Python would print if the guard raised there
(the replay's guard raises there, whatever policy the original run used), so a replay reproduces
it. The bundle also holds the failing batch's rows as the reducible data slice, every RNG state,
the guard's statistics history and, when allowed, a checkpoint of the model and optimizer.
"""

from __future__ import annotations

import base64
import io
import json
import logging
import os
import random
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any, Literal

import torch

from flaketriage.guards.activations import cuda_ready
from flaketriage.guards.checks import Trip
from flaketriage.process.replay_env import in_replay

if TYPE_CHECKING:
    # Imported where a trip is recorded: the manifest's pydantic costs about half a second of every
    # guarded run's start, and of every replay of one (which never records).
    from flaketriage.bundle.manifest import DataInput
    from flaketriage.store import Store

log = logging.getLogger("flaketriage.guards")


def replaying() -> bool:
    """True inside a flaketriage replay: guards then raise on every trip and capture nothing."""
    return in_replay(os.environ)


@dataclass(frozen=True)
class DatasetFile:
    """The dataset file the training script reads, one item per index (``.npy`` first axis,
    JSON Lines line, CSV/TSV row), so a trip can store the failing batch's rows.

    ``restore="slice"``: the failing batch's rows are the bundle's reducible data, restored at
    `path` on replay, so replays and minimization train on that batch alone (right for a bad
    sample; a fault that needs the whole run, like a learning rate, may not reproduce on it).
    ``restore="full"``: the whole file is the reducible data (as ``capture --data`` stores it),
    and the batch's rows are attached for reading.
    """

    path: str | Path
    restore: Literal["slice", "full"] = "slice"


@dataclass(frozen=True)
class CaptureOptions:
    """Where and what a guard captures on its first trip.

    ``store``: a `Store`, or a location `open_store` reads: a directory (relative to ``cwd``) or a
    store URL (default ``FLAKETRIAGE_STORE``, else ``.flaketriage``);
    ``checkpoint``: also store the model, optimizer and scaler state (off by default: it may be
    large or private); ``data``: the dataset file to slice; ``seeds``: seeds the program chose,
    recorded with the torch seed; ``argv``/``cwd``: the command that reruns the training (default:
    this interpreter with this process's arguments, in the current directory).
    """

    store: str | Path | Store | None = None
    checkpoint: bool = False
    data: DatasetFile | None = None
    seeds: Mapping[str, int | str] = field(default_factory=dict)
    argv: Sequence[str] | None = None
    cwd: str | Path | None = None


def traceback_text(exc: BaseException, frame: FrameType) -> str:
    """What Python prints for `exc` raised in `frame` and never caught: the stack down to it."""
    return (
        "Traceback (most recent call last):\n"
        + "".join(traceback.format_stack(frame))
        + "".join(traceback.format_exception_only(type(exc), exc))
    )


@dataclass
class TripEvidence:
    """What the guard hands over for one trip."""

    trip: Trip
    traceback: str
    batch_indices: list[int] | None
    stats: dict[str, Any]
    state: Callable[[], dict[str, Any]]


class Recorder:
    """Captures bundles for one guard; lists the source files when built, before training writes
    checkpoints or logs, so that outputs are not stored as inputs."""

    def __init__(self, capture: CaptureOptions) -> None:
        from flaketriage.capture.source import plan_source
        from flaketriage.settings import load_settings

        self.capture = capture
        self.cwd = Path(capture.cwd or Path.cwd()).resolve()
        self.settings = load_settings()
        self.plan = plan_source(self.cwd)
        self.started = time.monotonic()

    def store(self) -> Store:
        from flaketriage.store import Store, open_store

        where = self.capture.store
        if isinstance(where, Store):
            return where
        return open_store(
            where if where is not None else self.settings.store,
            relative_to=self.cwd,
            shared=self.settings.store_shared,
            settings=self.settings,
        )

    def record(self, evidence: TripEvidence) -> str:
        """Write the bundle; returns its id."""
        from flaketriage.capture.record import record_failure
        from flaketriage.capture.source import SourceLimits
        from flaketriage.errors import GuardError
        from flaketriage.failure.fingerprint import fingerprint_failure

        roots = sorted({str(self.cwd), str(self.plan.root)}, key=len, reverse=True)
        info = fingerprint_failure(exit_code=1, stdout="", stderr=evidence.traceback, roots=roots)
        if info is None:  # cannot happen for a traceback; keeps the types honest
            raise GuardError("the guard's traceback did not parse as a failure; nothing captured")
        store = self.store()
        attachments = {
            "guard/stats.json": _json(evidence.stats),
            "guard/rng_state.json": _json(rng_states()),
        }
        data, data_note = self._data(store, evidence.batch_indices, attachments)
        checkpoint = None
        if self.capture.checkpoint:
            buffer = io.BytesIO()
            torch.save(evidence.state(), buffer)
            checkpoint = buffer.getvalue()
        trip = evidence.trip
        settings = self.settings
        return record_failure(
            store,
            info,
            argv=self.capture.argv,
            cwd=self.cwd,
            kind="training",
            limits=SourceLimits.from_settings(settings),
            data=data,
            seed_values={**_torch_seeds(), **self.capture.seeds},
            stderr=evidence.traceback,
            attachments=attachments,
            checkpoint=checkpoint,
            annotations={
                "guard": {
                    "check": trip.check,
                    "step": trip.step,
                    "where": trip.where,
                    "message": trip.message,
                    "batch_indices": evidence.batch_indices,
                    "data": data_note,
                    "checkpoint": checkpoint is not None,
                }
            },
            timeout_s=max(60.0, 10 * (time.monotonic() - self.started)),
            plan=self.plan,
        )

    def _data(
        self, store: Store, indices: list[int] | None, attachments: dict[str, bytes]
    ) -> tuple[list[DataInput], dict[str, Any] | None]:
        spec = self.capture.data
        if spec is None:
            return [], None
        from flaketriage.bundle.datasets import detect_format, write_subset
        from flaketriage.bundle.files import relative_to_cwd, store_data_input

        source = Path(spec.path) if Path(spec.path).is_absolute() else self.cwd / spec.path
        rel = relative_to_cwd(source, self.cwd)
        fmt = detect_format(source)
        note: dict[str, Any] = {"path": rel, "format": fmt, "restore": spec.restore}
        if indices is None or spec.restore == "full":
            full = store_data_input(store, source, rel)
            note["items"] = full.items
            if indices is not None:
                attachments[f"guard/batch{source.suffix}"] = _subset_bytes(source, fmt, indices)
            return [full], note
        with tempfile.TemporaryDirectory(prefix="flaketriage-slice-") as tmp:
            sliced = Path(tmp) / source.name
            write_subset(source, sliced, fmt, indices)
            stored = store_data_input(store, sliced, rel)
        note["items"] = stored.items
        return [stored], note


def _subset_bytes(source: Path, fmt: Any, indices: list[int]) -> bytes:
    from flaketriage.bundle.datasets import write_subset

    with tempfile.TemporaryDirectory(prefix="flaketriage-slice-") as tmp:
        dest = Path(tmp) / source.name
        write_subset(source, dest, fmt, indices)
        return dest.read_bytes()


def rng_states() -> dict[str, Any]:
    """Every global RNG state at the trip: Python, NumPy (when imported), torch CPU and CUDA."""
    version, internal, gauss = random.getstate()
    states: dict[str, Any] = {"python": {"version": version, "state": list(internal), "gauss_next": gauss}}
    np = sys.modules.get("numpy")
    if np is not None:
        name, keys, pos, has_gauss, cached = np.random.get_state()
        states["numpy"] = {
            "bit_generator": name,
            "state": [int(k) for k in keys],
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "cached_gaussian": float(cached),
        }
    states["torch"] = {"initial_seed": torch.initial_seed(), "state_b64": _b64(torch.get_rng_state())}
    if cuda_ready():
        states["torch_cuda"] = [_b64(s) for s in torch.cuda.get_rng_state_all()]
    return states


def _torch_seeds() -> dict[str, int | str]:
    seeds: dict[str, int | str] = {"torch": torch.initial_seed()}
    if cuda_ready():
        seeds["torch_cuda"] = torch.cuda.initial_seed()
    return seeds


def _b64(state: torch.Tensor) -> str:
    return base64.b64encode(bytes(state.cpu().tolist())).decode("ascii")


def _json(value: Any) -> bytes:
    return json.dumps(value, sort_keys=True, default=str).encode()
