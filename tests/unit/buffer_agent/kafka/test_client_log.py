"""librdkafka's log lines: one line per spell of connection failures, not one per failure."""

from __future__ import annotations

import logging

import pytest

from durable_producer.buffer_agent.kafka.client_log import ClientLog
from support.clock import Clock

FAIL = (
    "[thrd:127.0.0.1:9/bootstrap]: 127.0.0.1:9/bootstrap: Connect to ipv4#127.0.0.1:9 failed:"
    " Connection refused (after 0ms in state CONNECT)"
)


def _lines(caplog: pytest.LogCaptureFixture) -> list[tuple[int, str]]:
    return [(record.levelno, record.getMessage()) for record in caplog.records]


def test_a_spell_of_connection_failures_is_one_warning_a_reminder_and_one_recovery(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = Clock()
    seen: list[str] = []
    client = ClientLog(
        logging.getLogger("test.client"),
        "forwarder",
        on_connection_error=seen.append,
        reminder_s=300,
        clock=clock,
    )
    caplog.set_level(logging.DEBUG, "test.client")
    for second in range(0, 400, 2):  # 200 failures over 400 s, as librdkafka logs them
        clock.now = second
        client.log(logging.ERROR, "%s [%s] %s", "FAIL", "rdkafka#producer-1", FAIL)
    clock.now = 400
    client.recovered()  # acknowledgements of records in flight: too soon to call it over
    assert client.failing
    clock.now = 410
    client.recovered()
    client.recovered()  # nothing more to say

    lines = _lines(caplog)
    assert len(seen) == 200, "every failure still reaches the forwarder's health"
    assert len(lines) == 3
    assert lines[0][0] == logging.WARNING
    assert "Kafka client forwarder: 127.0.0.1:9/bootstrap: Connect to" in lines[0][1]
    assert "[thrd:" not in lines[0][1]
    assert "still failing after 300 s (150 lines suppressed)" in lines[1][1]
    assert lines[2] == (
        logging.INFO,
        "Kafka client forwarder: connections work again after 410 s (199 connection error"
        " lines suppressed)",
    )
    assert not client.failing


def test_other_lines_keep_their_level_at_most_once_a_minute_per_facility(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = Clock()
    client = ClientLog(logging.getLogger("test.client"), "metadata", repeat_s=60, clock=clock)
    caplog.set_level(logging.DEBUG, "test.client")
    for second in range(0, 70, 10):
        clock.now = second
        client.log(logging.WARNING, "%s [%s] %s", "SASL", "rdkafka#producer-1", "bad creds")

    assert _lines(caplog) == [
        (logging.WARNING, "Kafka client metadata: SASL: bad creds"),
        (logging.WARNING, "Kafka client metadata: SASL: bad creds (5 similar suppressed)"),
    ]
