"""Reading the small JSON state files beside the WAL without ever stopping the agent.

The agent keeps a few files in ``DATA/state/`` (producer ids, the metadata cache, the producer
state snapshot), each replaced whole by ``atomic_file.write_atomic``. Like the WAL itself,
they must never stop the agent: a file that cannot be read or parsed (a torn copy from an old
agent, a directory in its place, no permission, bytes flipped on disk) is moved aside to
``NAME.damaged`` (kept for diagnosis, and out of the way of the next write), named in one
WARNING line, and reported to the owner, which falls back to what it can rebuild and counts
it (``durable_agent_state_files_damaged``).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

DAMAGED_SUFFIX = ".damaged"


@dataclass(frozen=True, slots=True)
class StateDamage:
    """A state file that could not be used, and why."""

    path: Path
    reason: str

    def __str__(self) -> str:
        return f"{self.path}: {self.reason}"


@dataclass(frozen=True, slots=True)
class StateRead:
    """What reading a state file gave: its JSON document (None when absent or damaged)."""

    document: Any = None
    damage: StateDamage | None = None


def read_json_state(path: Path, *, fallback: str) -> StateRead:
    """Read ``path`` as JSON. Absent: nothing. Unreadable: moved aside and logged once, with
    ``fallback`` saying what the owner does instead (e.g. "rebuilding from the WAL")."""
    try:
        return StateRead(json.loads(path.read_bytes()))
    except FileNotFoundError:
        return StateRead()
    except (OSError, ValueError, RecursionError) as error:  # JSON, UTF-8 errors: ValueErrors
        # RecursionError: JSON nested deeper than the parser goes ("[" * 100000)
        return StateRead(damage=set_aside(path, _describe(error), fallback))


def set_aside(path: Path, reason: str, fallback: str) -> StateDamage:
    """Move a damaged state file (or directory) to ``NAME.damaged`` and say so once.

    Also for a file that parses but does not hold what its owner expects."""
    aside = path.with_name(path.name + DAMAGED_SUFFIX)
    moved = ""
    try:
        if aside.is_dir() and not aside.is_symlink():
            shutil.rmtree(aside)  # an older damaged copy
        elif path.is_dir() and aside.exists():
            aside.unlink()
        os.replace(path, aside)
        moved = f"; moved aside to {aside.name}"
    except OSError as error:
        moved = f"; could not move it aside ({_describe(error)})"
    log.warning("state file %s is unusable (%s)%s; %s", path, reason, moved, fallback)
    return StateDamage(path, reason)


def _describe(error: BaseException) -> str:
    if isinstance(error, OSError) and error.strerror:
        return error.strerror
    return str(error) or type(error).__name__
