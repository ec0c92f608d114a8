"""The end of the newest segment under fsync=always: a torn write is truncated, a complete frame
gone bad was acknowledged and is reported; and ``wal inspect`` predicts what recovery does."""

from __future__ import annotations

import json
from dataclasses import replace
from functools import partial
from pathlib import Path

import pytest

from durable_producer.buffer_agent.cli import main
from durable_producer.buffer_agent.wal import FsyncPolicy, WriteAheadLog
from durable_producer.buffer_agent.wal.recovery.inspect import inspect_wal
from durable_producer.buffer_agent.wal.recovery.scan import scan_segment
from durable_producer.buffer_agent.wal.segment import list_segments
from support import wal_helpers
from support.wal_helpers import SMALL

ALWAYS = replace(SMALL, fsync=FsyncPolicy.ALWAYS)


write_frames = partial(wal_helpers.write_frames, config=ALWAYS, size=300)


def flip(path: Path, *positions: int) -> None:
    data = bytearray(path.read_bytes())
    for position in positions:
        data[position] ^= 0xFF
    path.write_bytes(bytes(data))


def test_a_zero_filled_tail_is_a_torn_write_even_under_always(wal_dir: Path) -> None:
    write_frames(wal_dir, 4)
    _, path = list_segments(wal_dir)[-1]
    with open(path, "ab") as file:
        file.write(bytes(4096))
    with WriteAheadLog.open(wal_dir, ALWAYS) as wal:
        assert [f.offset for f in wal.reader(0).poll(10)] == [0, 1, 2, 3]
        assert (wal.recovery.torn_tail_bytes, wal.recovery.quarantined_segments) == (4096, 0)


def test_every_complete_corrupt_frame_at_the_tail_is_reported_and_never_reused(
    wal_dir: Path,
) -> None:
    write_frames(wal_dir, 6)
    base, path = list_segments(wal_dir)[-1]
    spans = scan_segment(path, base).spans
    flip(path, spans[-2].end - 5, spans[-1].end - 5)  # the payloads of the last two frames
    with WriteAheadLog.open(wal_dir, ALWAYS) as wal:
        assert [f.offset for f in wal.reader(0).poll(10)] == [0, 1, 2, 3]
        assert wal.recovery.lost_frames == 2
        assert wal.append("t", 0, b"next") == 6
    (record,) = [json.loads(p.read_text()) for p in (wal_dir / "quarantine").glob("*.json")]
    assert record["lost_offsets"] == [f"4..5 (CRC32C mismatch at byte {spans[-2].start})"]
    assert "acknowledged under fsync=always" in record["damage"][0]


def test_under_interval_the_same_tail_is_truncated_as_torn(wal_dir: Path) -> None:
    write_frames(wal_dir, 6)
    base, path = list_segments(wal_dir)[-1]
    spans = scan_segment(path, base).spans
    flip(path, spans[-1].end - 5)
    with WriteAheadLog.open(wal_dir, replace(SMALL, fsync=FsyncPolicy.INTERVAL)) as wal:
        assert [f.offset for f in wal.reader(0).poll(10)] == [0, 1, 2, 3, 4]
        assert wal.recovery.torn_tail_bytes == spans[-1].end - spans[-1].start
        assert wal.recovery.quarantined_segments == 0
        assert wal.append("t", 0, b"next") == 5


def test_inspect_reports_what_recovery_then_does(
    wal_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write_frames(wal_dir, 40, size=600)
    segments = list_segments(wal_dir)
    first_spans = scan_segment(segments[0][1], segments[0][0]).spans
    flip(segments[0][1], first_spans[3].start + 50)  # a frame inside the oldest segment
    flip(segments[1][1], 3)  # a header byte: nothing lost
    newest_base, newest = segments[-1]
    flip(newest, scan_segment(newest, newest_base).spans[-1].end - 1)  # the acknowledged last
    (wal_dir / f"{900:020d}.seg").write_bytes(b"junk")
    (wal_dir / "notes.txt").write_bytes(b"")

    report = inspect_wal(wal_dir, FsyncPolicy.ALWAYS)
    predicted = {s.name: s.lost_offsets for s in report.segments if s.lost_offsets}
    assert predicted == {
        segments[0][1].name: [f"3..3 (CRC32C mismatch at byte {first_spans[3].start})"],
        newest.name: [predicted[newest.name][0]],
    }
    assert predicted[newest.name][0].startswith("39..39 ")
    assert {s.name: s.on_open for s in report.strays} == {
        f"{900:020d}.seg": "moved to quarantine/",
        "notes.txt": "left alone (not a WAL file)",
    }
    assert main(["wal", "inspect", "--fsync", "always", str(wal_dir)]) == 1
    assert "LOST offsets 39..39" in capsys.readouterr().out

    with WriteAheadLog.open(wal_dir, ALWAYS) as wal:
        assert wal.recovery.lost_frames == 2
        assert wal.next_offset == report.next_offset == 40
    recorded = {}
    for path in (wal_dir / "quarantine").glob("*.json"):
        record = json.loads(path.read_text())
        recorded[record["segment"]] = record["lost_offsets"]
    assert recorded == {
        **predicted,
        segments[1][1].name: [],
        f"{900:020d}.seg": [],
    }
    after = inspect_wal(wal_dir, FsyncPolicy.ALWAYS)
    assert not any(s.problems for s in after.segments) and not after.gaps
    assert [s.name for s in after.strays] == ["notes.txt"]


_TRUNCATED_MID_SCAN = """
import sys
from pathlib import Path

from durable_producer.buffer_agent.wal.recovery import scan
from durable_producer.buffer_agent.wal.recovery.inspect import inspect_wal

directory, newest = Path(sys.argv[1]), Path(sys.argv[2])
real = scan._scan_frames


def truncated_first(view, segment_scan):
    if segment_scan.path == newest:
        with open(newest, "r+b") as file:
            file.truncate(64)  # as the agent's roll back after a failed write
    return real(view, segment_scan)


scan._scan_frames = truncated_first
report = inspect_wal(directory)
print(report.segments[-1].frames)
"""


def test_inspect_survives_the_agent_truncating_the_newest_segment_mid_scan(
    wal_dir: Path, tmp_path: Path
) -> None:
    """``wal inspect`` takes no lock: a running agent whose write fails (a full disk) cuts
    the newest segment back meanwhile. Read through a mapping, the pages past the new end
    killed the inspecting process with SIGBUS; the newest segment is read as a copy."""
    import subprocess
    import sys

    write_frames(wal_dir, 60, config=replace(SMALL, segment_bytes=1 << 20, max_bytes=1 << 22))
    (newest,) = [path for _, path in list_segments(wal_dir)]  # 18 KB: pages past the cut
    script = tmp_path / "truncate_mid_scan.py"
    script.write_text(_TRUNCATED_MID_SCAN)
    done = subprocess.run(
        [sys.executable, str(script), str(wal_dir), str(newest)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, f"inspect died ({done.returncode}): {done.stderr[-400:]}"
    assert int(done.stdout.strip()) == 60, "what the segment held when inspect read it"
