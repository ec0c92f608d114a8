"""Tests that leave a librdkafka client alive in the pytest process fail.

A client still alive when a process exits can crash it: ``exit()`` cleans up the OpenSSL bundled
in librdkafka while the client's threads still use it (docs/development.md, "librdkafka clients
end before the process does"). The project-wide conftest counts the live clients (one
``rdk:main`` thread each) before and after every test; a test after which there are more, even
after a garbage collection and a short wait (a client another thread is destroying), fails in
its teardown, and the terminal summary lists every test that left clients, failed or not.

A client is kept alive past its test by a reference from C as well as from Python: a producer
holds each undelivered message's delivery callback, so a bound method keeps its object (and,
through a callback of the client's own, the client) alive until the reports are served.
"""

from __future__ import annotations

import gc
import time
from dataclasses import dataclass, field

from support.threads import live_librdkafka_clients

DESTROYING_GRACE_S = 2.0
"""How long a client over the count may take to go (another thread may be destroying it)."""


@dataclass
class ClientLeaks:
    """The tests after which more librdkafka clients were alive than before, and how many more."""

    left_by: dict[str, int] = field(default_factory=dict)

    def after(self, nodeid: str, before: int) -> int:
        """How many more clients are alive than ``before`` (noted for ``nodeid``): a collection
        first frees those only in cycles, and a client being destroyed has a moment to go."""
        if live_librdkafka_clients() <= before:
            return 0
        gc.collect()
        deadline = time.monotonic() + DESTROYING_GRACE_S
        while (left := live_librdkafka_clients() - before) > 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        if left > 0:
            self.left_by[nodeid] = left
        return max(left, 0)

    def summary(self) -> list[str]:
        """Lines for the terminal summary: one a test that left clients, then the total."""
        if not self.left_by:
            return []
        lines = [f"{nodeid}: {n} left alive" for nodeid, n in self.left_by.items()]
        lines.append(
            f"{sum(self.left_by.values())} librdkafka client(s) left alive by "
            f"{len(self.left_by)} test(s); {live_librdkafka_clients()} alive now"
        )
        return lines
