"""Recovery on open: torn tails are truncated, corruption is quarantined, valid frames survive."""

from __future__ import annotations

import json
import logging
from dataclasses import replace
from functools import partial
from pathlib import Path

import pytest
from crc32c import crc32c

from durable_producer.buffer_agent.volume.format import MAX_OFFSET, encode_segment_header
from durable_producer.buffer_agent.wal import FsyncPolicy, WalConfig, WriteAheadLog
from durable_producer.buffer_agent.wal.checkpoint import CHECKPOINT_FILE
from durable_producer.buffer_agent.wal.frame import FrameProblem, decode_frame, encode_frame_header
from durable_producer.buffer_agent.wal.recovery import damage
from durable_producer.buffer_agent.wal.recovery.scan import scan_segment
from durable_producer.buffer_agent.wal.segment import list_segments
from support import wal_helpers
from support.wal_helpers import SMALL, payload_for

ONE_SEGMENT = replace(SMALL, segment_bytes=1 << 20, max_frame_bytes=4096, max_bytes=1 << 22)


write_frames = partial(
    wal_helpers.write_frames, config=ONE_SEGMENT, size=300, topic="orders", partitions=3
)


def read_all(directory: Path, config=ONE_SEGMENT) -> tuple[list[int], WriteAheadLog]:
    wal = WriteAheadLog.open(directory, config)
    frames = wal.reader(0).poll(100_000)
    for frame in frames:
        assert frame.payload == payload_for(frame.offset, len(frame.payload))
    return [f.offset for f in frames], wal


def last_frame_bounds(directory: Path) -> tuple[Path, int, int]:
    base, path = list_segments(directory)[-1]
    spans = scan_segment(path, base).spans
    return path, spans[-1].start, spans[-1].end


@pytest.mark.parametrize("fsync", [FsyncPolicy.NEVER, FsyncPolicy.ALWAYS])
def test_truncation_at_every_byte_of_the_last_frame(tmp_path: Path, fsync: FsyncPolicy) -> None:
    """A frame cut short is a torn write under every policy (under ``always`` it was never
    acknowledged): truncated, not quarantined."""
    config = replace(ONE_SEGMENT, fsync=fsync)
    original = tmp_path / "original"
    write_frames(original, 5, config=config)
    path, start, end = last_frame_bounds(original)
    content = path.read_bytes()
    for cut in range(start, end):
        directory = tmp_path / f"cut-{cut}"
        directory.mkdir()
        (directory / path.name).write_bytes(content[:cut])
        offsets, wal = read_all(directory, config)
        try:
            assert offsets == [0, 1, 2, 3], f"cut at byte {cut}"
            assert wal.stats().quarantined_segments == 0
            assert wal.recovery.torn_tail_bytes == cut - start
            assert wal.append("orders", 0, payload_for(4)) == 4, "the log accepts new appends"
        finally:
            wal.close()
        offsets, wal = read_all(directory, config)
        wal.close()
        assert offsets == [0, 1, 2, 3, 4]


def test_zero_filled_tail_is_truncated(wal_dir: Path) -> None:
    write_frames(wal_dir, 4)
    _, path = list_segments(wal_dir)[-1]
    with open(path, "ab") as file:
        file.write(bytes(4096))
    offsets, wal = read_all(wal_dir)
    with wal:
        assert offsets == [0, 1, 2, 3]
        assert wal.stats().truncated_bytes_on_open == 4096
        assert wal.stats().quarantined_segments == 0


