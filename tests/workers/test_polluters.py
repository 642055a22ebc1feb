"""The polluter search: delta debugging over the tests that ran before a victim, with simulated runs."""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable, Sequence
from typing import Any, cast

from hypothesis import given, settings
from hypothesis import strategies as st

from flaketriage.bundle.manifest import Command, Failure, Manifest, PytestContext
from flaketriage.failure.fingerprint import fingerprint_failure
from flaketriage.process.child import ProcessResult
from flaketriage.workers.polluters import (
    ORDER_ENV,
    ORDER_PLUGIN,
    OrderTarget,
    PolluterSearch,
    fails_in,
    find_polluters,
    passes_in,
    repeat_base,
    search_polluters,
)
from flaketriage.workers.replay import Replayer, ReplayResult, Variant
from flaketriage.workers.triage import SequentialReplays, decide_order, decide_seeds, decide_setters
from flaketriage.workers.verdict import Outcome, Verdict, VerdictPolicy

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


def test_a_bare_assert_victim_captured_before_its_type_was_read_still_fails_the_same_way() -> None:
    line = f"FAILED {VICTIM} - assert 16.99 == 17.0"
    earlier = f"pytest|{VICTIM}||assert <n> == <n>"
    assert fails_in(_process(line), VICTIM, hashlib.sha256(earlier.encode()).hexdigest())


# -- the target and the command --------------------------------------------------------------------
def test_target_inserts_tests_before_the_victim(make_manifest: Callable[..., Manifest]) -> None:
    manifest = _manifest(make_manifest, ["tests/test_a.py::t1", "tests/test_a.py::t1", VICTIM], elapsed_s=3.5)
    target = OrderTarget.of(manifest)
    assert target is not None
    # Duplicates dropped; the victim's own earlier run kept: a test can be its own polluter.
    assert target.preceding == ("tests/test_a.py::t1", VICTIM)
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


# -- a test that is its own polluter, a test that fails alone (issue 21, items 3 to 5) ---------------
class OrderedFakeReplayer(FakeReplayer):
    """Like `FakeReplayer`, but reads the order the replay's ``flaketriage_order`` plugin would run,
    and runs the victim as often as it is named (pytest alone would run a repeated id once)."""

    def __init__(self, manifest: Manifest, fails_after: Callable[[list[str]], bool], alone: Outcome) -> None:
        super().__init__(manifest, None)
        self.fails_after = fails_after
        self.alone = alone
        self.variants: list[Variant | None] = []

    def run(self, variant: Variant | None = None) -> ReplayResult:
        self.variants.append(variant)
        argv = list(variant.argv) if variant and variant.argv else list(self.manifest.command.argv)
        order = json.loads(variant.env[ORDER_ENV]) if variant and variant.env else None
        tests = order or list(dict.fromkeys(a for a in argv[3:] if "::" in a))
        self.runs.append(tests)
        if len(tests) == 1:
            if self.alone is Outcome.REPRODUCED:
                return ReplayResult(outcome=self.alone, failure=None, process=_process(VICTIM_LINE))
            if self.alone is Outcome.DIFFERENT:
                other = f"FAILED {VICTIM} - ImportError: cannot import name 'x'"
                return ReplayResult(outcome=self.alone, failure=None, process=_process(other))
            return ReplayResult(outcome=self.alone, failure=None, process=_process(exit_code=0))
        if self.fails_after(tests[:-1]):
            return ReplayResult(outcome=Outcome.PASSED, failure=None, process=_process(VICTIM_LINE))
        passed = _process(f"PASSED {VICTIM}", exit_code=0) if "-rA" in argv else _process(exit_code=0)
        return ReplayResult(outcome=Outcome.PASSED, failure=None, process=passed)


def test_a_test_that_fails_on_its_second_run_is_its_own_polluter(
    make_manifest: Callable[..., Manifest],
) -> None:
    # The session ran the file twice (--keep-duplicates): the victim ran once before it failed.
    manifest = _manifest(make_manifest, [*PRECEDING[:6], VICTIM, *PRECEDING[6:12]])
    target = OrderTarget.of(manifest)
    assert target is not None and VICTIM in target.preceding
    fake = OrderedFakeReplayer(manifest, lambda before: VICTIM in before, alone=Outcome.PASSED)
    search = decide_order(SequentialReplays(cast(Replayer, fake), VerdictPolicy()), target)
    assert search is not None and search.found
    assert search.polluters == (VICTIM,) and search.itself
    assert search.cause().startswith("fails when run twice in one process")
    # Every replay that names the victim twice hands the order to the plugin, which runs it twice.
    ordered = [v for v in fake.variants if v is not None and v.env]
    assert ordered and all(v.env and v.env["PYTEST_PLUGINS"] == ORDER_PLUGIN for v in ordered)
    assert fake.runs[-1] == [VICTIM, VICTIM]


