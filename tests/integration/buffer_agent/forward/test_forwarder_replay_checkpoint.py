"""What a restart replays: the previous run's frames Kafka may hold.

A replayed backlog is checkpointed as soon as Kafka has it, not one interval later: an agent
killed again and again before its first checkpoint would otherwise send the same backlog at
every restart (the chaos test saw five times the traffic in duplicates).

The sent mark on the volume covers the frames sent, not every frame read ahead. After a
restart that cannot place the previous run's frames (its identity lost, or a leader that
cannot say what it holds), every frame below the mark counts as a possible duplicate. The mark
moved when frames were *read* (up to 32 MiB ahead of what was sent), so frames that never left
the agent counted too: 2,983 counted for 1,009 records stored twice in one kill -9 run without
READ. It also moved for requests whose connection was then refused (Kafka cut while a backlog
grew): a probe counted 2,000-10,000 records a restart against 0-22 stored twice.
"""

from __future__ import annotations

import json
import logging
import shutil
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from durable_producer.buffer_agent.forward.config import ForwarderConfig
from durable_producer.buffer_agent.forward.dead_letter import DeadLetterStore
from durable_producer.buffer_agent.forward.forwarder import Forwarder
from durable_producer.buffer_agent.forward.identity import (
    IDENTITY_FILE,
    IdentityFile,
    IdentityRecord,
    load_identity,
)
from durable_producer.buffer_agent.forward.progress import LEGACY_HINT_FILES, read_hint
from durable_producer.buffer_agent.forward.publisher import ForwarderStats
from durable_producer.buffer_agent.volume.format import CHECKPOINT_FILE, LOG_ID_FILE
from durable_producer.buffer_agent.wal import WriteAheadLog
from support.batch_builder import SampleRecord, build_batch
from support.broker import KafkaBroker, ProxiedBroker, consume_all, create_topic
from support.kafka_fixtures import TopicFactory
from support.waiting import wait_for, wait_until_still
from support.wal_helpers import forwarding_wal

pytestmark = pytest.mark.integration

LONG_INTERVAL = ForwarderConfig(checkpoint_interval_s=120.0, hint_interval_s=0.1)
HELD_BACK = ForwarderConfig(hint_interval_s=0.1, unknown_topic_wait_s=600.0)
HELD = 5


@pytest.fixture
def wal(tmp_path: Path) -> Iterator[WriteAheadLog]:
    with forwarding_wal(tmp_path / "wal", max_bytes=16 * 1024 * 1024) as log:
        yield log


def _forwarder(
    wal: WriteAheadLog, bootstrap: str, tmp_path: Path, config: ForwarderConfig = LONG_INTERVAL
) -> Forwarder:
    return Forwarder(
        wal,
        {"bootstrap.servers": bootstrap},
        dead_letters=DeadLetterStore(tmp_path / "dead-letter"),
        state_dir=tmp_path / "state",
        config=config,
    )


def _forwarded(
    wal: WriteAheadLog, bootstrap: str, tmp_path: Path, config: ForwarderConfig
) -> ForwarderStats:
    """A forwarder's figures once it forwarded ``HELD`` records (then stopped)."""
    forwarder = _forwarder(wal, bootstrap, tmp_path, config).start()
    try:
        wait_for(lambda: forwarder.stats().forwarded_records == HELD, 60, 0.05, what="records")
        return forwarder.stats()
    finally:
        forwarder.stop()


def _wait_for_checkpoint(wal: WriteAheadLog, offset: int, timeout: float) -> float:
    """Seconds until the WAL checkpoint reaches ``offset``."""
    started = time.monotonic()
    wait_for(lambda: wal.checkpoint_offset >= offset, timeout, 0.02, what=f"checkpoint at {offset}")
    return time.monotonic() - started


def test_replayed_frames_are_checkpointed_once_delivered(
    kafka_broker: KafkaBroker, new_topic: TopicFactory, wal: WriteAheadLog, tmp_path: Path
) -> None:
    topic = new_topic(1)
    for frame in range(5):
        wal.append(topic, 0, build_batch([SampleRecord(b"k", b"v%d" % frame, frame)]), 1)
    # A previous run sent all five frames and died before checkpointing any of them.
    (tmp_path / "state").mkdir()
    hint = tmp_path / "state" / LEGACY_HINT_FILES[0]  # as an agent before the two-slot hint left it
    hint.write_text(json.dumps({"sent_high": 5, "delivered_high": 5}))
    forwarder = _forwarder(wal, kafka_broker.bootstrap, tmp_path).start()
    try:
        waited = _wait_for_checkpoint(wal, 5, timeout=30)
        wal.append(topic, 0, build_batch([SampleRecord(b"k", b"new", 9)]), 1)
        # Delivered, yet not checkpointed while the interval (120 s) has not passed: the
        # checkpoint is read once it has stood still for a second after the delivery (a
        # checkpoint of the new frame would follow its delivery within the same pass).
        wait_for(lambda: forwarder.stats().watermark == 6, 30, 0.02, what="the new frame delivered")
        checkpoint_while_running = wait_until_still(lambda: wal.checkpoint_offset, 1.0)
        stats = forwarder.stats()
    finally:
        forwarder.stop()

    assert waited < LONG_INTERVAL.checkpoint_interval_s / 4
    # A hint alone (no delivery marks) does not prove delivery: possible, not certain.
    assert stats.possible_duplicates == 5
    assert stats.watermark == 6, "the new frame was delivered"
    assert checkpoint_while_running == 5, "frames beyond the replay wait for the interval"
    assert wal.checkpoint_offset == 6, "stop checkpoints everything delivered"
    values = [record.value for record in consume_all(kafka_broker.bootstrap, topic)]
    assert values == [b"v0", b"v1", b"v2", b"v3", b"v4", b"new"]


