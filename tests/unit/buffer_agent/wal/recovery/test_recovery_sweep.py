"""Flip every byte of a small WAL, one at a time, and open it: only the frame that byte belongs
to may be lost (a segment header byte loses nothing), and the loss is on record.

Three segments of three frames (6.5 KB), written by real appends; each position gets a fresh
copy in a RAM-backed directory where there is one. Each copy is recovered by ``recover_log``
under ``fsync=always`` (what ``WriteAheadLog.open`` runs first, with its config's policy), then
opened with ``fsync=never`` to read it back: that open recovers again and must find nothing
left to do, and it starts no syncer thread, so the whole sweep takes seconds. Every 50th
position also goes through ``WriteAheadLog.open`` under ``always`` in one step.
"""

from __future__ import annotations

import json
import logging
import re
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from durable_producer.buffer_agent.volume.format import SEGMENT_HEADER_SIZE
from durable_producer.buffer_agent.wal import FsyncPolicy, WalConfig, WriteAheadLog
from durable_producer.buffer_agent.wal.recovery.repair import recover_log
from durable_producer.buffer_agent.wal.recovery.scan import scan_segment
from durable_producer.buffer_agent.wal.segment import list_segments
from support.wal_helpers import payload_for

SWEEP = WalConfig(
    segment_bytes=4096, max_bytes=1 << 20, max_frame_bytes=4096, fsync=FsyncPolicy.ALWAYS
)
READ_BACK = WalConfig(
    segment_bytes=4096, max_bytes=1 << 20, max_frame_bytes=4096, fsync=FsyncPolicy.NEVER
)
FRAMES = 9
PAYLOAD_SIZES = [60, 64, 1900, 1892, 60, 64, 1900, 60, 64]
"""Small segments that still rotate after three frames: the first frame of the next segment
does not fit in 4096 bytes (the smallest segment size) beside the three before it."""
_RANGE = re.compile(r"^(\d+)\.\.(\d+) ")


@dataclass(frozen=True)
class Original:
    """The undamaged WAL: each segment's name and bytes, and which frame owns which bytes."""

    files: list[tuple[str, bytes]]
    owners: list[list[int | None]]
    """Per segment, per byte: the offset of the frame it belongs to (None: segment header)."""

    def positions(self) -> Iterator[tuple[int, int, int | None]]:
        for index, owners in enumerate(self.owners):
            for position, owner in enumerate(owners):
                yield index, position, owner


@pytest.fixture(scope="module")
def ram_dir() -> Iterator[Path]:
    shm = Path("/dev/shm")
    parent = str(shm) if shm.is_dir() else None
    with tempfile.TemporaryDirectory(dir=parent, prefix="wal-sweep-") as name:
        yield Path(name)


@pytest.fixture(scope="module")
def original(ram_dir: Path) -> Original:
    directory = ram_dir / "original"
    with WriteAheadLog.open(directory, SWEEP) as wal:
        for offset, size in enumerate(PAYLOAD_SIZES):
            assert wal.append("orders", offset % 3, payload_for(offset, size), 1) == offset
    segments = list_segments(directory)
    assert len(segments) == 3, "the sweep needs three segments"
    files, owners = [], []
    for base, path in segments:
        data = path.read_bytes()
        spans = scan_segment(path, base).spans
        assert len(spans) == 3 and spans[-1].end == len(data)
        owner: list[int | None] = [None] * SEGMENT_HEADER_SIZE
        for span in spans:
            owner += [span.offset] * (span.end - span.start)
        files.append((path.name, data))
        owners.append(owner)
    return Original(files, owners)


def damaged_copy(directory: Path, original: Original, index: int, position: int) -> None:
    directory.mkdir()
    for number, (name, data) in enumerate(original.files):
        if number == index:
            flipped = bytearray(data)
            flipped[position] ^= 0x5A
            data = bytes(flipped)
        (directory / name).write_bytes(data)


def lost_on_record(directory: Path) -> tuple[set[int], int, int]:
    """Offsets named lost by the quarantine records, their lost_frames total, record count."""
    records = [json.loads(p.read_text()) for p in (directory / "quarantine").glob("*.json")]
    lost: set[int] = set()
    for record in records:
        for entry in record["lost_offsets"]:
            match = _RANGE.match(entry)
            assert match, entry
            lost |= set(range(int(match[1]), int(match[2]) + 1))
    return lost, sum(r["lost_frames"] for r in records), len(records)


