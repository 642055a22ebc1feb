"""Minimizing a failing input: the smallest subset of its items, or the smallest count, that still fails.

``SubsetReducer`` finds the culprits with QuickXplain's divide and conquer (Junker 2004): k interacting
culprits among n items cost O(k·log(n/k)) predicate calls, where ddmin (Zeller & Hildebrandt 2002)
pays far more once culprits interact. QuickXplain relies on monotonicity (a superset of a failing
subset fails too); real test suites break that now and then, so the result is always verified and,
when it does not fail, the reducer falls back to ddmin. A last pass removes items one at a time, so
whatever path was taken the answer fails and is 1-minimal: dropping any one item makes it pass.

Every subset is tried at most once (memoized) and ``calls`` counts the real predicate calls, which
for flaketriage are replays and so the cost that matters.
"""

from __future__ import annotations

import hashlib
from array import array
from collections.abc import Callable, Sequence
from typing import Generic, TypeVar

from flaketriage.errors import MinimizeError

__all__ = ["SubsetReducer", "ddmin", "minimize_integer"]

T = TypeVar("T")

Indices = list[int]


class _Oracle(Generic[T]):
    """The predicate over subsets of ``items``, named by sorted index lists, memoized and counted."""

    def __init__(self, items: Sequence[T], predicate: Callable[[Sequence[T]], bool]) -> None:
        # A list indexes faster than a range or other lazy sequence, and every call indexes it.
        self._items = list(items)
        self._predicate = predicate
        # Keys are digests of the index tuples: on 100,000 items a tuple per tried subset would hold
        # gigabytes, a 16-byte digest does not, and a collision at 2**-128 is not a practical risk.
        self._memo: dict[bytes, bool] = {}
        self.calls = 0

    @staticmethod
    def _key(indices: Sequence[int]) -> bytes:
        return hashlib.blake2b(array("q", indices).tobytes(), digest_size=16).digest()

    def fails(self, indices: Sequence[int]) -> bool:
        key = self._key(indices)
        known = self._memo.get(key)
        if known is None:
            self.calls += 1
            known = bool(self._predicate([self._items[i] for i in indices]))
            self._memo[key] = known
        return known

    def assume(self, indices: Sequence[int], fails: bool) -> None:
        """Record an answer the caller already knows, so it costs no call."""
        self._memo[self._key(indices)] = fails

    def subset(self, indices: Sequence[int]) -> list[T]:
        return [self._items[i] for i in indices]


def _merge(a: Indices, b: Indices) -> Indices:
    # Both are sorted and disjoint; timsort merges two sorted runs in linear time.
    return sorted(a + b)


def _quickxplain(oracle: _Oracle[T], background: Indices, added: bool, candidates: Indices) -> Indices:
    """The smallest part of ``candidates`` that fails together with ``background`` (Junker's QX).

    ``added`` says the last call grew ``background``; only then can it fail on its own, which is
    what lets a whole half be dropped with one call.
    """
    if added and oracle.fails(background):
        return []
    if len(candidates) == 1:
        return candidates
    half = len(candidates) // 2
    first, second = candidates[:half], candidates[half:]
    from_second = _quickxplain(oracle, _merge(background, first), True, second)
    from_first = _quickxplain(oracle, _merge(background, from_second), bool(from_second), first)
    return _merge(from_first, from_second)


def _ddmin(oracle: _Oracle[T], indices: Indices) -> Indices:
    """Zeller and Hildebrandt's ddmin over ``indices``, which must fail."""
    current = indices
    granularity = 2
    while len(current) >= 2:
        size = len(current)
        bounds = [size * i // granularity for i in range(granularity + 1)]
        chunks = [current[bounds[i] : bounds[i + 1]] for i in range(granularity)]
        reduced = next((chunk for chunk in chunks if oracle.fails(chunk)), None)
        if reduced is not None:
            current, granularity = reduced, 2
            continue
        complements = (current[: bounds[i]] + current[bounds[i + 1] :] for i in range(granularity))
        reduced = next((comp for comp in complements if oracle.fails(comp)), None)
        if reduced is not None:
            current, granularity = reduced, max(granularity - 1, 2)
            continue
        if granularity >= size:
            break
        granularity = min(size, granularity * 2)
    return current


def _one_minimal(oracle: _Oracle[T], indices: Indices) -> Indices:
    """Drop single items from failing ``indices`` while the rest still fails."""
    current = indices
    i = 0
    while i < len(current):
        without = current[:i] + current[i + 1 :]
        if oracle.fails(without):
            current = without  # the next item slid into position i; test it without advancing
        else:
            i += 1
    # A removal can make an earlier item removable only when the predicate is not monotone;
    # repeat until a full sweep removes nothing so the result is 1-minimal regardless.
    return current if len(current) == len(indices) else _one_minimal(oracle, current)


class SubsetReducer(Generic[T]):
    """Reduce a failing sequence to a 1-minimal failing subsequence (original order kept).

    ``predicate(subset)`` is True when the subset still fails. ``calls`` counts the predicate calls
    made by the latest ``reduce``; subsets already tried are answered from memory for free.
    """

    def __init__(self, predicate: Callable[[Sequence[T]], bool], *, assume_failing: bool = True) -> None:
        self._predicate = predicate
        self._assume_failing = assume_failing
        self.calls = 0

    def reduce(self, items: Sequence[T]) -> list[T]:
        """A 1-minimal subsequence of ``items`` that fails; ``items`` must fail as a whole."""
        oracle = _Oracle(items, self._predicate)
        everything = list(range(len(items)))
        try:
            if self._assume_failing:
                oracle.assume(everything, fails=True)
            elif not oracle.fails(everything):
                raise MinimizeError(
                    f"the input to minimize ({len(items)} items) passes as a whole, so there is "
                    "nothing to reduce; check that the failure reproduces before minimizing"
                )
            found = _quickxplain(oracle, [], False, everything) if everything else []
            if not oracle.fails(found):
                # Not monotone: a part of a failing set failed where the whole did not. ddmin only
                # ever keeps subsets that failed when tried, so it cannot be misled the same way.
                found = _ddmin(oracle, everything)
            return oracle.subset(_one_minimal(oracle, found))
        finally:
            self.calls = oracle.calls


def ddmin(items: Sequence[T], predicate: Callable[[Sequence[T]], bool]) -> tuple[list[T], int]:
    """Plain memoized ddmin, the baseline ``SubsetReducer`` is measured against: (result, predicate calls).

    ``items`` must fail as a whole; it is not called on them.
    """
    oracle = _Oracle(items, predicate)
    oracle.assume(list(range(len(items))), fails=True)
    result = _ddmin(oracle, list(range(len(items))))
    return oracle.subset(result), oracle.calls


def minimize_integer(value: int, predicate: Callable[[int], bool], lowest: int = 1) -> tuple[int, int]:
    """The smallest v in [lowest, value] that still fails, assuming failing is monotone in v.

    Returns (v, predicate calls). ``value`` itself is assumed to fail and is not tried. ``lowest``
    is tried first, because a size that does not matter at all is common and costs one call to find.
    """
    if value < lowest:
        raise MinimizeError(f"cannot minimize {value}: it is already below the lowest allowed, {lowest}")
    memo: dict[int, bool] = {value: True}

    def fails(v: int) -> bool:
        if v not in memo:
            memo[v] = bool(predicate(v))
        return memo[v]

    if fails(lowest):
        return lowest, len(memo) - 1
    passing, failing = lowest, value
    while failing - passing > 1:
        middle = (passing + failing) // 2
        if fails(middle):
            failing = middle
        else:
            passing = middle
    return failing, len(memo) - 1
