"""The forwarder against Apache Kafka: exact content, outages, restarts, dead letters."""

from __future__ import annotations

import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient, ConfigResource

from durable_producer.buffer_agent.figures.metrics import AgentMetrics
from durable_producer.buffer_agent.forward import dead_letter, partition_queue
from durable_producer.buffer_agent.forward.config import ForwarderConfig
from durable_producer.buffer_agent.forward.dead_letter import DeadLetterStore, list_dead_letters
from durable_producer.buffer_agent.forward.forwarder import Forwarder
from durable_producer.buffer_agent.forward.identity import (
    IdentityFile,
    IdentityRecord,
    load_identity,
)
from durable_producer.buffer_agent.forward.resend import resend_dead_letters
from durable_producer.buffer_agent.kafka.record_batch import (
    COMPRESSION_GZIP,
    COMPRESSION_LZ4,
    COMPRESSION_NONE,
    COMPRESSION_ZSTD,
)
from durable_producer.buffer_agent.wal import WalClosedError, WriteAheadLog
from support.batch_builder import SampleRecord, build_batch, with_raw_snappy
from support.broker import KafkaBroker, ProxiedBroker, consume_all, create_topic
from support.kafka_fixtures import TopicFactory
from support.waiting import wait_for

pytestmark = pytest.mark.integration

FAST = ForwarderConfig(checkpoint_interval_s=0.2, hint_interval_s=0.1)


def _forwarder(
    wal: WriteAheadLog,
    bootstrap: str,
    data_dir: Path,
    *,
    config: ForwarderConfig = FAST,
    extra: dict[str, object] | None = None,
    metrics: AgentMetrics | None = None,
) -> Forwarder:
    return Forwarder(
        wal,
        {"bootstrap.servers": bootstrap, **(extra or {})},
        dead_letters=DeadLetterStore(data_dir / "dead-letter"),
        state_dir=data_dir / "state",
        metrics=metrics,
        config=config,
    )


def _sample(batch_index: int, size: int = 10) -> list[SampleRecord]:
    return [
        SampleRecord(
            key=None if i % 4 == 0 else b"" if i % 4 == 1 else b"key-%d" % i,
            value=None if i == 3 else b"batch %d record %d " % (batch_index, i) + b"x" * (i * 7),
            timestamp_ms=1_732_240_000_000 + batch_index * 1_000 + i * 3,
            headers=(("trace", b"t-%d" % i), ("nullable", None)) if i % 2 else (),
        )
        for i in range(size)
    ]


def _append_batches(
    wal: WriteAheadLog, topic: str, batches: int, partitions: int, start: int = 0
) -> dict[tuple[int, int], SampleRecord]:
    """Append frames round-robin over partitions; returns the records by (partition, timestamp)."""
    codecs = [COMPRESSION_NONE, COMPRESSION_GZIP, COMPRESSION_LZ4, COMPRESSION_ZSTD, -1]
    expected = {}
    for index in range(start, start + batches):
        records = _sample(index)
        codec = codecs[index % len(codecs)]
        payload = (
            with_raw_snappy(build_batch(records))
            if codec == -1
            else build_batch(records, compression=codec)
        )
        partition = index % partitions
        wal.append(topic, partition, payload, len(records))
        for record in records:
            expected[(partition, record.timestamp_ms)] = record
    return expected


WAITING_CPU_SHARE = 0.05
"""A waiting forwarder's thread may spend at most this share of a core (measured about 0.01;
0.6-1.0 before metadata refreshes backed off and the loop slept while nothing could move,
0.1 before it waited for the WAL's next append instead of looking every 2 ms)."""


def _forwarder_cpu_share(forwarder: Forwarder, seconds: float) -> float:
    """The share of a core the forwarding thread spends over the next ``seconds``."""
    thread = forwarder._thread
    assert thread is not None and thread.ident is not None
    clock = time.pthread_getcpuclockid(thread.ident)
    started = time.clock_gettime(clock)
    time.sleep(seconds)
    return (time.clock_gettime(clock) - started) / seconds


def _assert_byte_exact(consumed: list, expected: dict) -> None:
    assert len(consumed) == len(expected)
    for record in consumed:
        want = expected[(record.partition, record.timestamp_ms)]
        assert record.key == want.key
        assert record.value == want.value
        assert record.timestamp_ms == want.timestamp_ms
        assert record.headers == want.headers


