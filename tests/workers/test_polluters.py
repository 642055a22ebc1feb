"""The polluter search: delta debugging over the tests that ran before a victim, with simulated runs."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any, cast

from hypothesis import given, settings
from hypothesis import strategies as st

from flaketriage.child_process import ProcessResult
from flaketriage.fingerprint import fingerprint_failure
from flaketriage.manifest import Command, Failure, Manifest, PytestContext
from flaketriage.workers.polluters import OrderTarget, fails_in, find_polluters, search_polluters
from flaketriage.workers.replay import Replayer, ReplayResult, Variant
from flaketriage.workers.triage import SequentialReplays, decide_order
from flaketriage.workers.verdict import Outcome, VerdictPolicy

VICTIM = "tests/test_z.py::test_victim"
HEADER = "=========================== short test summary info ============================"
VICTIM_LINE = f"FAILED {VICTIM} - AssertionError: left behind: {{'dirty': True}}"


def _info_of(*lines: str) -> Any:
    info = fingerprint_failure(exit_code=1, stdout="\n".join([HEADER, *lines]), stderr="")
    assert info is not None
    return info


FINGERPRINT = _info_of(VICTIM_LINE).fingerprint


def _manifest(
    make_manifest: Callable[..., Manifest], preceding: Sequence[str], elapsed_s: float = 0.0
) -> Manifest:
    info = _info_of(VICTIM_LINE)
    return make_manifest(
        kind="test",
        command=Command(argv=("python", "-m", "pytest", VICTIM, "-p", "no:randomly"), cwd="/work/p"),
        failure=Failure(kind="test", test_id=VICTIM, fingerprint=info.fingerprint, signature=info.signature),
        pytest=PytestContext(
            node_id=VICTIM,
            preceding=tuple(preceding),
            rootdir="/work/p",
            invocation_dir="/work/p",
            elapsed_s=elapsed_s,
        ),
    )


# -- the reduction ---------------------------------------------------------------------------------
def test_one_polluter_among_many() -> None:
    tests = [f"t.py::test_{i}" for i in range(200)]
    found, calls = find_polluters(tests, lambda ran: "t.py::test_137" in ran)
    assert found == ["t.py::test_137"]
    assert calls <= 2 * math.log2(200) + 5


def test_two_polluters_needed_together_keep_their_order() -> None:
    tests = [f"t.py::test_{i}" for i in range(50)]
    found, _ = find_polluters(tests, lambda ran: "t.py::test_40" in ran and "t.py::test_3" in ran)
    assert found == ["t.py::test_3", "t.py::test_40"]


def test_a_cleaner_between_polluter_and_victim_is_left_out() -> None:
    # test_5 pollutes, test_7 cleans up after it: the full order fails only because test_9 pollutes
    # again after the cleaner. Not monotone; the answer must still fail and be 1-minimal.
    tests = [f"t.py::test_{i}" for i in range(12)]

    def fails(ran: Sequence[str]) -> bool:
        dirty = False
        for t in ran:
            dirty = t in ("t.py::test_5", "t.py::test_9") or (dirty and t != "t.py::test_7")
        return dirty

    found, _ = find_polluters(tests, fails)
    assert fails(found) and len(found) == 1


def test_the_victim_alone_is_never_run() -> None:
    ran: list[Sequence[str]] = []

    def fails(tests: Sequence[str]) -> bool:
        ran.append(tests)
        return "b" in tests

    find_polluters(["a", "b", "c"], fails)
    assert all(tests for tests in ran)
    assert ["a", "b", "c"] not in [list(t) for t in ran]  # known to fail: not run either


@settings(max_examples=60, deadline=None)
@given(data=st.data(), n=st.integers(min_value=1, max_value=2000))
def test_one_polluter_costs_at_most_2_log2_n_plus_5_runs(data: st.DataObject, n: int) -> None:
    polluter = data.draw(st.integers(min_value=0, max_value=n - 1))
    found, calls = find_polluters(list(range(n)), lambda ran: polluter in ran)
    assert found == [polluter]
    assert calls <= 2 * math.log2(max(n, 2)) + 5


# -- reading pytest's output -----------------------------------------------------------------------
def _process(*lines: str, exit_code: int = 1) -> ProcessResult:
    return ProcessResult(exit_code=exit_code, stdout="\n".join(["...", HEADER, *lines, "== 2 failed =="]),
                         stderr="", timed_out=False, duration_s=0.1)  # fmt: skip


def test_the_victims_own_summary_line_decides() -> None:
    other = "FAILED tests/test_a.py::test_pollutes - ValueError: boom"
    assert fails_in(_process(other, VICTIM_LINE), VICTIM, FINGERPRINT)
    assert not fails_in(_process(other), VICTIM, FINGERPRINT)
    assert not fails_in(_process(f"FAILED {VICTIM} - KeyError: 'x'"), VICTIM, FINGERPRINT)
    assert not fails_in(_process(exit_code=0), VICTIM, FINGERPRINT)


# -- the target and the command --------------------------------------------------------------------
def test_target_inserts_tests_before_the_victim(make_manifest: Callable[..., Manifest]) -> None:
    manifest = _manifest(make_manifest, ["tests/test_a.py::t1", "tests/test_a.py::t1", VICTIM], elapsed_s=3.5)
    target = OrderTarget.of(manifest)
    assert target is not None
    assert target.preceding == ("tests/test_a.py::t1",)  # duplicates and the victim itself dropped
    assert target.elapsed_s == 3.5
    assert target.argv_with(["x::a", "x::b"]) == [
        "python",
        "-m",
        "pytest",
        "x::a",
        "x::b",
        VICTIM,
        "-p",
        "no:randomly",
    ]


def test_no_target_without_preceding_tests_or_outside_pytest(make_manifest: Callable[..., Manifest]) -> None:
    assert OrderTarget.of(_manifest(make_manifest, [])) is None
    outside = PytestContext(node_id="a::c", preceding=("a::b",), rootdir="/p", invocation_dir="/p")
    assert OrderTarget.of(make_manifest(pytest=outside)) is None  # not a test bundle
    other_argv = _manifest(make_manifest, ["a::b"]).model_copy(
        update={"command": Command(argv=("python", "-m", "pytest", "-k", "victim"), cwd="/work/p")}
    )
    assert OrderTarget.of(other_argv) is None  # the rerun command does not name the test


# -- the search, with a simulated pytest -----------------------------------------------------------
class FakeReplayer:
    """Answers each replay like pytest would: the victim fails when `polluter` ran before it."""

    def __init__(self, manifest: Manifest, polluter: str | None, fails_alone: bool = False) -> None:
        self.manifest = manifest
        self.polluter = polluter
        self.fails_alone = fails_alone
        self.timeout_s = 60.0
        self.runs: list[list[str]] = []
        self.timeouts: list[float] = []

    def run(self, variant: Variant | None = None) -> ReplayResult:
        argv = list(variant.argv) if variant and variant.argv else list(self.manifest.command.argv)
        tests = [a for a in argv[3:] if "::" in a]
        self.runs.append(tests)
        self.timeouts.append(self.timeout_s)
        fails = self.fails_alone or (self.polluter in tests[:-1])
        process = _process(VICTIM_LINE) if fails else _process(exit_code=0)
        outcome = Outcome.REPRODUCED if fails and len(tests) == 1 else Outcome.PASSED
        return ReplayResult(outcome=outcome, failure=None, process=process)


PRECEDING = [f"tests/test_m.py::test_{i}" for i in range(30)]


def test_search_finds_confirms_and_counts(make_manifest: Callable[..., Manifest]) -> None:
    manifest = _manifest(make_manifest, PRECEDING, elapsed_s=30.0)
    target = OrderTarget.of(manifest)
    assert target is not None
    fake = FakeReplayer(manifest, polluter=PRECEDING[17])
    search = search_polluters(cast(Replayer, fake), target, confirm_runs=4)
    assert search.found and search.polluters == (PRECEDING[17],)
    assert search.reproduced_in_order and search.confirmations == 4
    assert fake.runs[0] == [*PRECEDING, VICTIM]  # the original order first
    assert fake.runs[-1] == [PRECEDING[17], VICTIM]
    assert search.replays == len(fake.runs) == 1 + search.oracle_calls + 4
    assert search.oracle_calls <= 2 * math.log2(30) + 5
    assert set(fake.timeouts) == {360.0} and fake.timeout_s == 60.0  # longer for the prefix, restored


def test_no_search_when_the_original_order_passes(make_manifest: Callable[..., Manifest]) -> None:
    manifest = _manifest(make_manifest, PRECEDING)
    target = OrderTarget.of(manifest)
    assert target is not None
    search = search_polluters(cast(Replayer, FakeReplayer(manifest, None)), target, confirm_runs=4)
    assert not search.found and not search.reproduced_in_order and search.replays == 1


def test_order_is_only_asked_after_enough_clean_runs_alone(make_manifest: Callable[..., Manifest]) -> None:
    manifest = _manifest(make_manifest, PRECEDING)
    target = OrderTarget.of(manifest)
    assert target is not None
    policy = VerdictPolicy()
    victim = FakeReplayer(manifest, polluter=PRECEDING[3])
    replays = SequentialReplays(cast(Replayer, victim), policy)
    search = decide_order(replays, target)
    assert search is not None and search.polluters == (PRECEDING[3],)
    assert victim.runs[: policy.deterministic_after] == [[VICTIM]] * policy.deterministic_after
    # A failure that reproduces alone is not an order question: no prefix is ever run.
    plain = FakeReplayer(manifest, polluter=None, fails_alone=True)
    assert decide_order(SequentialReplays(cast(Replayer, plain), policy), target) is None
    assert all(run == [VICTIM] for run in plain.runs)
