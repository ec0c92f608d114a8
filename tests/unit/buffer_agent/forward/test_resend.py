"""Re-sending a letter of the per-record forwarder of earlier versions: the one record it
holds becomes a v2 batch that decodes to that record (key, value, headers, timestamp), null
fields and negative numbers included. The batches of today's letters are re-sent as they were
stored (tests/integration/buffer_agent/forward/test_forwarder.py)."""

from __future__ import annotations

import pytest

from durable_producer.buffer_agent.forward.dead_letter import DeadLetter
from durable_producer.buffer_agent.forward.resend import _batches_of
from durable_producer.buffer_agent.kafka.record_decode import decode_batch


def letter(**fields: object) -> DeadLetter:
    base: dict[str, object] = {
        "id": "9-0",
        "recorded_ms": 1,
        "wal_offset": 9,
        "topic": "orders",
        "partition": 0,
        "record_index": 0,
        "reason": "refused",
        "error_code": "MESSAGE_TOO_LARGE",
    }
    return DeadLetter(**(base | fields))  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("key", "value", "headers", "timestamp"),
    [
        (b"k", b"v" * 300, (("h", b"x"), ("nul\x00key", None)), 1_700_000_000_123),
        (None, None, (), 0),
        (b"", b"", (("", b""),), None),
        (b"k" * 70_000, b"v", tuple((f"h{i}", b"y" * i) for i in range(200)), 5),
    ],
)
def test_an_earlier_agents_letter_is_sent_as_the_record_it_holds(
    key: bytes | None,
    value: bytes | None,
    headers: tuple[tuple[str, bytes | None], ...],
    timestamp: int | None,
) -> None:
    old = letter(key=key, value=value, headers=headers, timestamp_ms=timestamp)
    [(batch, count)] = _batches_of(old)
    assert count == 1
    decoded = decode_batch(bytes(batch), fast=False)
    assert decoded.header.record_count == 1
    [record] = decoded.records
    assert (record.key, record.value) == (key, value)
    assert [(name, data) for name, data in record.headers] == list(headers)
    assert record.timestamp_ms == (-1 if timestamp is None else timestamp)
    assert decode_batch(bytes(batch)).records == decoded.records  # the compiled decoder agrees
