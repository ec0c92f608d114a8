"""Entries of the WAL directory that are not part of the log: never a crash, never a false
"lost offsets" alarm, never a jump in offsets; each one moved aside with a record or left alone
with one warning."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest

from durable_producer.buffer_agent.figures.metrics import AgentMetrics
from durable_producer.buffer_agent.volume.format import (
    MAX_OFFSET,
    QUARANTINE_DIR,
    QUARANTINE_REASON_SUFFIX,
    encode_segment_header,
)
from durable_producer.buffer_agent.wal import WriteAheadLog
from durable_producer.buffer_agent.wal.recovery.quarantine import read_records
from durable_producer.buffer_agent.wal.segment import list_segments
from support.wal_helpers import SMALL, payload_for, write_frames


def records(directory: Path) -> list[dict[str, Any]]:
    return [json.loads(p.read_text()) for p in sorted((directory / "quarantine").glob("*.json"))]


def reopen_reads_everything(directory: Path, count: int) -> WriteAheadLog:
    wal = WriteAheadLog.open(directory, SMALL)
    assert [f.offset for f in wal.reader(0).poll(1000)] == list(range(count))
    assert wal.append("t", 0, b"next") == count, "offsets continue where the log ended"
    return wal


@pytest.mark.parametrize(
    ("name", "content"),
    [
        ("99999999999999999999.seg", b"junk"),  # above 2**64 - 1: a struct.error crash loop
        (f"{2**64 - 1:020d}.seg", b""),  # the first produce killed the agent
        (f"{MAX_OFFSET + 1:020d}.seg", encode_segment_header(MAX_OFFSET + 1)),
    ],
)
def test_a_segment_name_beyond_the_offset_range_is_moved_aside(
    wal_dir: Path, name: str, content: bytes
) -> None:
    write_frames(wal_dir, 5)
    (wal_dir / name).write_bytes(content)
    with reopen_reads_everything(wal_dir, 5) as wal:
        assert wal.recovery.lost_frames == 0
        assert wal.stats().quarantined_segments == 1
    assert not (wal_dir / name).exists()
    (record,) = records(wal_dir)
    assert record["segment"] == name and record["lost_offsets"] == []
    assert record["reason"].startswith("not part of the log: the offset in its name")
    assert (wal_dir / "quarantine" / record["quarantined_file"]).read_bytes() == content


@pytest.mark.parametrize("content", [b"garbage" * 20, b"", b"\0" * 16, b"\0" * 4096])
def test_a_junk_segment_raises_no_lost_offsets_alarm(wal_dir: Path, content: bytes) -> None:
    """A file named like a segment, with no valid header or frame, that does not continue the
    log: no evidence that anything was lost, and the next offset does not jump to its name."""
    write_frames(wal_dir, 5)
    (wal_dir / f"{500:020d}.seg").write_bytes(content)
    with reopen_reads_everything(wal_dir, 5) as wal:
        assert wal.recovery.lost_frames == 0
    (record,) = records(wal_dir)
    assert record["lost_offsets"] == [] and record["lost_frames"] == 0
    assert "does not continue the log" in record["reason"]


def test_junk_named_inside_the_log_below_the_checkpoint_deletes_nothing(wal_dir: Path) -> None:
    """A junk file named between the oldest segment's base and the checkpoint must not make the
    oldest segment look delivered (it still holds frames at and above the checkpoint)."""
    with WriteAheadLog.open(wal_dir, SMALL) as wal:
        for offset in range(10):
            wal.append("t", 0, payload_for(offset), 1)
        wal.checkpoint(6)
    assert [base for base, _ in list_segments(wal_dir)] == [0]
    (wal_dir / f"{3:020d}.seg").write_bytes(b"junk" * 10)
    with WriteAheadLog.open(wal_dir, SMALL) as wal:
        assert [f.offset for f in wal.reader().poll(100)] == [6, 7, 8, 9]
        assert wal.recovery.lost_frames == 0
    assert "overlaps offsets" in records(wal_dir)[0]["reason"]


def test_a_directory_named_like_a_segment_is_moved_aside(wal_dir: Path) -> None:
    """Even where the log must create that very segment (a new volume)."""
    (wal_dir / f"{0:020d}.seg").mkdir(parents=True)
    with WriteAheadLog.open(wal_dir, SMALL) as wal:
        assert wal.append("t", 0, b"first") == 0
    (record,) = records(wal_dir)
    assert record["reason"] == "not part of the log: named like a segment but not a file"
    assert (wal_dir / "quarantine" / record["quarantined_file"]).is_dir()


def test_unknown_names_are_left_alone_with_one_warning(
    wal_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    write_frames(wal_dir, 3)
    strays = ["foo.seg", f"{0:020d}.seg.tmp", "notes.txt", "1.seg"]
    for name in strays:
        (wal_dir / name).write_bytes(b"not ours")
    (wal_dir / "subdir").mkdir()
    caplog.set_level(logging.WARNING, logger="durable_producer.buffer_agent.wal")
    with reopen_reads_everything(wal_dir, 3) as wal:
        assert wal.recovery.ignored_files == 5
        assert wal.stats().quarantined_segments == 0
    warnings = [r.getMessage() for r in caplog.records if "not WAL files" in r.getMessage()]
    assert len(warnings) == 1
    assert all(name in warnings[0] for name in [*strays, "subdir"])
    assert all((wal_dir / name).read_bytes() == b"not ours" for name in strays)


def test_a_zero_byte_segment_that_does_not_continue_the_log_is_moved_aside(
    wal_dir: Path,
) -> None:
    write_frames(wal_dir, 5)
    (wal_dir / f"{7:020d}.seg").write_bytes(b"")  # the log ends at 4: not a rotation crash
    with reopen_reads_everything(wal_dir, 5):
        pass
    assert len(records(wal_dir)) == 1


def test_a_file_in_place_of_the_quarantine_directory_is_renamed(wal_dir: Path) -> None:
    write_frames(wal_dir, 3)
    (wal_dir / "quarantine").write_bytes(b"a file")
    (wal_dir / f"{500:020d}.seg").write_bytes(b"junk")
    with reopen_reads_everything(wal_dir, 3):
        pass
    assert (wal_dir / "quarantine").is_dir() and len(records(wal_dir)) == 1
    assert [p.read_bytes() for p in wal_dir.glob("quarantine.not-a-directory.*")] == [b"a file"]


def test_a_directory_in_place_of_the_lock_file_is_moved_aside(wal_dir: Path) -> None:
    write_frames(wal_dir, 3)
    (wal_dir / "LOCK").unlink()
    (wal_dir / "LOCK").mkdir()
    with reopen_reads_everything(wal_dir, 3):
        assert (wal_dir / "LOCK").is_file()
    assert records(wal_dir)[0]["segment"] == "LOCK"


def test_a_directory_in_place_of_the_checkpoint_is_moved_aside(wal_dir: Path) -> None:
    write_frames(wal_dir, 3)
    (wal_dir / "checkpoint").unlink(missing_ok=True)
    (wal_dir / "checkpoint").mkdir()
    (wal_dir / "checkpoint" / "note").write_text("someone's file")
    with reopen_reads_everything(wal_dir, 3) as wal:  # replayed from the oldest segment
        wal.checkpoint(2)
        assert (wal_dir / "checkpoint").is_file()
    (record,) = records(wal_dir)
    assert record["segment"] == "checkpoint" and record["lost_offsets"] == []
    moved = wal_dir / "quarantine" / record["quarantined_file"]
    assert (moved / "note").read_text() == "someone's file"
    with WriteAheadLog.open(wal_dir, SMALL) as wal:
        assert wal.stats().checkpoint_offset == 2


def test_a_directory_in_place_of_the_log_id_is_moved_aside(wal_dir: Path) -> None:
    """Else the id could never be written, and the forwarder took a new producer id at
    every start (its identity names an id this log never keeps)."""
    write_frames(wal_dir, 3)
    (wal_dir / "id").unlink()
    (wal_dir / "id").mkdir()
    with reopen_reads_everything(wal_dir, 3) as wal:
        given = wal.log_id.value
        assert not wal.log_id.adopted, "a log with something in its id's place is no older log"
    (record,) = records(wal_dir)
    assert record["segment"] == "id" and record["lost_offsets"] == []
    assert record["reason"].endswith("not a file, so not the log's id")
    with WriteAheadLog.open(wal_dir, SMALL) as wal:
        assert wal.log_id.value == given


def test_a_missing_segment_file_is_reported_as_a_gap(
    wal_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with WriteAheadLog.open(wal_dir, SMALL) as wal:
        for offset in range(60):
            wal.append("t", 0, payload_for(offset, 600), 1)
    segments = list_segments(wal_dir)
    segments[1][1].unlink()
    missing = (segments[1][0], segments[2][0] - 1)
    caplog.set_level(logging.WARNING, logger="durable_producer.buffer_agent.wal")
    WriteAheadLog.open(wal_dir, SMALL).close()
    assert f"WAL offsets {missing[0]}..{missing[1]} are missing" in caplog.text


def test_the_agent_metrics_show_what_opening_found(wal_dir: Path) -> None:
    write_frames(wal_dir, 9)
    (_, path) = list_segments(wal_dir)[-1]
    data = bytearray(path.read_bytes())
    data[60] ^= 0xFF  # the first frame's payload: corruption followed by valid frames
    path.write_bytes(bytes(data))
    (wal_dir / "stray.txt").write_bytes(b"")
    metrics = AgentMetrics()
    with WriteAheadLog.open(wal_dir, SMALL) as wal:
        metrics.record_wal_recovery(wal.recovery)
    text = metrics.render().decode()
    assert "durable_agent_wal_lost_frames 1.0" in text
    assert "durable_agent_quarantined_segments 1.0" in text
    assert "durable_agent_wal_ignored_files 1.0" in text
    assert "durable_agent_wal_torn_tail_bytes 0.0" in text


def test_a_deeply_nested_quarantine_record_is_listed_as_unreadable(tmp_path: Path) -> None:
    """A RecursionError, not a ValueError: it ended ``wal inspect`` with a traceback before."""
    area = tmp_path / QUARANTINE_DIR
    area.mkdir()
    (area / f"00000000000000000000{QUARANTINE_REASON_SUFFIX}").write_bytes(b"[" * 100_000)
    [record] = read_records(tmp_path)
    assert record["quarantined_file"].endswith(QUARANTINE_REASON_SUFFIX) and record["error"]
