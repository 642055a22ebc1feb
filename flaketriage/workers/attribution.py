"""Hardware attribution: does a failure reproduce only on runners like the one it was captured on?

A runner is a host and its GPUs (`RunnerIdentity`); its id is the host name plus a short digest of
its GPUs' UUIDs, so the same machine has the same id in every worker process and a GPU swapped out
makes a new runner. A runner *matches* the original when it is the same host, or has the same GPU
models on the same driver.

After the sequential test decides, the replays that reproduced or passed are split by runner into
those matching the original and the others (2 × 2: reproduced / passed, matching / elsewhere). The
failure is ``environment_specific`` when it reproduced on one side only and a one-sided Fisher
exact test says that split is unlikely to be chance (p ≤ ``alpha``, the verdict's own error
bound). In plain numbers, at the default alpha of 5%: 5 reproductions of 5 on matching runners
against 0 of 4 elsewhere gives p = 1/126 ≈ 0.8%, environment-specific; 3 of 6 against 0 of 4 (a
50% flake that happened to miss) gives p ≈ 17%, not. The same test read the other way finds a
failure that reproduces only away from the original hardware. It needs replays on both sides:
one machine (``flaketriage triage`` on a laptop) never gives this verdict.
"""

from __future__ import annotations

import hashlib
import math
import socket
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from flaketriage.bundle.manifest import Hardware
from flaketriage.workers.gpus import RunnerGPUs, runner_gpus
from flaketriage.workers.verdict import Outcome

Side = Literal["original", "elsewhere"]


@dataclass(frozen=True)
class GPUIdentity:
    name: str
    uuid: str | None = None


