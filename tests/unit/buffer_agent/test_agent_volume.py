"""``durable-agent run`` on a volume too small for its WAL: one line with the numbers, exit 2,
nothing opened; a limit larger than the volume is lowered (the agent opens its WAL with it)."""

from __future__ import annotations

from pathlib import Path

import pytest

from durable_producer.buffer_agent import agent as agent_module
from durable_producer.buffer_agent.cli import main
from durable_producer.buffer_agent.volume.space import VolumeSpace
from support.agent_args import run_args

MIB = 1 << 20


def run(tmp_path: Path, *extra: str) -> int:
    return main(
        run_args(
            tmp_path / "volume", "--segment-bytes", str(MIB), "--max-batch-bytes", "65536", *extra
        )
    )


def test_a_volume_too_small_for_two_segments_exits_2_with_the_numbers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    tiny = VolumeSpace(free_bytes=3 * MIB, capacity_bytes=3 * MIB, segment_bytes=0)
    monkeypatch.setattr(agent_module, "measure_volume", lambda *_: tiny)
    assert run(tmp_path) == 2
    # the line every other exit code 2 is (it was a log record: "... ERROR durable_producer...")
    assert capsys.readouterr().err.splitlines() == [
        f"durable-agent: --data-dir {tmp_path / 'volume'}: the volume ({3 * MIB} bytes"
        f" writable) is too small for the WAL: {3 * MIB} usable bytes hold no WAL of 2 segments"
        f" of {MIB} bytes beside a reserve of 5373952 bytes: at least 7471104 usable bytes are"
        f" needed. Give the agent a larger volume, or lower --segment-bytes ({MIB}) or"
        " --max-batch-bytes (65536)"
    ]
    wal_dir = tmp_path / "volume" / "wal"  # created empty by the start-up checks
    assert not wal_dir.exists() or not any(wal_dir.iterdir()), "nothing was opened"


def test_the_configured_limit_is_lowered_to_what_the_volume_holds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    space = VolumeSpace(free_bytes=20 * MIB, capacity_bytes=64 * MIB, segment_bytes=0)
    monkeypatch.setattr(agent_module, "measure_volume", lambda *_: space)
    opened: list[int] = []

    class Stop(Exception):
        pass

    def open_wal(self: agent_module.BufferAgent, *_: object) -> None:
        opened.append(self.settings.wal.max_bytes)
        raise Stop

    monkeypatch.setattr(agent_module.BufferAgent, "_open_wal_and_forwarder", open_wal)
    with pytest.raises(Stop):
        run(tmp_path, "--max-buffer-bytes", str(1 << 30))
    assert opened == [14 * MIB]  # 20 MiB - (4 MiB + 1 MiB + 128 KiB), in whole segments
