"""Damaged WAL files with a real agent process, checked end to end through the broker.

A real client produces through the agent while the broker is cut off (so every record stays in
the WAL), the agent is SIGKILLed, one byte of a segment is flipped, the broker comes back and
the agent restarts. Reading the topic back: exactly the records of the damaged frame are
missing (none for a segment header byte), everything else arrived intact, and the agent's
metrics report the loss. Then stray names in the WAL directory: the agent starts and serves.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from confluent_kafka import Producer

from durable_producer.buffer_agent.kafka.record_decode import iter_decoded
from durable_producer.buffer_agent.wal.frame import Frame, decode_frame
from durable_producer.buffer_agent.wal.recovery.scan import FrameSpan, scan_segment
from durable_producer.buffer_agent.wal.segment import list_segments
from durable_producer.local.agent_process import AgentProcess
from durable_producer.local.broker import ProxiedBroker, consume_all, create_topic

pytestmark = pytest.mark.integration

RECORDS = 400
AGENT_ARGS = [
    "--segment-bytes",
    "16384",
    "--max-batch-bytes",
    "4096",
    "--fsync",
    "always",
    "--checkpoint-interval",
    "0.5",
    "--default-partitions",
    "2",
]


def value_for(index: int) -> bytes:
    return (f"damage-{index}:".encode() * 12)[:100]


def produce(bootstrap: str, start: int, count: int) -> None:
    """Produce ``count`` records; every one must be acknowledged by the agent."""
    failures: list[str] = []

    def delivered(error: object, _message: object) -> None:
        if error is not None:
            failures.append(str(error))

    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "enable.idempotence": True,
            "linger.ms": 5,
            "batch.size": 2048,
            "log_level": 2,
        }
    )
    for index in range(start, start + count):
        producer.produce(
            "damage", key=str(index).encode(), value=value_for(index), on_delivery=delivered
        )
        producer.poll(0)
    assert producer.flush(60) == 0
    assert not failures, failures[:3]


@dataclass(frozen=True)
class StoredFrame:
    path: Path
    span: FrameSpan
    keys: frozenset[int]


def stored_frames(wal_dir: Path) -> list[list[StoredFrame]]:
    """Every frame of every segment, with the record keys its batch holds."""
    segments = []
    for base, path in list_segments(wal_dir):
        data = memoryview(path.read_bytes())
        frames = []
        for span in scan_segment(path, base).spans:
            decoded = decode_frame(data, span.start)
            assert not isinstance(decoded, Exception) and isinstance(decoded[0], Frame)
            keys = {
                int(record.key or b"")
                for batch in iter_decoded(decoded[0].payload)
                for record in batch.records
            }
            frames.append(StoredFrame(path, span, frozenset(keys)))
        segments.append(frames)
    return segments


def flip(path: Path, position: int) -> None:
    data = bytearray(path.read_bytes())
    data[position] ^= 0x20
    path.write_bytes(bytes(data))


def damage(wal_dir: Path, where: str) -> tuple[frozenset[int], int]:
    """Flip one byte; the keys of the records it destroys and the frames lost."""
    segments = stored_frames(wal_dir)
    assert len(segments) >= 3 and all(len(frames) >= 3 for frames in segments[:-1]), (
        "the test needs several segments of several frames"
    )
    middle = segments[0][len(segments[0]) // 2]
    if where == "segment header":
        flip(middle.path, 3)  # the magic of the oldest segment
        return frozenset(), 0
    if where == "frame header":
        flip(middle.path, middle.span.start + 9)  # its CRC field
        return middle.keys, 1
    if where == "payload":
        flip(middle.path, middle.span.end - 20)
        return middle.keys, 1
    assert where == "last frame"
    last = segments[-1][-1]
    flip(last.path, last.span.end - 20)
    return last.keys, 1


@pytest.fixture(scope="module")
def broker() -> Iterator[ProxiedBroker]:
    with ProxiedBroker() as proxied:
        create_topic(proxied.bootstrap, "damage", 2)
        yield proxied


def wait_for_forwarded(agent: AgentProcess, count: int, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while agent.metrics().get("durable_agent_forwarded_records_total", 0) < count:
        assert time.monotonic() < deadline, agent.log_tail()
        time.sleep(0.2)


@pytest.mark.parametrize("where", ["segment header", "frame header", "payload", "last frame"])
def test_damage_costs_exactly_the_damaged_frame_end_to_end(
    tmp_path: Path, broker: ProxiedBroker, where: str
) -> None:
    first = {"segment header": 0, "frame header": 1, "payload": 2, "last frame": 3}[where]
    first *= 10 * RECORDS  # each case its own key range in the shared topic
    agent = AgentProcess(
        tmp_path / "volume", broker.bootstrap, extra_args=AGENT_ARGS, log_path=tmp_path / "a.log"
    )
    broker.proxy.cut()
    try:
        with agent:
            produce(agent.bootstrap, first, RECORDS)  # acknowledged, and all of it in the WAL
            agent.kill()
            lost_keys, lost_frames = damage(agent.data_dir / "wal", where)
            broker.proxy.restore()
            agent.start()
            metrics = agent.metrics()
            wait_for_forwarded(agent, RECORDS - len(lost_keys))
            assert agent.stop() == 0
    finally:
        broker.proxy.restore()
    consumed = [
        record
        for record in consume_all(broker.direct_address, "damage", timeout=60, idle=2)
        if first <= int(record.key or b"") < first + RECORDS
    ]
    keys = [int(record.key or b"") for record in consumed]
    assert set(keys) == set(range(first, first + RECORDS)) - lost_keys
    assert all(record.value == value_for(int(record.key or b"")) for record in consumed)
    if where != "segment header":
        assert lost_keys, "the damaged frame held records"
    assert metrics.get("durable_agent_wal_lost_frames") == lost_frames
    assert metrics.get("durable_agent_quarantined_segments") == 1
    log = agent.log_path.read_text()
    assert "ERROR" in log and "quarantined WAL segment" in log


STRAYS = {
    "99999999999999999999.seg": b"junk",
    f"{2**64 - 1:020d}.seg": b"",
    f"{500:020d}.seg": b"not a segment",
    "foo.seg": b"x",
    f"{0:020d}.seg.tmp": b"x",
    "notes.txt": b"x",
}


def test_the_agent_starts_and_serves_beside_stray_names(tmp_path: Path) -> None:
    with ProxiedBroker() as proxied:
        create_topic(proxied.bootstrap, "damage", 2)
        agent = AgentProcess(
            tmp_path / "volume",
            proxied.bootstrap,
            extra_args=AGENT_ARGS,
            log_path=tmp_path / "a.log",
        )
        with agent:
            produce(agent.bootstrap, 0, 100)
            assert agent.stop() == 0
            wal_dir = agent.data_dir / "wal"
            for name, content in STRAYS.items():
                (wal_dir / name).write_bytes(content)
            (wal_dir / f"{100:020d}.seg").mkdir()
            (wal_dir / "subdir").mkdir()
            agent.start()
            produce(agent.bootstrap, 100, 300)  # the 2**64 - 1 name killed it on the first one
            wait_for_forwarded(agent, 300)
            metrics = agent.metrics()
            assert agent.stop() == 0
        consumed = consume_all(proxied.direct_address, "damage", timeout=60, idle=2)
    assert {int(record.key or b"") for record in consumed} == set(range(400))
    assert metrics.get("durable_agent_wal_ignored_files") == 4
    assert metrics.get("durable_agent_quarantined_segments") == 4
    assert metrics.get("durable_agent_wal_lost_frames") == 0
    log = agent.log_path.read_text()
    assert "Traceback" not in log
    assert "lost offsets" not in log, "no false alarm"
