"""Order-dependent tests: the earlier tests (polluters) that make a test fail, found by delta debugging.

A test that failed in its suite but passes alone may depend on what an earlier test left behind (a
module global, a file, an environment variable). iDFlakies calls the earlier test a *polluter* and the
failing one its *victim*. The search replays ``pytest P... NODEID`` for subsets P of the tests that
ran before the victim, in their original order, and reduces them with `SubsetReducer` (culprits by
binary search over prefixes, ddmin when the victim breaks monotonicity): one polluter among n
preceding tests costs about log2(n) + 1 replays, where plain ddmin pays more
(``bench/polluters.py``). The victim's failure counts only when its own summary
lines carry the original fingerprint; other tests of the run may fail as they like.

Two more shapes of the same question. A *non-idempotent* test fails on its second run in one
process: its own earlier run is a candidate like any other test (a test listed twice, or a
pytest-repeat id such as ``test_x[2-2]`` whose ``test_x[1-2]`` ran first), and a search that ends
with only the test itself names it ("fails when run twice in one process"). pytest runs a node id
named twice on its command line once, so such replays hand the order to the replay's
``flaketriage_order`` plugin (`ORDER_PLUGIN`). A *brittle* test fails alone and passes after a
*state-setter*: when it fails alone every time, the same reduction with the predicate turned round
(the victim passes after the set) finds the smallest set of the session's other tests it needs.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

from flaketriage.bundle.manifest import Manifest
from flaketriage.failure.fingerprint import pytest_failure_info
from flaketriage.failure.normalize import strip_ansi
from flaketriage.failure.tracebacks import parse_pytest_failures
from flaketriage.process.child import ProcessResult
from flaketriage.workers.minimize.reducer import SubsetReducer
from flaketriage.workers.replay import Replayer, Variant

T = TypeVar("T")

Progress = Callable[[str], None]

ORDER_PLUGIN = "flaketriage_order"
"""The pytest plugin (``workers/sitecustomize/flaketriage_order.py``, on every replay's
``PYTHONPATH``) that runs the collected tests in the order `ORDER_ENV` gives, repeats included."""
ORDER_ENV = "FLAKETRIAGE_TEST_ORDER"

SETTER_TIMEOUT_S = 600.0
"""The least time a replay of the session's later tests gets: the capture saw them collected, not
run, so nothing says how long they take."""

# pytest-repeat's ids: ``test_x[2-3]``, or ``test_x[a-2-3]`` for a parametrized test.
_REPEAT_ID = re.compile(r"^(?P<base>.*?)(?:\[(?P<alone>\d+-\d+)\]|-(?P<param>\d+-\d+)\])$")
_SUMMARY_HEADER = re.compile(r"^=+ short test summary info =+[ \t\r]*$", re.MULTILINE)


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
    following: tuple[str, ...] = ()
    """The tests the session collected after it: with `preceding`, the state-setter candidates."""
    plugins: str = ""
    """``PYTEST_PLUGINS`` as recorded: an ordered replay adds `ORDER_PLUGIN` to it."""

    @classmethod
    def of(cls, manifest: Manifest) -> OrderTarget | None:
        """The target of a test bundle that recorded the other tests of its session, else None.

        The test's own earlier run stays among the preceding tests: a test that fails when it runs
        a second time is its own polluter.
        """
        run = manifest.pytest
        if manifest.kind != "test" or run is None or not (run.preceding or run.following):
            return None
        argv = tuple(manifest.command.argv)
        if run.node_id not in argv:
            return None  # a rerun command this search cannot put earlier tests into
        preceding = tuple(dict.fromkeys(run.preceding))
        return cls(
            nodeid=run.node_id,
            preceding=preceding,
            argv=argv,
            position=argv.index(run.node_id),
            elapsed_s=run.elapsed_s,
            following=tuple(
                t for t in dict.fromkeys(run.following) if t not in preceding and t != run.node_id
            ),
            plugins=str(manifest.command.env.get("PYTEST_PLUGINS", "")),
        )

    def argv_with(self, tests: Sequence[str], options: Sequence[str] = ()) -> list[str]:
        """The rerun command with ``tests`` run first, in the order given, and ``options`` added
        where pytest reads them last among the options (so they win over the recorded ones):
        at the end, or just before a ``--`` that ends the options."""
        argv = [*self.argv[: self.position], *tests, *self.argv[self.position :]]
        cut = argv.index("--") if "--" in argv else len(argv)
        return [*argv[:cut], *options, *argv[cut:]]

    def variant_with(self, tests: Sequence[str], options: Sequence[str] = ()) -> Variant:
        """The replay of ``tests`` then the victim. When the victim is among ``tests`` (its own
        earlier run), pytest would run it once: the order goes to `ORDER_PLUGIN` instead."""
        argv = self.argv_with(tests, options)
        if self.nodeid not in tests:
            return Variant(argv=argv)
        plugins = ",".join(p for p in (self.plugins, ORDER_PLUGIN) if p)
        return Variant(
            argv=argv, env={"PYTEST_PLUGINS": plugins, ORDER_ENV: json.dumps([*tests, self.nodeid])}
        )

    def is_itself(self, test: str) -> bool:
        """Whether ``test`` is the victim's own run: the same id, or another repetition of it
        under pytest-repeat (``--count``)."""
        if test == self.nodeid:
            return True
        if not any(a == "--count" or a.startswith("--count=") for a in self.argv):
            return False
        return repeat_base(test) == repeat_base(self.nodeid) != test


def repeat_base(nodeid: str) -> str:
    """The node id without pytest-repeat's ``i-N`` part (``t.py::test_x[a-2-3]`` → ``t.py::test_x[a]``)."""
    match = _REPEAT_ID.match(nodeid)
    if match is None:
        return nodeid
    return match.group("base") + ("]" if match.group("param") else "")