def test_frames_read_but_never_sent_are_no_possible_duplicates_after_a_restart(
    kafka_broker: KafkaBroker, new_topic: TopicFactory, wal: WriteAheadLog, tmp_path: Path
) -> None:
    present, absent = new_topic(1), new_topic.name()
    for n in range(HELD):
        wal.append(present, 0, build_batch([SampleRecord(b"k", b"p%d" % n, n)]), 1)
    for n in range(HELD):  # read with the others, held back: Kafka has no such topic yet
        wal.append(absent, 0, build_batch([SampleRecord(b"k", b"a%d" % n, n)]), 1)
    state = tmp_path / "state"
    forwarder = _forwarder(wal, kafka_broker.bootstrap, tmp_path, HELD_BACK).start()
    try:
        wait_for(
            lambda: forwarder.stats().forwarded_records == HELD, 30, 0.05, what="first topic"
        )
        wait_for(lambda: read_hint(state).get("delivered_high") == HELD, 10, 0.05, what="hint")
        on_volume, _ = load_identity(state)  # what a kill -9 now would leave
        hint = read_hint(state)
    finally:
        forwarder.stop()
    assert on_volume is not None
    assert on_volume.sent_below == HELD, "the frames held back were never sent"
    assert hint["sent_high"] == HELD

    # The next run cannot use the identity (lost with the node): it counts what may be in
    # Kafka twice, which is none of the held-back frames.
    (state / IDENTITY_FILE).unlink()
    create_topic(kafka_broker.bootstrap, absent, 1)
    stats = _forwarded(wal, kafka_broker.bootstrap, tmp_path, HELD_BACK)
    assert stats.possible_duplicates == 0
    values = [record.value for record in consume_all(kafka_broker.bootstrap, absent)]
    assert values == [b"a%d" % n for n in range(HELD)]


def test_frames_refused_a_connection_are_no_possible_duplicates_after_a_restart(
    proxied_broker: ProxiedBroker, wal: WriteAheadLog, tmp_path: Path
) -> None:
    topic = "refused"
    create_topic(proxied_broker.bootstrap, topic, 1)
    for n in range(HELD):
        wal.append(topic, 0, build_batch([SampleRecord(b"k", b"d%d" % n, n)]), 1)
    state = tmp_path / "state"
    forwarder = _forwarder(wal, proxied_broker.bootstrap, tmp_path, HELD_BACK).start()
    try:
        wait_for(lambda: forwarder.stats().forwarded_records == HELD, 30, 0.05, what="delivery")
        proxied_broker.proxy.cut()  # the leader known, every connection to it refused
        client = forwarder._sender.client
        wait_for(  # the cut seen: a connection still open would rightly move the mark
            lambda: all(client.open_connection(node) is None for node in list(client.brokers)),
            10,
            0.01,
            what="the connections closed",
        )
        for n in range(HELD):
            wal.append(topic, 0, build_batch([SampleRecord(b"k", b"r%d" % n, n)]), 1)
        wait_for(
            lambda: forwarder.health.last_error("transport") is not None,
            30,
            0.05,
            what="a refused send",
        )
        time.sleep(1.5)  # rounds of retries against the refused leader
        on_volume, _ = load_identity(state)  # what a kill -9 now would leave
        hint = read_hint(state)
    finally:
        forwarder.stop(flush_timeout_s=0)
    assert on_volume is not None
    assert on_volume.sent_below == HELD, "no frame reached Kafka after the cut"
    assert hint["sent_high"] == HELD

    # The next run cannot use the identity (lost with the node): it counts what may be in
    # Kafka twice, which is none of the frames refused a connection.
    (state / IDENTITY_FILE).unlink()
    proxied_broker.proxy.restore()
    forwarder = _forwarder(wal, proxied_broker.bootstrap, tmp_path, HELD_BACK).start()
    try:
        wait_for(lambda: forwarder.stats().forwarded_records == HELD, 60, 0.05, what="backlog")
        stats = forwarder.stats()
    finally:
        forwarder.stop()
    assert stats.possible_duplicates == 0
    values = [record.value for record in consume_all(proxied_broker.direct_address, topic)]
    assert values == [b"d%d" % n for n in range(HELD)] + [b"r%d" % n for n in range(HELD)]


