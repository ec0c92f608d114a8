"""Crash safety with real processes: SIGKILL a writer at random moments, then check the disk."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from durable_producer.buffer_agent.wal import WriteAheadLog
from support.wal_helpers import all_frames
from support.wal_writer import CRASH_CONFIG, id_of, payload_for_id

pytestmark = pytest.mark.integration

TESTS_DIR = Path(__file__).resolve().parents[3]
KILLS = 50


def run_writer_until_killed(directory: Path, run: int, rng: random.Random) -> list[str]:
    """Start a writer, let it append for a random while, SIGKILL it; return the acked ids."""
    env = dict(os.environ, PYTHONPATH=str(TESTS_DIR))
    process = subprocess.Popen(
        [sys.executable, "-m", "support.wal_writer", str(directory), "4", str(run)],
        stdout=subprocess.PIPE,
        env=env,
    )
    acked: list[str] = []
    ready = threading.Event()

    def collect() -> None:
        assert process.stdout is not None
        for line in process.stdout:
            text = line.decode().strip()
            if text == "ready":
                ready.set()
            elif text:
                acked.append(text)

    reader = threading.Thread(target=collect)
    reader.start()
    try:
        assert ready.wait(30), "writer did not start"
        time.sleep(rng.uniform(0.01, 0.25))
        process.send_signal(signal.SIGKILL)
    finally:
        process.kill()
        process.wait()
        reader.join()
    return acked


def test_every_acknowledged_append_survives_sigkill(tmp_path: Path) -> None:
    rng = random.Random(int(os.environ.get("CRASH_SEED", time.time_ns())))
    directory = tmp_path / "wal"
    all_acked: set[str] = set()
    for run in range(KILLS):
        acked = run_writer_until_killed(directory, run, rng)
        all_acked.update(acked)
        with WriteAheadLog.open(directory, CRASH_CONFIG) as wal:
            frames = all_frames(wal)
            present = set()
            for frame in frames:
                ident = id_of(frame.payload)
                assert frame.payload == payload_for_id(ident), f"frame {frame.offset} is damaged"
                present.add(ident)
            missing = all_acked - present
            assert not missing, f"run {run}: acknowledged appends lost: {sorted(missing)[:5]}"
            assert [f.offset for f in frames] == sorted(f.offset for f in frames)
            assert len(present) == len(frames), "an append must never be stored twice"
            next_offset = wal.append("crash", 0, payload_for_id(f"after-{run}"))
            assert next_offset == wal.next_offset - 1
            all_acked.add(f"after-{run}")
    assert len(all_acked) > KILLS * 5, "the writer must have made progress between kills"
