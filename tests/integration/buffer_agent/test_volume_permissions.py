"""A file of the buffer volume the agent may not open (a volume copied with the wrong owner, a
mode changed by hand): the real ``durable-agent`` process says which, in one line, exit code 2,
and changes nothing on the volume. Before, each was a traceback (exit 1), and an unreadable
``wal/id`` was replaced by a new id, which threw away the marks kept for the log."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from durable_producer.buffer_agent.volume.format import LOG_ID_FILE
from durable_producer.buffer_agent.wal import WriteAheadLog
from support.volumes import as_file_modes_apply
from support.wal_helpers import SMALL, payload_for

pytestmark = pytest.mark.integration


def a_volume(root: Path) -> Path:
    volume = root / "volume"
    with WriteAheadLog.open(volume / "wal", SMALL) as wal:
        for index in range(3):
            wal.append("t", 0, payload_for(index, 100))
        wal.checkpoint(1)
    return volume


def drain(volume: Path) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "durable_producer.buffer_agent.cli", "drain",
               "--data-dir", str(volume), "--kafka-bootstrap", "127.0.0.1:1", "--timeout", "1"]
    return subprocess.run(as_file_modes_apply(command), capture_output=True, text=True,
                          timeout=60)  # fmt: skip


def contents(volume: Path) -> dict[str, bytes]:
    return {
        str(path.relative_to(volume)): path.read_bytes()  # as root: modes do not bind here
        for path in sorted(volume.rglob("*"))
        if path.is_file() and path.name != "LOCK"  # the pid of the last agent that held it
    }


@pytest.mark.parametrize("name", [LOG_ID_FILE, "checkpoint", "LOCK", "segment"])
def test_a_wal_file_the_agent_may_not_open_is_one_line_and_nothing_changes(
    tmp_path: Path, name: str
) -> None:
    volume = a_volume(tmp_path)
    wal = volume / "wal"
    target = next(wal.glob("*.seg")) if name == "segment" else wal / name
    target.chmod(0)
    before = contents(volume)

    result = drain(volume)

    lines = [line for line in result.stderr.splitlines() if line.startswith("durable-agent:")]
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    assert lines == [
        f"durable-agent: {target}: Permission denied; the agent (user id {os.getuid()}) cannot"
        " use this file of the buffer volume: fix its type or permissions (fsGroup), or move it"
        " aside"
    ], result.stderr
    assert contents(volume) == before  # the id kept above all: the marks of the log name it
