"""Minimizing a failing input: the smallest subset of its items, or the smallest count, that still fails.

``SubsetReducer`` finds the culprits one at a time by binary search over prefixes (the shape of Hwang's
generalized binary splitting): the shortest prefix of the items that fails, together with the
culprits found so far, ends with the next culprit, and every culprit still missing lies before it.
Before each further search one call asks whether the culprits found so far already fail on their
own; when they do, they are the answer. With k culprits among n items that costs at most
``k * (ceil(log2 n) + 1)`` calls, close to the information bound ``log2 C(n, k)``: 15 calls for one
culprit among 10,000 items (bound 13.3), at most 30 for two (bound 25.6), 60 for four (bound 48.6).
A failure that needs any one of several items gets one of them.

The search assumes monotonicity (a superset of a failing subset fails too) and uses it to answer
questions it never asks: the answer is verified to fail (the last question asked), and it is
1-minimal because removing any one culprit leaves a subset of a set seen to pass. Nothing known is
asked again: the whole input failing, the empty set when the caller knows it, and every subset
tried (memoized). A predicate caught contradicting monotonicity sends the search to ddmin
(Zeller & Hildebrandt 2002), which only keeps subsets that failed when tried, and a final pass
that removes items one at a time. ``calls`` counts the predicate calls, which for flaketriage are
replays and so the cost that matters; plain ``ddmin`` is also the baseline the benchmark compares
against.
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
        return hashlib.blake2b(array("q", sorted(indices)).tobytes(), digest_size=16).digest()

    def fails(self, indices: Sequence[int]) -> bool:
        indices = sorted(indices)  # a subset keeps the items' original order
        key = self._key(indices)
        known = self._memo.get(key)
        if known is None:
            self.calls += 1
            known = bool(self._predicate([self._items[i] for i in indices]))
            self._memo[key] = known
        return known

    def known(self, indices: Sequence[int]) -> bool | None:
        """What was recorded for this subset, or None."""
        return self._memo.get(self._key(indices))

    def assume(self, indices: Sequence[int], fails: bool) -> None:
        """Record an answer the caller already knows, so it costs no call."""
        self._memo[self._key(indices)] = fails

    def subset(self, indices: Sequence[int]) -> list[T]:
        return [self._items[i] for i in indices]


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


def _confirm(
    oracle: _Oracle[T], indices: Indices, predicate: Callable[[Sequence[T]], bool], trust_passes: bool
) -> Indices:
    """Drop each item whose removal still fails, asking `predicate` unless the removal was already
    seen to fail (proof); what the search saw pass is asked again, unless `trust_passes`, which
    asks only what the search inferred from another subset's pass (and never the empty set)."""
    current = list(indices)
    i = 0
    while i < len(current):
        without = current[:i] + current[i + 1 :]
        known = oracle.known(without)
        trusted = trust_passes and (known is False or not without)
        if known is True or (not trusted and _ask(oracle, without, predicate)):
            current = without  # the next item slid into position i
        else:
            i += 1
    return current


def _ask(oracle: _Oracle[T], indices: Indices, predicate: Callable[[Sequence[T]], bool]) -> bool:
    oracle.calls += 1
    fails = bool(predicate(oracle.subset(indices)))
    if fails:
        oracle.assume(indices, fails=True)
    return fails


class NotMonotone(MinimizeError):
    """The predicate contradicted monotonicity: a subset failed where a superset passed. Caught
    where the culprit search is called, which falls back to ddmin."""


class SubsetReducer(Generic[T]):
    """Reduce a failing sequence to a 1-minimal failing subsequence (original order kept).

    ``predicate(subset)`` is True when the subset still fails. ``empty_fails`` is what the caller
    already knows of the empty subset (None: unknown; asked only if it decides the answer).
    ``confirm`` asks, instead of inferring, that each culprit's removal passes (k more calls): for
    a predicate that may not be monotone, the answer is then 1-minimal whatever it does.
    ``confirm_with`` is the predicate those questions go to (default: ``predicate``): a noisy
    predicate searches cheaply and confirms carefully, and the confirmation trusts only what
    the search saw fail (a failure is proof; a pass seen by the search is asked again).
    ``trust_passes`` is for a predicate whose passes have held so far (a failure that reproduced
    every time): the confirmation then asks only the removals the search inferred from a larger
    subset's pass, since a miss there is what leaves an unneeded item in the answer; a pass the
    search saw itself stands, and so does the empty set's (the failure is taken to need an item;
    a one-item answer is then confirmed by the search's own last call).
    ``calls`` counts the predicate calls made by the latest ``reduce``; subsets already tried are
    answered from memory for free.
    """

    def __init__(
        self,
        predicate: Callable[[Sequence[T]], bool],
        *,
        assume_failing: bool = True,
        empty_fails: bool | None = None,
        confirm: bool = False,
        confirm_with: Callable[[Sequence[T]], bool] | None = None,
        trust_passes: bool = False,
    ) -> None:
        self._predicate = predicate
        self._assume_failing = assume_failing
        self._empty_fails = empty_fails
        self._confirm = confirm or confirm_with is not None
        self._confirm_with = confirm_with
        self._trust_passes = trust_passes
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
            if self._empty_fails is not None:
                oracle.assume([], fails=self._empty_fails)
            try:
                found = sorted(_culprits(oracle, len(items)))
            except NotMonotone:
                found = _one_minimal(oracle, _ddmin(oracle, everything))
            if self._confirm_with is not None:
                found = _confirm(oracle, found, self._confirm_with, self._trust_passes)
            elif self._confirm:
                found = _one_minimal(oracle, found)
            return oracle.subset(found)
        finally:
            self.calls = oracle.calls


def _culprits(oracle: _Oracle[T], n: int) -> Indices:
    """The culprits among items ``0..n-1``, found one at a time from the end.

    Invariant: ``found`` + ``items[:end]`` fails, and every culprit not yet found lies before `end`.
    """
    found: Indices = []
    end = n
    while True:
        if found and oracle.fails(found):
            return found  # the culprits found so far fail on their own: nothing else is needed
        if end == 0:
            raise NotMonotone  # found + items[:0] == found failed before and passes now
        # found + items[:passing] passes (asked just above, or for the empty set assumed until the
        # search says otherwise), found + items[:failing] fails.
        passing, failing = 0, end
        while failing - passing > 1:
            middle = (passing + failing) // 2
            if oracle.fails([*found, *range(middle)]):
                failing = middle
            else:
                passing = middle
        if not found and failing == 1 and oracle.fails([]):
            return []  # the shortest failing prefix is the empty one: no item is needed
        # items[:failing] fails with `found` and items[:failing - 1] does not: its last item is a
        # culprit, and every one still missing lies before it.
        found.append(failing - 1)
        end = failing - 1


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
