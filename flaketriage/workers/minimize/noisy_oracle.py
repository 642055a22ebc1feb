"""Deciding whether a minimization candidate still fails when a run reproduces only sometimes.

A reproduction is proof (its fingerprint matches), so a candidate fails at its first one. A pass is
never proof: it only says the failure did not show in so many clean runs. Wrong answers can only be
one kind, then: a candidate that really fails taken for one that passes. In the culprit search such
a mistake costs no correctness, only work: the search keeps an item it could have dropped, and a
confirmation pass at the end asks, for each item kept, whether the set without it passes, with
enough clean runs that a mistake there is rare (``error`` over the items kept). An item whose
removal reproduces is dropped (proof again). So the search runs cheaply (`search_runs`, a 10%
chance of a wrong pass per question) and only the final answer pays for certainty
(`confirm_runs`).

How many clean runs make a pass comes from the evidence about the rate: the verdict's replays and
then every run of a candidate that failed (each such run could have reproduced, and a share did).
With k reproductions in n such runs, the rate is taken at its one-sided lower Clopper–Pearson bound
at ``1 - error/2``, never at the point estimate: a failure called deterministic after 5 of 5
replays is not certainly deterministic (a 70% flake does that 17% of the time).

A failure that has reproduced on every run so far is **trusted** (`trusted`): one run answers a
question, for that is all a deterministic failure needs, and the answer is checked where a miss
could have made it wrong, at `TRUST_CHECK_RUNS` runs a check. A check that reproduces where the
search had seen a pass is a miss caught (`missed`): from then on the failure is flaky, trusted no
more, and questions get the runs above. What trust costs is measured rather than bounded: a 70%
flake (trusted in the 17% of trials where it passed its verdict 5 of 5) was minimized exactly in 993
of 1,000 trials of ``bench/minimize.py``, since a miss it makes is caught by a check 91% of the time.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from flaketriage.errors import MinimizeError
from flaketriage.workers.verdict import MAX_CLEAN_RUNS, clopper_pearson

DEFAULT_ERROR = 0.01
"""The accepted chance that a minimal set is not exactly right (1 trial in 100)."""
SEARCH_ERROR = 0.1
"""The accepted chance that one question of the search takes a failing candidate for a passing one:
it costs work (the item is kept until the confirmation drops it), never the answer."""
TRUST_CHECK_RUNS = 2
"""Runs of a check while the failure is trusted: a miss left in the answer shows in one run with
the failure's own rate (70% for a 70% flake), so two leave 9% of them uncaught."""


class NoisyOracle:
    """``fails(run, runs)`` decides one candidate: ``run()`` replays it once and says whether it
    reproduced; `search_runs` and `confirm_runs` say how many clean runs make a pass."""

    def __init__(self, reproductions: int, trials: int, *, error: float = DEFAULT_ERROR) -> None:
        if reproductions <= 0:
            raise MinimizeError("cannot minimize a failure that never reproduced; triage it first")
        if not 0 < error < 1:
            raise MinimizeError(f"the accepted error of a minimization must be in (0, 1); got {error}")
        self.reproductions = reproductions
        self.trials = max(trials, reproductions)
        self.error = error
        self.runs = 0

    @property
    def trusted(self) -> bool:
        """Every run of something that held the cause reproduced, and no miss was caught."""
        return self.reproductions == self.trials

    @property
    def low_rate(self) -> float:
        """The lowest reproduction rate the evidence allows (one-sided, at 1 - error/2)."""
        low, _ = clopper_pearson(self.reproductions, self.trials, 1.0 - self.error)
        return low

    def _runs_for(self, miss: float) -> int:
        low = self.low_rate
        if low >= 1.0:
            return 1
        if low <= 0.0:
            return MAX_CLEAN_RUNS
        return max(1, min(MAX_CLEAN_RUNS, math.ceil(math.log(miss) / math.log1p(-low))))

    @property
    def search_runs(self) -> int:
        """Clean runs before a search question counts as passing (one while `trusted`)."""
        return 1 if self.trusted else self._runs_for(SEARCH_ERROR)

    def confirm_runs(self, items: int) -> int:
        """Clean runs before a confirmation question counts as passing, for a set of `items`
        (`TRUST_CHECK_RUNS` while `trusted`)."""
        return TRUST_CHECK_RUNS if self.trusted else self._runs_for((self.error / 2.0) / max(1, items))

    def fails(self, run: Callable[[], bool], runs: int) -> bool:
        """Replay the candidate until it reproduces (fails) or `runs` pass in a row."""
        for attempt in range(1, runs + 1):
            self.runs += 1
            if run():
                # A candidate that failed held the cause: its runs are evidence about the rate.
                self.reproductions += 1
                self.trials += attempt
                return True
        return False

    def missed(self) -> None:
        """A run that did not reproduce although its candidate held the cause (a check reproduced
        where the search had seen a pass): the failure is flaky, and its rate says so."""
        self.trials += 1
