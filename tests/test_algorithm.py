"""The pure Redlock decisions of ``redlock_async._core._algorithm``: no servers, no clock, no sleeping.

Verdicts are checked against an oracle written plainly here, over every vote
pattern for small N and over hypothesis-drawn patterns beyond that.
"""

from __future__ import annotations

import itertools
import math
from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st

from redlock_async._core import _algorithm
from redlock_async._core._algorithm import (
    CLOCK_PRECISION,
    Marker,
    Verdict,
    Vote,
    best_validity,
    drift,
    extended,
    granted,
    quorum,
    retry_delay,
    sit_out,
    tally,
    ttl_to_ms,
    unavailable,
    validity,
    verdict,
)
from redlock_async._rounds._lease import MOVES, IllegalMove, Phase, move

FAILED_KINDS = (Vote.NO, Vote.ERROR, Vote.TIMEOUT, Vote.SKIPPED, Vote.QUARANTINED)
REDUCED = (Vote.YES, Vote.NO, Vote.PENDING)
RANK = {Verdict.LOST: 0, Verdict.UNDECIDED: 1, Verdict.WON: 2}


def oracle(n: int, votes: tuple[Vote, ...] | list[Vote]) -> Verdict:
    """The verdict written from the definition, independently of the code under test."""
    assert len(votes) == n
    need = next(k for k in range(1, n + 1) if 2 * k > n)  # smallest strict majority
    yes = sum(1 for v in votes if v == Vote.YES)
    pending = sum(1 for v in votes if v == Vote.PENDING)
    if yes >= need:
        return Verdict.WON
    if yes + pending < need:
        return Verdict.LOST
    return Verdict.UNDECIDED


def ballots(max_n: int = 15) -> st.SearchStrategy[list[Vote]]:
    """A full ballot: one vote (possibly PENDING) per node, 1..max_n nodes."""
    return st.integers(1, max_n).flatmap(lambda n: st.lists(st.sampled_from(list(Vote)), min_size=n, max_size=n))


# -- Vote ----------------------------------------------------------------------


def test_vote_members_are_the_seven_known_ones() -> None:
    # A new member must be classified in test_vote_failed below.
    assert set(Vote) == {
        Vote.YES,
        Vote.NO,
        Vote.ERROR,
        Vote.TIMEOUT,
        Vote.SKIPPED,
        Vote.PENDING,
        Vote.QUARANTINED,
    }


@pytest.mark.parametrize(
    ("vote", "failed"),
    [
        (Vote.YES, False),
        (Vote.NO, True),
        (Vote.ERROR, True),
        (Vote.TIMEOUT, True),
        (Vote.SKIPPED, True),
        (Vote.PENDING, False),
        (Vote.QUARANTINED, True),
    ],
)
def test_vote_failed(vote: Vote, failed: bool) -> None:
    assert vote.failed is failed


# -- quorum and verdict ----------------------------------------------------------


@pytest.mark.parametrize(("n", "expected"), [(1, 1), (2, 2), (3, 2), (4, 3), (5, 3), (6, 4), (7, 4), (8, 5), (9, 5)])
def test_quorum_is_the_smallest_strict_majority(n: int, expected: int) -> None:
    assert quorum(n) == expected
    assert 2 * quorum(n) > n
    assert 2 * (quorum(n) - 1) <= n


@pytest.mark.parametrize("n", [0, -1, -5])
def test_quorum_of_no_nodes_raises(n: int) -> None:
    with pytest.raises(ValueError, match="at least one node"):
        quorum(n)


def test_verdict_over_every_possible_tally() -> None:
    for n in range(1, 10):
        need = n // 2 + 1
        for yes in range(n + 1):
            for failed in range(n + 1 - yes):
                pending = n - yes - failed
                expected = oracle(n, (Vote.YES,) * yes + (Vote.NO,) * failed + (Vote.PENDING,) * pending)
                assert verdict(n, yes, failed) is expected, (n, yes, failed)
                # The same thing said plainly, to check the oracle too.
                if yes >= need:
                    assert expected is Verdict.WON
                elif yes + pending < need:
                    assert expected is Verdict.LOST
                else:
                    assert expected is Verdict.UNDECIDED


@pytest.mark.parametrize(
    ("n", "yes", "failed"),
    [
        (3, -1, 0),
        (3, 0, -1),
        (3, -1, -1),
        (3, 4, 0),
        (3, 0, 4),
        (3, 2, 2),
        (5, 3, 3),
        (1, 1, 1),
        (0, 1, 0),
        (-1, 0, 0),
    ],
)
def test_verdict_rejects_impossible_tallies(n: int, yes: int, failed: int) -> None:
    with pytest.raises(ValueError, match="impossible tally"):
        verdict(n, yes, failed)


