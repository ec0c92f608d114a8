"""Dead letters: batches Kafka refused for good, kept on the volume whole with the reason.

Nothing the agent acknowledged is ever dropped silently. A client batch that Kafka rejects
with a non-retriable error (too large for the topic, topic authorization, a topic that was
deleted) is appended here as it was stored, and the forwarder moves on. Operators list them
and re-send them once the cause is fixed (``durable-agent dead-letters list|resend``).
The area has a budget (``--dead-letter-max-bytes``): a letter that does not fit, or that
the disk has no room for, is not written (an append cut short is cut back), its frame stays
in the WAL and the forwarder retries (``forwarder.py``). Letters
written by the per-record forwarder of earlier versions (one record each) are still listed
and re-sent.

Layout of ``DATA/dead-letter/``: ``volume/format.py``. The letters of one pass, such as a
deleted topic's whole backlog, are appended together, one fsync each ``LETTERS_WRITE_BYTES``.
"""

from __future__ import annotations

import base64
import contextlib
import errno
import json
import os
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from durable_producer.buffer_agent.volume.atomic_file import fsync_directory

DEAD_LETTERS_FILE = "dead-letters.jsonl"
RESENT_FILE = "resent.jsonl"
LETTERS_WRITE_BYTES = 8 * 1024 * 1024
"""Letters appended (and fsynced) together at most, beyond the first: a deleted topic's
backlog of 100,000 batches was 100,000 fsyncs, the forwarding loop waiting on each."""


@dataclass(frozen=True, slots=True)
class RefusedBatch:
    """A batch to keep as a dead letter: where it was stored, why Kafka refused it."""

    wal_offset: int
    topic: str
    partition: int
    payload: bytes | memoryview
    reason: str
    error_code: str
    index: int = 0


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """One refused record, or a whole frame that could not be decoded (``payload`` set)."""

    id: str
    recorded_ms: int
    wal_offset: int
    topic: str
    partition: int
    record_index: int | None
    reason: str
    error_code: str
    timestamp_ms: int | None = None
    key: bytes | None = None
    value: bytes | None = None
    headers: tuple[tuple[str, bytes | None], ...] = ()
    payload: bytes | None = None
    resent: bool = False


def _b64(data: bytes | None) -> str | None:
    return None if data is None else base64.b64encode(data).decode("ascii")


def _unb64(text: str | None) -> bytes | None:
    return None if text is None else base64.b64decode(text)


class DeadLetterBudgetExhausted(OSError):
    """The dead-letter area is at its budget."""


