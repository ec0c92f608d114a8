"""Which tests leave a librdkafka client alive in the pytest process.

A client still alive when a process exits can crash it: ``exit()`` cleans up the OpenSSL bundled
in librdkafka while the client's threads still use it (docs/development.md, "librdkafka clients
end before the process does"). The project-wide conftest counts the live clients (one
``rdk:main`` thread each) around every test; a test after which there are more, even after a
garbage collection, is noted with how many it left, and the terminal summary lists them.
"""

from __future__ import annotations

import gc
from dataclasses import dataclass, field

from support.threads import live_librdkafka_clients


@dataclass
class ClientLeaks:
    """The tests after which more librdkafka clients were alive than before, and how many more."""

    left_by: dict[str, int] = field(default_factory=dict)

    def before(self) -> int:
        return live_librdkafka_clients()

    def after(self, nodeid: str, before: int) -> None:
        """Note ``nodeid`` if it left clients; a collection first frees those only in cycles."""
        if live_librdkafka_clients() <= before:
            return
        gc.collect()
        left = live_librdkafka_clients() - before
        if left > 0:
            self.left_by[nodeid] = left

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
