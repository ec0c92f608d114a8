"""Rate-limited warnings: a misbehaving peer must not flood the log."""

from __future__ import annotations

import logging
import time


class RateLimitedLog:
    """One log line per reason per ``interval_s`` on ``logger``; the rest are counted, not printed.

    The next line printed for a reason says how many of its kind were suppressed before it.
    At most ``MAX_REASONS`` reasons are remembered (a reason may name what a client sent, e.g.
    a topic): past that, reasons whose interval has passed are forgotten, then the oldest.
    """

    MAX_REASONS = 1024

    def __init__(self, logger: logging.Logger, interval_s: float = 5.0) -> None:
        self._logger = logger
        self._interval_s = interval_s
        self._last: dict[str, tuple[float, int]] = {}

    def warning(self, reason: str, message: str, *args: object) -> None:
        now = time.monotonic()
        last, suppressed = self._last.get(reason, (-self._interval_s, 0))
        if now - last < self._interval_s:
            self._last[reason] = (last, suppressed + 1)
            return
        self._last.pop(reason, None)
        self._last[reason] = (now, 0)  # insertion order is the order of last printing
        if len(self._last) > self.MAX_REASONS:
            self._forget(now)
        if suppressed:
            message += " (%d similar suppressed)"
            args = (*args, suppressed)
        self._logger.warning(message, *args)

    def _forget(self, now: float) -> None:
        expired = [r for r, (last, n) in self._last.items() if now - last >= self._interval_s]
        for reason in expired:
            del self._last[reason]  # its suppressed count (if any) goes unsaid
        while len(self._last) > self.MAX_REASONS:
            del self._last[next(iter(self._last))]
