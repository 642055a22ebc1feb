"""What a triage cost: CPU, GPU and wall seconds of its replays, by phase, and the budget that caps it.

Each replay's CPU seconds are the user plus system time of its whole process tree, read with
``wait4`` when the sandbox's child ends (`flaketriage.process.child`); a container's are not
measured (counted in ``unmeasured``, as 0). Its GPU seconds are its wall time times the GPUs it was
given: a bundle captured on GPUs gets the runner's GPUs, any other bundle none, so on a machine with
no GPU they are 0. The wall seconds are the replays' own, without materializing or building
environments (in the service, a replay row's ``duration_s``, which includes copying its workspace).

A budget (``FLAKETRIAGE_TRIAGE_BUDGET_S``, ``flaketriage triage --budget``) caps the CPU plus GPU
seconds of a triage's replays, what a user pays for on metered machines. It is checked before each
replay starts, so a triage spends at most one replay (in the service, one batch of them) beyond it;
a triage that runs out stops replaying and ends undecided with the evidence so far.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from flaketriage.errors import BudgetSpentError
from flaketriage.process.child import ProcessResult

PHASES = ("verdict", "order", "minimize")
"""The verdict's isolated replays, the polluter (or state-setter) search, and minimization."""


@dataclass(frozen=True)
class RunCost:
    """One replay's cost."""

    cpu_s: float | None
    """None: the sandbox could not measure it."""
    gpu_s: float
    wall_s: float

    @classmethod
    def of(cls, process: ProcessResult, gpus: int) -> RunCost:
        """The cost of `process`, a run given `gpus` GPUs."""
        return cls(cpu_s=process.cpu_s, gpu_s=process.duration_s * gpus, wall_s=process.duration_s)


@dataclass
class PhaseCost:
    """The replays of one phase of a triage, added up."""

    runs: int = 0
    cpu_s: float = 0.0
    gpu_s: float = 0.0
    wall_s: float = 0.0
    unmeasured: int = 0
    """Runs whose CPU seconds the sandbox could not measure (counted as 0)."""

    def add(self, run: RunCost) -> None:
        self.runs += 1
        self.cpu_s += run.cpu_s or 0.0
        self.gpu_s += run.gpu_s
        self.wall_s += run.wall_s
        self.unmeasured += run.cpu_s is None

    def merged(self, other: PhaseCost) -> PhaseCost:
        return PhaseCost(
            runs=self.runs + other.runs,
            cpu_s=self.cpu_s + other.cpu_s,
            gpu_s=self.gpu_s + other.gpu_s,
            wall_s=self.wall_s + other.wall_s,
            unmeasured=self.unmeasured + other.unmeasured,
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "runs": self.runs,
            "cpu_s": self.cpu_s,
            "gpu_s": self.gpu_s,
            "wall_s": self.wall_s,
            "unmeasured": self.unmeasured,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> PhaseCost:
        return cls(
            runs=data["runs"],
            cpu_s=data["cpu_s"],
            gpu_s=data["gpu_s"],
            wall_s=data["wall_s"],
            unmeasured=data.get("unmeasured", 0),
        )


def _phases() -> dict[str, PhaseCost]:
    return {name: PhaseCost() for name in PHASES}


@dataclass
class TriageCost:
    """A triage's cost by phase, its budget, and whether the budget stopped it."""

    phases: dict[str, PhaseCost] = field(default_factory=_phases)
    gpus: int = 0
    """The GPUs each replay was given (0: none, or no GPU on the runner)."""
    budget_s: float | None = None
    budget_spent: bool = False
    """The budget ran out before the triage was done: it stopped replaying there."""

    def _total(self) -> PhaseCost:
        total = PhaseCost()
        for phase in self.phases.values():
            total = total.merged(phase)
        return total

    @property
    def runs(self) -> int:
        return self._total().runs

    @property
    def cpu_s(self) -> float:
        return self._total().cpu_s

    @property
    def gpu_s(self) -> float:
        return self._total().gpu_s

    @property
    def wall_s(self) -> float:
        return self._total().wall_s

    @property
    def paid_s(self) -> float:
        """What the budget counts: CPU plus GPU seconds."""
        total = self._total()
        return total.cpu_s + total.gpu_s

    def add(self, phase: str, run: RunCost) -> None:
        self.phases.setdefault(phase, PhaseCost()).add(run)

    def over_budget(self) -> bool:
        return self.budget_s is not None and self.paid_s >= self.budget_s

    def line(self) -> str:
        """The cost in one line, for the CLI and reports."""
        total = self._total()
        gpu = f"{total.gpu_s:.1f} GPU s" if self.gpus else "0 GPU s (no GPU given)"
        parts = [f"{total.cpu_s:.1f} CPU s", gpu, f"{total.wall_s:.1f} s of replays ({total.runs} runs"]
        by_phase = ", ".join(f"{n} {p.runs}" for n, p in self.phases.items() if p.runs)
        text = ", ".join(parts) + (f": {by_phase})" if by_phase else ")")
        if total.unmeasured:
            text += f"; CPU not measured for {total.unmeasured} runs (containers)"
        if self.budget_s is not None:
            spent = "spent, triage stopped" if self.budget_spent else "not spent"
            text += f"; budget {self.budget_s:g} CPU+GPU s {spent}"
        return text

    def to_json(self) -> dict[str, Any]:
        total = self._total()
        return {
            **total.to_json(),
            "gpus": self.gpus,
            "budget_s": self.budget_s,
            "budget_spent": self.budget_spent,
            "phases": {name: phase.to_json() for name, phase in self.phases.items()},
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> TriageCost:
        """The cost `to_json` wrote (the totals are derived, so they are not read)."""
        return cls(
            phases={name: PhaseCost.from_json(p) for name, p in data["phases"].items()},
            gpus=data["gpus"],
            budget_s=data["budget_s"],
            budget_spent=data["budget_spent"],
        )


class CostMeter:
    """Counts a replayer's runs into the phase under way and guards the budget.

    One per triage (its `Replayer`'s), never shared between threads.
    """

    def __init__(self, budget_s: float | None = None, gpus: int = 0) -> None:
        self.cost = TriageCost(gpus=gpus, budget_s=budget_s)
        self.phase = "verdict"

    @contextlib.contextmanager
    def during(self, phase: str) -> Iterator[None]:
        """Count the runs made inside into `phase`."""
        before, self.phase = self.phase, phase
        try:
            yield
        finally:
            self.phase = before

    def record(self, run: RunCost) -> None:
        self.cost.add(self.phase, run)

    def exhausted(self) -> bool:
        """Whether the budget is spent; once it is, the cost says so."""
        if self.cost.over_budget():
            self.cost.budget_spent = True
        return self.cost.budget_spent

    def check(self) -> None:
        """Raise `BudgetSpentError` when no further replay may start."""
        if self.exhausted():
            c = self.cost
            raise BudgetSpentError(
                f"the triage budget of {c.budget_s:g} CPU+GPU seconds is spent ({c.paid_s:.1f} s over "
                f"{c.runs} replays); raise FLAKETRIAGE_TRIAGE_BUDGET_S (or --budget) to go further"
            )
