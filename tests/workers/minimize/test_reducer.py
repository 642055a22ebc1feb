"""The minimizers: results that fail and are 1-minimal, and how few predicate calls they cost."""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence

import pytest
from hypothesis import given
from hypothesis import strategies as st

from flaketriage.errors import MinimizeError
from flaketriage.workers.minimize.reducer import SubsetReducer, ddmin, minimize_integer


class Recorder:
    """A predicate that remembers every subset it was asked about."""

    def __init__(self, fails: Callable[[Sequence[int]], bool]) -> None:
        self._fails = fails
        self.asked: list[tuple[int, ...]] = []

    def __call__(self, subset: Sequence[int]) -> bool:
        self.asked.append(tuple(subset))
        return self._fails(subset)


def contains_any_group(groups: list[set[int]]) -> Callable[[Sequence[int]], bool]:
    """A monotone predicate: fails when every value of some group is present."""
    return lambda subset: any(group <= set(subset) for group in groups)


def is_subsequence(part: Sequence[int], whole: Sequence[int]) -> bool:
    it = iter(whole)
    return all(any(x == y for y in it) for x in part)


def assert_one_minimal(result: list[int], predicate: Callable[[Sequence[int]], bool]) -> None:
    assert predicate(result)
    for i in range(len(result)):
        assert not predicate(result[:i] + result[i + 1 :]), f"{result} without item {i} still fails"


@st.composite
def monotone_cases(draw: st.DrawFn) -> tuple[list[int], list[set[int]]]:
    # Small values so that duplicates are common; groups are drawn from the values present.
    items = draw(st.lists(st.integers(0, 12), min_size=0, max_size=40))
    values = sorted(set(items))
    group = st.sets(st.sampled_from(values), max_size=4) if values else st.just(set[int]())
    return items, draw(st.lists(group, min_size=1, max_size=3))


@given(monotone_cases())
def test_result_fails_and_is_one_minimal_for_monotone_predicates(
    case: tuple[list[int], list[set[int]]],
) -> None:
    items, groups = case
    predicate = contains_any_group(groups)
    result = SubsetReducer(predicate).reduce(items)
    assert is_subsequence(result, items)
    assert_one_minimal(result, predicate)
    # Monotone and 1-minimal means exactly one whole group is left.
    assert set(result) in groups
    assert len(result) == len(set(result))


@given(
    items=st.lists(st.integers(0, 3), max_size=30),
    seed=st.integers(0, 2**32),
)
def test_result_fails_and_is_one_minimal_for_arbitrary_predicates(items: list[int], seed: int) -> None:
    whole = tuple(items)

    def predicate(subset: Sequence[int]) -> bool:
        # Fails on the whole input, and on about a third of all subsets, with no structure at all.
        return tuple(subset) == whole or random.Random(f"{seed}{tuple(subset)}").random() < 1 / 3

    # Nothing can be inferred from a predicate without structure: `confirm` asks every removal.
    result = SubsetReducer(predicate, confirm=True).reduce(items)
    assert is_subsequence(result, items)
    assert_one_minimal(result, predicate)


@given(monotone_cases())
def test_no_subset_is_asked_about_twice(case: tuple[list[int], list[set[int]]]) -> None:
    items, groups = case
    # Distinct values, so a repeated subset of values means a repeated subset of indices.
    distinct = list(dict.fromkeys(items))
    predicate = Recorder(contains_any_group(groups))
    reducer = SubsetReducer(predicate)
    reducer.reduce(distinct)
    assert reducer.calls == len(predicate.asked) == len(set(predicate.asked))
    assert tuple(distinct) not in predicate.asked or not distinct  # assumed to fail, never asked


@pytest.mark.parametrize("n", [1000, 10_000, 100_000])
def test_a_single_culprit_costs_about_two_log_n_calls(n: int) -> None:
    rng = random.Random(n)
    for culprit in [0, n - 1, *rng.sample(range(n), 3)]:
        reducer = SubsetReducer(contains_any_group([{culprit}]))
        assert reducer.reduce(range(n)) == [culprit]
        assert reducer.calls <= 2 * math.log2(n) + 10


def test_two_interacting_culprits_cost_fewer_calls_than_ddmin() -> None:
    rng = random.Random("pair")
    n = 2000
    ours = theirs = 0
    for _ in range(10):
        a, b = sorted(rng.sample(range(n), 2))

        def predicate(subset: Sequence[int], a: int = a, b: int = b) -> bool:
            return a in subset and b in subset

        reducer = SubsetReducer(predicate)
        assert reducer.reduce(range(n)) == [a, b]
        result, calls = ddmin(range(n), predicate)
        assert result == [a, b]
        ours, theirs = ours + reducer.calls, theirs + calls
    assert ours < 0.75 * theirs


def test_edge_cases() -> None:
    always = SubsetReducer[int](lambda subset: True)
    assert always.reduce([]) == []
    assert always.calls == 0
    assert always.reduce([7, 7, 7]) == []
    needs_one = SubsetReducer[int](lambda subset: len(subset) >= 1)
    assert needs_one.reduce([5]) == [5]
    assert needs_one.calls == 1  # only the empty subset was asked about
    assert needs_one.reduce([3, 3, 3]) == [3]
    two_sevens = SubsetReducer[int](lambda subset: list(subset).count(7) >= 2)
    assert two_sevens.reduce([7, 1, 7, 2, 7]) == [7, 7]