def test_a_pytest_repeat_repetition_is_the_test_itself(make_manifest: Callable[..., Manifest]) -> None:
    victim = "tests/test_z.py::test_victim[2-2]"
    argv = ("python", "-m", "pytest", "-p", "repeat", "--count=2", victim)
    manifest = _manifest(make_manifest, ["tests/test_z.py::test_victim[1-2]", *PRECEDING[:5]]).model_copy(
        update={
            "command": Command(argv=argv, cwd="/work/p"),
            "pytest": PytestContext(node_id=victim, preceding=("tests/test_z.py::test_victim[1-2]",),
                                    rootdir="/work/p", invocation_dir="/work/p"),
        }
    )  # fmt: skip
    target = OrderTarget.of(manifest)
    assert target is not None
    assert target.is_itself("tests/test_z.py::test_victim[1-2]") and target.is_itself(victim)
    assert not target.is_itself("tests/test_z.py::test_other[1-2]")
    assert repeat_base("t.py::test_p[a-2-3]") == "t.py::test_p[a]" == repeat_base("t.py::test_p[a-1-3]")
    assert (
        repeat_base("t.py::test_x[1-2]") == "t.py::test_x"
        and repeat_base("t.py::test_x[a]") == "t.py::test_x[a]"
    )
    # Without pytest-repeat's --count an id that looks like one is an ordinary parameter.
    plain = OrderTarget.of(_manifest(make_manifest, PRECEDING[:3]))
    assert plain is not None and not plain.is_itself("tests/test_z.py::test_victim[1-2]")


def test_no_order_search_for_a_test_that_never_passed_alone(make_manifest: Callable[..., Manifest]) -> None:
    # Alone it fails another way every time; after the earlier tests it fails as captured. That is
    # no proof of order dependence: the different failure alone is the finding.
    manifest = _manifest(make_manifest, PRECEDING)
    target = OrderTarget.of(manifest)
    assert target is not None
    fake = OrderedFakeReplayer(manifest, lambda before: True, alone=Outcome.DIFFERENT)
    replays = SequentialReplays(cast(Replayer, fake), VerdictPolicy())
    assert decide_order(replays, target) is None
    assert all(len(run) == 1 for run in fake.runs)  # no prefix ever ran


def test_a_brittle_test_names_the_state_setter_it_needs(make_manifest: Callable[..., Manifest]) -> None:
    setter = "tests/test_s.py::test_sets_up"
    later = [*PRECEDING[10:20], setter, *PRECEDING[20:]]
    manifest = _manifest(make_manifest, PRECEDING[:10])
    manifest = manifest.model_copy(
        update={"pytest": manifest.pytest.model_copy(update={"following": tuple(later)})}  # type: ignore[union-attr]
    )
    target = OrderTarget.of(manifest)
    assert target is not None and target.following == tuple(later)
    # Fails alone on every replay; passes once the setter ran before it.
    fake = OrderedFakeReplayer(manifest, lambda before: setter not in before, alone=Outcome.REPRODUCED)
    replays = SequentialReplays(cast(Replayer, fake), VerdictPolicy())
    assert decide_order(replays, target) is None  # it reproduced alone: no polluter question
    replays.run()
    search = decide_setters(replays, target)
    assert search is not None and search.found and search.kind == "setters"
    assert search.polluters == (setter,) and not search.itself
    assert "passes only after tests/test_s.py::test_sets_up" in search.cause()
    assert fake.runs[replays.test.replays] == [*PRECEDING[:10], *later, VICTIM]  # all candidates first
    assert PolluterSearch.from_json(json.loads(json.dumps(search.to_json()))) == search


def test_no_setter_search_without_later_tests_or_when_it_fails_after_them(
    make_manifest: Callable[..., Manifest],
) -> None:
    manifest = _manifest(make_manifest, PRECEDING[:10])
    target = OrderTarget.of(manifest)
    assert target is not None
    fake = OrderedFakeReplayer(manifest, lambda before: True, alone=Outcome.REPRODUCED)
    replays = SequentialReplays(cast(Replayer, fake), VerdictPolicy())
    replays.run()
    assert decide_setters(replays, target) is None  # the tests before it were there when it failed
    with_later = OrderTarget(**{**target.__dict__, "following": ("tests/test_s.py::test_later",)})
    search = decide_setters(replays, with_later)
    assert search is not None and not search.found and not search.reproduced_in_order
    assert search.replays == 1