def test_verdict_of_zero_nodes_raises() -> None:
    with pytest.raises(ValueError, match="at least one node"):
        verdict(0, 0, 0)


def test_tally_rejects_more_votes_in_than_nodes() -> None:
    with pytest.raises(ValueError, match="impossible tally"):
        tally(3, [Vote.YES, Vote.NO, Vote.NO, Vote.TIMEOUT])


# -- tally over every vote pattern ---------------------------------------------------


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5])
def test_tally_every_pattern_of_every_vote_kind(n: int) -> None:
    for votes in itertools.product(list(Vote), repeat=n):
        assert tally(n, votes) is oracle(n, votes), votes


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 6, 7])
def test_tally_every_pattern_of_yes_no_pending(n: int) -> None:
    for votes in itertools.product(REDUCED, repeat=n):
        expected = oracle(n, votes)
        assert tally(n, votes) is expected, votes
        # Any failure is as good as any other: replace all NOs by each other failed kind.
        for kind in FAILED_KINDS:
            swapped = tuple(kind if v is Vote.NO else v for v in votes)
            assert tally(n, swapped) is expected, swapped


@given(ballots())
def test_tally_matches_oracle(votes: list[Vote]) -> None:
    assert tally(len(votes), votes) is oracle(len(votes), votes)


@given(ballots(), st.data())
def test_every_failed_kind_counts_the_same(votes: list[Vote], data: st.DataObject) -> None:
    n = len(votes)
    # Replace each failed vote by an arbitrary (possibly different) failed kind.
    swapped = [data.draw(st.sampled_from(FAILED_KINDS)) if v.failed else v for v in votes]
    assert tally(n, swapped) is tally(n, votes)
    # And by NO everywhere: only the count of failures matters.
    as_no = [Vote.NO if v.failed else v for v in votes]
    assert tally(n, as_no) is tally(n, votes)


@given(ballots())
def test_pending_never_counts_as_a_failure(votes: list[Vote]) -> None:
    n = len(votes)
    yes = votes.count(Vote.YES)
    failed = sum(1 for v in votes if v in FAILED_KINDS)
    assert tally(n, votes) is verdict(n, yes, failed)
    # Dropping the PENDING votes (not in yet) changes nothing.
    assert tally(n, [v for v in votes if v is not Vote.PENDING]) is tally(n, votes)


def test_all_pending_is_undecided_and_all_failed_is_lost() -> None:
    for n in range(1, 10):
        assert tally(n, [Vote.PENDING] * n) is Verdict.UNDECIDED
        assert tally(n, []) is Verdict.UNDECIDED
        for kind in FAILED_KINDS:
            assert tally(n, [kind] * n) is Verdict.LOST
        assert tally(n, [Vote.YES] * n) is Verdict.WON


@pytest.mark.parametrize(
    ("votes", "expected"),
    [
        ([Vote.YES, Vote.YES, Vote.PENDING], Verdict.WON),
        ([Vote.YES, Vote.TIMEOUT, Vote.PENDING], Verdict.UNDECIDED),
        ([Vote.ERROR, Vote.SKIPPED, Vote.PENDING], Verdict.LOST),
        ([Vote.YES, Vote.NO, Vote.NO], Verdict.LOST),
    ],
)
def test_tally_examples_of_three(votes: list[Vote], expected: Verdict) -> None:
    assert tally(3, votes) is expected


# -- monotonicity: decisions are final -------------------------------------------------


@given(ballots(), st.data())
def test_a_vote_coming_in_never_undoes_a_decision(votes: list[Vote], data: st.DataObject) -> None:
    n = len(votes)
    pending_at = [i for i, v in enumerate(votes) if v is Vote.PENDING]
    if not pending_at:
        votes[data.draw(st.integers(0, n - 1))] = Vote.PENDING
        pending_at = [i for i, v in enumerate(votes) if v is Vote.PENDING]
    before = tally(n, votes)
    i = data.draw(st.sampled_from(pending_at))
    for arrived in list(Vote):
        after = list(votes)
        after[i] = arrived
        if before is not Verdict.UNDECIDED:
            assert tally(n, after) is before, (votes, i, arrived)
        if arrived is Vote.YES:
            assert RANK[tally(n, after)] >= RANK[before]
            if before is Verdict.WON:
                assert tally(n, after) is Verdict.WON
        if arrived.failed:
            assert RANK[tally(n, after)] <= RANK[before]