def test_forwards_every_codec_byte_exact_and_checkpoints(
    kafka_broker: KafkaBroker, new_topic: TopicFactory, wal: WriteAheadLog, data_dir: Path
) -> None:
    topic = new_topic(3)
    expected = _append_batches(wal, topic, batches=30, partitions=3)
    metrics = AgentMetrics()
    forwarder = _forwarder(wal, kafka_broker.bootstrap, data_dir, metrics=metrics).start()
    try:
        wait_for(lambda: forwarder.stats().watermark == 30, 30, what="all frames delivered")
        more = _append_batches(wal, topic, batches=5, partitions=3, start=30)
        summary = forwarder.drain(timeout_s=30)
    finally:
        forwarder.stop()

    assert summary.complete and summary.target_offset == 35
    assert wal.checkpoint_offset == 35
    assert summary.forwarded_records == 350 and summary.possible_duplicates == 0
    consumed = consume_all(kafka_broker.bootstrap, topic, expected=350)
    _assert_byte_exact(consumed, expected | more)
    by_partition: dict[int, list[int]] = {}
    for record in consumed:
        by_partition.setdefault(record.partition, []).append(record.timestamp_ms)
    assert all(stamps == sorted(stamps) for stamps in by_partition.values()), "per-partition order"
    rendered = metrics.render()
    assert b"durable_agent_forwarded_records_total 350.0" in rendered
    assert b"durable_agent_checkpoint_offset 35.0" in rendered


def test_broker_cut_off_mid_stream_loses_nothing(
    proxied_broker: ProxiedBroker, wal: WriteAheadLog, data_dir: Path
) -> None:
    create_topic(proxied_broker.bootstrap, "orders", partitions=2)
    expected = _append_batches(wal, "orders", batches=10, partitions=2)
    metrics = AgentMetrics()
    forwarder = _forwarder(wal, proxied_broker.bootstrap, data_dir, metrics=metrics).start()
    try:
        wait_for(lambda: wal.checkpoint_offset == 10, 30, what="first batches checkpointed")
        proxied_broker.proxy.cut()
        expected |= _append_batches(wal, "orders", batches=20, partitions=2, start=10)
        waiting_share = _forwarder_cpu_share(forwarder, 2.0)
        assert waiting_share < WAITING_CPU_SHARE, f"{waiting_share:.0%} of a core while cut off"
        assert wal.checkpoint_offset == 10, "checkpoint must not pass undelivered frames"
        assert forwarder.stats().in_flight_records == 200
        age = metrics.registry.get_sample_value("durable_agent_oldest_unsent_age_seconds")
        assert age is not None and age >= 1.5
        proxied_broker.proxy.restore()
        summary = forwarder.drain(timeout_s=60)
    finally:
        forwarder.stop()

    assert summary.complete, summary
    assert wal.checkpoint_offset == 30
    consumed = consume_all(proxied_broker.direct_address, "orders", expected=300)
    _assert_byte_exact(consumed, expected)


def test_kafka_down_from_the_start_costs_no_cpu_and_everything_goes_once_it_is_back(
    proxied_broker: ProxiedBroker, wal: WriteAheadLog, data_dir: Path
) -> None:
    """An agent started while Kafka is unreachable keeps its frames and waits quietly (seen:
    a whole core, a refresh of the metadata on every pass of the loop, for the whole outage),
    then sends them all within a second or two of Kafka coming back."""
    create_topic(proxied_broker.bootstrap, "late", partitions=2)
    proxied_broker.proxy.cut()
    expected = _append_batches(wal, "late", batches=6, partitions=2)
    forwarder = _forwarder(wal, proxied_broker.bootstrap, data_dir).start()
    try:
        time.sleep(0.5)
        waiting_share = _forwarder_cpu_share(forwarder, 3.0)
        assert waiting_share < WAITING_CPU_SHARE, f"{waiting_share:.0%} of a core, Kafka down"
        expected |= _append_batches(wal, "late", batches=4, partitions=2, start=6)
        proxied_broker.proxy.restore()
        back = time.monotonic()
        wait_for(lambda: wal.checkpoint_offset == 10, 30, what="every frame checkpointed")
        delay = time.monotonic() - back
    finally:
        forwarder.stop()

    assert delay < 5.0, f"{delay:.1f} s from Kafka's return to the last checkpoint"
    consumed = consume_all(proxied_broker.direct_address, "late", expected=len(expected))
    _assert_byte_exact(consumed, expected)


