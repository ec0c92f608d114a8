"""The forwarding producer's identity file: read back as written, and damage never stops it.

A damaged ``state/producer-identity`` (garbage, a directory in its place, a slot that parses but
holds no identity) is moved aside, reported once and the forwarder falls back to a new producer
id; a torn newest slot falls back to the older one (no damage); a file of zeros is no damage.
"""

from __future__ import annotations

import json
import logging
import struct
import zlib
from dataclasses import replace
from pathlib import Path

import pytest

from durable_producer.buffer_agent.forward.identity import (
    IDENTITY_FILE,
    MAGIC,
    SLOT_BYTES,
    Anchor,
    IdentityFile,
    IdentityRecord,
    load_identity,
)
from durable_producer.buffer_agent.wal.log_id import LogId

RECORD = IdentityRecord(
    producer_id=7,
    epoch=2,
    delivered_below=100,
    sent_below=140,
    partitions={("orders", 1): Anchor(7, 2, 90, 12)},
    written_checkpoint=50,
)


def written(state_dir: Path, *records: IdentityRecord) -> Path:
    file = IdentityFile(state_dir)
    for record in records:
        assert file.write(record)
    file.close()
    return state_dir / IDENTITY_FILE


def test_a_written_record_is_read_back(tmp_path: Path) -> None:
    newer = IdentityRecord(7, 3, delivered_below=120, sent_below=150)
    written(tmp_path, RECORD, newer)
    record, damage = load_identity(tmp_path)
    assert damage is None
    assert record is not None
    assert (record.epoch, record.delivered_below, record.sent_below) == (3, 120, 150)


def test_topic_ids_and_gaps_are_read_back_and_kept_apart_from_the_numbering() -> None:
    """Apart, so that an agent from before them still reads the record (it unpacks each
    entry of ``partitions`` into six fields)."""
    anchors = {
        ("orders", 0): Anchor(7, 2, 90, 12, "0f" * 16, gap=True),
        ("orders", 2): Anchor(7, 2, 97, 5, gap=True, gap_why="a dead-lettered batch may be"),
        ("orders", 1): Anchor(7, 2, 95, 3, "0f" * 16),
        ("audit", 0): Anchor(7, 2, 99, 0),
    }
    record = IdentityRecord(7, 2, partitions=anchors)
    data = record.encode()
    assert IdentityRecord.decode(data).partitions == anchors
    entry = json.loads(data)
    assert all(len(numbering) == 6 for numbering in entry["partitions"])
    del entry["topic_ids"], entry["gaps"], entry["gap_reasons"]  # as an agent before them
    assert IdentityRecord.decode(json.dumps(entry).encode()).partitions == {
        key: Anchor(a.producer_id, a.epoch, a.offset, a.sequence) for key, a in anchors.items()
    }


def test_no_file_is_no_damage(tmp_path: Path) -> None:
    assert load_identity(tmp_path) == (None, None)


def test_a_file_of_zeros_is_no_damage(tmp_path: Path) -> None:
    (tmp_path / IDENTITY_FILE).write_bytes(bytes(2 * SLOT_BYTES))
    assert load_identity(tmp_path) == (None, None)
    assert (tmp_path / IDENTITY_FILE).exists()


def test_a_torn_newest_slot_falls_back_to_the_older_one(tmp_path: Path) -> None:
    newer = IdentityRecord(7, 3, delivered_below=120, sent_below=150)
    path = written(tmp_path, RECORD, newer)
    data = bytearray(path.read_bytes())
    data[20:30] = b"x" * 10  # sequence 2 lives in slot 0
    path.write_bytes(bytes(data))
    record, damage = load_identity(tmp_path)
    assert damage is None
    assert record is not None
    assert (record.epoch, record.sent_below, record.partitions) == (2, 140, RECORD.partitions)


def _slot(payload: bytes, sequence: int = 1) -> bytes:
    head = struct.pack(">4sQII", MAGIC, sequence, len(payload), zlib.crc32(payload))
    return (head + payload).ljust(SLOT_BYTES, b"\0")


@pytest.mark.parametrize(
    ("name", "make"),
    [
        ("garbage", lambda path: path.write_bytes(b"{")),
        ("directory", lambda path: (path / "inside").mkdir(parents=True)),
        ("no identity in a valid slot", lambda path: path.write_bytes(2 * _slot(b'{"a": 1}'))),
        # A RecursionError (not a ValueError) ended the forwarder's start before.
        ("deep JSON in a valid slot", lambda path: path.write_bytes(2 * _slot(b"[" * 60_000))),
    ],
)
def test_a_damaged_file_is_set_aside_logged_once_and_reported(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, name: str, make: object
) -> None:
    path = tmp_path / IDENTITY_FILE
    make(path)  # type: ignore[operator]
    with caplog.at_level(logging.WARNING):
        record, damage = load_identity(tmp_path)
    assert record is None
    assert damage is not None and damage.path == path
    assert not path.exists()
    assert (tmp_path / f"{IDENTITY_FILE}.damaged").exists()
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert "new producer id" in warnings[0].getMessage()

    # The next write makes a good file again, read back without damage.
    written(tmp_path, RECORD)
    again, damage = load_identity(tmp_path)
    assert damage is None and again is not None and again.producer_id == RECORD.producer_id


@pytest.mark.parametrize(
    ("wal_id", "id_adopted", "checkpoint", "fits"),
    [
        ("a" * 32, False, 50, True),
        ("a" * 32, False, 100, True),
        ("a" * 32, False, 49, False),  # a checkpoint it cannot have seen
        ("a" * 32, False, 101, False),  # past its watermark
        ("b" * 32, False, 50, False),  # another log (recreated at offset 0)
        ("b" * 32, True, 50, False),  # another log, even one just given its id
    ],
)
def test_a_record_fits_only_the_log_it_names_between_its_checkpoints(
    wal_id: str, id_adopted: bool, checkpoint: int, fits: bool
) -> None:
    record = IdentityRecord.decode(replace(RECORD, wal_id="a" * 32).encode())
    assert record.wal_id == "a" * 32
    assert record.fits(checkpoint, LogId(wal_id, id_adopted)) is fits


def test_a_record_from_before_log_ids_fits_only_a_log_given_its_id_over_its_frames() -> None:
    """An upgrade keeps the identity; a log made new beside it (no frames, so no adoption)
    does not: its offsets start at 0 again and say nothing of the record's."""
    old = json.loads(RECORD.encode())
    del old["wal_id"]
    record = IdentityRecord.decode(json.dumps(old).encode())
    assert record.wal_id == ""
    assert record.fits(50, LogId("c" * 32, adopted=True))
    assert not record.fits(50, LogId("c" * 32))
    assert not replace(record, producer_id=-1).fits(50, LogId("c" * 32, adopted=True))