@given(ballots(), st.data())
def test_a_yes_instead_of_anything_never_makes_it_worse(votes: list[Vote], data: st.DataObject) -> None:
    n = len(votes)
    i = data.draw(st.integers(0, n - 1))
    better = list(votes)
    better[i] = Vote.YES
    assert RANK[tally(n, better)] >= RANK[tally(n, votes)]
    if tally(n, votes) is Verdict.WON:
        assert tally(n, better) is Verdict.WON


@given(
    st.integers(1, 15).flatmap(
        lambda n: st.tuples(
            st.lists(st.sampled_from(list(Vote)), min_size=n, max_size=n),
            st.permutations(range(n)),
        )
    )
)
def test_votes_arriving_in_any_order_decide_once(case: tuple[list[Vote], list[int]]) -> None:
    final, order = case
    n = len(final)
    current = [Vote.PENDING] * n
    decided: Verdict | None = None
    assert tally(n, current) is Verdict.UNDECIDED
    for i in order:
        current[i] = final[i]
        now = tally(n, current)
        assert now is oracle(n, current)
        if decided is not None:
            assert now is decided
        elif now is not Verdict.UNDECIDED:
            decided = now
    assert tally(n, final) is oracle(n, final)
    if decided is not None:
        assert tally(n, final) is decided


# -- unavailable: nodes that could not vote, never contention ----------------------------------

COULD_NOT_VOTE = (Vote.ERROR, Vote.TIMEOUT, Vote.SKIPPED, Vote.QUARANTINED)


def unavailable_oracle(votes: list[Vote]) -> bool:
    """Written from the definition: would the ballot have failed had every node that could vote said yes?"""
    n = len(votes)
    best = [vote if vote in COULD_NOT_VOTE else Vote.YES for vote in votes]
    return oracle(n, best) is not Verdict.WON


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5])
def test_unavailable_over_every_pattern_of_every_vote_kind(n: int) -> None:
    for votes in itertools.product(list(Vote), repeat=n):
        assert unavailable(votes) is unavailable_oracle(list(votes)), votes


@given(ballots())
def test_unavailable_never_blames_the_nodes_for_contention(votes: list[Vote]) -> None:
    """Nodes saying no (a holder) or not needed (pending) never make it unavailable; a failed ballot that
    is not unavailable would have been won had the refusing nodes said yes."""
    refusing = [Vote.YES if vote in (Vote.NO, Vote.PENDING) else vote for vote in votes]
    assert unavailable(votes) is unavailable(refusing)
    if not unavailable(votes):
        assert tally(len(votes), [v if v in COULD_NOT_VOTE else Vote.YES for v in votes]) is Verdict.WON


@pytest.mark.parametrize(
    ("votes", "expected"),
    [
        ([Vote.SKIPPED, Vote.SKIPPED, Vote.PENDING], True),  # 0 of 3 answered: decided at the 2nd refusal
        ([Vote.NO, Vote.NO, Vote.PENDING], False),  # held: contention
        ([Vote.NO, Vote.ERROR, Vote.PENDING], False),  # 1 of 3 cannot vote: the holder leaving would do
        ([Vote.NO, Vote.NO, Vote.TIMEOUT, Vote.TIMEOUT, Vote.TIMEOUT], True),  # the mixed case: 2 held, 3 silent
        ([Vote.QUARANTINED, Vote.QUARANTINED, Vote.YES], True),  # restart quarantine: no majority can count
        ([Vote.YES, Vote.YES, Vote.YES], False),
    ],
)
def test_unavailable_examples(votes: list[Vote], expected: bool) -> None:
    assert unavailable(votes) is expected


# -- ttl_to_ms ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("ttl", "ms"),
    [
        (0.0019, 1),
        (0.001, 1),
        (0.0009, 0),
        (1.9999, 1999),
        (10.0, 10000),
        (0.5, 500),
        (30, 30000),
        (0.0, 0),
        # Decimal ttls mean what they say, although their binary value is a hair below.
        (0.3, 300),
        (1.9, 1900),
        (1.005, 1005),
        (0.11699999999999999, 117),
    ],
)
def test_ttl_to_ms_rounds_down(ttl: float, ms: int) -> None:
    result = ttl_to_ms(ttl)
    assert type(result) is int
    assert result == ms


@given(st.floats(min_value=0.0, max_value=1e7, allow_nan=False))
def test_ttl_to_ms_is_floor_of_the_millis(ttl: float) -> None:
    ms = ttl_to_ms(ttl)
    assert type(ms) is int
    # Never longer than the ttl the caller gave (to within a nanosecond), never a whole ms shorter.
    assert Fraction(ms, 1000) <= Fraction(ttl) + Fraction(1, 10**9)
    assert Fraction(ttl) < Fraction(ms + 1, 1000)


