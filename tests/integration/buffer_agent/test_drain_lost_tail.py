"""A drain completes when the WAL ends in offsets recovery found lost (review finding 10).

Under ``fsync=always`` a complete last frame with a bad CRC was acknowledged, so recovery
reports it lost and never gives its offset to a new frame. The drain aimed at the next offset,
which no frame will ever settle: it ran to its timeout and exited 1, the operator retried the
Job for ever and the volume was never marked empty. Librdkafka's mock cluster stands in for
Kafka here only because this needs no broker behaviour at all, just somewhere to deliver to.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from durable_producer.buffer_agent.wal import FsyncPolicy, WalConfig, WriteAheadLog
from durable_producer.buffer_agent.wal.recovery.scan import scan_segment
from durable_producer.buffer_agent.wal.segment import list_segments
from durable_producer.local.mock_cluster import MockCluster
from durable_producer.local.topics import consume_all
from support.ingest_harness import record_batch

pytestmark = pytest.mark.integration

TOPIC = "drained"
ALWAYS = WalConfig(segment_bytes=1 << 20, max_bytes=64 << 20, max_frame_bytes=1 << 16,
                   fsync=FsyncPolicy.ALWAYS)  # fmt: skip


def test_a_drain_of_a_wal_ending_in_a_lost_frame_completes(tmp_path: Path) -> None:
    wal_dir = tmp_path / "volume" / "wal"
    with WriteAheadLog.open(wal_dir, ALWAYS) as wal:
        for number in range(6):
            wal.append(TOPIC, 0, record_batch([b"value-%d" % number]), 1)
    base, path = list_segments(wal_dir)[-1]
    last = scan_segment(path, base).spans[-1]
    data = bytearray(path.read_bytes())
    data[last.end - 3] ^= 0xFF  # the last frame's payload: its CRC no longer holds
    path.write_bytes(bytes(data))
    with WriteAheadLog.open(wal_dir, ALWAYS) as wal:  # the agent restarted: offset 5 is lost
        assert (wal.recovery.lost_frames, wal.next_offset) == (1, 6)

    with MockCluster(brokers=1) as cluster:
        cluster.topic_create(TOPIC, partitions=1, replication_factor=1)
        drain = subprocess.run(
            [sys.executable, "-m", "durable_producer.buffer_agent.cli", "drain",
             "--data-dir", str(tmp_path / "volume"), "--kafka-bootstrap", cluster.bootstrap,
             "--timeout", "20"],
            capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
        assert drain.returncode == 0, drain.stderr[-3000:]
        assert "drain complete" in drain.stderr
        values = sorted(record.value for record in consume_all(cluster.bootstrap, TOPIC))
    assert values == [b"value-%d" % number for number in range(5)]  # the lost one is lost
