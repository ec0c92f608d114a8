"""A batch dead-lettered while a copy of it is in Kafka, against Apache Kafka.

Batch B is appended by the leader but its answer is lost; B's retries are then refused for
good (the topic's ``max.message.bytes`` lowered below B's size: Kafka checks the size in
``UnifiedLog.analyzeAndValidateRecords``, before its producer-state duplicate check), and B
is dead-lettered after ``dead_letter_after_s``. The next frame C used to take B's sequence
number: the leader, which holds B under it, answered DUPLICATE_SEQUENCE_NUMBER, which the
forwarder takes as success, so C was acknowledged and checkpointed but never stored. Now the
frames after B go under a new producer epoch (``PartitionQueue.drop_heads``,
``Forwarder._letter_for_heads``) and C is stored.

The fault proxy is needed because Apache Kafka cannot be made to append a batch and lose its
answer on demand: in ``ANSWERS_LOST`` mode the proxy lets the Produce request reach the
broker and drops the answer on its way back, as a connection lost mid-answer would. The
broker is read and reconfigured at its own address (the proxy's is the advertised one), by
requests written here on the wire, so neither depends on the proxy's mode.

The steps: a warm-up frame first (with every answer lost the forwarder would not get the
topic's metadata or its producer id), then B with the answers lost until Kafka's end offset
shows B appended; the proxy cut while the limit is lowered (a retry reaching Kafka first would
be answered DUPLICATE_SEQUENCE_NUMBER, B acknowledged); then B's retries are refused as too
large until B is dead-lettered, and C is written to the WAL after that.
"""

from __future__ import annotations

import random
import socket
import struct
import time
from collections import Counter
from dataclasses import replace
from pathlib import Path

import pytest
from kio.serial import entity_reader

from durable_producer.buffer_agent.figures.metrics import AgentMetrics
from durable_producer.buffer_agent.forward.config import ForwarderConfig
from durable_producer.buffer_agent.forward.dead_letter import DeadLetterStore, list_dead_letters
from durable_producer.buffer_agent.forward.forwarder import MAYBE_IN_KAFKA, Forwarder
from durable_producer.buffer_agent.forward.identity import load_identity
from durable_producer.buffer_agent.kafka.protocol import (
    build,
    nested_schema,
    request_schema,
    response_schema,
)
from durable_producer.buffer_agent.kafka.record_batch import COMPRESSION_GZIP
from durable_producer.buffer_agent.wal import WriteAheadLog
from support.batch_builder import SampleRecord, build_batch
from support.broker import KafkaBroker, ProxiedBroker, consume_all
from support.kafka_fixtures import TopicFactory
from support.kafka_wire import encode_request, recv_exactly
from support.raw_fetch import high_watermark
from support.waiting import wait_for

pytestmark = pytest.mark.integration

API_INCREMENTAL_ALTER_CONFIGS = 44
API_DESCRIBE_CONFIGS = 32
TOPIC_RESOURCE = 2
SET = 0
LIMIT = 10_000
"""The topic's ``max.message.bytes`` once lowered: below B's size, above C's."""
DEAD_LETTER_AFTER_S = 3.0
CONFIG = ForwarderConfig(
    checkpoint_interval_s=0.2,
    hint_interval_s=0.1,
    request_timeout_s=2.0,
    dead_letter_after_s=DEAD_LETTER_AFTER_S,
    retry_backoff_s=0.05,
    retry_backoff_max_s=0.3,
    metadata_interval_s=1.0,
)

_random = random.Random(20261205)
WARM = [SampleRecord(b"w", b"warm-up", 1_000, ())]
B_RECORDS = [SampleRecord(b"b-%d" % n, _random.randbytes(3_000), 2_000 + n, ()) for n in range(10)]
B = build_batch(B_RECORDS, compression=COMPRESSION_GZIP)
"""About 30 kB stored (random values do not compress); never merged with a neighbour."""
C_VALUE = b"C: the frame after the dead-lettered one"
C = build_batch([SampleRecord(b"c", C_VALUE, 3_000, ())])


def _ask(address: str, api_key: int, version: int, body: object) -> object:
    """One request to the broker at ``address`` itself (no metadata: the proxy is bypassed)."""
    host, port = address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(encode_request(api_key, version, 1, body))
        (size,) = struct.unpack(">i", recv_exactly(sock, 4))
        frame = recv_exactly(sock, size)
    schema = response_schema(api_key, version)
    _, header_size = entity_reader(schema.__header_schema__)(frame, 0)
    answer, _ = entity_reader(schema)(frame, header_size)
    return answer