@given(st.integers(1, 10**7))
def test_ttl_to_ms_of_whole_millis_is_exact(k: int) -> None:
    # k/1000 is not exact in binary, but k milliseconds is what the caller meant.
    assert ttl_to_ms(k / 1000) == k


def test_ttl_to_ms_exceeds_the_exact_ttl_by_float_noise_at_most() -> None:
    ttl = math.nextafter(0.117, 0.0)
    assert ttl == 0.11699999999999999
    assert ttl_to_ms(ttl) == 117
    assert Fraction(ttl_to_ms(ttl), 1000) - Fraction(ttl) < Fraction(1, 10**15)


@given(
    st.floats(min_value=0.001, max_value=1e6, allow_nan=False),
    st.floats(min_value=0.0, max_value=0.5, exclude_max=True),
    st.floats(min_value=0.0, max_value=100.0),
)
def test_validity_from_the_millis_sent_is_never_more(ttl: float, drift_factor: float, elapsed: float) -> None:
    from_ms = validity(ttl_to_ms(ttl) / 1000, 0.0, elapsed, drift_factor)
    from_ttl = validity(ttl, 0.0, elapsed, drift_factor)
    # Float rounding of the subtraction only.
    assert from_ms <= from_ttl + 4 * math.ulp(ttl) + math.ulp(elapsed)
    assert best_validity(ttl_to_ms(ttl) / 1000, drift_factor) <= best_validity(ttl, drift_factor) + 4 * math.ulp(ttl)


@pytest.mark.parametrize("ttl", [0.001, 0.0019, 0.117, 1.005, 1.9999, 10.0, 30.0])
def test_validity_from_the_millis_sent_is_never_more_examples(ttl: float) -> None:
    assert validity(ttl_to_ms(ttl) / 1000, 5.0, 5.25, 0.01) <= validity(ttl, 5.0, 5.25, 0.01)


# -- drift and validity ---------------------------------------------------------------------


def test_clock_precision_is_two_ms() -> None:
    assert CLOCK_PRECISION == 0.002


@given(
    st.floats(min_value=0.0, max_value=1e6, allow_nan=False),
    st.floats(min_value=0.0, max_value=0.5, exclude_max=True),
)
def test_drift_formula(ttl: float, drift_factor: float) -> None:
    assert drift(ttl, drift_factor) == ttl * drift_factor + 0.002


@given(
    st.floats(min_value=0.001, max_value=1e6),
    st.floats(min_value=-1e6, max_value=1e6),
    st.floats(min_value=0.0, max_value=1e6),
    st.floats(min_value=0.0, max_value=0.5, exclude_max=True),
)
def test_validity_formula(ttl: float, started: float, elapsed: float, drift_factor: float) -> None:
    decided = started + elapsed
    assert validity(ttl, started, decided, drift_factor) == ttl - (decided - started) - (ttl * drift_factor + 0.002)
    assert best_validity(ttl, drift_factor) == ttl - 0.0 - (ttl * drift_factor + 0.002)
    assert validity(ttl, started, decided, drift_factor) <= best_validity(ttl, drift_factor)


def test_validity_examples() -> None:
    assert validity(10.0, 100.0, 100.5, 0.01) == pytest.approx(10.0 - 0.5 - 0.1 - 0.002)
    assert validity(1.0, 0.0, 0.0, 0.0) == pytest.approx(0.998)
    assert best_validity(10.0, 0.01) == pytest.approx(9.898)
    # The started/decided pair matters, not the clock's origin.
    assert validity(3.0, 1e3, 1e3 + 0.25, 0.02) == pytest.approx(validity(3.0, 0.0, 0.25, 0.02))


# -- granted ------------------------------------------------------------------------------------

MAJORITY_OF_3 = [Vote.YES, Vote.YES, Vote.PENDING]


def test_granted_exactly_zero_validity_is_none() -> None:
    # ttl = 2 x CLOCK_PRECISION and no drift factor: every step below is exact in binary.
    ttl, started, decided = 0.004, 0.0, 0.002
    assert validity(ttl, started, decided, 0.0) == 0.0
    assert granted(3, MAJORITY_OF_3, ttl, started, decided, 0.0) is None
    # A hair earlier: positive, and granted.
    earlier = math.nextafter(decided, -math.inf)
    left = validity(ttl, started, earlier, 0.0)
    assert left > 0
    assert granted(3, MAJORITY_OF_3, ttl, started, earlier, 0.0) == left
    # A hair later: negative.
    later = math.nextafter(decided, math.inf)
    assert validity(ttl, started, later, 0.0) < 0
    assert granted(3, MAJORITY_OF_3, ttl, started, later, 0.0) is None


