"""The log's id: a random name given to one WAL when it is first opened, kept in ``wal/id``.

Offsets alone do not tell one log from another: a WAL directory removed and made again while
``state/`` was kept starts again at offset 0, and a mark such as the forwarder's "frames below
500 are in Kafka" would then pass that log's first frames unsent. What is kept beside the log
names the id it was written for, and is used only with the same id (``forward/identity.py``,
``ingest/producer_state.py``). Format in ``volume/format.py``.

The file is made with an atomic replace when the log is opened without one. A log that held
frames without an id was written by an agent before ids: its id is marked *adopted* in the
file, and marks naming no id (that agent's) speak of it, on every later open too (a kill
before the marks are rewritten, a downgrade and back). A damaged file is replaced by a new id,
not adopted; one that cannot be read (no permission, an I/O error) stops the open. Where the
file cannot be made (a full disk), the id is this run's only and not adopted: the marks kept
for the log are then not used (possible duplicates, never a loss).
"""

from __future__ import annotations

import logging
import re
import secrets
from dataclasses import dataclass
from pathlib import Path

from durable_producer.buffer_agent.volume.atomic_file import write_atomic
from durable_producer.buffer_agent.volume.format import LOG_ID_ADOPTED, LOG_ID_FILE

log = logging.getLogger(__name__)

_VALID = re.compile(rb"([0-9a-f]{32})(\n" + re.escape(LOG_ID_ADOPTED) + rb")?\n?")


@dataclass(frozen=True, slots=True)
class LogId:
    value: str
    """32 lowercase hex digits."""
    adopted: bool = False
    """Given to a log that already held frames: a log from an agent before ids, whose marks
    kept beside it name no id (an upgrade), and are the only ones that may."""

    def named_by(self, kept: str) -> bool:
        """Whether a mark kept outside the log, naming ``kept`` ("": written before ids),
        speaks of this log."""
        return kept == self.value if kept else self.adopted

    def other_than(self, kept: str) -> str:
        """Why a mark naming ``kept`` is not used, for its owner's warning."""
        other = kept or "none"
        return f"written for another WAL (id {other}; this one is {self.value}: recreated?)"


def read_log_id(directory: Path) -> LogId | None:
    """The id ``directory``'s log has; None when it has none or an unreadable one."""
    try:
        found = _VALID.fullmatch((directory / LOG_ID_FILE).read_bytes())
    except OSError:
        return None
    return None if found is None else LogId(found[1].decode(), found[2] is not None)


def open_log_id(directory: Path, *, holds_frames: bool, had_entry: bool) -> LogId:
    """The id of the log in ``directory``, made if it has none. ``holds_frames``: the log
    has (or had) frames, so one without an id was written by an agent before ids;
    ``had_entry``: something had the id's name before recovery (which moves a directory
    there to ``quarantine/``): then it is no log from before ids."""
    path = directory / LOG_ID_FILE
    if path.is_file():
        try:
            found = _VALID.fullmatch(path.read_bytes())
        except FileNotFoundError:  # gone meanwhile
            found = None
        # Any other error (no permission, an I/O error) is raised: an id that is there but
        # cannot be read is not replaced (the marks kept for it would be thrown away).
        if found is not None:
            return LogId(found[1].decode(), found[2] is not None)
    adopt = holds_frames and not had_entry
    if had_entry:
        log.warning("%s held no readable log id: a new id for this log", path)
    value = secrets.token_hex(16)
    try:
        write_atomic(path, f"{value}\n".encode() + (LOG_ID_ADOPTED + b"\n" if adopt else b""))
    except OSError as error:
        log.warning(
            "cannot write %s (%s): this run's log id is kept in memory only; the forwarder"
            " takes a new producer id (records sent again may be duplicates)",
            path,
            error.strerror or error,
        )
        return LogId(value)
    return LogId(value, adopt)