def _set_max_message_bytes(address: str, topic: str, limit: int) -> None:
    schema = request_schema(API_INCREMENTAL_ALTER_CONFIGS, 0)
    config = build(
        nested_schema(schema, "AlterableConfig"),
        name="max.message.bytes",
        config_operation=SET,
        value=str(limit),
    )
    resource = build(
        nested_schema(schema, "AlterConfigsResource"),
        resource_type=TOPIC_RESOURCE,
        resource_name=topic,
        configs=(config,),
    )
    body = build(schema, resources=(resource,), validate_only=False)
    answer = _ask(address, API_INCREMENTAL_ALTER_CONFIGS, 0, body)
    (result,) = answer.responses  # type: ignore[attr-defined]
    assert result.error_code.value == 0, f"alter configs: {result.error_code}"


def _max_message_bytes(address: str, topic: str) -> int:
    schema = request_schema(API_DESCRIBE_CONFIGS, 1)
    resource = build(
        nested_schema(schema, "DescribeConfigsResource"),
        resource_type=TOPIC_RESOURCE,
        resource_name=topic,
        configuration_keys=("max.message.bytes",),
    )
    answer = _ask(address, API_DESCRIBE_CONFIGS, 1, build(schema, resources=(resource,)))
    (result,) = answer.results  # type: ignore[attr-defined]
    (entry,) = result.configs
    return int(entry.value)


def _errors(metrics: AgentMetrics, name: str) -> float:
    return sum(
        sample.value
        for family in metrics.registry.collect()
        for sample in family.samples
        if sample.name.endswith("kafka_errors_total") and sample.labels.get("error") == name
    )


@pytest.mark.parametrize("c_waiting", [False, True], ids=["c-after-the-letter", "c-behind-b"])
def test_the_frame_after_a_letter_kafka_holds_a_copy_of_is_stored_before_it_is_acknowledged(
    proxied_broker: ProxiedBroker,
    new_topic: TopicFactory,
    wal: WriteAheadLog,
    data_dir: Path,
    c_waiting: bool,
) -> None:
    """``c_waiting``: C is written before B's retries reach Kafka, so it goes behind the
    first; the leader takes it (it follows B's copy) and the forwarder moves to a new epoch
    before B is lettered, which numbers B anew: its letter still says it may be in Kafka
    (it did not: the mark was of the old epoch)."""
    started = time.monotonic()
    proxy = proxied_broker.proxy
    direct = proxied_broker.direct_address
    topic = new_topic(1, bootstrap=proxied_broker.bootstrap)
    assert len(B) > LIMIT and len(C) < LIMIT, (len(B), len(C))
    wal.append(topic, 0, build_batch(WARM), 1)
    metrics = AgentMetrics()
    forwarder = Forwarder(
        wal,
        {"bootstrap.servers": proxied_broker.bootstrap},
        dead_letters=DeadLetterStore(data_dir / "dead-letter"),
        state_dir=data_dir / "state",
        metrics=metrics,
        config=CONFIG,
    ).start()
    try:
        # The metadata and the producer id come through first: in ANSWERS_LOST the forwarder
        # would hear neither.
        wait_for(lambda: wal.checkpoint_offset == 1, 30, what="the warm-up frame delivered")
        proxy.lose_answers()
        wal.append(topic, 0, B, len(B_RECORDS))
        wait_for(
            lambda: high_watermark(direct, topic, 0) == 1 + len(B_RECORDS),
            15,
            interval=0.05,
            what="B appended by Kafka, its answer lost",
        )
        proxy.cut()  # nothing reaches Kafka while its limit is lowered
        _set_max_message_bytes(direct, topic, LIMIT)
        wait_for(lambda: _max_message_bytes(direct, topic) == LIMIT, 10, what="the limit lowered")
        assert wal.checkpoint_offset == 1 and forwarder.stats().forwarded_records == 1
        if c_waiting:  # queued behind B, sent with B's first retry, well within B's window
            wal.append(topic, 0, C, 1)
        proxy.restore()
        wait_for(
            lambda: _errors(metrics, "MESSAGE_TOO_LARGE") >= 1,
            10,
            interval=0.02,
            what="a retry of B refused as too large",
        )
        wait_for(
            lambda: len(list_dead_letters(data_dir / "dead-letter")) == 1,
            DEAD_LETTER_AFTER_S + 15,
            interval=0.05,
            what="B dead-lettered",
        )
        # C comes after the letter: the next sequence is B's. In the WAL while B was retried
        # (``c_waiting``), C goes with a retry (after a refusal the queue sends its batches
        # again in order and those after them too): the leader takes C, which follows B's
        # copy, refuses B, and the forwarder moves to a new epoch before B is dead-lettered.
        if not c_waiting:
            wait_for(lambda: wal.checkpoint_offset == 2, 10, what="the checkpoint past B")
            wal.append(topic, 0, C, 1)
        summary = forwarder.drain(timeout_s=20)
        stats = forwarder.stats()
    finally:
        forwarder.stop()

    assert summary.complete, summary
    assert wal.checkpoint_offset == 3, "the checkpoint passed B and C"
    assert stats.forwarded_records == 2 and stats.dead_letters == len(B_RECORDS), stats
    values = Counter(record.value for record in consume_all(direct, topic, timeout=20))
    assert values[C_VALUE] == 1, (
        f"C was acknowledged (checkpoint {wal.checkpoint_offset}) but Kafka does not hold it:"
        f" {high_watermark(direct, topic, 0)} records stored"
    )
    assert values == Counter([WARM[0].value, C_VALUE, *(r.value for r in B_RECORDS)]), (
        "B once (its first append), the warm-up and C once each"
    )
    (letter,) = list_dead_letters(data_dir / "dead-letter")
    assert letter.wal_offset == 1 and letter.payload == B
    assert letter.error_code == "MESSAGE_TOO_LARGE"
    assert "it may be in Kafka as well" in letter.reason, letter.reason
    assert _errors(metrics, "MESSAGE_TOO_LARGE") >= 1, "B's retries were refused as too large"
    assert stats.producer_resets >= 1, "C went under a new epoch"
    if c_waiting:  # B numbered anew under the new epoch, its copy counted (not lettered first)
        assert stats.possible_duplicates == len(B_RECORDS), stats
    print(f"letter: {letter.reason}; {time.monotonic() - started:.1f} s")