def test_hung_broker_then_resumed_loses_nothing(
    proxied_broker: ProxiedBroker, wal: WriteAheadLog, data_dir: Path
) -> None:
    create_topic(proxied_broker.bootstrap, "hung", partitions=1)
    expected = _append_batches(wal, "hung", batches=3, partitions=1)
    forwarder = _forwarder(wal, proxied_broker.bootstrap, data_dir).start()
    broker = proxied_broker.broker
    assert broker is not None
    try:
        wait_for(lambda: wal.checkpoint_offset == 3, 30, what="first batches checkpointed")
        broker.suspend()
        try:
            expected |= _append_batches(wal, "hung", batches=5, partitions=1, start=3)
            hung_share = _forwarder_cpu_share(forwarder, 2.0)
            assert hung_share < WAITING_CPU_SHARE, f"{hung_share:.0%} of a core, Kafka hung"
            assert wal.checkpoint_offset == 3
        finally:
            broker.resume()
        summary = forwarder.drain(timeout_s=60)
    finally:
        forwarder.stop()

    assert summary.complete, summary
    _assert_byte_exact(consume_all(broker.direct_address, "hung", expected=80), expected)


CRASHING_FORWARDER = """
import sys, time
from pathlib import Path
from durable_producer.buffer_agent.forward.config import ForwarderConfig
from durable_producer.buffer_agent.forward.dead_letter import DeadLetterStore
from durable_producer.buffer_agent.forward.forwarder import Forwarder
from durable_producer.buffer_agent.wal import FsyncPolicy, WalConfig, WriteAheadLog

data, bootstrap = Path(sys.argv[1]), sys.argv[2]
wal = WriteAheadLog.open(data / "wal", WalConfig(
    segment_bytes=256 * 1024, max_frame_bytes=128 * 1024, max_bytes=64 * 1024 * 1024,
    fsync=FsyncPolicy.NEVER))
Forwarder(wal, {"bootstrap.servers": bootstrap},
          dead_letters=DeadLetterStore(data / "dead-letter"), state_dir=data / "state",
          config=ForwarderConfig(checkpoint_interval_s=3600, hint_interval_s=0.05)).start()
time.sleep(600)
"""


