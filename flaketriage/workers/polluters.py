"""Order-dependent tests: the earlier tests (polluters) that make a test fail, found by delta debugging.

A test that failed in its suite but passes alone may depend on what an earlier test left behind (a
module global, a file, an environment variable). iDFlakies calls the earlier test a *polluter* and the
failing one its *victim*. The search replays ``pytest P... NODEID`` for subsets P of the tests that
ran before the victim, in their original order, and reduces them with `SubsetReducer` (culprits by
binary search over prefixes, ddmin when the victim breaks monotonicity): one polluter among n
preceding tests costs about log2(n) + 1 replays, where plain ddmin pays more
(``bench/polluters.py``). The victim's failure counts only when its own summary
lines carry the original fingerprint; other tests of the run may fail as they like.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

from flaketriage.child_process import ProcessResult
from flaketriage.fingerprint import pytest_failure_info
from flaketriage.manifest import Manifest
from flaketriage.tracebacks import parse_pytest_failures
from flaketriage.workers.replay import Replayer, Variant
from flaketriage.workers.subset_reducer import SubsetReducer

T = TypeVar("T")

Progress = Callable[[str], None]


@dataclass(frozen=True)
class OrderTarget:
    """A captured test and the tests that ran before it, with the command to rerun them together."""

    nodeid: str
    preceding: tuple[str, ...]
    argv: tuple[str, ...]
    position: int
    """Where `nodeid` sits in `argv`; preceding tests are inserted just before it."""
    elapsed_s: float = 0.0
    """How long the original session ran up to the end of this test."""

    @classmethod
    def of(cls, manifest: Manifest) -> OrderTarget | None:
        """The target of a test bundle that recorded preceding tests, else None."""
        run = manifest.pytest
        if manifest.kind != "test" or run is None or not run.preceding:
            return None
        argv = tuple(manifest.command.argv)
        if run.node_id not in argv:
            return None  # a rerun command this search cannot put earlier tests into
        return cls(
            nodeid=run.node_id,
            preceding=tuple(dict.fromkeys(t for t in run.preceding if t != run.node_id)),
            argv=argv,
            position=argv.index(run.node_id),
            elapsed_s=run.elapsed_s,
        )

    def argv_with(self, tests: Sequence[str]) -> list[str]:
        """The rerun command with ``tests`` run first, in the order given."""
        return [*self.argv[: self.position], *tests, *self.argv[self.position :]]


def fails_in(process: ProcessResult, nodeid: str, fingerprint: str) -> bool:
    """Whether ``nodeid`` failed in this pytest run the way the captured failure did."""
    tests = parse_pytest_failures(process.stdout) or parse_pytest_failures(process.stderr)
    own = [t for t in tests if t.nodeid == nodeid]
    return bool(own) and pytest_failure_info(own, process.exit_code).fingerprint == fingerprint


def find_polluters(preceding: Sequence[T], fails: Callable[[Sequence[T]], bool]) -> tuple[list[T], int]:
    """A 1-minimal subsequence of ``preceding`` after which the victim fails, and the calls it took.

    ``fails(tests)`` runs ``tests`` then the victim; all of ``preceding`` is known to fail and none
    of it (the victim alone) to pass, so neither costs a call.
    """
    calls = 0

    def predicate(tests: Sequence[T]) -> bool:
        nonlocal calls
        if not tests:
            return False
        calls += 1
        return fails(tests)

    return SubsetReducer(predicate).reduce(preceding), calls


@dataclass(frozen=True)
class PolluterSearch:
    """What the search found, and what it cost."""

    preceding: int
    reproduced_in_order: bool
    """The full original order made the victim fail again (else there was nothing to search)."""
    polluters: tuple[str, ...] = ()
    oracle_calls: int = 0
    """Replays the reduction itself made."""
    confirmations: int = 0
    """Further replays of polluters + victim that reproduced, in a row."""
    confirm_runs: int = 0
    replays: int = 0
    """Every replay of the search: the full order, the reduction and the confirmation."""

    @property
    def found(self) -> bool:
        """Polluters found, and they made the victim fail on every confirmation run."""
        return bool(self.polluters) and self.confirmations == self.confirm_runs

    def to_json(self) -> dict[str, Any]:
        """A JSON object that `from_json` turns back into an equal search."""
        return {
            "preceding": self.preceding,
            "reproduced_in_order": self.reproduced_in_order,
            "polluters": list(self.polluters),
            "oracle_calls": self.oracle_calls,
            "confirmations": self.confirmations,
            "confirm_runs": self.confirm_runs,
            "replays": self.replays,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> PolluterSearch:
        """The search `to_json` wrote."""
        return cls(
            preceding=data["preceding"],
            reproduced_in_order=data["reproduced_in_order"],
            polluters=tuple(data["polluters"]),
            oracle_calls=data["oracle_calls"],
            confirmations=data["confirmations"],
            confirm_runs=data["confirm_runs"],
            replays=data["replays"],
        )


@contextmanager
def _timeout_for(replayer: Replayer, target: OrderTarget) -> Iterator[None]:
    # The bundle's limit was set for the victim alone; a run of the tests before it takes about
    # as long as they took in the original session.
    original = replayer.timeout_s
    replayer.timeout_s = max(original, 60.0 + 10 * target.elapsed_s)
    try:
        yield
    finally:
        replayer.timeout_s = original


def search_polluters(
    replayer: Replayer, target: OrderTarget, *, confirm_runs: int, progress: Progress | None = None
) -> PolluterSearch:
    """Replay the original order once; when the victim fails again, reduce it to the polluters and
    confirm them with ``confirm_runs`` more replays (they must all reproduce)."""
    fingerprint = replayer.manifest.failure.fingerprint
    replays = 0
    say = progress or (lambda _msg: None)

    def fails(tests: Sequence[str]) -> bool:
        nonlocal replays
        replays += 1
        result = replayer.run(Variant(argv=target.argv_with(tests)))
        return fails_in(result.process, target.nodeid, fingerprint)

    n = len(target.preceding)
    with _timeout_for(replayer, target):
        say(f"replaying the {n} tests that ran before it")
        if not fails(target.preceding):
            return PolluterSearch(preceding=n, reproduced_in_order=False, replays=replays)
        say(f"searching {n} preceding tests for polluters")
        polluters, calls = find_polluters(target.preceding, fails)
        confirmed = 0
        for _ in range(confirm_runs):
            say(f"confirming: {' '.join(polluters)} then the test")
            if not fails(polluters):
                break
            confirmed += 1
    return PolluterSearch(
        preceding=n,
        reproduced_in_order=True,
        polluters=tuple(polluters),
        oracle_calls=calls,
        confirmations=confirmed,
        confirm_runs=confirm_runs,
        replays=replays,
    )