@pytest.mark.parametrize(
    ("ttl", "started", "drift_factor"),
    [(10.0, 1000.0, 0.01), (0.5, 12345.678, 0.0), (30.0, 0.0, 0.3), (0.01, 7.0, 0.01)],
)
def test_granted_at_the_last_float_before_validity_runs_out(ttl: float, started: float, drift_factor: float) -> None:
    # Walk decided across the boundary one float at a time: the last positive validity is granted,
    # the first one that is <= 0 is not.
    decided = started + ttl - drift(ttl, drift_factor)
    while validity(ttl, started, decided, drift_factor) > 0:
        decided = math.nextafter(decided, math.inf)
    while validity(ttl, started, decided, drift_factor) <= 0:
        decided = math.nextafter(decided, -math.inf)
    last_good = decided
    first_bad = math.nextafter(last_good, math.inf)
    left = validity(ttl, started, last_good, drift_factor)
    assert 0 < left < 1e-9
    assert granted(5, [Vote.YES] * 3 + [Vote.TIMEOUT] * 2, ttl, started, last_good, drift_factor) == left
    assert validity(ttl, started, first_bad, drift_factor) <= 0
    assert granted(5, [Vote.YES] * 3 + [Vote.TIMEOUT] * 2, ttl, started, first_bad, drift_factor) is None


@pytest.mark.parametrize(
    "votes",
    [
        [Vote.YES, Vote.NO, Vote.NO],
        [Vote.YES, Vote.PENDING, Vote.PENDING],
        [Vote.YES, Vote.TIMEOUT, Vote.PENDING],
        [Vote.PENDING, Vote.PENDING, Vote.PENDING],
        [Vote.ERROR, Vote.SKIPPED, Vote.TIMEOUT],
        [],
    ],
)
def test_granted_without_a_majority_is_none_however_fast(votes: list[Vote]) -> None:
    assert granted(3, votes, 10.0, 5.0, 5.0, 0.01) is None
    assert granted(3, votes, 10.0, 5.0, 5.000001, 0.01) is None


@given(
    ballots(7),
    st.floats(min_value=0.001, max_value=100.0),
    st.floats(min_value=0.0, max_value=1e4),
    st.floats(min_value=0.0, max_value=200.0),
    st.floats(min_value=0.0, max_value=0.5, exclude_max=True),
)
def test_granted_is_validity_when_won_and_positive(
    votes: list[Vote], ttl: float, started: float, elapsed: float, drift_factor: float
) -> None:
    n = len(votes)
    decided = started + elapsed
    result = granted(n, votes, ttl, started, decided, drift_factor)
    left = validity(ttl, started, decided, drift_factor)
    if oracle(n, votes) is Verdict.WON and left > 0:
        assert result == left
    else:
        assert result is None


def test_granted_accepts_any_iterable_of_votes() -> None:
    assert granted(3, iter([Vote.YES, Vote.YES]), 10.0, 0.0, 0.1, 0.01) == pytest.approx(9.798)
    assert granted(3, (v for v in [Vote.YES, Vote.YES, Vote.NO]), 10.0, 0.0, 0.1, 0.01) == pytest.approx(9.798)


# -- extended -------------------------------------------------------------------------------------


def test_extended_at_or_after_the_deadline_is_none() -> None:
    votes = [Vote.YES] * 3
    ttl, started, decided, drift_factor = 10.0, 100.0, 100.01, 0.01
    assert granted(3, votes, ttl, started, decided, drift_factor) is not None
    assert extended(3, votes, ttl, started, decided, drift_factor, deadline=decided) is None
    assert extended(3, votes, ttl, started, decided, drift_factor, deadline=math.nextafter(decided, 0.0)) is None
    assert extended(3, votes, ttl, started, decided, drift_factor, deadline=50.0) is None
    just_before = math.nextafter(decided, math.inf)
    assert extended(3, votes, ttl, started, decided, drift_factor, deadline=just_before) == granted(
        3, votes, ttl, started, decided, drift_factor
    )