def test_partitions_read_before_the_first_producer_id_are_recorded_with_it(
    proxied_broker: ProxiedBroker,
    wal: WriteAheadLog,
    data_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Seen in a fresh clone's CI (kill -9 x20 against Kafka, a loaded machine): one partition
    never forwarded again, in any later run. Frames read while no producer id could be had
    make queues without one; the first identity record was written before they took the id,
    so it named producer -1 for their partitions, and a restart from it (a kill before the
    next identity write) restored queues that could never send. Every record written must
    name a real producer for every partition."""
    topic = "early-frames"
    create_topic(proxied_broker.bootstrap, topic, partitions=2)
    written: list[IdentityRecord] = []
    write = IdentityFile.write

    def recording(self: IdentityFile, record: IdentityRecord, *, sync: bool = False) -> bool:
        written.append(replace(record, partitions=dict(record.partitions)))  # as written
        return write(self, record, sync=sync)

    monkeypatch.setattr(IdentityFile, "write", recording)
    proxied_broker.proxy.cut()
    expected = _append_batches(wal, topic, batches=6, partitions=2)
    forwarder = _forwarder(wal, proxied_broker.bootstrap, data_dir).start()
    try:
        time.sleep(1.5)  # the frames are read and queued; Kafka gives no producer id
        assert not written
        proxied_broker.proxy.restore()
        wait_for(lambda: written, 30, what="the first identity record")
        summary = forwarder.drain(timeout_s=60)
    finally:
        forwarder.stop()

    first = written[0]
    assert first.producer_id >= 0
    assert {key: anchor.producer_id for key, anchor in first.partitions.items()} == {
        (topic, 0): first.producer_id,
        (topic, 1): first.producer_id,
    }
    assert summary.complete, summary
    broker = proxied_broker.broker
    assert broker is not None
    consumed = consume_all(broker.direct_address, topic, expected=len(expected))
    _assert_byte_exact(consumed, expected)


def _marked_delivered_below(data_dir: Path) -> int:
    record, _ = load_identity(data_dir / "state")
    return -1 if record is None else record.delivered_below


def test_restart_after_sigkill_sends_nothing_twice(
    kafka_broker: KafkaBroker, new_topic: TopicFactory, wal: WriteAheadLog, data_dir: Path
) -> None:
    topic = new_topic(1)
    expected = _append_batches(wal, topic, batches=20, partitions=1)
    wal.close()
    crashing = subprocess.Popen(
        [sys.executable, "-c", CRASHING_FORWARDER, str(data_dir), kafka_broker.bootstrap]
    )
    try:
        wait_for(lambda: _marked_delivered_below(data_dir) == 20, 30, what="delivered, marked")
    finally:
        crashing.kill()  # SIGKILL: no final checkpoint
        crashing.wait(timeout=10)

    reopened = WriteAheadLog.open(data_dir / "wal", wal.config)
    try:
        assert reopened.checkpoint_offset == 0
        summary = _forwarder(reopened, kafka_broker.bootstrap, data_dir).drain(timeout_s=30)
        assert summary.complete
        assert summary.possible_duplicates == 0
        assert reopened.checkpoint_offset == 20
    finally:
        reopened.close()
    consumed = consume_all(kafka_broker.bootstrap, topic, expected=200)
    assert len(consumed) == 200, "the frames Kafka held were not sent again"
    assert {(r.partition, r.timestamp_ms) for r in consumed} == set(expected)


def test_clean_restart_replays_nothing(
    kafka_broker: KafkaBroker, new_topic: TopicFactory, wal: WriteAheadLog, data_dir: Path
) -> None:
    topic = new_topic(1)
    _append_batches(wal, topic, batches=5, partitions=1)
    assert _forwarder(wal, kafka_broker.bootstrap, data_dir).drain(timeout_s=30).complete
    _append_batches(wal, topic, batches=5, partitions=1, start=5)

    summary = _forwarder(wal, kafka_broker.bootstrap, data_dir).drain(timeout_s=30)

    assert summary.complete and summary.possible_duplicates == 0
    assert summary.forwarded_records == 50
    assert len(consume_all(kafka_broker.bootstrap, topic, expected=100)) == 100


def test_oversized_batch_goes_to_dead_letters_whole_and_can_be_resent(
    kafka_broker: KafkaBroker, new_topic: TopicFactory, wal: WriteAheadLog, data_dir: Path
) -> None:
    topic = new_topic(1, config={"max.message.bytes": "20000"})
    small = [SampleRecord(b"a", b"small-1", 1_000, ())]
    mixed = [
        SampleRecord(b"b", b"small-2", 2_000, ()),
        SampleRecord(b"huge", b"H" * 50_000, 2_001, (("why", b"too big"),)),
        SampleRecord(b"c", b"small-3", 2_002, ()),
    ]
    wal.append(topic, 0, build_batch(small), 1)
    wal.append(topic, 0, build_batch(mixed), 3)
    wal.append(topic, 0, b"garbage that is not a record batch", 1)
    metrics = AgentMetrics()
    config = ForwarderConfig(checkpoint_interval_s=0.2, dead_letter_after_s=0)
    forwarder = _forwarder(wal, kafka_broker.bootstrap, data_dir, config=config, metrics=metrics)

    summary = forwarder.drain(timeout_s=30)

    assert summary.complete and wal.checkpoint_offset == 3
    assert summary.dead_letters == 4, "counted in records: the whole batch of 3, the frame as 1"
    letters = list_dead_letters(data_dir / "dead-letter")
    assert sorted((letter.id, letter.error_code) for letter in letters) == [
        ("1-0", "MESSAGE_TOO_LARGE"),
        ("2-0", "INVALID_RECORD_BATCH"),
    ]
    refused = next(letter for letter in letters if letter.id == "1-0")
    assert refused.payload == build_batch(mixed), "the client's batch, whole"
    assert b'durable_agent_dead_letters_total{reason="MESSAGE_TOO_LARGE"} 3.0' in metrics.render()
    values = [r.value for r in consume_all(kafka_broker.bootstrap, topic, expected=1)]
    assert values == [b"small-1"]

    resend = resend_dead_letters(
        data_dir / "dead-letter", {"bootstrap.servers": kafka_broker.bootstrap}, timeout=20
    )
    assert resend.failed == [("1-0", "MESSAGE_TOO_LARGE")], "still too large for the topic"
    admin = AdminClient({"bootstrap.servers": kafka_broker.bootstrap})
    resource = ConfigResource("topic", topic, set_config={"max.message.bytes": "1000000"})
    admin.alter_configs([resource])[resource].result(timeout=30)
    wait_for(
        lambda: (
            not resend_dead_letters(
                data_dir / "dead-letter", {"bootstrap.servers": kafka_broker.bootstrap}, timeout=20
            ).failed
        ),
        30,
        what="the letter re-sent once the topic takes it",
    )

    assert [letter.id for letter in list_dead_letters(data_dir / "dead-letter")] == ["2-0"]
    consumed = consume_all(kafka_broker.bootstrap, topic, expected=4)
    assert [r.value for r in consumed] == [b"small-1", b"small-2", b"H" * 50_000, b"small-3"]
    assert consumed[2].timestamp_ms == 2_001 and consumed[2].headers == (("why", b"too big"),)


def test_an_undecodable_frame_whose_letter_fails_is_not_checkpointed_past(
    kafka_broker: KafkaBroker,
    new_topic: TopicFactory,
    wal: WriteAheadLog,
    data_dir: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The dead-letter area has no room for the frame that is no record batch: the forwarder
    stops on it (in the read that meets it, before anything of that read is sent), the
    checkpoint stays below it, and the next run with room letters it and delivers all."""
    topic = new_topic(1)
    wal.append(topic, 0, build_batch([SampleRecord(b"a", b"before", 1_000, ())]), 1)
    wal.append(topic, 0, b"garbage that is not a record batch", 1)
    wal.append(topic, 0, build_batch([SampleRecord(b"b", b"after", 2_000, ())]), 1)
    config = ForwarderConfig(checkpoint_interval_s=0.2)
    full = Forwarder(
        wal,
        {"bootstrap.servers": kafka_broker.bootstrap},
        dead_letters=DeadLetterStore(data_dir / "dead-letter", max_bytes=10),
        state_dir=data_dir / "state",
        config=config,
    )
    summary = full.drain(timeout_s=10)
    assert not summary.complete and summary.dead_letters == 0, summary
    assert isinstance(full.failure, WalClosedError), full.failure
    assert "cannot dead-letter undecodable frame 1" in str(full.failure)
    assert wal.checkpoint_offset == 0, "not past the frame that has no letter"
    (said,) = [r.getMessage() for r in caplog.records if "could not write a dead letter" in r.msg]
    assert said.endswith("(the forwarder stops; the agent's next start tries again)"), said
    assert list_dead_letters(data_dir / "dead-letter") == []

    summary = _forwarder(wal, kafka_broker.bootstrap, data_dir, config=config).drain(30)
    assert summary.complete and summary.dead_letters == 1 and wal.checkpoint_offset == 3
    letters = list_dead_letters(data_dir / "dead-letter")
    assert [(item.id, item.error_code) for item in letters] == [("1-0", "INVALID_RECORD_BATCH")]
    assert letters[0].payload == b"garbage that is not a record batch"
    values = [r.value for r in consume_all(kafka_broker.bootstrap, topic, expected=2)]
    assert values == [b"before", b"after"]


def test_an_undecodable_frame_lettered_before_a_crash_is_not_lettered_again(
    kafka_broker: KafkaBroker,
    new_topic: TopicFactory,
    wal: WriteAheadLog,
    data_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Lettered, then the frame after it sent (the identity on the volume says both are
    done), then a crash before the WAL's checkpoint: the next run reads the frame again and
    wrote a second letter of the same id."""
    topic = new_topic(1)
    wal.append(topic, 0, b"garbage that is not a record batch", 1)
    wal.append(topic, 0, build_batch([SampleRecord(b"b", b"after", 2_000, ())]), 1)
    config = ForwarderConfig(checkpoint_interval_s=0.2)
    with monkeypatch.context() as crash:
        crash.setattr(wal, "checkpoint", lambda offset: None)  # killed before any checkpoint
        summary = _forwarder(wal, kafka_broker.bootstrap, data_dir, config=config).drain(30)
    assert summary.dead_letters == 1 and summary.forwarded_records == 1, summary
    assert wal.checkpoint_offset == 0 and _marked_delivered_below(data_dir) == 2

    again = _forwarder(wal, kafka_broker.bootstrap, data_dir, config=config).drain(30)
    assert again.complete and wal.checkpoint_offset == 2, again
    assert again.dead_letters == 0 and again.forwarded_records == 0, again
    assert [letter.id for letter in list_dead_letters(data_dir / "dead-letter")] == ["0-0"]
    assert [r.value for r in consume_all(kafka_broker.bootstrap, topic, expected=1)] == [
        b"after"
    ]


def test_unknown_partition_is_retried_for_a_bounded_time_then_dead_lettered(
    kafka_broker: KafkaBroker, new_topic: TopicFactory, wal: WriteAheadLog, data_dir: Path
) -> None:
    topic = new_topic(1)
    wal.append(topic, 7, build_batch([SampleRecord(b"k", b"lost partition", 5, ())]), 1)
    wal.append(topic, 0, build_batch([SampleRecord(b"k", b"fine", 6, ())]), 1)
    config = ForwarderConfig(
        checkpoint_interval_s=0.2, unknown_topic_wait_s=1.5, retry_backoff_s=0.2
    )
    forwarder = _forwarder(wal, kafka_broker.bootstrap, data_dir, config=config)

    summary = forwarder.drain(timeout_s=30)

    assert summary.complete and wal.checkpoint_offset == 2
    assert summary.elapsed_s >= 1.5, "retried for the configured time before giving up"
    assert forwarder.stats().producer_resets == 0
    letters = list_dead_letters(data_dir / "dead-letter")
    assert [(letter.partition, letter.wal_offset) for letter in letters] == [(7, 0)]
    assert letters[0].error_code == "UNKNOWN_TOPIC_OR_PARTITION"
    values = [r.value for r in consume_all(kafka_broker.bootstrap, topic)]
    assert values == [b"fine"]


def test_a_missing_partitions_backlog_is_dead_lettered_in_one_pass(
    kafka_broker: KafkaBroker,
    new_topic: TopicFactory,
    wal: WriteAheadLog,
    data_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # One frame at a time, every frame left was numbered again at each (a review measured a
    # deleted topic's backlog of 100,000 frames at half an hour, the forwarder stalled), and
    # each letter was fsynced and logged on its own (2,000 fsyncs, 2,000 error lines).
    topic, backlog = new_topic(1), 2_000
    for index in range(backlog):
        wal.append(topic, 7, build_batch([SampleRecord(b"k", b"%d" % index, 5, ())]), 1)
    wal.append(topic, 0, build_batch([SampleRecord(b"k", b"fine", 6, ())]), 1)
    renumbered = []
    numbered_anew = partition_queue._with
    monkeypatch.setattr(
        partition_queue,
        "_with",
        lambda *args: renumbered.append(1) or numbered_anew(*args),
    )
    appends = []
    append_whole = dead_letter._append_whole
    monkeypatch.setattr(
        dead_letter, "_append_whole", lambda *args: appends.append(1) or append_whole(*args)
    )
    config = ForwarderConfig(
        checkpoint_interval_s=0.2, unknown_topic_wait_s=1.0, retry_backoff_s=0.2
    )
    forwarder = _forwarder(wal, kafka_broker.bootstrap, data_dir, config=config)

    with caplog.at_level("ERROR", logger="durable_producer.buffer_agent.forward.forwarder"):
        summary = forwarder.drain(timeout_s=60)

    assert summary.complete and wal.checkpoint_offset == backlog + 1
    letters = list_dead_letters(data_dir / "dead-letter")
    assert [letter.wal_offset for letter in letters] == list(range(backlog))
    assert {letter.error_code for letter in letters} == {"UNKNOWN_TOPIC_OR_PARTITION"}
    assert len(renumbered) <= backlog, f"{len(renumbered)} frames numbered again"
    # A pass takes every frame read by then (the read-ahead takes all 2,000 at once): one
    # append (one fsync) and one line a pass.
    said = [r.getMessage() for r in caplog.records if "dead-letter area" in r.getMessage()]
    assert 1 <= len(appends) == len(said) <= 3, (len(appends), said)
    ends = f"({topic}/7) moved to the dead-letter area: partition {topic}/7 does not exist"
    assert all(ends in line for line in said), said
    assert said[0].startswith("2000 batches of 2000 records of WAL frames 0 to 1999 (") or (
        len(said) > 1  # the reads came in parts
    ), said
    assert [r.value for r in consume_all(kafka_broker.bootstrap, topic)] == [b"fine"]


def test_a_new_topic_is_looked_up_at_once_after_a_complete_refresh(
    kafka_broker: KafkaBroker, new_topic: TopicFactory, wal: WriteAheadLog, data_dir: Path
) -> None:
    """The metadata backoff is for refreshes that failed or found no leader; a topic's first
    frame after a good one is not held back by it (seen: the first frame of every new topic
    waited the backoff out). 10 s here: the refresh that found the first topic's leader
    came just before its frame was delivered, so under the defect the second topic's frame,
    written at once after, waits about 10 s less that frame's round trip."""
    first, second = new_topic(1), new_topic(1)
    config = replace(FAST, retry_backoff_s=10.0, retry_backoff_max_s=10.0)
    forwarder = _forwarder(wal, kafka_broker.bootstrap, data_dir, config=config).start()
    try:
        wal.append(first, 0, build_batch([SampleRecord(b"k", b"first", 5, ())]), 1)
        wait_for(lambda: forwarder.stats().watermark == 1, 60, 0.01, "the first topic's frame")
        written = time.monotonic()
        wal.append(second, 0, build_batch([SampleRecord(b"k", b"second", 6, ())]), 1)
        wait_for(lambda: forwarder.stats().watermark == 2, 30, what="the second topic's frame")
        delay = time.monotonic() - written
    finally:
        forwarder.stop()

    assert delay < 4.0, f"{delay:.2f} s for a new topic's first frame"
    assert [r.value for r in consume_all(kafka_broker.bootstrap, second)] == [b"second"]


def test_waiting_out_a_missing_partition_costs_no_cpu(
    kafka_broker: KafkaBroker, new_topic: TopicFactory, wal: WriteAheadLog, data_dir: Path
) -> None:
    """Seen: a frame for a partition Kafka does not have kept the forwarder asking for the
    metadata on every pass of its loop, most of a core, for all of ``unknown_topic_wait_s``."""
    topic = new_topic(1)
    wal.append(topic, 3, build_batch([SampleRecord(b"k", b"nowhere yet", 5, ())]), 1)
    config = replace(FAST, unknown_topic_wait_s=60.0)
    forwarder = _forwarder(wal, kafka_broker.bootstrap, data_dir, config=config).start()
    try:
        time.sleep(0.5)
        waiting_share = _forwarder_cpu_share(forwarder, 3.0)
        assert forwarder.stats().in_flight_records == 1 and forwarder.stats().dead_letters == 0
    finally:
        forwarder.stop()

    assert waiting_share < WAITING_CPU_SHARE, f"{waiting_share:.0%} of a core, waiting"
    assert wal.checkpoint_offset == 0, "the frame stays until it is delivered or dead-lettered"


def test_batches_cut_off_in_flight_are_sent_again_in_order_once(
    proxied_broker: ProxiedBroker, wal: WriteAheadLog, data_dir: Path
) -> None:
    """Connections cut again and again while batches are in flight: they go again with the
    same numbers, in order; Kafka keeps one copy of each."""
    create_topic(proxied_broker.bootstrap, "cut", partitions=1)
    expected = _append_batches(wal, "cut", batches=4, partitions=1)
    forwarder = _forwarder(wal, proxied_broker.bootstrap, data_dir).start()
    try:
        wait_for(lambda: wal.checkpoint_offset == 4, 30, what="first batches checkpointed")
        for round_ in range(3):
            expected |= _append_batches(wal, "cut", batches=3, partitions=1, start=4 + 3 * round_)
            proxied_broker.proxy.cut()
            time.sleep(0.3)
            proxied_broker.proxy.restore()
        summary = forwarder.drain(timeout_s=60)
    finally:
        forwarder.stop()

    assert summary.complete and wal.checkpoint_offset == 13
    assert summary.possible_duplicates == 0
    consumed = consume_all(proxied_broker.direct_address, "cut")
    _assert_byte_exact(consumed, expected)
    assert [r.timestamp_ms for r in consumed] == sorted(r.timestamp_ms for r in consumed)


def test_a_failing_wal_stops_the_forwarder_visibly(wal: WriteAheadLog, data_dir: Path) -> None:
    wal.append("any", 0, build_batch([SampleRecord(None, b"v", 1)]), 1)
    config = ForwarderConfig(checkpoint_interval_s=0.05, hint_interval_s=0.05)
    forwarder = _forwarder(wal, "127.0.0.1:1", data_dir, config=config).start()
    wait_for(lambda: forwarder.stats().in_flight_records == 1, 10, what="record in flight")
    wal.close()

    wait_for(lambda: not forwarder.running, 10, what="forwarder thread ended")
    summary = forwarder.drain(timeout_s=1)

    assert forwarder.failure is not None
    assert not summary.complete
