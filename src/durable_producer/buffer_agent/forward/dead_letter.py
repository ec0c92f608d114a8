"""Dead letters: batches Kafka refused for good, kept on the volume whole with the reason.

Nothing the agent acknowledged is ever dropped silently. A client batch that Kafka rejects
with a non-retriable error (too large for the topic, topic authorization, a topic that was
deleted) is appended here as it was stored, and the forwarder moves on. Operators list them
and re-send them once the cause is fixed (``durable-agent dead-letters list|resend``).
The area has a budget (``--dead-letter-max-bytes``): a letter that does not fit, or that
the disk has no room for, is not written (an append cut short is cut back), its frame stays
in the WAL and the forwarder retries (``forwarder.py``).

Layout of ``DATA/dead-letter/`` (letters of earlier versions included): ``volume/format.py``.
"""

from __future__ import annotations

import base64
import contextlib
import errno
import json
import logging
import os
import threading
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from durable_producer.buffer_agent.volume.atomic_file import fsync_directory

log = logging.getLogger(__name__)
DEAD_LETTERS_FILE = "dead-letters.jsonl"
RESENT_FILE = "resent.jsonl"
TAKEN_FILE = "taken.jsonl"
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
    taken_batches: int = 0
    """Of a letter of several batches (an older agent's frame): its first batches Kafka took
    in a resend that failed at a later one; a resend sends the rest."""


def _b64(data: bytes | None) -> str | None:
    return None if data is None else base64.b64encode(data).decode("ascii")


def _unb64(text: str | None) -> bytes | None:
    return None if text is None else base64.b64decode(_text(text), validate=True)


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
        self._recorded_ms = 0

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
        held = self._size_of_whole_lines() if budget is not None else 0
        with self._lock:  # a mark names a letter by id and time: one store's never repeat
            recorded_ms = max(int(time.time() * 1000), self._recorded_ms + 1)
            self._recorded_ms = recorded_ms
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
        for all, one at a time as far as they fit: (how many, why the next was not)."""
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

    def _size_of_whole_lines(self) -> int:
        """The letters' size once a torn tail is cut off (it held the budget, for good)."""
        with self._lock:
            try:
                fd = os.open(self.directory / DEAD_LETTERS_FILE, os.O_RDWR)
            except FileNotFoundError:
                return 0
            try:
                return _end_torn_tail(fd, os.fstat(fd).st_size)
            finally:
                os.close(fd)

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
                size = _end_torn_tail(fd, os.fstat(fd).st_size)
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

    def mark_taken(self, letter: DeadLetter, batches: int) -> None:
        """Kafka took the first ``batches`` of ``letter``'s and refused the next: a later
        resend sends the rest. In a file of its own, which agents before it do not read (each
        of them read any line of ``resent.jsonl`` as a re-sent mark, or as damage, or failed
        on it): they send the whole letter again, as they did."""
        mark = {"id": letter.id, "recorded_ms": letter.recorded_ms, "batches": batches}
        self._append(TAKEN_FILE, _line(mark))


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


def _end_torn_tail(fd: int, size: int) -> int:
    """The file's size once its last line ends in a newline. A last line a crash cut short
    (never fsynced whole: its batch stayed in the WAL and is lettered again) is cut off, so
    that a line before the end that cannot be read is damage (``read_dead_letters``); a
    whole line that lost its newline (a hand edit) gets it back."""
    end = size
    while end and os.pread(fd, 1, end - 1) != b"\n":
        start = max(0, end - 65536)
        newline = os.pread(fd, end - start, start).rfind(b"\n")
        end = start + newline + 1 if newline >= 0 else start
    if end == size:
        return size
    if _entry(os.pread(fd, size - end, end)) is not None:
        os.pwrite(fd, b"\n", size)  # fsynced with the line appended next
        return size + 1
    os.ftruncate(fd, end)
    return end


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


def _from_json(
    entry: Mapping[str, Any],
    resent: set[tuple[str, int]],
    resent_until: Mapping[str, int],
    taken: Mapping[tuple[str, int], int],
) -> DeadLetter:
    """The letter of one line; KeyError, TypeError or ValueError if it holds none."""
    letter_id, recorded_ms = _text(entry["id"]), _whole(entry["recorded_ms"])
    index, timestamp = entry["record_index"], entry["timestamp_ms"]
    return DeadLetter(
        id=letter_id,
        recorded_ms=recorded_ms,
        wal_offset=_whole(entry["wal_offset"]),
        topic=_text(entry["topic"]),
        partition=_whole(entry["partition"]),
        record_index=None if index is None else _whole(index),
        reason=_text(entry["reason"]),
        error_code=_text(entry["error_code"]),
        timestamp_ms=None if timestamp is None else _whole(timestamp),
        key=_unb64(entry["key"]),
        value=_unb64(entry["value"]),
        headers=tuple((_text(name), _unb64(value)) for name, value in entry["headers"]),
        payload=_unb64(entry["payload"]),
        resent=(letter_id, recorded_ms) in resent
        or recorded_ms <= resent_until.get(letter_id, -1),
        taken_batches=taken.get((letter_id, recorded_ms), 0),
    )


