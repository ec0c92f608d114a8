"""The shared request-memory budget: bounded, served in line, and never deadlocked by requests
that each hold part of it."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from durable_producer.buffer_agent.ingest.request_memory import Claim, RequestMemory
from durable_producer.buffer_agent.ingest.stats import IngestStats


class Waiter:
    """A request that wants ``size`` more bytes for its claim; records when it got them."""

    def __init__(self, memory: RequestMemory, claim: Claim, size: int, log: list[str]) -> None:
        self.memory, self.claim, self.size, self.log = memory, claim, size, log

    def __call__(self) -> bool:
        if not self.memory.grow(self.claim, self.size, waiting=True):
            return False
        self.log.append(f"{self.claim.size}")
        return True


def test_claims_grow_within_the_limit_only() -> None:
    stats = IngestStats()
    memory = RequestMemory(100, stats)
    claim = Claim(100)
    assert memory.grow(claim, 60) and memory.grow(claim, 40)
    assert not memory.grow(Claim(10), 1)
    memory.finish(claim)
    memory.give_back(40)
    assert stats.request_memory_bytes == memory.used == 60 and memory.peak == 100


def test_received_bytes_are_always_taken_even_beyond_the_limit() -> None:
    memory = RequestMemory(100)
    memory.take(150)
    assert memory.used == 150 and not memory.grow(Claim(10), 1)


def test_a_claim_may_not_grow_where_no_order_finishes_every_claim() -> None:
    """Two requests of 80 in a budget of 100: once one holds 50, the other may take at most
    what still lets the first finish (50 + 30 missing <= 100 - 50 - x)."""
    memory = RequestMemory(100)
    first, second = Claim(80), Claim(80)
    assert memory.grow(first, 50)
    assert not memory.grow(second, 21), "would leave neither able to finish"
    assert memory.grow(second, 20)
    assert not memory.grow(second, 1)
    assert memory.grow(first, 30)  # the first finishes...
    memory.finish(first)
    memory.give_back(80)  # ...and is answered: the second can finish now
    assert memory.grow(second, 60)


def test_waiters_are_served_in_line_but_one_that_cannot_go_does_not_block_the_rest() -> None:
    stats = IngestStats()
    memory = RequestMemory(100, stats)
    memory.take(100)  # complete requests being processed
    served: list[str] = []
    big, small = Claim(90), Claim(20)
    memory.wait(Waiter(memory, big, 90, served))
    memory.wait(Waiter(memory, small, 20, served))
    assert not memory.grow(Claim(5), 5), "newcomers queue behind those waiting"
    memory.give_back(30)  # room for the small one only
    assert served == ["20"] and memory.waiting == 1
    memory.give_back(70)
    memory.finish(small)
    memory.give_back(20)
    assert served == ["20", "90"] and memory.waiting == 0
    assert stats.request_memory_waits == 2


def test_a_forgotten_claim_and_a_cancelled_waiter_free_their_place() -> None:
    memory = RequestMemory(100)
    stalled, next_one = Claim(100), Claim(60)
    assert memory.grow(stalled, 50)
    served: list[str] = []
    waiter = Waiter(memory, next_one, 60, served)
    memory.wait(waiter)
    memory.forget(stalled)  # its connection closed...
    memory.give_back(50)  # ...and gave its bytes back
    assert served == ["60"]
    memory.cancel(waiter)  # already served, or never queued: nothing happens


@settings(max_examples=300, deadline=None)
@given(
    limit=st.integers(1, 1000),
    sizes=st.lists(st.integers(1, 1000), min_size=1, max_size=8),
    steps=st.lists(st.tuples(st.integers(0, 7), st.integers(1, 300)), max_size=60),
)
def test_whatever_is_granted_every_claim_can_still_finish(
    limit: int, sizes: list[int], steps: list[tuple[int, int]]
) -> None:
    """Grow claims at random; then finishing them one at a time, smallest lack first,
    always succeeds: no grant ever leaves the budget deadlocked."""
    memory = RequestMemory(limit)
    claims = [Claim(min(size, limit)) for size in sizes]
    for index, step in steps:
        claim = claims[index % len(claims)]
        memory.grow(claim, min(step, claim.size - claim.held))
        assert memory.used <= limit
    open_claims = [claim for claim in claims if claim.held]
    while open_claims:
        claim = min(open_claims, key=lambda c: c.size - c.held)
        lacking = claim.size - claim.held
        assert lacking == 0 or memory.grow(claim, lacking, waiting=True)
        memory.finish(claim)
        memory.give_back(claim.size)
        open_claims.remove(claim)
    assert memory.used == 0


def test_the_budget_must_be_positive() -> None:
    with pytest.raises(ValueError, match="must be positive"):
        RequestMemory(0)


def test_a_request_may_take_its_whole_size_only_while_half_the_budget_stays_free() -> None:
    memory = RequestMemory(100)
    assert memory.plentiful_for(50) and not memory.plentiful_for(51)
    memory.take(30)
    assert memory.plentiful_for(20) and not memory.plentiful_for(21)
    memory.give_back(30)
    memory.wait(lambda: False)
    assert not memory.plentiful_for(1), "never ahead of a connection waiting in line"