def open_and_read(directory: Path, config: WalConfig) -> tuple[list[int], WriteAheadLog]:
    wal = WriteAheadLog.open(directory, config)
    frames = wal.reader(0).poll(100)
    for frame in frames:
        expected = (
            payload_for(frame.offset, PAYLOAD_SIZES[frame.offset])
            if frame.offset < FRAMES
            else b"new"
        )
        assert frame.payload == expected
    return [frame.offset for frame in frames], wal


@pytest.fixture
def quiet_recovery(caplog: pytest.LogCaptureFixture) -> None:
    """Thousands of recoveries: keep their log lines out of the captured output."""
    caplog.set_level(logging.CRITICAL, logger="durable_producer.buffer_agent.wal")


def test_every_flipped_byte_loses_at_most_its_own_frame_and_says_so(
    original: Original, ram_dir: Path, quiet_recovery: None
) -> None:
    checked = 0
    for index, position, owner in original.positions():
        directory = ram_dir / f"flip-{index}-{position}"
        damaged_copy(directory, original, index, position)
        where = f"byte {position} of segment {index} (frame {owner})"
        expected_lost = set() if owner is None else {owner}
        survivors = [o for o in range(FRAMES) if o not in expected_lost]

        recovered = recover_log(directory, FsyncPolicy.ALWAYS)
        assert recovered.summary.lost_frames == len(expected_lost), where
        assert recovered.quarantined_segments == 1, f"{where}: the damage is on record"
        assert recovered.result.next_offset == FRAMES, f"{where}: a lost offset is not reused"
        lost, lost_frames, records = lost_on_record(directory)
        assert (lost, lost_frames, records) == (expected_lost, len(expected_lost), 1), where
        offsets, wal = open_and_read(directory, READ_BACK)
        with wal:
            assert offsets == survivors, where
            assert wal.recovery == recovered.summary, f"{where}: a second recovery did more"
            assert wal.next_offset == FRAMES, where

        if checked % 50 == 0:  # in one step, as the agent opens it; and the log goes on
            shutil.rmtree(directory)
            damaged_copy(directory, original, index, position)
            offsets, wal = open_and_read(directory, SWEEP)
            with wal:
                assert offsets == survivors, where
                assert wal.recovery == recovered.summary, where
                assert wal.append("orders", 0, b"new") == FRAMES, where
            offsets, wal = open_and_read(directory, SWEEP)
            wal.close()
            assert offsets == [*survivors, FRAMES], where
        shutil.rmtree(directory)
        checked += 1
    assert checked == sum(len(data) for _, data in original.files)


@pytest.mark.parametrize("policy", [FsyncPolicy.INTERVAL, FsyncPolicy.NEVER])
def test_a_damaged_last_frame_is_a_torn_write_without_fsync_always(
    original: Original, ram_dir: Path, quiet_recovery: None, policy: FsyncPolicy
) -> None:
    """Under interval/never the newest frame may be half-written after a crash: truncated and
    counted, not quarantined, and its offset is reused."""
    config = WalConfig(
        segment_bytes=SWEEP.segment_bytes,
        max_bytes=SWEEP.max_bytes,
        max_frame_bytes=SWEEP.max_frame_bytes,
        fsync=policy,
    )
    last = len(original.files) - 1
    owners = original.owners[last]
    start = owners.index(FRAMES - 1)
    for position in range(start, len(owners)):
        directory = ram_dir / f"torn-{policy}-{position}"
        damaged_copy(directory, original, last, position)
        offsets, wal = open_and_read(directory, config)
        with wal:
            assert offsets == list(range(FRAMES - 1)), position
            assert wal.recovery.torn_tail_bytes == len(owners) - start, position
            assert wal.recovery.lost_frames == 0
            assert wal.stats().quarantined_segments == 0
            assert wal.append("orders", 0, b"new") == FRAMES - 1
        assert not (directory / "quarantine").exists()
        shutil.rmtree(directory)
