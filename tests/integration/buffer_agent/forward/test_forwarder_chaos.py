"""Forwarder-level chaos: appends never stop while the broker is cut off, hung (network and
SIGSTOP) and the forwarder is stopped and replaced; afterwards Kafka holds every record,
and duplicates are no more than the forwarders counted."""

from __future__ import annotations

import threading
import time
from collections import Counter
from pathlib import Path

import pytest

from durable_producer.buffer_agent.forward.config import ForwarderConfig
from durable_producer.buffer_agent.forward.dead_letter import DeadLetterStore
from durable_producer.buffer_agent.forward.forwarder import Forwarder
from durable_producer.buffer_agent.wal import FsyncPolicy, WalConfig, WriteAheadLog
from support.batch_builder import SampleRecord, build_batch
from support.broker import ProxiedBroker, consume_all, create_topic

pytestmark = pytest.mark.integration

TOPIC = "chaos"
PARTITIONS = 3
RECORDS_PER_FRAME = 10
CONFIG = ForwarderConfig(checkpoint_interval_s=0.3, hint_interval_s=0.1)


class Loader:
    """Appends a frame every few milliseconds; every record has a unique timestamp."""

    def __init__(self, wal: WriteAheadLog) -> None:
        self.wal = wal
        self.appended: set[tuple[int, int]] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        frame = 0
        while not self._stop.is_set():
            partition = frame % PARTITIONS
            records = [
                SampleRecord(
                    b"k%d" % (frame * RECORDS_PER_FRAME + i),
                    b"value-%d-%d" % (frame, i),
                    1_700_000_000_000 + frame * RECORDS_PER_FRAME + i,
                )
                for i in range(RECORDS_PER_FRAME)
            ]
            self.wal.append(TOPIC, partition, build_batch(records), len(records))
            self.appended.update((partition, record.timestamp_ms) for record in records)
            frame += 1
            self._stop.wait(0.01)

    def __enter__(self) -> Loader:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        self._thread.join()


def _forwarder(wal: WriteAheadLog, bootstrap: str, data_dir: Path) -> Forwarder:
    return Forwarder(
        wal,
        {"bootstrap.servers": bootstrap, "reconnect.backoff.max.ms": 500},
        dead_letters=DeadLetterStore(data_dir / "dead-letter"),
        state_dir=data_dir / "state",
        config=CONFIG,
    )


def test_no_record_lost_through_outages_hangs_and_forwarder_replacement(
    proxied_broker: ProxiedBroker, tmp_path: Path
) -> None:
    create_topic(proxied_broker.bootstrap, TOPIC, PARTITIONS)
    broker = proxied_broker.broker
    assert broker is not None
    proxy = proxied_broker.proxy
    wal = WriteAheadLog.open(
        tmp_path / "wal",
        WalConfig(segment_bytes=64 * 1024, max_frame_bytes=32 * 1024, fsync=FsyncPolicy.NEVER),
    )
    forwarders = [_forwarder(wal, proxied_broker.bootstrap, tmp_path).start()]
    checkpoints = []
    try:
        with Loader(wal) as loader:
            for cycle in range(2):
                time.sleep(0.7)
                proxy.cut()
                time.sleep(1.0)
                checkpoints.append(wal.checkpoint_offset)
                proxy.restore()
                time.sleep(0.7)
                proxy.hang()
                time.sleep(1.0)
                proxy.restore()
                time.sleep(0.7)
                broker.suspend()
                time.sleep(1.0)
                broker.resume()
                # replace the forwarder, once mid-outage and once while healthy
                if cycle == 0:
                    proxy.cut()
                forwarders[-1].stop(flush_timeout_s=0.2)
                forwarders.append(_forwarder(wal, proxied_broker.bootstrap, tmp_path).start())
                proxy.restore()
        summary = forwarders[-1].drain(timeout_s=60)
        appended = loader.appended
    finally:
        broker.resume()
        proxy.restore()
        for forwarder in forwarders:
            forwarder.stop(flush_timeout_s=0)
        wal.close()

    assert summary.complete, summary
    assert checkpoints == sorted(checkpoints), "the checkpoint only moves forward"
    consumed = consume_all(proxied_broker.direct_address, TOPIC, timeout=60)
    seen = Counter((record.partition, record.timestamp_ms) for record in consumed)
    missing = appended - set(seen)
    assert not missing, f"{len(missing)} of {len(appended)} records lost"
    assert set(seen) == appended, "nothing that was not appended"
    duplicates = sum(count - 1 for count in seen.values())
    possible = sum(forwarder.stats().possible_duplicates for forwarder in forwarders)
    print(f"records {len(appended)}, duplicates in Kafka {duplicates}, counted {possible} possible")
    assert duplicates <= possible
    for partition in range(PARTITIONS):
        stamps = [r.timestamp_ms for r in consumed if r.partition == partition]
        first_seen = list(dict.fromkeys(stamps))
        assert first_seen == sorted(first_seen), f"partition {partition} out of order"
