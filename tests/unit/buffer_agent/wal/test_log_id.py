"""The log's id (``wal/id``): made once, kept across opens, new for a recreated log.

The forwarder trusts what it kept beside the log (``state/producer-identity``) only for the
log it names: a WAL recreated at offset 0 beside a kept ``state/`` must read as another log.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import pytest

from durable_producer.buffer_agent.volume.format import LOG_ID_FILE
from durable_producer.buffer_agent.wal import WriteAheadLog
from durable_producer.buffer_agent.wal.log_id import open_log_id
from durable_producer.buffer_agent.wal.recovery.inspect import format_report, inspect_wal
from support.wal_helpers import SMALL


def _opened(directory: Path) -> tuple[str, bool]:
    with WriteAheadLog.open(directory, SMALL) as wal:
        return wal.log_id.value, wal.log_id.adopted


def test_a_log_keeps_its_id_across_opens_and_a_recreated_one_gets_another(wal_dir: Path) -> None:
    first, adopted = _opened(wal_dir)
    assert not adopted, "a new log held no frames"
    with WriteAheadLog.open(wal_dir, SMALL) as wal:
        wal.append("t", 0, b"x", 1)
        assert wal.log_id.value == first
    assert _opened(wal_dir) == (first, False)
    assert (wal_dir / LOG_ID_FILE).read_text() == first + "\n"

    shutil.rmtree(wal_dir)
    assert _opened(wal_dir)[0] != first


def test_a_log_from_before_ids_is_adopted_for_good(wal_dir: Path) -> None:
    """For good: a kill before the older agent's marks are rewritten with the id (the ingest
    replay of a long backlog comes first), or a downgrade and back, must not cost the
    upgrade its identity."""
    with WriteAheadLog.open(wal_dir, SMALL) as wal:
        wal.append("t", 0, b"x", 1)
    (wal_dir / LOG_ID_FILE).unlink()  # as an agent before ids left it
    given, adopted = _opened(wal_dir)
    assert adopted, "frames and no id: an older agent's log"
    assert _opened(wal_dir) == (given, True)
    assert (wal_dir / LOG_ID_FILE).read_text() == f"{given}\nadopted\n"
    assert "(adopted: the log was begun by an agent before ids)" in format_report(
        inspect_wal(wal_dir)
    )


def test_an_unreadable_id_is_replaced_and_said(
    wal_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    first, _ = _opened(wal_dir)
    (wal_dir / LOG_ID_FILE).write_bytes(b"\x00garbage")
    with caplog.at_level(logging.WARNING):
        second, adopted = _opened(wal_dir)
    assert second != first and not adopted, "damage is no upgrade: the old marks are not used"
    assert [r.getMessage() for r in caplog.records] == [
        f"{wal_dir / LOG_ID_FILE} held no readable log id: a new id for this log"
    ]
    assert _opened(wal_dir) == (second, False)


def test_an_id_that_cannot_be_written_is_kept_for_the_run_and_said(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    def full(path: Path, data: bytes) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("durable_producer.buffer_agent.wal.log_id.write_atomic", full)
    with caplog.at_level(logging.WARNING):
        given = open_log_id(tmp_path, holds_frames=True, had_entry=False)
    assert not given.adopted, "an adoption not on the volume would be made again next time"
    assert not given.named_by(""), "an older agent's marks are not used"
    assert given.named_by(given.value)
    assert "No space left on device" in caplog.records[0].getMessage()
    assert "takes a new producer id" in caplog.records[0].getMessage()


def test_inspect_shows_the_id_and_makes_none(wal_dir: Path) -> None:
    wal_dir.mkdir()
    assert inspect_wal(wal_dir).log_id is None
    assert not (wal_dir / LOG_ID_FILE).exists(), "inspect changes nothing"
    given, _ = _opened(wal_dir)
    report = inspect_wal(wal_dir)
    assert report.log_id == given
    assert f"log id:        {given}" in format_report(report).splitlines()


@pytest.mark.parametrize(
    ("content", "adopted"),
    [(b"%s", False), (b"%s\n", False), (b"%s\nadopted", True), (b"%s\nadopted\n", True)],
)
def test_an_id_written_by_hand_reads_with_or_without_its_last_newline(
    wal_dir: Path, content: bytes, adopted: bool
) -> None:
    wal_dir.mkdir()
    (wal_dir / LOG_ID_FILE).write_bytes(content % (b"ab" * 16))
    assert _opened(wal_dir) == ("ab" * 16, adopted)