def fails_in(process: ProcessResult, nodeid: str, fingerprint: str) -> bool:
    """Whether ``nodeid`` failed in this pytest run the way the captured failure did."""
    tests = parse_pytest_failures(process.stdout) or parse_pytest_failures(process.stderr)
    own = [t for t in tests if t.nodeid == nodeid]
    return bool(own) and pytest_failure_info(own, process.exit_code).as_of(fingerprint) is not None


def passes_in(process: ProcessResult, nodeid: str) -> bool:
    """Whether ``nodeid`` ran and passed in this pytest run (its ``PASSED`` line under ``-rA``):
    a test that was never collected has no failure line either, and must not count as a pass."""
    for text in (process.stdout, process.stderr):
        text = strip_ansi(text)
        headers = list(_SUMMARY_HEADER.finditer(text))
        if not headers:
            continue
        lines = text[headers[-1].end() :].splitlines()
        passed = any(line.rstrip() == f"PASSED {nodeid}" for line in lines)
        failed = any(f.nodeid == nodeid for f in parse_pytest_failures(text))
        return passed and not failed
    return False


def find_polluters(preceding: Sequence[T], fails: Callable[[Sequence[T]], bool]) -> tuple[list[T], int]:
    """A 1-minimal subsequence of ``preceding`` after which the victim fails, and the calls it took.

    ``fails(tests)`` runs ``tests`` then the victim; all of ``preceding`` is known to fail and none
    of it (the victim alone) to pass, so neither costs a call. The same search finds a brittle
    test's state-setters with ``fails`` turned round (the victim passes after ``tests``).
    """
    calls = 0

    def predicate(tests: Sequence[T]) -> bool:
        nonlocal calls
        if not tests:
            return False
        calls += 1
        return fails(tests)

    # confirm: a suite is no monotone predicate (a later test can undo what an earlier one left
    # behind, as six's tests do with sys.modules), so each culprit's removal is asked, not inferred
    # from a larger set's pass; the answer is then 1-minimal whatever the tests do.
    return SubsetReducer(predicate, confirm=True).reduce(preceding), calls


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
    kind: Literal["polluters", "setters"] = "polluters"
    """``setters``: the victim fails alone and `polluters` holds the tests it needs to run first
    (``reproduced_in_order`` then says it passed after all the candidates)."""
    itself: bool = False
    """The only polluter is the victim's own earlier run: it fails when run twice in one process."""

    @property
    def found(self) -> bool:
        """Tests found, and they had the same effect on the victim on every confirmation run."""
        return bool(self.polluters) and self.confirmations == self.confirm_runs

    def cause(self) -> str:
        """One line that says what the order does to the test, for issues, quarantines and replies."""
        names = ", ".join(self.polluters)
        if self.kind == "setters":
            return f"fails alone; passes only after {names} (state-setter: it needs what they set up)"
        if self.itself:
            return "fails when run twice in one process (its own earlier run leaves state behind)"
        return f"passes alone; fails after {names} (polluter: it leaves state behind)"

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
            "kind": self.kind,
            "itself": self.itself,
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
            # .get: searches recorded before these keys existed read back without them.
            kind=data.get("kind", "polluters"),
            itself=data.get("itself", False),
        )