def test_a_passing_input_is_refused_when_not_assumed_to_fail() -> None:
    reducer = SubsetReducer[int](lambda subset: False, assume_failing=False)
    with pytest.raises(MinimizeError, match="passes as a whole"):
        reducer.reduce([1, 2, 3])
    assert reducer.calls == 1


def test_ddmin_finds_a_minimal_subset() -> None:
    result, calls = ddmin(list(range(100)), contains_any_group([{3, 50, 97}]))
    assert result == [3, 50, 97]
    assert calls > 0
    assert ddmin([], lambda subset: True) == ([], 0)


@given(
    lowest=st.integers(-50, 50),
    span=st.integers(0, 10_000),
    data=st.data(),
)
def test_minimize_integer_finds_the_threshold(lowest: int, span: int, data: st.DataObject) -> None:
    value = lowest + span
    threshold = data.draw(st.integers(lowest, value))
    asked: list[int] = []

    def predicate(v: int) -> bool:
        asked.append(v)
        return v >= threshold

    found, calls = minimize_integer(value, predicate, lowest=lowest)
    assert found == threshold
    assert calls == len(asked) == len(set(asked))
    assert value not in asked  # assumed to fail, never asked
    assert calls <= 1 + math.ceil(math.log2(span + 1))


def test_minimize_integer_edges() -> None:
    assert minimize_integer(5, lambda v: False, lowest=5) == (5, 0)
    assert minimize_integer(1000, lambda v: True) == (1, 1)
    with pytest.raises(MinimizeError, match="below the lowest"):
        minimize_integer(0, lambda v: True, lowest=1)


@pytest.mark.parametrize(("k", "budget"), [(1, 15), (2, 34), (4, 66)])
def test_culprits_cost_close_to_the_information_bound_every_time(k: int, budget: int) -> None:
    rng = random.Random(k)
    n = 10_000
    for _ in range(25):
        culprits = set(rng.sample(range(n), k))
        asked: list[frozenset[int]] = []

        def predicate(
            subset: Sequence[int], culprits: set[int] = culprits, asked: list[frozenset[int]] = asked
        ) -> bool:
            asked.append(frozenset(subset))
            return culprits <= set(subset)

        reducer = SubsetReducer(predicate)
        assert reducer.reduce(range(n)) == sorted(culprits)
        assert reducer.calls <= budget
        # Known facts are never asked: the whole input, and nothing twice.
        assert frozenset(range(n)) not in asked and len(asked) == len(set(asked))


def test_a_failure_that_needs_any_one_of_several_items_gets_one() -> None:
    culprits = {17, 4_242, 9_001}
    reducer = SubsetReducer(lambda subset: bool(culprits & set(subset)))
    found = reducer.reduce(range(10_000))
    assert len(found) == 1 and found[0] in culprits
    assert reducer.calls <= 15


def test_an_empty_set_known_to_pass_is_not_asked() -> None:
    asked: list[tuple[int, ...]] = []

    def predicate(subset: Sequence[int]) -> bool:
        asked.append(tuple(subset))
        return 0 in subset

    assert SubsetReducer(predicate, empty_fails=False).reduce(range(64)) == [0]
    assert () not in asked
    asked.clear()
    assert SubsetReducer(predicate).reduce(range(64)) == [0]
    assert () in asked  # unknown, and the answer depended on it


def test_a_failure_that_needs_no_item_is_told_apart() -> None:
    assert SubsetReducer(lambda subset: True).reduce(range(100)) == []


def test_a_confirmation_that_trusts_passes_asks_only_the_removals_the_search_inferred() -> None:
    # Culprits 30 and 70 among 100: the search ran [70] alone (it passed) and inferred that [30]
    # passes from a longer prefix's pass; trusting passes, only [30] is asked again.
    fails = contains_any_group([{30, 70}])
    confirmed = Recorder(fails)
    reducer = SubsetReducer(Recorder(fails), confirm_with=confirmed, trust_passes=True)
    assert reducer.reduce(range(100)) == [30, 70]
    assert confirmed.asked == [(30,)]
    # One culprit: its removal leaves the empty set, which trusted passes never ask about.
    alone = Recorder(contains_any_group([{42}]))
    assert SubsetReducer(contains_any_group([{42}]), confirm_with=alone, trust_passes=True).reduce(
        range(100)
    ) == [42]
    assert alone.asked == []


def test_a_trusting_confirmation_still_drops_an_item_whose_removal_fails() -> None:
    # A search answer that was wrong (a miss: the first half reported passing) leaves 50 in the
    # answer; the confirmation asks [30] alone, sees it fail, and drops 50.
    def search(subset: Sequence[int]) -> bool:
        if list(subset) == list(range(50)):
            return False
        return 30 in subset

    confirmed = Recorder(lambda subset: 30 in subset)
    reducer = SubsetReducer(search, confirm_with=confirmed, trust_passes=True)
    assert reducer.reduce(range(100)) == [30]
    assert (30,) in confirmed.asked