def _text(value: object) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{value!r} is not text")
    return value


def _whole(value: object) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"{value!r} is not a whole number")
    return value


def _read_lines(path: Path) -> Iterator[tuple[int, dict[str, Any] | None]]:
    """The JSON objects of ``path`` by line number, None for a line that holds none. Lines a
    crash cut short are skipped: a last line without its newline that is not whole, and
    ``_torn`` ones."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return
    lines = data.split(b"\n")
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        entry = _entry(line)
        if entry is not None or not (number == len(lines) or _torn(line)):
            yield number, entry
        else:
            log.info("%s line %d: a line a crash cut short, skipped", path, number)


def _entry(line: bytes) -> dict[str, Any] | None:
    try:
        entry = json.loads(line)
    except (ValueError, RecursionError):
        return None
    return entry if isinstance(entry, dict) else None


def _torn(line: bytes) -> bool:
    """A line a crash cut short: the start of one the agent writes (they end in ``}``; older
    agents wrote on after one, ``volume/format.py``), or one with zeros of an append never
    fsynced (a power loss; the agent writes no NUL). Other bytes are damage."""
    if line.startswith(b"\x00"):
        return True
    return line.startswith(b'{"id":') and (b"\x00" in line or not line.rstrip().endswith(b"}"))


def list_dead_letters(directory: Path, *, include_resent: bool = False) -> list[DeadLetter]:
    """Dead letters in the order they were recorded; re-sent ones only if asked for."""
    return read_dead_letters(directory, include_resent=include_resent).letters


@dataclass(frozen=True, slots=True)
class DeadLetterReading:
    letters: list[DeadLetter]
    unreadable: list[str]
    """Lines that hold no letter or mark (damage), as "<file> line <n>": nothing may treat
    the area as empty while there are any (a drain, a shutdown record)."""


def unreadable_note(unreadable: list[str]) -> str:
    """" and N damaged lines (...)" for a message about the area, or ""."""
    if not unreadable:
        return ""
    shown = ", ".join(unreadable[:3]) + (", ..." if len(unreadable) > 3 else "")
    return (
        f" and {len(unreadable)} line(s) that hold no letter ({shown}: damaged; read them,"
        " and remove them once handled, the agent stopped)"
    )


def read_dead_letters(directory: Path, *, include_resent: bool = False) -> DeadLetterReading:
    """Dead letters in the order they were recorded; re-sent ones only if asked for; and the
    lines that could not be read.

    A letter of the same batch as an earlier one (its id, place and bytes) is left out: the
    agent killed after a letter was stored and before its volume said so letters the batch
    again when it is refused again, and re-sending both would store it twice in Kafka. A
    re-send mark names the letter's id and recording time: another batch of the same id (a
    WAL made again numbers from 0) stays pending."""
    directory = Path(directory)
    unreadable = []
    resent: set[tuple[str, int]] = set()
    resent_until: dict[str, int] = {}  # older agents' marks: every letter of the id before it
    for number, mark in _read_lines(directory / RESENT_FILE):
        try:
            if mark is None:
                raise ValueError
            letter_id = _text(mark["id"])
            if "recorded_ms" in mark:
                resent.add((letter_id, _whole(mark["recorded_ms"])))
            else:
                until = _whole(mark["resent_ms"])
                resent_until[letter_id] = max(resent_until.get(letter_id, 0), until)
        except (KeyError, TypeError, ValueError):
            unreadable.append(f"{RESENT_FILE} line {number}")
    taken: dict[tuple[str, int], int] = {}  # a letter's first batches Kafka took (mark_taken)
    for number, mark in _read_lines(directory / TAKEN_FILE):
        try:
            if mark is None:
                raise ValueError
            key = (_text(mark["id"]), _whole(mark["recorded_ms"]))
            batches = _whole(mark["batches"])
            if batches < 1:
                raise ValueError
            taken[key] = max(taken.get(key, 0), batches)
        except (KeyError, TypeError, ValueError):
            unreadable.append(f"{TAKEN_FILE} line {number}")
    letters = []
    seen: dict[str, list[DeadLetter]] = {}
    for number, entry in _read_lines(directory / DEAD_LETTERS_FILE):
        try:
            if entry is None:
                raise ValueError
            letter = _from_json(entry, resent, resent_until, taken)
        except (KeyError, TypeError, ValueError):  # binascii.Error is a ValueError
            unreadable.append(f"{DEAD_LETTERS_FILE} line {number}")
            continue
        same_id = seen.setdefault(letter.id, [])
        if any(_same_batch(earlier, letter) for earlier in same_id):
            continue
        same_id.append(letter)
        if include_resent or not letter.resent:
            letters.append(letter)
    return DeadLetterReading(letters, unreadable)


def _same_batch(one: DeadLetter, other: DeadLetter) -> bool:
    """Lettered twice (the reason and the time may differ, and only the first is marked
    re-sent; the batch does not)."""
    return _without_marks(one) == _without_marks(other)


def _without_marks(letter: DeadLetter) -> DeadLetter:
    return replace(
        letter, recorded_ms=0, reason="", error_code="", resent=False, taken_batches=0
    )
