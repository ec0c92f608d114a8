"""``make demo``'s job, short: the progress lines cannot contradict each other, and --keep
leaves a WAL that ``durable-agent wal inspect`` reads."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

PROGRESS = re.compile(
    r"stored by the agent +(\d+) +forwarded to Kafka +(\d+) +backlog +(\d+)"
    r" +in finished Spark writes +(\d+)"
)


def test_short_demo_with_a_plain_producer(tmp_path: Path) -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "durable_producer.demo",
            "--load",
            "producer",
            "--rate",
            "5000",
            "--duration",
            "12",
            "--outage-at",
            "3",
            "--outage",
            "5",
            "--keep",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "RESULT: OK" in done.stdout
    lines = PROGRESS.findall(done.stdout)
    assert lines, done.stdout
    for stored, forwarded, backlog, finished in ((int(v) for v in line) for line in lines):
        assert forwarded <= stored
        assert backlog == stored - forwarded
        assert finished <= stored
    kept = re.search(r"durable-agent wal inspect (\S+)", done.stdout)
    assert kept is not None, done.stdout
    wal = Path(kept.group(1))
    try:
        inspected = subprocess.run(
            [sys.executable, "-m", "durable_producer.buffer_agent.cli", "wal", "inspect", str(wal)],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert inspected.returncode == 0, inspected.stderr
        assert "checkpoint:" in inspected.stdout
    finally:
        import shutil

        shutil.rmtree(wal.parents[1], ignore_errors=True)
