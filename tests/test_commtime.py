"""integration.commtime: splitting a TP run's time by every rank's call stamps."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from integration import commtime


def test_synchronised_split_by_hand():
    # call 0: both enter at 0, leave at 1.  call 1: rank 0 computes 2, rank 1 computes 4
    # (enter 3 and 5), the collective ends at 6 for both.
    rank0 = [(0.0, 1.0), (3.0, 6.0)]
    rank1 = [(0.0, 1.0), (5.0, 6.0)]
    split = commtime.synchronised_split([rank0, rank1], 0, 2, cycles=1)
    assert split["collective_ms"] == pytest.approx(1000 * (1.0 + 1.0))  # last arrival -> done
    # critical path compute 5 - 1 = 4 against a mean of 3: one unit waited for rank 1
    assert split["straggler_ms"] == pytest.approx(1000 * 1.0)
    assert split["in_collective_ms"] == pytest.approx(1000 * (1.0 + (3.0 + 1.0) / 2))
    assert split["calls_per_cycle"] == 2


def test_straggler_estimate_is_half_the_gap_at_two_ranks():
    # compute only: rank 0's segments 2 and 1, rank 1's 4 and 1 (no waiting happened)
    rank0 = [(0.0, 0.0), (2.0, 2.0), (3.0, 3.0)]
    rank1 = [(10.0, 10.0), (14.0, 14.0), (15.0, 15.0)]
    est = commtime.straggler_estimate([rank0, rank1], 0, 3, cycles=2)
    assert est["straggler_ms"] == pytest.approx(1000 * (4 - 3) / 2)  # per cycle
    # one rank cannot wait for another
    assert commtime.straggler_estimate([rank0], 0, 3, cycles=1)["straggler_ms"] == 0


def test_ranges_that_are_not_stamped_everywhere_are_refused():
    with pytest.raises(ValueError, match="not stamped on every rank"):
        commtime.synchronised_split([[(0.0, 1.0)] * 3, [(0.0, 1.0)] * 2], 0, 3, cycles=1)
    with pytest.raises(ValueError, match="cycles"):
        commtime.straggler_estimate([[(0.0, 1.0)]], 0, 1, cycles=0)


@settings(max_examples=60, deadline=None)
@given(
    st.integers(2, 4).flatmap(
        lambda ranks: st.lists(
            st.lists(st.tuples(st.floats(0, 5), st.floats(0, 3)), min_size=ranks, max_size=ranks),
            min_size=1,
            max_size=12,
        )
    )
)
def test_split_telescopes_into_the_runs_time(steps):
    # Build a synchronised run: each rank computes, enters; the call ends for everyone
    # after the last arrival plus a transfer time.
    ranks = len(steps[0])
    stamps = [[] for _ in range(ranks)]
    leave = [0.0] * ranks
    computes = 0.0
    for step in steps:
        enters = [leave[r] + step[r][0] for r in range(ranks)]
        done = max(enters) + step[0][1]
        exits = [done + 0.01 * r for r in range(ranks)]  # ranks leave a little apart
        if stamps[0]:
            computes += sum(step[r][0] for r in range(ranks)) / ranks
        for r in range(ranks):
            stamps[r].append((enters[r], exits[r]))
        leave = exits
    split = commtime.synchronised_split(stamps, 0, len(steps), cycles=1)
    first_arrival = max(s[0][0] for s in stamps)
    last_exit = max(s[-1][1] for s in stamps)
    total = (split["collective_ms"] + split["straggler_ms"]) / 1000 + computes
    assert total == pytest.approx(last_exit - first_arrival, abs=1e-9)
