"""log_limits: one line per reason per interval, and the count of what was suppressed."""

from __future__ import annotations

import logging

import pytest

from durable_producer.buffer_agent import log_limits
from durable_producer.buffer_agent.log_limits import RateLimitedLog

LOGGER = logging.getLogger("test.log_limits")


def test_one_line_per_reason_per_interval(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    now = [100.0]
    monkeypatch.setattr(log_limits.time, "monotonic", lambda: now[0])
    limited = RateLimitedLog(LOGGER, interval_s=5.0)
    with caplog.at_level(logging.WARNING, logger=LOGGER.name):
        limited.warning("a", "refusing %s", "first")
        limited.warning("a", "refusing %s", "second")
        limited.warning("a", "refusing %s", "third")
        limited.warning("b", "other %d", 1)  # another reason has its own budget
        now[0] += 5.0
        limited.warning("a", "refusing %s", "fourth")
        limited.warning("a", "refusing %s", "fifth")
    assert [record.getMessage() for record in caplog.records] == [
        "refusing first",
        "other 1",
        "refusing fourth (2 similar suppressed)",
    ]
    assert {record.name for record in caplog.records} == {LOGGER.name}


def test_reasons_remembered_are_bounded() -> None:
    """Review finding 16: a reason per distinct topic name a client asked about was kept for
    ever."""
    limited = RateLimitedLog(logging.getLogger("test"), interval_s=3600)
    for number in range(3 * RateLimitedLog.MAX_REASONS):
        limited.warning(f"metadata:no-such-{number}", "unknown topic %s", number)
    assert len(limited._last) == RateLimitedLog.MAX_REASONS
    assert f"metadata:no-such-{3 * RateLimitedLog.MAX_REASONS - 1}" in limited._last