def test_an_identity_left_beside_a_recreated_wal_skips_none_of_its_frames(
    kafka_broker: KafkaBroker,
    new_topic: TopicFactory,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The WAL made again while ``state/`` was kept (its directory removed to clear damage):
    the new log numbers its frames from 0 again. The
    identity a killed run left says its frames below ``delivered_below`` are in Kafka, and it
    was written before the checkpoint moved (``written_checkpoint`` 0), so the offsets alone
    cannot tell it from this log's: the new log's first frames were passed as delivered,
    never sent, and checkpointed (lost)."""
    topic = new_topic(1)
    state = tmp_path / "state"
    left = _killed_after_delivering(kafka_broker.bootstrap, topic, tmp_path)
    assert (left.written_checkpoint, left.delivered_below) == (0, HELD)

    shutil.rmtree(tmp_path / "wal")
    caplog.set_level(logging.WARNING, "durable_producer.buffer_agent.forward.forwarder")
    with forwarding_wal(tmp_path / "wal") as wal:
        new_id = wal.log_id.value
        for n in range(HELD):
            wal.append(topic, 0, build_batch([SampleRecord(b"k", b"new%d" % n, n)]), 1)
        stats = _forwarded(wal, kafka_broker.bootstrap, tmp_path, LONG_INTERVAL)
    values = [record.value for record in consume_all(kafka_broker.bootstrap, topic)]
    assert values == [b"v%d" % n for n in range(HELD)] + [b"new%d" % n for n in range(HELD)]
    assert stats.forwarded_records == HELD
    assert stats.possible_duplicates == 0, "the old log's sent mark says nothing of this one"
    after, _ = load_identity(state)
    assert after is not None and after.producer_id != left.producer_id, "a new producer id"
    assert after.wal_id == new_id != left.wal_id
    assert (
        "the producer identity in the state directory was written for another WAL (id"
        f" {left.wal_id}; this one is {new_id}: recreated?): forwarding every frame of this WAL"
        " as a new producer"
    ) in [r.getMessage() for r in caplog.records]


def test_an_identity_from_before_log_ids_is_kept_on_an_upgrade(
    kafka_broker: KafkaBroker, new_topic: TopicFactory, tmp_path: Path
) -> None:
    """An older agent killed with frames sent and not checkpointed left a record naming no
    WAL, and no ``wal/id``. The log is given its id over its frames, and
    the record is used: the frames are sent again under the same producer id and sequences,
    and Kafka keeps one copy (a new producer id would have stored all five twice)."""
    topic = new_topic(1)
    state = tmp_path / "state"
    left = _killed_after_delivering(kafka_broker.bootstrap, topic, tmp_path)
    IdentityFile(state).write(replace(left, wal_id=""))  # as an older agent wrote it
    (tmp_path / "wal" / LOG_ID_FILE).unlink()
    with forwarding_wal(tmp_path / "wal") as wal:
        assert wal.log_id.adopted and wal.checkpoint_offset == 0
        forwarder = _forwarder(wal, kafka_broker.bootstrap, tmp_path).start()
        try:
            wait_for(lambda: wal.checkpoint_offset == HELD, 30, 0.05, what="the replay")
            stats = forwarder.stats()
        finally:
            forwarder.stop()
    values = [record.value for record in consume_all(kafka_broker.bootstrap, topic)]
    assert values == [b"v%d" % n for n in range(HELD)], "each once"
    assert stats.possible_duplicates == 0
    after, _ = load_identity(state)
    assert after is not None and after.producer_id == left.producer_id
    assert after.wal_id == wal.log_id.value


def _killed_after_delivering(bootstrap: str, topic: str, tmp_path: Path) -> IdentityRecord:
    """``HELD`` frames delivered to ``topic``, and the volume left as a kill -9 would leave it
    then: the identity written past them, the WAL's checkpoint not yet moved."""
    state = tmp_path / "state"
    with forwarding_wal(tmp_path / "wal") as wal:
        for n in range(HELD):
            wal.append(topic, 0, build_batch([SampleRecord(b"k", b"v%d" % n, n)]), 1)
        checkpoint = (tmp_path / "wal" / CHECKPOINT_FILE).read_bytes()
        forwarder = _forwarder(wal, bootstrap, tmp_path).start()
        try:
            wait_for(
                lambda: (load_identity(state)[0] or IdentityRecord(-1, 0)).delivered_below
                == HELD,
                30,
                0.05,
                what="the identity written past the delivered frames",
            )
            killed = (state / IDENTITY_FILE).read_bytes()
        finally:
            forwarder.stop()
    assert wal.checkpoint_offset == HELD
    (state / IDENTITY_FILE).write_bytes(killed)
    (tmp_path / "wal" / CHECKPOINT_FILE).write_bytes(checkpoint)
    left, _ = load_identity(state)
    assert left is not None
    return left
