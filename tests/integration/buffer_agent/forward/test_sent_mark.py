"""The sent mark on the volume covers the frames sent, not every frame read ahead.

After a restart that cannot place the previous run's frames (its identity lost, or a leader
that cannot say what it holds), every frame below the mark counts as a possible duplicate.
The mark was moved when frames were *read* (up to 32 MiB ahead of what was sent), so frames
that never left the agent counted too: 2,983 counted for 1,009 records stored twice in one
kill -9 run without READ. Here the frames read but held back (their topic does not exist yet)
must not count.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from durable_producer.buffer_agent.forward.config import ForwarderConfig
from durable_producer.buffer_agent.forward.dead_letter import DeadLetterStore
from durable_producer.buffer_agent.forward.forwarder import Forwarder
from durable_producer.buffer_agent.forward.identity import IDENTITY_FILE, read_identity
from durable_producer.buffer_agent.forward.progress import read_hint
from durable_producer.buffer_agent.wal import WriteAheadLog
from support.batch_builder import SampleRecord, build_batch
from support.broker import KafkaBroker, consume_all, create_topic
from support.kafka_fixtures import TopicFactory
from support.waiting import wait_for
from support.wal_helpers import forwarding_wal

pytestmark = pytest.mark.integration

FRAMES = 5
CONFIG = ForwarderConfig(hint_interval_s=0.1, unknown_topic_wait_s=600.0)


@pytest.fixture
def wal(tmp_path: Path) -> Iterator[WriteAheadLog]:
    with forwarding_wal(tmp_path / "wal", max_bytes=16 * 1024 * 1024) as log:
        yield log


def _forwarder(wal: WriteAheadLog, bootstrap: str, state: Path) -> Forwarder:
    return Forwarder(
        wal,
        {"bootstrap.servers": bootstrap},
        dead_letters=DeadLetterStore(state.parent / "dead-letter"),
        state_dir=state,
        config=CONFIG,
    )


def test_frames_read_but_never_sent_are_no_possible_duplicates_after_a_restart(
    kafka_broker: KafkaBroker, new_topic: TopicFactory, wal: WriteAheadLog, tmp_path: Path
) -> None:
    present, absent = new_topic(1), new_topic.name()
    for n in range(FRAMES):
        wal.append(present, 0, build_batch([SampleRecord(b"k", b"p%d" % n, n)]), 1)
    for n in range(FRAMES):  # read with the others, held back: Kafka has no such topic yet
        wal.append(absent, 0, build_batch([SampleRecord(b"k", b"a%d" % n, n)]), 1)
    state = tmp_path / "state"
    forwarder = _forwarder(wal, kafka_broker.bootstrap, state).start()
    try:
        wait_for(
            lambda: forwarder.stats().forwarded_records == FRAMES, 30, 0.05, what="first topic"
        )
        wait_for(lambda: read_hint(state).get("delivered_high") == FRAMES, 10, 0.05, what="hint")
        on_volume = read_identity(state)  # what a kill -9 now would leave
        hint = read_hint(state)
    finally:
        forwarder.stop()
    assert on_volume is not None
    assert on_volume.sent_below == FRAMES, "the frames held back were never sent"
    assert hint["sent_high"] == FRAMES

    # The next run cannot use the identity (lost with the node): it counts what may be in
    # Kafka twice, which is none of the held-back frames.
    (state / IDENTITY_FILE).unlink()
    create_topic(kafka_broker.bootstrap, absent, 1)
    forwarder = _forwarder(wal, kafka_broker.bootstrap, state).start()
    try:
        wait_for(
            lambda: forwarder.stats().forwarded_records == FRAMES, 60, 0.05, what="second topic"
        )
        stats = forwarder.stats()
    finally:
        forwarder.stop()
    assert stats.possible_duplicates == 0
    values = [record.value for record in consume_all(kafka_broker.bootstrap, absent)]
    assert values == [b"a%d" % n for n in range(FRAMES)]
