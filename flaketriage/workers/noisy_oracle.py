"""Deciding whether a minimization candidate still fails when a run reproduces only sometimes.

A reproduction is proof (its fingerprint matches), so a candidate fails at its first one. A pass is
never proof: a candidate counts as passing only after enough clean runs that the failure, at the
lowest rate the evidence still allows, would have shown. The evidence is the verdict's replays and
then every run of a candidate that failed (each such run could have reproduced, and a share did).
In numbers: with k reproductions in n such runs, the rate is taken at its one-sided lower
Clopper–Pearson bound at ``1 - error/2``, and a pass needs the smallest m with
``(1 - low)^m <= (error/2) / decisions``. The chance that a minimization with up to ``decisions``
pass decisions ends with a wrong item kept or dropped is then at most ``error``.

A failure called deterministic after 5 of 5 replays is not certainly deterministic (a 70% flake
does that 17% of the time): its low bound is 0.35, not 1, so its candidates get several clean runs
too, and the bound rises as candidates reproduce on their first run. Never one run per candidate
on a point estimate.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from flaketriage.errors import MinimizeError
from flaketriage.workers.verdict import MAX_CLEAN_RUNS, clopper_pearson

DEFAULT_ERROR = 0.01
"""The accepted chance that a minimal set is not exactly right (1 trial in 100)."""


class NoisyOracle:
    """``fails(run)`` decides one candidate: ``run()`` replays it once and says whether it reproduced."""

    def __init__(
        self, reproductions: int, trials: int, *, decisions: int, error: float = DEFAULT_ERROR
    ) -> None:
        if reproductions <= 0:
            raise MinimizeError("cannot minimize a failure that never reproduced; triage it first")
        if not 0 < error < 1:
            raise MinimizeError(f"the accepted error of a minimization must be in (0, 1); got {error}")
        self.reproductions = reproductions
        self.trials = max(trials, reproductions)
        self.decisions = max(1, decisions)
        self.error = error
        self.runs = 0

    @property
    def low_rate(self) -> float:
        """The lowest reproduction rate the evidence allows (one-sided, at 1 - error/2)."""
        if self.reproductions >= self.trials and self.trials == 0:
            return 0.0
        low, _ = clopper_pearson(self.reproductions, self.trials, 1.0 - self.error)
        return low

    @property
    def clean_runs(self) -> int:
        """Runs without a reproduction before a candidate counts as passing."""
        low = self.low_rate
        per_decision = (self.error / 2.0) / self.decisions
        if low >= 1.0:
            return 1
        if low <= 0.0:
            return MAX_CLEAN_RUNS
        return max(1, min(MAX_CLEAN_RUNS, math.ceil(math.log(per_decision) / math.log1p(-low))))

    def fails(self, run: Callable[[], bool]) -> bool:
        """Replay the candidate until it reproduces (fails) or `clean_runs` pass in a row."""
        needed = self.clean_runs
        for attempt in range(1, needed + 1):
            self.runs += 1
            if run():
                # A candidate that failed held the cause: its runs are evidence about the rate.
                self.reproductions += 1
                self.trials += attempt
                return True
        return False

    def observe(self, reproduced: bool) -> None:
        """One more replay of something known to hold the cause (the whole bundle)."""
        self.trials += 1
        self.reproductions += int(reproduced)
