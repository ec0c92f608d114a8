"""A hand-driven clock for code that takes a ``clock: Callable[[], float]``."""

from __future__ import annotations


class Clock:
    """Returns ``now`` when called; tests move time by setting or adding to ``now``."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now