@dataclass(frozen=True)
class RunnerIdentity:
    """A machine that replays run on (or the one a failure was captured on)."""

    host: str
    gpus: tuple[GPUIdentity, ...] = ()
    driver: str | None = None

    @property
    def id(self) -> str:
        """``host``, or ``host/gpu-<digest>`` with GPUs: a digest of their UUIDs (else of their
        names), so that eight GPUs do not make an id hundreds of characters long."""
        if not self.gpus:
            return self.host
        parts = sorted(g.uuid or f"{i}:{g.name}" for i, g in enumerate(self.gpus))
        digest = hashlib.sha256("\n".join(parts).encode()).hexdigest()[:10]
        return f"{self.host}/gpu-{digest}"

    def describe(self) -> str:
        """``host (2 × NVIDIA H100, driver 550.54)``: the id's meaning, for a report."""
        if not self.gpus:
            return self.host
        models: dict[str, int] = {}
        for g in self.gpus:
            models[g.name] = models.get(g.name, 0) + 1
        listed = ", ".join(f"{n} × {name}" for name, n in models.items())
        return f"{self.host} ({listed}{f', driver {self.driver}' if self.driver else ''})"

    def matches(self, other: RunnerIdentity) -> bool:
        """Same host, or the same GPU models (as a multiset) on the same driver."""
        if self.host and self.host == other.host:
            return True
        if not self.gpus or not other.gpus or not self.driver or self.driver != other.driver:
            return False
        return sorted(g.name for g in self.gpus) == sorted(g.name for g in other.gpus)

    @classmethod
    def of_hardware(cls, hardware: Hardware, fallback_host: str | None = None) -> RunnerIdentity:
        """The runner a manifest's hardware describes (the original runner of a bundle)."""
        return cls(
            host=hardware.host or fallback_host or "unknown",
            gpus=tuple(GPUIdentity(g.name, g.uuid) for g in sorted(hardware.gpus, key=lambda g: g.index)),
            driver=hardware.driver_version,
        )

    @classmethod
    def local(cls, gpus: RunnerGPUs | None = None, *, host: str | None = None) -> RunnerIdentity:
        """This machine: its host name (or `host`: ``FLAKETRIAGE_RUNNER_HOST``, e.g. a Kubernetes
        node's name where the host name is the pod's), and its GPUs and driver (`gpus`, else read
        as capture reads them: NVML, else nvidia-smi)."""
        found = gpus if gpus is not None else runner_gpus()
        return cls(
            host=host or socket.gethostname() or "unknown",
            gpus=tuple(GPUIdentity(g.name, g.uuid) for g in sorted(found.gpus, key=lambda g: g.index)),
            driver=found.driver_version,
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "host": self.host,
            "gpus": [{"name": g.name, "uuid": g.uuid} for g in self.gpus],
            "driver": self.driver,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> RunnerIdentity:
        return cls(
            host=str(data["host"]),
            gpus=tuple(GPUIdentity(str(g["name"]), g.get("uuid")) for g in data.get("gpus", ())),
            driver=data.get("driver"),
        )


@dataclass(frozen=True)
class RunnerTally:
    """What the replays on one runner did."""

    runner: str
    matches_original: bool
    reproductions: int = 0
    passes: int = 0

    def to_json(self) -> dict[str, Any]:
        return {
            "runner": self.runner,
            "matches_original": self.matches_original,
            "reproductions": self.reproductions,
            "passes": self.passes,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> RunnerTally:
        return cls(
            runner=data["runner"],
            matches_original=data["matches_original"],
            reproductions=data["reproductions"],
            passes=data["passes"],
        )


@dataclass(frozen=True)
class Attribution:
    """The replays by runner, and whether they make the failure environment-specific."""

    original: str
    """The id of the runner the failure was captured on."""
    runners: tuple[RunnerTally, ...]
    specific: bool
    side: Side | None
    """Where it reproduced when specific: on runners matching the original, or only elsewhere."""
    p_value: float

    @property
    def suspects(self) -> list[str]:
        """The runners it reproduced on, when it reproduced only on one side: the ones to look at."""
        if not self.specific:
            return []
        return [t.runner for t in self.runners if t.reproductions]

    def lines(self) -> list[str]:
        """One Markdown-safe line per runner, for the report."""
        out = []
        for t in self.runners:
            kind = "matches the original runner" if t.matches_original else "another runner"
            out.append(f"{t.runner} ({kind}): reproduced {t.reproductions}, passed {t.passes}")
        return out

    def to_json(self) -> dict[str, Any]:
        return {
            "original": self.original,
            "runners": [t.to_json() for t in self.runners],
            "specific": self.specific,
            "side": self.side,
            "p_value": self.p_value,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Attribution:
        return cls(
            original=data["original"],
            runners=tuple(RunnerTally.from_json(t) for t in data["runners"]),
            specific=data["specific"],
            side=data["side"],
            p_value=data["p_value"],
        )


def tally(
    replays: Iterable[tuple[str | None, str | None]],
    original: RunnerIdentity,
    identities: Mapping[str, RunnerIdentity],
) -> list[RunnerTally]:
    """Count ``(runner id, outcome)`` pairs by runner: reproductions and passes only (the other
    outcomes say nothing about where it fails). A runner with no known identity matches the
    original only when its id is the original's."""
    counts: dict[str, list[int]] = {}
    for runner, outcome in replays:
        if runner is None or outcome not in (Outcome.REPRODUCED, Outcome.PASSED):
            continue
        entry = counts.setdefault(runner, [0, 0])
        entry[0 if outcome == Outcome.REPRODUCED else 1] += 1
    tallies = []
    for runner, (reproduced, passed) in sorted(counts.items()):
        identity = identities.get(runner)
        matches = original.matches(identity) if identity is not None else runner == original.id
        tallies.append(RunnerTally(runner, matches, reproduced, passed))
    return tallies


def attribute(original: RunnerIdentity, tallies: Sequence[RunnerTally], alpha: float) -> Attribution:
    """Whether the replays in `tallies` make the failure environment-specific at level `alpha`."""
    here = [t for t in tallies if t.matches_original]
    away = [t for t in tallies if not t.matches_original]
    here_failed, here_passed = sum(t.reproductions for t in here), sum(t.passes for t in here)
    away_failed, away_passed = sum(t.reproductions for t in away), sum(t.passes for t in away)
    side: Side | None = None
    p_value = 1.0
    if here_failed and not away_failed and away_passed:
        side, p_value = "original", fisher_one_sided(here_failed, here_passed, away_failed, away_passed)
    elif away_failed and not here_failed and here_passed:
        side, p_value = "elsewhere", fisher_one_sided(away_failed, away_passed, here_failed, here_passed)
    specific = side is not None and p_value <= alpha
    return Attribution(
        original=original.id,
        runners=tuple(tallies),
        specific=specific,
        side=side if specific else None,
        p_value=p_value,
    )


def fisher_one_sided(a: int, b: int, c: int, d: int) -> float:
    """P(X >= a) for the 2 × 2 table [[a, b], [c, d]] with its margins fixed (X hypergeometric):
    how likely chance alone puts at least `a` of the a + c failures in the first row. Exact, in
    integers."""
    n_row, k_fail, total = a + b, a + c, a + b + c + d
    denominator = math.comb(total, n_row)
    numerator = sum(
        math.comb(k_fail, x) * math.comb(total - k_fail, n_row - x) for x in range(a, min(n_row, k_fail) + 1)
    )
    return numerator / denominator
