"""``durable-agent run`` on a real volume too small for its WAL (a 1 MiB tmpfs): the one
``durable-agent:`` line every other exit code 2 is, in either log format, not a log record."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from support.agent_args import run_args
from support.volumes import mounted_tmpfs

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("log_format", ["text", "json"])
def test_a_volume_too_small_for_the_wal_is_one_line(tmp_path: Path, log_format: str) -> None:
    """It was an ERROR record (``... ERROR durable_producer.buffer_agent.agent: ...``, or a
    JSON object with --log-format json), exit 2."""
    with mounted_tmpfs(tmp_path / "small", "1m") as volume:
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "durable_producer.buffer_agent.cli",
                *run_args(volume, "--log-format", log_format),
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert done.returncode == 2
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith(
        f"durable-agent: --data-dir {volume}: the volume (1048576 bytes writable) is too small"
        " for the WAL: "
    ), lines[0]
    assert lines[0].endswith("or lower --segment-bytes (67108864) or --max-batch-bytes (1048588)")