@given(
    ballots(7),
    st.floats(min_value=0.001, max_value=100.0),
    st.floats(min_value=0.0, max_value=1e4),
    st.floats(min_value=0.0, max_value=200.0),
    st.floats(min_value=0.0, max_value=0.5, exclude_max=True),
    st.floats(min_value=-300.0, max_value=300.0),
)
def test_extended_is_granted_before_the_deadline(
    votes: list[Vote], ttl: float, started: float, elapsed: float, drift_factor: float, to_deadline: float
) -> None:
    n = len(votes)
    decided = started + elapsed
    deadline = decided + to_deadline
    result = extended(n, votes, ttl, started, decided, drift_factor, deadline)
    if decided >= deadline:
        assert result is None
    else:
        assert result == granted(n, votes, ttl, started, decided, drift_factor)


# -- retry_delay ------------------------------------------------------------------------------------

UNIT = st.floats(min_value=0.0, max_value=1.0, exclude_max=True)


@given(st.floats(min_value=0.0, max_value=1e6), UNIT, st.floats(min_value=0.0, max_value=1e7))
def test_retry_delay_never_exceeds_the_time_left(base: float, unit_random: float, remaining: float) -> None:
    delay = retry_delay(base, unit_random, remaining)
    assert 0.0 <= delay <= remaining
    if remaining <= base / 2:
        assert delay == remaining


@given(st.floats(min_value=0.0, max_value=1e6), UNIT)
def test_retry_delay_spreads_around_base(base: float, unit_random: float) -> None:
    delay = retry_delay(base, unit_random, remaining=1e12)
    assert base / 2 <= delay <= 3 * base / 2


@given(st.floats(min_value=0.0, max_value=1e6), st.floats(min_value=0.0, max_value=0.999))
def test_retry_delay_below_the_top_is_half_open(base: float, unit_random: float) -> None:
    delay = retry_delay(base, unit_random, remaining=math.inf)
    assert base / 2 <= delay
    assert delay < 3 * base / 2 or base == 0


def test_retry_delay_examples() -> None:
    assert retry_delay(0.2, 0.0, 10.0) == pytest.approx(0.1)
    assert retry_delay(0.2, 0.5, 10.0) == pytest.approx(0.2)
    assert retry_delay(0.2, 0.5, 0.05) == 0.05
    assert retry_delay(0.2, 0.5, 0.0) == 0.0
    assert retry_delay(0.0, 0.7, 10.0) == 0.0
    assert retry_delay(0.2, 0.5, math.inf) == pytest.approx(0.2)


def test_retry_delay_is_uniform_in_unit_random() -> None:
    # Equal steps of unit_random give equal steps of delay.
    delays = [retry_delay(1.0, k / 10, 100.0) for k in range(10)]
    steps = [b - a for a, b in itertools.pairwise(delays)]
    assert steps == pytest.approx([0.1] * 9)


def test_retry_delay_top_is_reachable_but_not_passed() -> None:
    # The largest random.random() rounds to the top: the interval is closed.
    assert retry_delay(1.0, 1 - 2**-53, 100.0) == 1.5


@pytest.mark.parametrize("unit_random", [1.0, 1.5, -0.1, -1e-300, math.nan, math.inf, -math.inf])
def test_retry_delay_rejects_unit_random_outside_unit_interval(unit_random: float) -> None:
    with pytest.raises(ValueError, match=r"unit_random must be in \[0, 1\)"):
        retry_delay(0.2, unit_random, 10.0)


# -- restart quarantine ----------------------------------------------------------

Q = 10.0
CUR, STALE, ABSENT, UNKNOWN, WATCHED = Marker.CURRENT, Marker.STALE, Marker.ABSENT, Marker.UNKNOWN, Marker.WATCHED


