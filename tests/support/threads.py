"""The threads of this process that librdkafka started (it names them ``rdk:...``)."""

from __future__ import annotations

import os
from pathlib import Path


def librdkafka_threads() -> set[int]:
    """Thread ids of this process whose name starts with ``rdk:`` (Linux ``/proc``)."""
    found = set()
    for task in Path(f"/proc/{os.getpid()}/task").iterdir():
        try:
            name = (task / "comm").read_text()
        except OSError:
            continue  # the thread ended while we looked
        if name.startswith("rdk:"):
            found.add(int(task.name))
    return found
