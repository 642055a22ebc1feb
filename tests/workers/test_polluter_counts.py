"""What the polluter search's confirmation counts rest on: the set it returns was already seen to fail.

The manual (docs/commands/triage.md, "Verdicts") says a polluter set reproduces 5 times, "once in
the search, then `confirm_runs` (4) confirmations": that holds only if every set `find_polluters`
returns is the full order (seen to fail before the search) or a set one of its own replays saw fail.
"""

from __future__ import annotations

from collections.abc import Sequence

from hypothesis import given, settings
from hypothesis import strategies as st

from flaketriage.workers.polluters import find_polluters


@settings(max_examples=200, deadline=None)
@given(data=st.data(), n=st.integers(min_value=1, max_value=80))
def test_the_set_found_was_seen_to_fail_in_the_search(data: st.DataObject, n: int) -> None:
    culprits = data.draw(st.sets(st.integers(min_value=0, max_value=n - 1), min_size=1, max_size=min(3, n)))
    failed: list[tuple[int, ...]] = []

    def fails(tests: Sequence[int]) -> bool:
        result = culprits <= set(tests)
        if result:
            failed.append(tuple(tests))
        return result

    found, _ = find_polluters(list(range(n)), fails)
    assert set(found) == culprits
    assert found == list(range(n)) or tuple(found) in failed