@pytest.mark.parametrize(
    ("uptime", "known", "restarted", "marker", "expected"),
    [
        # A client that knew another server here: out for what is left of Q since it came back
        # (its uptime taken as 1 s less than reported: whole-second clocks may overstate it by 1 s).
        (0.6, False, True, CUR, (Q, False)),
        (3.0, False, True, CUR, (8.0, False)),
        (3.0, False, True, ABSENT, (Q, False)),  # without our marker: restarted empty, or a spare
        (3.0, False, True, UNKNOWN, (8.0, False)),
        (25.0, False, True, ABSENT, (Q, False)),  # a spare up for ages: its uptime proves nothing
        (None, False, True, CUR, (Q, False)),
        # The marker was written under this server process: judged in service, by us or another client.
        (3.0, True, False, CUR, (0.0, False)),
        (3.0, False, False, CUR, (0.0, False)),
        # The marker came from an earlier process: restarted with data that may be stale.
        (3.0, False, False, STALE, (8.0, False)),
        (500.0, False, False, STALE, (0.0, False)),
        # No marker on the process we knew: lost in place (a FLUSHALL), since when is unknown.
        (500.0, True, False, ABSENT, (Q, True)),
        # No marker at first sight: new, restarted empty, or another empty server behind the same address
        # (up for ages: its uptime proves nothing). The whole period, suspect until the others tell.
        (3.0, False, False, ABSENT, (Q, True)),
        (500.0, False, False, ABSENT, (Q, True)),
        # Marker unreadable: the uptime alone decides, unless we know this process.
        (3.0, False, False, UNKNOWN, (8.0, False)),
        (3.0, True, False, UNKNOWN, (0.0, False)),
        # INFO refused: only the marker can tell.
        (None, False, False, CUR, (0.0, False)),
        (None, False, False, ABSENT, (Q, True)),
        (None, False, False, UNKNOWN, (0.0, False)),
    ],
)
def test_sit_out(
    uptime: float | None, known: bool, restarted: bool, marker: Marker, expected: tuple[float, bool]
) -> None:
    assert sit_out(Q, uptime=uptime, known_run_id=known, restarted=restarted, marker=marker) == expected


@pytest.mark.parametrize(
    ("watched", "restarted", "expected"),
    [
        # Found without marker *watched* seconds ago (the node's clock), nothing lost since: the rest of
        # the period from then, for every client alike (a restart this client saw came before the watch).
        (4.0, False, (6.0, True)),
        (4.0, True, (6.0, True)),
        (Q, False, (0.0, False)),
        (500.0, True, (0.0, False)),
        # The node does not say its time, or says one before the watch began: the whole period.
        (None, False, (Q, True)),
        (-2.0, False, (Q, True)),
    ],
)
def test_sit_out_of_a_watched_node(watched: float | None, restarted: bool, expected: tuple[float, bool]) -> None:
    for uptime in (None, 0.5, 500.0):  # its uptime says nothing: the watch began after any loss
        seconds = sit_out(Q, uptime=uptime, known_run_id=False, restarted=restarted, marker=WATCHED, watched=watched)
        assert seconds == expected


@given(st.one_of(st.none(), st.floats(0, 1e6)), st.booleans(), st.booleans(), st.sampled_from(list(Marker)))
def test_sit_out_is_off_at_zero_and_never_longer_than_the_period(
    uptime: float | None, known: bool, restarted: bool, marker: Marker
) -> None:
    assert sit_out(0.0, uptime=uptime, known_run_id=known, restarted=restarted, marker=marker) == (0.0, False)
    seconds, suspect = sit_out(Q, uptime=uptime, known_run_id=known, restarted=restarted, marker=marker)
    assert 0.0 <= seconds <= Q
    # Only a node without marker, or watched, is a suspect, and only while it sits out.
    if suspect:
        assert marker in (Marker.ABSENT, Marker.WATCHED)
        assert not restarted or marker is Marker.WATCHED
        assert seconds > 0
    if marker is Marker.ABSENT and not restarted:
        assert (seconds, suspect) == (Q, True)


@given(st.floats(0, 1e6), st.floats(0, 100), st.booleans(), st.sampled_from(list(Marker)))
def test_sit_out_never_ends_before_the_period_since_the_true_restart(
    started: float, true_uptime: float, restarted: bool, marker: Marker
) -> None:
    """The server reports whole seconds off two whole-second clocks; the quarantine must still cover
    *period* from the true start (a lease granted before the restart ends within it)."""
    reported = float(math.floor(started + true_uptime) - math.floor(started))
    seconds, _ = sit_out(Q, uptime=reported, known_run_id=False, restarted=restarted, marker=marker)
    if restarted or marker is not Marker.CURRENT:
        assert seconds >= Q - true_uptime - 1e-9


# -- adaptive node timeout ---------------------------------------------------------------------


def test_smoothed_rtt_follows_rfc_6298() -> None:
    assert _algorithm.smoothed_rtt(0.0, 0.0, 0.1) == (0.1, 0.05)  # first sample
    srtt, rttvar = _algorithm.smoothed_rtt(0.1, 0.05, 0.2)
    assert srtt == pytest.approx(0.1125)
    assert rttvar == pytest.approx(0.0625)
    with pytest.raises(ValueError, match="negative"):
        _algorithm.smoothed_rtt(0.1, 0.05, -1.0)