class DeadLetterStore:
    """Appends dead letters (thread-safe), within ``max_bytes`` (None: no budget)."""

    def __init__(self, directory: Path, max_bytes: int | None = None) -> None:
        self.directory = Path(directory)
        self.max_bytes = max_bytes
        self._lock = threading.Lock()
        self._synced: set[str] = set()
        """Files whose directory entry this store has fsynced (once: a file created by an
        append that failed after it must not miss it)."""

    def size_bytes(self) -> int:
        try:
            return (self.directory / DEAD_LETTERS_FILE).stat().st_size
        except OSError:
            return 0

    def add_batches(self, batches: Iterable[RefusedBatch]) -> tuple[int, OSError | None]:
        """Store refused batches whole, in order: (how many were stored, the first ones; why
        the next was not, None if all were). The budget counts every byte of a letter's line;
        a letter that cannot fit is refused before its batch is encoded (the forwarder
        retries it); an append the disk has no room for is cut back whole."""
        budget = self.max_bytes
        held = self.size_bytes() if budget is not None else 0
        recorded_ms = int(time.time() * 1000)
        lines: list[bytes] = []
        pending = stored = 0
        refusal: OSError | None = None
        for refused in batches:
            letter = DeadLetter(
                id=f"{refused.wal_offset}-{refused.index}",
                recorded_ms=recorded_ms,
                wal_offset=refused.wal_offset,
                topic=refused.topic,
                partition=refused.partition,
                record_index=None,
                reason=refused.reason,
                error_code=refused.error_code,
                payload=b"",
            )
            size = len(refused.payload)
            length = len(_line(_to_json(letter))) + _b64_length(size)
            refusal = _over_budget(budget, held + pending, length, size)
            if refusal is not None:
                break  # and the budget is checked again under the lock
            if lines and pending + length > LETTERS_WRITE_BYTES:
                written, failure = self._write(lines, budget)
                stored += written
                if failure is not None:
                    return stored, failure
                held, pending, lines = held + pending, 0, []
            lines.append(_line(_to_json(replace(letter, payload=bytes(refused.payload)))))
            pending += length
        written, failure = self._write(lines, budget)
        return stored + written, failure if failure is not None else refusal

    def _write(self, lines: list[bytes], budget: int | None) -> tuple[int, OSError | None]:
        """Append ``lines`` in one write and one fsync; if the disk or the budget has no room
        for all, one at a time as far as they fit (as letters were written before they went
        together): (how many, why the next was not)."""
        try:
            if lines:
                self._append(DEAD_LETTERS_FILE, b"".join(lines), budget)
            return len(lines), None
        except OSError as failure:
            if len(lines) == 1:
                return 0, failure
        for count, line in enumerate(lines):
            try:
                self._append(DEAD_LETTERS_FILE, line, budget)
            except OSError as failure:
                return count, failure
        return len(lines), None

    def _append(self, name: str, line: bytes, budget: int | None = None) -> None:
        """Append ``line`` to ``name`` (fsynced), if the file stays within ``budget``."""
        with self._lock:
            self.directory.mkdir(parents=True, exist_ok=True)
            path = self.directory / name
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o644)
            try:
                if name not in self._synced:  # the file's entry, before any line of it
                    fsync_directory(self.directory)
                    self._synced.add(name)
                size = os.fstat(fd).st_size
                if size and os.pread(fd, 1, size - 1) != b"\n":
                    line = b"\n" + line  # close a line torn by a crash, keep this one whole
                if budget is not None and size + len(line) > budget:
                    raise _no_room(size, budget, len(line))
                _append_whole(fd, line, size)
            finally:
                os.close(fd)

    def mark_resent(self, letter: DeadLetter) -> None:
        """``letter`` was re-sent: named by its id and the time it was recorded (a WAL made
        again numbers from 0, and another batch can get the same id)."""
        mark = {"id": letter.id, "recorded_ms": letter.recorded_ms}
        self._append(RESENT_FILE, _line({**mark, "resent_ms": int(time.time() * 1000)}))


def _over_budget(
    budget: int | None, held: int, length: int, size: int
) -> DeadLetterBudgetExhausted | None:
    """Why a letter of ``length`` bytes (a ``size``-byte batch) does not fit beside ``held``
    bytes, or None: it does."""
    if budget is None or held + length <= budget:
        return None
    if length > budget:
        return DeadLetterBudgetExhausted(
            errno.ENOSPC,
            f"a letter of {length} bytes (a {size}-byte batch) is larger"
            f" than the whole dead-letter budget, {budget} bytes"
            " (--dead-letter-max-bytes): raise the budget above the largest batch"
            " clients send (4/3 of the topics' max.message.bytes)",
        )
    return _no_room(held, budget, length)


def _no_room(size: int, budget: int, length: int) -> DeadLetterBudgetExhausted:
    return DeadLetterBudgetExhausted(
        errno.ENOSPC,
        f"the dead-letter area holds {size} bytes, its budget is {budget}"
        f" (--dead-letter-max-bytes), a letter of {length} bytes does not fit; re-send or"
        " remove letters",
    )


