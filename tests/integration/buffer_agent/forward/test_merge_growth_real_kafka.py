"""A backlog of small records from batching clients, merged and forwarded to Apache Kafka.

The forwarder merges consecutive small uncompressed client batches of a partition into one
batch of up to ``ForwarderConfig.max_merge_bytes`` (1,000,000). The merge rewrites every
record's offset and timestamp deltas against the merged batch's start, and they grow as a
record lies further from it: 100 records a client batch, batches 20 s apart, take 2-4 bytes
more a record once merged. Such a backlog once merged into 1,111,905-byte batches planned at
1,000,000: above the topic's default ``max.message.bytes`` (1,048,588), refused with
MESSAGE_TOO_LARGE, and merged again the same way for ever, so the partition never forwarded
again. Now a merged batch that came out larger than planned is made again from fewer frames.

Here the real forwarder forwards such a backlog (two partitions of 600 client batches each,
timestamps ending now) to a topic with Kafka's default limit: every record must be in Kafka
once, in order, soon, with nothing refused as too large and nothing dead-lettered.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient, ConfigResource

from durable_producer.buffer_agent.figures.metrics import AgentMetrics
from durable_producer.buffer_agent.forward.config import ForwarderConfig
from durable_producer.buffer_agent.forward.dead_letter import DeadLetterStore, list_dead_letters
from durable_producer.buffer_agent.forward.forwarder import Forwarder
from durable_producer.buffer_agent.wal import WriteAheadLog
from support.batch_builder import SampleRecord, build_batch
from support.broker import KafkaBroker, consume_all
from support.kafka_fixtures import TopicFactory
from support.raw_fetch import high_watermark, stored_batches

pytestmark = pytest.mark.integration

PARTITIONS = 2
CLIENT_BATCHES = 600
"""A partition's client batches: about 1.7 MB in all, so more than one merged batch."""
RECORDS_PER_BATCH = 100
VALUE_BYTES = 20
APART_MS = 20_000
"""Between two client batches of a partition: each record's merged timestamp delta grows."""
KAFKA_DEFAULT_MAX_MESSAGE_BYTES = 1_048_588
DELIVERED_WITHIN_S = 60.0
CONFIG = ForwarderConfig(checkpoint_interval_s=0.2)


def _value(partition: int, batch: int, index: int) -> bytes:
    value = b"p%d-b%03d-r%02d-" % (partition, batch, index)
    return value + b"v" * (VALUE_BYTES - len(value))


def _backlog(end_ms: int) -> dict[int, list[list[SampleRecord]]]:
    """Each partition's client batches, oldest first, the last one at ``end_ms``; every
    record of a batch has its batch's timestamp (a client batch of one millisecond)."""
    return {
        partition: [
            [
                SampleRecord(None, _value(partition, batch, index), timestamp)
                for index in range(RECORDS_PER_BATCH)
            ]
            for batch in range(CLIENT_BATCHES)
            for timestamp in [end_ms - (CLIENT_BATCHES - 1 - batch) * APART_MS]
        ]
        for partition in range(PARTITIONS)
    }


def _max_message_bytes(bootstrap: str, topic: str) -> int:
    resource = ConfigResource(ConfigResource.Type.TOPIC, topic)
    admin = AdminClient({"bootstrap.servers": bootstrap})
    entries = admin.describe_configs([resource])[resource].result(30)
    return int(entries["max.message.bytes"].value)


def _too_large_refusals(metrics: AgentMetrics) -> float:
    labels = {"kind": "delivery", "error": "MESSAGE_TOO_LARGE"}
    return metrics.registry.get_sample_value("durable_agent_kafka_errors_total", labels) or 0.0


def test_a_backlog_of_small_records_merges_within_kafkas_default_limit_and_is_delivered(
    kafka_broker: KafkaBroker, new_topic: TopicFactory, wal: WriteAheadLog, tmp_path: Path
) -> None:
    bootstrap = kafka_broker.bootstrap
    topic = new_topic(PARTITIONS)
    assert _max_message_bytes(bootstrap, topic) == KAFKA_DEFAULT_MAX_MESSAGE_BYTES
    backlog = _backlog(end_ms=int(time.time() * 1000))
    stored_bytes = dict.fromkeys(range(PARTITIONS), 0)
    for batch in range(CLIENT_BATCHES):  # the partitions' client batches interleaved
        for partition in range(PARTITIONS):
            records = backlog[partition][batch]
            payload = build_batch(records)
            stored_bytes[partition] += len(payload)
            wal.append(topic, partition, payload, len(records))
    assert min(stored_bytes.values()) > CONFIG.max_merge_bytes, "more than one merge apiece"
    total = PARTITIONS * CLIENT_BATCHES * RECORDS_PER_BATCH
    metrics = AgentMetrics()
    forwarder = Forwarder(
        wal,
        {"bootstrap.servers": bootstrap},
        dead_letters=DeadLetterStore(tmp_path / "dead-letter"),
        state_dir=tmp_path / "state",
        metrics=metrics,
        config=CONFIG,
    )

    summary = forwarder.drain(timeout_s=DELIVERED_WITHIN_S)

    refused = _too_large_refusals(metrics)
    assert summary.complete, (
        f"{summary.forwarded_records} of {total} records forwarded in {DELIVERED_WITHIN_S:.0f} s"
        f" (checkpoint at frame {summary.checkpoint_offset} of {summary.target_offset});"
        f" Kafka refused {refused:.0f} batches with MESSAGE_TOO_LARGE"
    )
    assert refused == 0, "no merged batch above the topic's limit"
    assert summary.dead_letters == 0 and list_dead_letters(tmp_path / "dead-letter") == []
    assert summary.forwarded_records == total and summary.possible_duplicates == 0

    ends = {p: high_watermark(bootstrap, topic, p) for p in range(PARTITIONS)}
    assert ends == dict.fromkeys(range(PARTITIONS), CLIENT_BATCHES * RECORDS_PER_BATCH)
    consumed = consume_all(bootstrap, topic, expected=total)
    for partition in range(PARTITIONS):
        got = [(r.value, r.timestamp_ms) for r in consumed if r.partition == partition]
        want = [(r.value, r.timestamp_ms) for batch in backlog[partition] for r in batch]
        assert got == want, f"partition {partition}: every record once, in order"
        sizes = [stored.header.size for stored in stored_batches(bootstrap, topic, partition)]
        assert max(sizes) <= CONFIG.max_merge_bytes, sizes
        assert len(sizes) < CLIENT_BATCHES / 10, f"still merged: {len(sizes)} batches"
        print(f"partition {partition}: {len(sizes)} batches in Kafka, sizes {sizes}")
    print(f"{total} records delivered in {summary.elapsed_s:.1f} s")
