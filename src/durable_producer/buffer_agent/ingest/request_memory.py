"""One budget of bytes for every connection's request buffers together.

A connection takes from the budget as the bytes of a request arrive (``frame_receiver``) and
gives them back once the request is answered or the connection closes. When the budget is
used up, a connection that needs more stops reading (the kernel's socket buffer and TCP flow
control hold the client back) and waits in line. So the agent holds at most ``limit`` bytes
of requests however many clients send, and whatever they announce in their size prefixes.

While at least half the budget is free, a large request whose first bytes have arrived
takes its whole announced size at once (``plentiful_for``): a client sends a request at once,
and one buffer of the right size saves the copies of growing one. Beyond that, large requests
are received a part at a time, each part taken when its bytes arrive: a :class:`Claim` per
request being received. So clients that announce much and send little hold at most half the
budget between them for bytes they never send.

Growing claims could deadlock (each holds part of the budget and waits for more than is
left), so a claim only grows while the rest of the budget can still finish every claim in
some order (the banker's rule: a request's announced size is its maximum need, never more
than the budget). A request that is complete needs nothing more and comes back once
answered.

Bytes already received are always taken (``take``): a small request copied out of a
connection's staging buffer is never dropped, at worst the budget runs over by it and others
wait.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from durable_producer.buffer_agent.ingest.stats import IngestStats

DEFAULT_REQUEST_MEMORY_BYTES = 64 << 20
"""Default budget: an eighth of the sidecar's 512 MiB limit; 4 producers keeping 5 requests of
1 MB in flight each use a third of it."""

Waiter = Callable[[], bool]
"""Called when bytes come back: grows its claim (``grow`` with ``waiting=True``) and returns
True, or returns False to keep its place in line."""


class Claim:
    """One large request being received: ``size`` announced, ``held`` taken so far."""

    __slots__ = ("held", "size")

    def __init__(self, size: int) -> None:
        self.size = size
        self.held = 0


class RequestMemory:
    """The shared budget; ``stats`` (optional) mirrors its use for metrics."""

    def __init__(self, limit: int, stats: IngestStats | None = None) -> None:
        if limit <= 0:
            raise ValueError(f"the request memory budget must be positive, not {limit}")
        self.limit = limit
        self.used = 0
        self.peak = 0
        """Highest use since the last ``reset_peak``."""
        self._stats = stats
        self._claims: set[Claim] = set()
        self._waiters: list[Waiter] = []
        self._wake_scheduled = False

    # ------------------------------------------------------------------ complete requests
    def take(self, size: int) -> None:
        """Take ``size`` bytes whether or not they fit (they are already received)."""
        self.used += size
        self.peak = max(self.peak, self.used)
        if self._stats is not None:
            self._stats.request_memory_bytes = self.used

    def give_back(self, size: int) -> None:
        """Return ``size`` bytes and let waiters, first in line first, take what now fits."""
        if size <= 0:
            return
        self.used -= size
        if self._stats is not None:
            self._stats.request_memory_bytes = self.used
        self._wake()

    # ------------------------------------------------------------------ requests being received
    def plentiful_for(self, size: int) -> bool:
        """``size`` more bytes would leave at least half the budget free, and nobody waits:
        a large request may take its whole announced size at once (one buffer, no copies as
        it grows). Below that, requests take what has arrived, a part at a time."""
        return not self._waiters and self.used + size <= self.limit // 2

    def grow(self, claim: Claim, size: int, *, waiting: bool = False) -> bool:
        """Take ``size`` more bytes for ``claim`` if they fit, nobody waits before us (unless
        ``waiting``: it is our turn) and every claim can still be finished afterwards."""
        if (self._waiters and not waiting) or self.used + size > self.limit:
            return False
        if claim.held + size == claim.size and claim not in self._claims:
            # complete at once: it lacks nothing, so every claim that could finish before
            # still can (it finishes first and gives back all it holds)
            claim.held = claim.size
            self.take(size)
            return True
        self._claims.add(claim)
        claim.held += size
        if not self._can_finish_all():
            claim.held -= size
            if not claim.held:
                self._claims.discard(claim)
            return False
        self.take(size)
        return True

    def finish(self, claim: Claim) -> None:
        """``claim``'s request is complete: what it holds is given back with the request.
        Others may grow now (it lacks nothing any more)."""
        self._claims.discard(claim)
        if self._waiters:
            self._schedule_wake()

    def forget(self, claim: Claim) -> None:
        """``claim``'s connection closed: its bytes are given back with the connection's."""
        self._claims.discard(claim)
        self._wake()

    def _can_finish_all(self) -> bool:
        """Some order finishes every claim: each in turn gets what it lacks from the bytes
        not held by claims (complete requests come back), then returns what it held."""
        free = self.limit - sum(claim.held for claim in self._claims)
        for lacking, held in sorted((c.size - c.held, c.held) for c in self._claims):
            if lacking > free:
                return False
            free += held
        return True

    # ------------------------------------------------------------------ the line
    def wait(self, waiter: Waiter) -> None:
        """Queue ``waiter`` (see :data:`Waiter`) until bytes come back."""
        self._waiters.append(waiter)
        if self._stats is not None:
            self._stats.request_memory_waits += 1
        self._schedule_wake()  # it may have queued behind waiters only: see if it can go

    def _schedule_wake(self) -> None:
        """Serve the line soon, outside the caller (a receiver in the middle of a callback)."""
        if self._wake_scheduled:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return  # no event loop (unit tests): the next give_back serves the line
        self._wake_scheduled = True
        loop.call_soon(self._scheduled_wake)

    def _scheduled_wake(self) -> None:
        self._wake_scheduled = False
        self._wake()

    def cancel(self, waiter: Waiter) -> None:
        """Take ``waiter`` out of the line (its connection closed)."""
        if waiter in self._waiters:
            self._waiters.remove(waiter)
            self._wake()

    def _wake(self) -> None:
        """Serve waiters in order; one that cannot be served yet does not block those after
        it (another claim may be the one that can finish)."""
        for waiter in list(self._waiters):
            if self.used >= self.limit:
                return
            if waiter in self._waiters and waiter():
                self._waiters.remove(waiter)

    def reset_peak(self) -> None:
        self.peak = self.used

    @property
    def waiting(self) -> int:
        return len(self._waiters)