@contextmanager
def _timeout_for(replayer: Replayer, target: OrderTarget, least_s: float = 0.0) -> Iterator[None]:
    # The bundle's limit was set for the victim alone; a run of the tests before it takes about
    # as long as they took in the original session.
    original = replayer.timeout_s
    replayer.timeout_s = max(original, least_s, 60.0 + 10 * target.elapsed_s)
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
        result = replayer.run(target.variant_with(tests))
        return fails_in(result.process, target.nodeid, fingerprint)

    with _timeout_for(replayer, target):
        say(f"replaying the {len(target.preceding)} tests that ran before it")
        search = _search(target.preceding, fails, "polluters", confirm_runs, say)
    itself = bool(search.polluters) and all(target.is_itself(t) for t in search.polluters)
    return dataclasses.replace(search, replays=replays, itself=itself)


def search_setters(
    replayer: Replayer, target: OrderTarget, *, confirm_runs: int, progress: Progress | None = None
) -> PolluterSearch | None:
    """For a test that fails alone: replay it after all the session's other tests once; when it
    passes there, reduce them to the state-setters it needs and confirm them with ``confirm_runs``
    more passing replays. None when the session recorded no other test."""
    candidates = [t for t in (*target.preceding, *target.following) if not target.is_itself(t)]
    if not candidates:
        return None
    replays = 0
    say = progress or (lambda _msg: None)

    def passes(tests: Sequence[str]) -> bool:
        nonlocal replays
        replays += 1
        # -rA: the victim's PASSED line is the evidence that it ran (a test that is not collected
        # has no FAILED line either).
        result = replayer.run(target.variant_with(tests, options=("-rA",)))
        return passes_in(result.process, target.nodeid)

    least = SETTER_TIMEOUT_S if target.following else 0.0
    with _timeout_for(replayer, target, least_s=least):
        say(f"replaying the test after the session's {len(candidates)} other tests")
        search = _search(candidates, passes, "setters", confirm_runs, say)
    return dataclasses.replace(search, replays=replays)


def _search(
    candidates: Sequence[str],
    holds: Callable[[Sequence[str]], bool],
    kind: Literal["polluters", "setters"],
    confirm_runs: int,
    say: Progress,
) -> PolluterSearch:
    """The search both kinds share: all of ``candidates`` first; when the victim shows the effect
    after them, their smallest subset that still shows it, confirmed ``confirm_runs`` times. Its
    ``replays`` are left to the caller, which counts every run."""
    n = len(candidates)
    if not holds(candidates):
        return PolluterSearch(preceding=n, reproduced_in_order=False, kind=kind)
    say(f"searching {n} tests for the {'state it needs' if kind == 'setters' else 'polluters'}")
    found, calls = find_polluters(candidates, holds)
    return PolluterSearch(
        preceding=n,
        reproduced_in_order=True,
        polluters=tuple(found),
        oracle_calls=calls,
        confirmations=_confirm(found, holds, confirm_runs, say),
        confirm_runs=confirm_runs,
        kind=kind,
    )


def _confirm(tests: Sequence[str], holds: Callable[[Sequence[str]], bool], runs: int, say: Progress) -> int:
    """How many of ``runs`` further replays of ``tests`` then the victim showed the effect, in a row."""
    confirmed = 0
    for _ in range(runs):
        say(f"confirming: {' '.join(tests)} then the test")
        if not holds(tests):
            break
        confirmed += 1
    return confirmed