@given(
    floor=st.floats(0.001, 1.0),
    timeouts=st.lists(st.floats(0.0, 10.0), min_size=1, max_size=9),
    cap=st.floats(0.001, 5.0),
    data=st.data(),
)
def test_patience_is_bounded_and_ignores_the_slowest_minority(
    floor: float, timeouts: list[float], cap: float, data: st.DataObject
) -> None:
    needed = data.draw(st.integers(1, len(timeouts)))
    wait = _algorithm.patience(floor, timeouts, needed, cap)
    assert floor <= wait <= max(floor, cap)
    if needed < len(timeouts):
        # The slowest node (dead, say) going slower still changes nothing.
        slower = sorted(timeouts)
        slower[-1] += 100.0
        assert _algorithm.patience(floor, slower, needed, cap) == wait
    if all(t <= floor for t in timeouts):
        assert wait == floor  # a fast network: node_timeout, unchanged


# -- one judge of extensions ---------------------------------------------------------------------

EXTENSION_VOTES = [Vote.YES, Vote.NO, Vote.TIMEOUT, Vote.ERROR, Vote.PENDING, Vote.QUARANTINED]


@pytest.mark.parametrize("n", [1, 2, 3, 5])
def test_judge_extension_over_every_vote_pattern(n: int) -> None:
    """Every pattern, before and after the deadline: the verdict agrees with extended() and refused()."""
    started, deadline = 100.0, 101.0
    for votes in itertools.product(EXTENSION_VOTES, repeat=n):
        for decided, now in ((100.01, 100.02), (100.5, 101.5), (101.2, 101.3)):
            verdict, validity = _algorithm.judge_extension(list(votes), 2.0, started, decided, 0.01, deadline, now)
            expected = _algorithm.extended(n, votes, 2.0, started, decided, 0.01, deadline=deadline)
            assert validity == expected
            if expected is not None:
                assert verdict is _algorithm.Extension.CONFIRMED
                assert decided < deadline
            elif _algorithm.refused(votes):
                assert verdict is _algorithm.Extension.REFUSED
            elif now < deadline:
                assert verdict is _algorithm.Extension.RETRY
            else:
                assert verdict is _algorithm.Extension.EXPIRED


@given(st.lists(st.sampled_from(EXTENSION_VOTES), min_size=1, max_size=7), st.floats(0, 5), st.floats(0, 5))
def test_judge_extension_never_confirms_after_the_deadline(votes: list[Vote], late: float, wait: float) -> None:
    deadline = 10.0
    verdict, validity = _algorithm.judge_extension(votes, 30.0, 9.0, deadline + late, 0.01, deadline, deadline + wait)
    assert verdict is not _algorithm.Extension.CONFIRMED
    assert validity is None
    assert verdict is not _algorithm.Extension.RETRY  # the old validity is over: retrying cannot help


# -- the lock's phases ---------------------------------------------------------------------------


def test_every_legal_move_is_allowed_and_every_other_raises() -> None:
    for current in Phase:
        for to in Phase:
            if to in MOVES[current]:
                assert move(current, to) is to
            else:
                with pytest.raises(IllegalMove, match=f"from {current.value} to {to.value}"):
                    move(current, to)


def test_the_moves_make_one_cycle_through_held() -> None:
    """From IDLE every phase is reachable, and every phase can come back to an acquire."""
    reachable = {Phase.IDLE}
    frontier = [Phase.IDLE]
    while frontier:
        for to in MOVES[frontier.pop()]:
            if to not in reachable:
                reachable.add(to)
                frontier.append(to)
    assert reachable == set(Phase)
    assert Phase.HELD not in MOVES[Phase.IDLE]  # nothing is held without an acquire
    assert Phase.HELD not in MOVES[Phase.LOST]  # a lost lease never comes back by itself


@pytest.mark.parametrize(
    ("uptime", "known", "restarted", "marker", "expected"),
    [
        # A replica promoted (a failover): its uptime and a marker replicated from its old master say nothing
        # of when it began to serve, nor of the keys it never received. The whole period, as a node restarted empty.
        (500.0, False, False, STALE, (Q, False)),
        (500.0, False, True, STALE, (Q, False)),
        (500.0, False, False, ABSENT, (Q, False)),
        (500.0, True, False, UNKNOWN, (Q, False)),
        (None, False, False, STALE, (Q, False)),
        # Judged in service since its promotion, under this very process: it counts.
        (500.0, False, False, CUR, (0.0, False)),
        (3.0, True, False, CUR, (0.0, False)),
    ],
)
def test_sit_out_a_promoted_replica(
    uptime: float | None, known: bool, restarted: bool, marker: Marker, expected: tuple[float, bool]
) -> None:
    assert sit_out(Q, uptime=uptime, known_run_id=known, restarted=restarted, marker=marker, promoted=True) == expected