def _b64_length(size: int) -> int:
    """The length of ``size`` bytes in base64 (padded): JSON adds no escapes to it."""
    return 4 * ((size + 2) // 3)


def _line(entry: Mapping[str, Any]) -> bytes:
    return (json.dumps(entry, separators=(",", ":")) + "\n").encode("utf-8")


def _append_whole(fd: int, line: bytes, size: int) -> None:
    """Append ``line`` and fsync, or cut the file back to ``size`` and raise ``OSError``: a
    full disk (ENOSPC part way through) must not leave half a letter that counts as written.
    The caller keeps the record in the WAL and tries again later."""
    try:
        view = memoryview(line)
        while view:
            written = os.write(fd, view)
            if written == 0:
                raise OSError(errno.ENOSPC, "no progress appending a dead letter")
            view = view[written:]
        os.fsync(fd)
    except OSError:
        with contextlib.suppress(OSError):
            os.ftruncate(fd, size)
        raise


def _to_json(letter: DeadLetter) -> dict[str, Any]:
    return {
        "id": letter.id,
        "recorded_ms": letter.recorded_ms,
        "wal_offset": letter.wal_offset,
        "topic": letter.topic,
        "partition": letter.partition,
        "record_index": letter.record_index,
        "reason": letter.reason,
        "error_code": letter.error_code,
        "timestamp_ms": letter.timestamp_ms,
        "key": _b64(letter.key),
        "value": _b64(letter.value),
        "headers": [[name, _b64(value)] for name, value in letter.headers],
        "payload": _b64(letter.payload),
    }


def _from_json(entry: Mapping[str, Any], resent: bool) -> DeadLetter:
    return DeadLetter(
        id=entry["id"],
        recorded_ms=entry["recorded_ms"],
        wal_offset=entry["wal_offset"],
        topic=entry["topic"],
        partition=entry["partition"],
        record_index=entry["record_index"],
        reason=entry["reason"],
        error_code=entry["error_code"],
        timestamp_ms=entry["timestamp_ms"],
        key=_unb64(entry["key"]),
        value=_unb64(entry["value"]),
        headers=tuple((name, _unb64(value)) for name, value in entry["headers"]),
        payload=_unb64(entry["payload"]),
        resent=resent,
    )


def _read_lines(path: Path) -> list[dict[str, Any]]:
    """Complete JSON lines of ``path``; a torn last line (crash mid-append) is skipped."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return []
    entries = []
    for line in data.split(b"\n"):
        if not line.strip():
            continue
        with contextlib.suppress(ValueError):
            entries.append(json.loads(line))
    return entries


def list_dead_letters(directory: Path, *, include_resent: bool = False) -> list[DeadLetter]:
    """Dead letters in the order they were recorded; re-sent ones only if asked for.

    A letter of the same batch as an earlier one (its id, place and bytes) is left out: the
    agent killed after a letter was stored and before its volume said so letters the batch
    again when it is refused again, and re-sending both would store it twice in Kafka. A
    re-send mark names the letter's id and recording time: another batch of the same id (a
    WAL made again numbers from 0) stays pending."""
    directory = Path(directory)
    marks = _read_lines(directory / RESENT_FILE)
    resent = {(mark["id"], mark["recorded_ms"]) for mark in marks if "recorded_ms" in mark}
    resent_until: dict[str, int] = {}  # older agents' marks: every letter of the id before it
    for mark in marks:
        if "recorded_ms" not in mark:
            resent_until[mark["id"]] = max(resent_until.get(mark["id"], 0), mark["resent_ms"])
    letters = []
    seen: dict[str, list[DeadLetter]] = {}
    for entry in _read_lines(directory / DEAD_LETTERS_FILE):
        key = (entry["id"], entry["recorded_ms"])
        was_resent = key in resent or key[1] <= resent_until.get(key[0], -1)
        letter = _from_json(entry, was_resent)
        same_id = seen.setdefault(letter.id, [])
        if any(_same_batch(earlier, letter) for earlier in same_id):
            continue
        same_id.append(letter)
        if include_resent or not letter.resent:
            letters.append(letter)
    return letters


def _same_batch(one: DeadLetter, other: DeadLetter) -> bool:
    """Lettered twice (the reason and the time may differ, and only the first is marked
    re-sent; the batch does not)."""
    return replace(one, recorded_ms=0, reason="", error_code="", resent=False) == replace(
        other, recorded_ms=0, reason="", error_code="", resent=False
    )
