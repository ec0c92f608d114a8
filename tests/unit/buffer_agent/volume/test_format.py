"""The on-disk format as ``volume/format.py`` documents it, written and read byte by byte here.

These tests spell the format out independently of the code (literal magics and struct layouts),
so a change to the format breaks them: volumes written by older agents must keep opening.
"""

from __future__ import annotations

import json
import re
import struct
import time
from pathlib import Path

from crc32c import crc32c

from durable_producer.buffer_agent.wal import WriteAheadLog
from support.wal_helpers import SMALL

SEGMENT_HEADER = struct.Struct(">8sQ")
FRAME_PREFIX = struct.Struct(">4sII")
FRAME_BODY_HEAD = struct.Struct(">QiIQH")
CHECKPOINT_SLOT = struct.Struct(">8sQQI")


def frame_bytes(
    offset: int, topic: str, partition: int, payload: bytes, records: int, appended_ms: int
) -> bytes:
    body = FRAME_BODY_HEAD.pack(offset, partition, records, appended_ms, len(topic.encode()))
    body += topic.encode() + payload
    crc = crc32c(payload + body[: len(body) - len(payload)])
    return FRAME_PREFIX.pack(b"\xd7WF1", len(body), crc) + body


def segment_bytes(base: int, *frames: bytes) -> bytes:
    return SEGMENT_HEADER.pack(b"DPWALSG1", base) + b"".join(frames)


def checkpoint_slot(sequence: int, offset: int) -> bytes:
    head = struct.pack(">8sQQ", b"DPWALCK2", sequence, offset)
    return head + struct.pack(">I", crc32c(head))


def parse_frame(data: bytes, position: int) -> tuple[dict[str, object], int]:
    magic, body_length, crc = FRAME_PREFIX.unpack_from(data, position)
    body = data[position + 12 : position + 12 + body_length]
    offset, partition, records, appended_ms, topic_length = FRAME_BODY_HEAD.unpack_from(body)
    payload = body[26 + topic_length :]
    assert magic == b"\xd7WF1"
    assert crc == crc32c(payload + body[: 26 + topic_length])
    fields = {
        "offset": offset,
        "partition": partition,
        "records": records,
        "appended_ms": appended_ms,
        "topic": body[26 : 26 + topic_length].decode(),
        "payload": payload,
    }
    return fields, position + 12 + body_length


def test_a_hand_written_volume_opens_and_reads_back_exactly(tmp_path: Path) -> None:
    directory = tmp_path / "wal"
    directory.mkdir()
    first = [
        frame_bytes(0, "orders", 0, b"batch-0", 2, 1_700_000_000_000),
        frame_bytes(1, "orders", 7, b"batch-1", 3, 1_700_000_000_001),
        frame_bytes(2, "t\u00e9", 1, b"", 0, 1_700_000_000_002),
    ]
    (directory / "00000000000000000000.seg").write_bytes(segment_bytes(0, *first))
    (directory / "00000000000000000003.seg").write_bytes(
        segment_bytes(3, frame_bytes(3, "orders", 2, b"batch-3", 5, 1_700_000_000_003))
    )
    checkpoint = bytearray(1024)
    checkpoint[512 : 512 + 28] = checkpoint_slot(1, 1)
    (directory / "checkpoint").write_bytes(bytes(checkpoint))

    with WriteAheadLog.open(directory, SMALL) as wal:
        stats = wal.stats()
        assert (wal.checkpoint_offset, wal.next_offset) == (1, 4)
        assert (stats.segment_count, stats.quarantined_segments) == (2, 0)
        assert stats.truncated_bytes_on_open == 0
        assert stats.backlog_records == 3 + 0 + 5
        frames = wal.reader(0).poll(10)
        assert [
            (f.offset, f.topic, f.partition, f.payload, f.record_count, f.appended_ms)
            for f in frames
        ] == [
            (0, "orders", 0, b"batch-0", 2, 1_700_000_000_000),
            (1, "orders", 7, b"batch-1", 3, 1_700_000_000_001),
            (2, "t\u00e9", 1, b"", 0, 1_700_000_000_002),
            (3, "orders", 2, b"batch-3", 5, 1_700_000_000_003),
        ]
        before = int(time.time() * 1000)
        assert wal.append("new-topic", 4, b"appended", record_count=9) == 4
        after = int(time.time() * 1000)
        wal.checkpoint(4)

    assert not (directory / "00000000000000000000.seg").exists(), "wholly below the checkpoint"
    data = (directory / "00000000000000000003.seg").read_bytes()
    assert SEGMENT_HEADER.unpack_from(data) == (b"DPWALSG1", 3)
    _, end = parse_frame(data, 16)
    fields, end = parse_frame(data, end)
    assert end == len(data)
    assert before <= fields.pop("appended_ms") <= after  # type: ignore[operator]
    assert fields == {
        "offset": 4,
        "partition": 4,
        "records": 9,
        "topic": "new-topic",
        "payload": b"appended",
    }
    stored = (directory / "checkpoint").read_bytes()
    assert len(stored) == 1024
    assert stored[:28] == checkpoint_slot(2, 4), "write 2 goes to the slot at byte 0"
    assert stored[512:540] == checkpoint_slot(1, 1), "the previous slot stays intact"
    assert (directory / "LOCK").read_text().startswith("pid=")