@pytest.mark.parametrize("flip_at", ["magic", "length", "crc", "topic", "payload"])
def test_bit_flip_in_a_middle_frame_quarantines_and_salvages(wal_dir: Path, flip_at: str) -> None:
    write_frames(wal_dir, 9)
    base, path = list_segments(wal_dir)[-1]
    victim = scan_segment(path, base).spans[4]
    position = {
        "magic": victim.start,
        "length": victim.start + 5,
        "crc": victim.start + 9,
        "topic": victim.start + 39,
        "payload": victim.end - 7,
    }[flip_at]
    data = bytearray(path.read_bytes())
    data[position] ^= 0x10
    path.write_bytes(bytes(data))

    offsets, wal = read_all(wal_dir)
    with wal:
        assert offsets == [0, 1, 2, 3, 5, 6, 7, 8]
        assert wal.stats().quarantined_segments == 1
        assert wal.append("orders", 0, payload_for(9)) == 9
    quarantine = wal_dir / "quarantine"
    reasons = [json.loads(p.read_text()) for p in quarantine.glob("*.json")]
    assert len(reasons) == 1
    assert reasons[0]["lost_offsets"][0].startswith("4..4 ")
    assert reasons[0]["salvaged_frames"] == 8
    originals = [p for p in quarantine.iterdir() if p.suffix != ".json"]
    assert [p.read_bytes() for p in originals] == [bytes(data)], "the damaged original is kept"
    offsets, wal = read_all(wal_dir)
    with wal:
        assert offsets == [0, 1, 2, 3, 5, 6, 7, 8, 9]
        assert wal.stats().quarantined_segments == 1, "recovery is not repeated"


def test_damage_in_an_older_segment_keeps_later_segments(wal_dir: Path) -> None:
    write_frames(wal_dir, 60, size=600, config=SMALL)
    segments = list_segments(wal_dir)
    assert len(segments) >= 3
    base, path = segments[0]
    spans = scan_segment(path, base).spans
    data = bytearray(path.read_bytes())
    data[spans[-1].end - 3] ^= 0xFF  # the last frame of an older segment: not a torn tail
    path.write_bytes(bytes(data))
    offsets, wal = read_all(wal_dir, SMALL)
    with wal:
        assert offsets == [o for o in range(60) if o != spans[-1].offset]
        assert wal.stats().quarantined_segments == 1


def test_a_garbage_segment_header_loses_no_frame(wal_dir: Path) -> None:
    """The file name gives the base offset and every frame carries its own offset and CRC."""
    write_frames(wal_dir, 60, size=600, config=SMALL)
    segments = list_segments(wal_dir)
    base, path = segments[1]
    data = bytearray(path.read_bytes())
    data[0:8] = b"NOTAWAL!"
    path.write_bytes(bytes(data))
    offsets, wal = read_all(wal_dir, SMALL)
    with wal:
        assert offsets == list(range(60))
        assert wal.stats().quarantined_segments == 1
        assert wal.recovery.lost_frames == 0
        assert wal.append("t", 0, b"x") == 60
    assert path.read_bytes()[:16] == encode_segment_header(base), "header rewritten from the name"
    (record,) = [json.loads(p.read_text()) for p in (wal_dir / "quarantine").glob("*.json")]
    assert record["lost_offsets"] == [] and record["lost_frames"] == 0
    assert record["salvaged_frames"] == segments[2][0] - base
    assert record["damage"] == ["segment header magic is wrong (not a WAL segment)"]


def test_empty_newest_segment_from_a_crash_during_rotation(wal_dir: Path) -> None:
    write_frames(wal_dir, 10)
    (wal_dir / f"{10:020d}.seg").write_bytes(b"")
    offsets, wal = read_all(wal_dir)
    with wal:
        assert offsets == list(range(10))
        assert wal.append("t", 0, payload_for(10)) == 10


def test_corrupt_checkpoint_falls_back_to_replaying_everything(wal_dir: Path) -> None:
    with WriteAheadLog.open(wal_dir, SMALL) as wal:
        for i in range(30):
            wal.append("t", 0, payload_for(i, 500))
        wal.checkpoint(20)
        oldest = wal.stats().checkpoint_offset
    (wal_dir / CHECKPOINT_FILE).write_bytes(b"garbage")
    with WriteAheadLog.open(wal_dir, SMALL) as wal:
        first = list_segments(wal_dir)[0][0]
        assert wal.checkpoint_offset == first <= oldest
        assert [f.offset for f in wal.reader().poll(100)] == list(range(first, 30))


