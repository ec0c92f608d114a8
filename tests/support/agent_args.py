"""The command line of a ``durable-agent run`` that needs no Kafka and no fixed port."""

from __future__ import annotations

from pathlib import Path

UNREACHABLE_KAFKA = "127.0.0.1:1"
"""No broker listens there: the agent starts, accepts and buffers all the same."""


def run_args(data_dir: Path, *flags: str) -> list[str]:
    """``run`` on ``data_dir`` (created by the agent if missing), Kafka unreachable, both
    listeners on ports the kernel picks, then ``flags``."""
    return [
        "run",
        "--data-dir",
        str(data_dir),
        "--kafka-bootstrap",
        UNREACHABLE_KAFKA,
        "--listen",
        "127.0.0.1:0",
        "--metrics-listen",
        "127.0.0.1:0",
        *flags,
    ]