def test_a_new_volume_starts_with_an_empty_segment_at_offset_zero(tmp_path: Path) -> None:
    directory = tmp_path / "wal"
    WriteAheadLog.open(directory, SMALL).close()
    names = sorted(p.name for p in directory.iterdir())
    assert names == ["00000000000000000000.seg", "LOCK", "checkpoint", "id"]
    assert (directory / "00000000000000000000.seg").read_bytes() == segment_bytes(0)
    assert re.fullmatch(r"[0-9a-f]{32}\n", (directory / "id").read_text())


def test_a_quarantine_record_has_the_documented_fields(tmp_path: Path) -> None:
    directory = tmp_path / "wal"
    directory.mkdir()
    (directory / "00000000000000000000.seg").write_bytes(
        segment_bytes(0, frame_bytes(0, "t", 0, b"a", 1, 1))
    )
    (directory / "00000000000000000001.seg").write_bytes(b"NOTAWAL!" + bytes(8))
    (directory / "00000000000000000005.seg").write_bytes(
        segment_bytes(5, frame_bytes(5, "t", 0, b"b", 1, 1))
    )
    with WriteAheadLog.open(directory, SMALL) as wal:
        assert [f.offset for f in wal.reader(0).poll(10)] == [0, 5]
        assert wal.stats().quarantined_segments == 1
    (reason_file,) = (directory / "quarantine").glob("*.json")
    reason = json.loads(reason_file.read_text())
    assert set(reason) == {
        "segment",
        "base_offset",
        "quarantined_file",
        "reason",
        "damage",
        "lost_offsets",
        "lost_frames",
        "salvaged_frames",
        "salvaged_offsets",
        "time",
    }
    assert reason["segment"] == "00000000000000000001.seg"
    assert reason["base_offset"] == 1
    assert re.fullmatch(r"\d{8}T\d{6}Z-\d{6}", reason["time"])
    assert reason["quarantined_file"] == f"00000000000000000001.seg.{reason['time']}"
    assert reason_file.name == reason["quarantined_file"] + ".json"
    assert (directory / "quarantine" / reason["quarantined_file"]).read_bytes()[:8] == b"NOTAWAL!"
    assert reason["lost_offsets"] == ["1..4 (segment header magic is wrong (not a WAL segment))"]
    assert reason["lost_frames"] == 4
    assert reason["reason"] == "damaged segment"
    assert reason["damage"] == ["segment header magic is wrong (not a WAL segment)"]
    assert (reason["salvaged_frames"], reason["salvaged_offsets"]) == (0, None)
