from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from durable_producer.buffer_agent.cli import main
from durable_producer.buffer_agent.forward.dead_letter import DeadLetterStore, list_dead_letters
from durable_producer.buffer_agent.wal import WriteAheadLog
from durable_producer.buffer_agent.wal.segment import list_segments
from support.batch_builder import SampleRecord, build_batch
from support.dead_letters import refused
from support.wal_helpers import SMALL, payload_for


def test_wal_inspect_reports_segments_checkpoint_and_quarantine(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    directory = tmp_path / "wal"
    with WriteAheadLog.open(directory, SMALL) as wal:
        for i in range(40):
            wal.append("t", 0, payload_for(i, 600))
        wal.checkpoint(25)
    assert main(["wal", "inspect", str(directory)]) == 0
    text = capsys.readouterr().out
    assert "checkpoint:    offset 25" in text
    assert "lock:          not held" in text
    for _, path in list_segments(directory):
        assert path.name in text

    _, newest = list_segments(directory)[-1]
    data = bytearray(newest.read_bytes())
    data[100] ^= 0xFF
    newest.write_bytes(bytes(data))
    assert main(["wal", "inspect", "--json", str(directory)]) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["checkpoint_offset"] == 25
    assert any(s["problems"] for s in report["segments"])

    WriteAheadLog.open(directory, SMALL).close()
    assert main(["wal", "inspect", str(directory)]) == 0
    assert "quarantined segments: 1" in capsys.readouterr().out


def test_wal_inspect_of_a_missing_directory_is_a_clear_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["wal", "inspect", str(tmp_path / "nope")]) == 2
    assert "is not a directory" in capsys.readouterr().err


def test_dead_letters_list_names_damaged_lines_in_one_line_and_exits_1(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A dead-letters file of garbage listed "no dead letters", exit 0."""
    letters = tmp_path / "dead-letter"
    letters.mkdir()
    (letters / "dead-letters.jsonl").write_bytes(b"\x8f garbage\n" * 3)
    assert main(["dead-letters", "list", "--data-dir", str(tmp_path)]) == 1
    captured = capsys.readouterr()
    assert captured.out == "no dead letters\n"
    [said] = captured.err.splitlines()
    assert "0 dead letter(s) and 3 line(s) that hold no letter" in said and "line 1" in said


def test_dead_letters_list_says_which_batches_of_a_letter_kafka_took(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A letter of several batches whose resend failed after its first: listed as such."""
    store = DeadLetterStore(tmp_path / "dead-letter")
    store.add_batches([refused(7, build_batch([SampleRecord(b"k", b"v", 1)]) * 3)])
    [letter] = list_dead_letters(tmp_path / "dead-letter")
    store.mark_taken(letter, 2)
    assert main(["dead-letters", "list", "--data-dir", str(tmp_path)]) == 0
    listed = capsys.readouterr().out.splitlines()[1]
    assert listed.startswith("7-0 ") and listed.endswith(
        "(its first 2 batches in Kafka: resend sends the rest)"
    )


@pytest.mark.parametrize(
    "argv",
    [
        ["dead-letters", "list", "--data-dir", "{missing}"],
        ["dead-letters", "list", "--data-dir", ""],
        ["dead-letters", "list", "--data-dir", "{tmp}", "--log-level", "LOUD"],
        ["wal", "inspect", "{tmp}", "--log-level", "5"],
    ],
)
def test_a_mistaken_read_only_command_says_so_in_one_line_with_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str]
) -> None:
    """A missing volume listed "no dead letters" (exit 0); a bad --log-level was a ValueError
    traceback."""
    given = [a.format(missing=tmp_path / "nope", tmp=tmp_path) for a in argv]
    try:
        code = main(given)
    except SystemExit as stopped:  # argparse's own refusal
        code = int(stopped.code or 0)
    assert code == 2
    assert "Traceback" not in capsys.readouterr().err


def test_wal_inspect_tells_a_checkpoint_never_written_from_a_damaged_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Kafka away since the agent started: the checkpoint file is there (made with the log,
    zeros) but was never written. That is no damage: inspect said CORRUPT."""
    directory = tmp_path / "wal"
    with WriteAheadLog.open(directory, SMALL) as wal:
        for i in range(5):
            wal.append("t", 0, payload_for(i, 600))
    assert main(["wal", "inspect", str(directory)]) == 0
    text = capsys.readouterr().out
    assert "checkpoint:    none yet (the agent replays from the oldest segment)" in text, text
    assert main(["wal", "inspect", "--json", str(directory)]) == 0
    assert json.loads(capsys.readouterr().out)["checkpoint_damaged"] is False

    checkpoint = directory / "checkpoint"
    checkpoint.write_bytes(b"\x01" * len(checkpoint.read_bytes()))
    assert main(["wal", "inspect", str(directory)]) == 1, "damage found: exit 1 (it was 0)"
    assert "checkpoint:    CORRUPT" in capsys.readouterr().out


def test_a_crash_in_compiled_code_prints_the_python_stack_of_the_agent(tmp_path: Path) -> None:
    """The agent's CLI enables faulthandler: a segfault (here a read of address 0, as a bug in
    a C module or a client library's thread would make) names where it happened."""
    script = (
        "import ctypes, sys\n"
        "from durable_producer.buffer_agent.cli import main\n"
        f"main(['wal', 'inspect', {str(tmp_path / 'missing')!r}])\n"
        "def crash_in_compiled_code():\n"
        "    ctypes.string_at(0)\n"
        "crash_in_compiled_code()\n"
    )
    environment = {k: v for k, v in os.environ.items() if k != "PYTHONFAULTHANDLER"}
    environment["PYTHONPATH"] = os.pathsep.join(sys.path)
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=environment,
        timeout=60,
    )
    assert done.returncode == -signal.SIGSEGV
    assert "Fatal Python error: Segmentation fault" in done.stderr
    assert "crash_in_compiled_code" in done.stderr


def test_a_resend_of_an_id_that_is_not_pending_is_no_success(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A mistyped id printed "skipped 1" and exit 0: nothing was re-sent."""
    (tmp_path / "dead-letter").mkdir()
    argv = ["dead-letters", "resend", "--data-dir", str(tmp_path), "--kafka-bootstrap", "k:1"]

    assert main([*argv, "7-O"]) == 1

    assert capsys.readouterr().out.splitlines() == [
        "re-sent 0, failed 0, skipped 1",
        "  7-O: no pending dead letter with this id",
    ]