def test_leftover_temp_files_are_removed(wal_dir: Path) -> None:
    write_frames(wal_dir, 3)
    (wal_dir / ".checkpoint.tmp").write_bytes(b"half")
    (wal_dir / f"{0:020d}.seg.rebuild").write_bytes(b"half")
    offsets, wal = read_all(wal_dir)
    wal.close()
    assert offsets == [0, 1, 2]
    assert not list(wal_dir.glob("*.tmp")) and not list(wal_dir.glob("*.rebuild"))


def test_torn_checkpoint_write_keeps_the_previous_checkpoint(wal_dir: Path) -> None:
    with WriteAheadLog.open(wal_dir, SMALL) as wal:
        for i in range(30):
            wal.append("t", 0, payload_for(i, 500))
        wal.checkpoint(10)
        wal.checkpoint(20)
    data = bytearray((wal_dir / CHECKPOINT_FILE).read_bytes())
    latest_slot = 0 if data[512:520] == b"DPWALCK2" and data[8:16] > data[520:528] else 512
    data[latest_slot + 20] ^= 0xFF
    (wal_dir / CHECKPOINT_FILE).write_bytes(bytes(data))
    with WriteAheadLog.open(wal_dir, SMALL) as wal:
        assert wal.checkpoint_offset == 10
        wal.checkpoint(25)
    with WriteAheadLog.open(wal_dir, SMALL) as wal:
        assert wal.checkpoint_offset == 25


def test_a_long_scan_says_how_far_it_got(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Opening reads every segment (minutes for a large backlog on a slow disk): the log says
    how far it got every PROGRESS_INTERVAL_S, here every segment."""
    config = WalConfig(
        segment_bytes=4096, max_frame_bytes=2048, max_bytes=1 << 20, fsync=FsyncPolicy.NEVER
    )
    with WriteAheadLog.open(tmp_path, config) as wal:
        for _ in range(12):
            wal.append("t", 0, b"x" * 1000, record_count=1)
    segments = len(list(tmp_path.glob("*.seg")))
    assert segments >= 3
    monkeypatch.setattr(damage, "PROGRESS_INTERVAL_S", 0.0)
    with caplog.at_level(logging.INFO, logger=damage.__name__):
        WriteAheadLog.open(tmp_path, config).close()
    progress = [r.getMessage() for r in caplog.records if "segments," in r.getMessage()]
    assert len(progress) == segments, progress
    assert progress[-1].endswith(f"{segments} of {segments} segments, 0.0 of 0.0 GiB")


@pytest.mark.parametrize("victim_index", [4, 8], ids=["middle", "last"])
@pytest.mark.parametrize("offset", [MAX_OFFSET + 1, (1 << 64) - 1])
def test_a_frame_whose_offset_is_beyond_the_format_is_damage(
    wal_dir: Path, victim_index: int, offset: int
) -> None:
    """A frame whose CRC holds but whose offset no writer of this log makes (above
    ``MAX_OFFSET``): damage like any other, not an OverflowError at every start (the compiled
    scans refused it already; ``decode_frame``, which says what is there, did not)."""
    write_frames(wal_dir, 9)
    base, path = list_segments(wal_dir)[-1]
    victim = scan_segment(path, base).spans[victim_index]
    data = bytearray(path.read_bytes())
    decoded = decode_frame(memoryview(data), victim.start)
    assert not isinstance(decoded, FrameProblem)
    frame = decoded[0]
    topic = frame.topic.encode()
    header = encode_frame_header(
        offset,
        topic,
        frame.partition,
        len(frame.payload),
        crc32c(frame.payload),
        frame.record_count,
        frame.appended_ms,
    )
    data[victim.start : victim.end] = header + frame.payload
    path.write_bytes(bytes(data))
    assert decode_frame(memoryview(data), victim.start) is FrameProblem.BAD_OFFSET

    offsets, wal = read_all(wal_dir)
    with wal:
        assert offsets == [o for o in range(9) if o != victim_index]
        if victim_index == 8:  # the last frame, under fsync=never: a torn tail, as a bad CRC
            assert wal.recovery.torn_tail_bytes == victim.end - victim.start
            assert wal.append("orders", 0, payload_for(8)) == 8
        else:
            assert wal.stats().quarantined_segments == 1
            assert wal.append("orders", 0, payload_for(9)) == 9