def test_a_letter_after_a_restart_says_a_batch_sent_before_it_may_be_in_kafka(
    kafka_broker: KafkaBroker, new_topic: TopicFactory, wal: WriteAheadLog, data_dir: Path
) -> None:
    """Which frames' answers never came is not kept on the volume (``copied_before`` nor
    ``UNKNOWN``): after a restart every frame the previous run sent is read again as one
    whose copy may be in Kafka, so its letter says so. Here the copy is not in fact in Kafka
    (the refusal came before the restart, and the volume does not keep answers): the hint
    errs on the side that never lets a re-send of the letter store it twice unwarned."""
    topic = new_topic(1, config={"max.message.bytes": "20000"})
    wal.append(topic, 0, build_batch(WARM), 1)
    big = build_batch([SampleRecord(b"big", b"H" * 50_000, 3_000, ())])
    wal.append(topic, 0, big, 1)

    def forwarder(dead_letter_after_s: float) -> Forwarder:
        return Forwarder(
            wal,
            {"bootstrap.servers": kafka_broker.bootstrap},
            dead_letters=DeadLetterStore(data_dir / "dead-letter"),
            state_dir=data_dir / "state",
            config=replace(CONFIG, dead_letter_after_s=dead_letter_after_s),
        )

    def sent_below() -> int:
        record, _ = load_identity(data_dir / "state")
        return 0 if record is None else record.sent_below

    first = forwarder(3600)  # the big frame sent, refused, retried: no letter yet
    first.start()
    try:
        wait_for(lambda: sent_below() == 2, 60, what="the big frame sent")
    finally:
        first.stop(flush_timeout_s=1.0)
    assert first.stats().dead_letters == 0

    second = forwarder(0).drain(timeout_s=30)
    assert second.complete and second.dead_letters == 1, second
    (letter,) = list_dead_letters(data_dir / "dead-letter")
    assert letter.wal_offset == 1 and letter.payload == big
    assert letter.reason.endswith(MAYBE_IN_KAFKA), letter.reason
    assert [r.value for r in consume_all(kafka_broker.bootstrap, topic, expected=1)] == [
        b"warm-up"
    ]