def test_a_test_that_was_not_collected_does_not_pass() -> None:
    assert passes_in(_process(f"PASSED {VICTIM}", exit_code=0), VICTIM)
    assert not passes_in(_process(exit_code=0), VICTIM)  # no PASSED line: it never ran
    assert not passes_in(_process(f"PASSED {VICTIM}", VICTIM_LINE), VICTIM)  # ran twice, failed once
    assert not passes_in(ProcessResult(exit_code=4, stdout="ERROR: not found: x", stderr="",
                                       timed_out=False, duration_s=0.1), VICTIM)  # fmt: skip


def test_the_polluters_are_1_minimal_when_a_later_test_undoes_the_pollution() -> None:
    # test_0 pollutes; test_1 cleans up what test_0 left, unless test_3 ran too (it pollutes again
    # only after a cleanup). The victim fails after test_0 alone: test_3 is no polluter of its own.
    tests = [f"t.py::test_{i}" for i in range(12)]

    def fails(ran: Sequence[str]) -> bool:
        return "t.py::test_0" in ran and ("t.py::test_1" not in ran or "t.py::test_3" in ran)

    found, _ = find_polluters(tests, fails)
    assert found == ["t.py::test_0"]


# -- a seed the session drew ---------------------------------------------------------------------
class SeededFakeReplayer:
    """The victim fails under `failing_seeds` (and the captured seed), passes under any other."""

    def __init__(self, manifest: Manifest, fails: Callable[[int], bool]) -> None:
        self.manifest = manifest
        self.fails = fails
        self.seeds: list[int] = []

    def run(self, variant: Variant | None = None) -> ReplayResult:
        argv = list(variant.argv) if variant and variant.argv else list(self.manifest.command.argv)
        seed = int(next(a for a in argv if a.startswith("--randomly-seed=")).split("=", 1)[1])
        self.seeds.append(seed)
        failed = self.fails(seed)
        process = _process(VICTIM_LINE) if failed else _process(exit_code=0)
        return ReplayResult(
            outcome=Outcome.REPRODUCED if failed else Outcome.PASSED, failure=None, process=process
        )


def _seeded(make_manifest: Callable[..., Manifest], *, drawn: bool) -> Manifest:
    from flaketriage.bundle.manifest import Seeds

    manifest = _manifest(make_manifest, [])
    argv = ("python", "-m", "pytest", "-p", "randomly", "--randomly-seed=1234", "--", VICTIM)
    return manifest.model_copy(
        update={
            "command": manifest.command.model_copy(update={"argv": argv}),
            "seeds": Seeds(values={"pytest-randomly": 1234}, drawn=("pytest-randomly",) if drawn else ()),
        }
    )


def test_a_failure_under_the_seed_its_session_drew_is_flaky_when_other_seeds_pass(
    make_manifest: Callable[..., Manifest],
) -> None:
    manifest = _seeded(make_manifest, drawn=True)
    fake = SeededFakeReplayer(manifest, lambda seed: seed == 1234 or seed % 2 == 0)
    replays = SequentialReplays(cast(Replayer, fake), VerdictPolicy())
    replays.run()
    assert replays.test.result().verdict is Verdict.DETERMINISTIC  # every replay under 1234 fails
    decided = decide_seeds(replays, manifest)
    assert decided is not None
    verdict, finding = decided
    assert verdict.verdict is Verdict.FLAKY and verdict.decided
    assert 0 < verdict.reproductions < verdict.replays  # the rate is the one across seeds
    assert verdict.rate.low < 0.5 < verdict.rate.high
    assert finding.kind == "seed" and "--randomly-seed=1234" in finding.summary
    assert len(set(fake.seeds[5:])) == len(fake.seeds[5:]) and 1234 not in fake.seeds[5:]  # fresh ones


def test_a_failure_under_every_seed_or_under_a_seed_someone_set_stays_deterministic(
    make_manifest: Callable[..., Manifest],
) -> None:
    for manifest, fails in (
        (_seeded(make_manifest, drawn=True), lambda seed: True),  # fails whatever the seed
        (_seeded(make_manifest, drawn=False), lambda seed: seed == 1234),  # CI always runs 1234
    ):
        fake = SeededFakeReplayer(manifest, fails)
        replays = SequentialReplays(cast(Replayer, fake), VerdictPolicy())
        replays.run()
        assert decide_seeds(replays, manifest) is None
