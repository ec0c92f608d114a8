"""Re-sending dead letters once their cause is fixed (``durable-agent dead-letters resend``).

Each selected letter's batch goes to its partition as a batch again, as the forwarder sends
it (its own producer id, the client's records untouched), and a success is marked in the
store (``resent.jsonl``) so the letter is no longer listed as pending. A letter of an earlier
agent version holds one record: it is sent as a batch of that record; one of several batches
(an older agent's frame) that Kafka refused part-way is marked taken in part, and the next
resend sends only the rest.
"""

from __future__ import annotations

import asyncio
import struct
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from durable_producer.buffer_agent.forward.dead_letter import (
    DeadLetter,
    DeadLetterStore,
    read_dead_letters,
)
from durable_producer.buffer_agent.forward.failure_policy import NOT_APPENDED, error_name
from durable_producer.buffer_agent.kafka import batch_stamp
from durable_producer.buffer_agent.kafka.cluster_client import (
    NO_LEADER,
    ClusterClient,
    KafkaRequestFailed,
)
from durable_producer.buffer_agent.kafka.produce_wire import (
    ANSWER_GRACE_S,
    produce,
    produce_version,
)
from durable_producer.buffer_agent.kafka.record_batch import InvalidRecordBatch, iter_batches
from durable_producer.buffer_agent.kafka.varint import encode_uvarint


@dataclass(slots=True)
class ResendSummary:
    """Letters by id, each letter once (two letters can share an id: a WAL made again
    numbers from 0); ``failed`` and ``skipped`` with the reason."""

    resent: list[str] = field(default_factory=list)
    failed: list[tuple[str, str]] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)


def resend_dead_letters(
    directory: Path,
    client_config: Mapping[str, Any],
    *,
    ids: Iterable[str] | None = None,
    timeout: float = 60.0,
) -> ResendSummary:
    """Send the selected (default: all pending) dead letters again, to their partition.

    Successes are marked re-sent; failures keep their entry and are reported with the new
    reason."""
    store = DeadLetterStore(Path(directory))
    wanted = None if ids is None else set(ids)
    reading = read_dead_letters(directory)
    letters = [letter for letter in reading.letters if wanted is None or letter.id in wanted]
    summary = ResendSummary()
    for line in reading.unreadable if wanted is None else ():  # asked for all: not all read
        summary.failed.append((line, "holds no dead letter (damaged): remove it once handled"))
    if wanted is not None:
        for missing in sorted(wanted - {letter.id for letter in letters}):
            summary.skipped.append((missing, "no pending dead letter with this id"))
    if letters:
        asyncio.run(_resend(store, letters, client_config, timeout, summary))
    return summary


async def _resend(
    store: DeadLetterStore,
    letters: list[DeadLetter],
    client_config: Mapping[str, Any],
    timeout: float,
    summary: ResendSummary,
) -> None:
    client = ClusterClient.for_config(client_config, timeout_s=min(timeout, 10.0))
    reached = 0
    partly = ""  # what of the letter being sent Kafka took, when the run ends there
    try:
        await client.refresh({letter.topic for letter in letters})
        producer_id, epoch = await client.init_producer_id()
        sequences: dict[tuple[str, int], int] = {}
        # Partitions whose last send may be in Kafka: a later letter, sent under its
        # sequence, would be taken for its copy (answered NONE, never stored).
        stopped: dict[tuple[str, int], str] = {}
        for reached, letter in enumerate(letters):
            try:
                batches = _batches_of(letter)
            except InvalidRecordBatch as error:
                summary.skipped.append((letter.id, f"not a record batch: {error}"))
                continue
            except (ValueError, OverflowError, struct.error) as error:  # a hand-edited old letter
                summary.skipped.append((letter.id, f"its record cannot be encoded: {error}"))
                continue
            if not batches:  # a hand-edited line: nothing to send, nothing to mark
                summary.skipped.append((letter.id, "holds no record batch"))
                continue
            already = letter.taken_batches  # in Kafka since a resend taken in part
            if already >= len(batches):  # a mark no resend writes (a hand edit)
                summary.failed.append((letter.id, _marked_beyond(already, len(batches))))
                continue
            key = (letter.topic, letter.partition)
            if key in stopped:
                summary.failed.append((letter.id, stopped[key]))
                continue
            leader = client.leaders.get(key, NO_LEADER)
            if leader == NO_LEADER:
                code = client.topic_errors.get(letter.topic)
                summary.failed.append(
                    (letter.id, error_name(code) if code else "the partition has no leader")
                )
                continue
            code = taken = 0
            for batch, records in batches[already:]:
                sequence = sequences.get(key, 0)
                try:
                    code = await _send_one(
                        client,
                        leader,
                        key,
                        batch_stamp.stamp(batch, producer_id, epoch, sequence),
                        timeout,
                    )
                except BaseException:  # the batches Kafka took stay marked (and said)
                    if taken:
                        partly = _mark_taken(store, letter, already + taken, len(batches))
                    raise
                if code:
                    break
                sequences[key] = sequence + records
                taken += 1
            if not code:
                try:
                    store.mark_resent(letter)
                except OSError as error:  # in Kafka, but still listed: say so, and stop
                    summary.failed.append((letter.id, _unmarked(error)))
                    why = f"not sent: the re-sent mark of letter {letter.id} could not be written"
                    summary.failed += [(later.id, why) for later in letters[reached + 1 :]]
                    return
                summary.resent.append(letter.id)
                continue
            why = _mark_taken(store, letter, already + taken, len(batches)) if taken else ""
            summary.failed.append((letter.id, error_name(code) + why))
            if code not in NOT_APPENDED:
                stopped[key] = (
                    f"not sent: letter {letter.id} before it may be in Kafka"
                    f" ({error_name(code)}); resend both once it is answered"
                )
    except (OSError, ValueError, KafkaRequestFailed) as error:  # ValueError: no Produce version
        if isinstance(error, TimeoutError):
            why = f"no answer from Kafka within {timeout + ANSWER_GRACE_S:g} s"
        elif isinstance(error, OSError):
            why = f"Kafka unreachable: {error or type(error).__name__}"
        else:
            why = str(error)
        for letter in letters[reached:]:  # the one being sent and those after it
            summary.failed.append((letter.id, why + partly))
            partly = ""
    finally:
        client.close()


async def _send_one(
    client: ClusterClient,
    leader: int,
    key: tuple[str, int],
    parts: list[bytes | memoryview],
    timeout: float,
) -> int:
    """Kafka's answer: 0 (taken), or the error code (-1: no answer for the partition)."""
    connection = await client.connection(leader)
    topics = [(key[0], [(key[1], parts)])]
    answers, _ = await produce(connection, produce_version(connection), topics, timeout)
    return answers[0].error_code if answers else -1


def _mark_taken(store: DeadLetterStore, letter: DeadLetter, taken: int, batches: int) -> str:
    """Kafka took the first ``taken`` of a letter's ``batches`` before it refused one: marked,
    so that a resend sends the rest; what the summary says of it."""
    try:
        store.mark_taken(letter, taken)
    except OSError as error:
        return (
            f"; Kafka took its first {taken} of {batches} batches, which a resend of it sends"
            f" again (stored twice): the mark could not be written ({error.strerror or error})"
        )
    return f"; Kafka took its first {taken} of {batches} batches: a resend sends the rest"


def _marked_beyond(taken: int, batches: int) -> str:
    return (
        f"its taken mark names {taken} of its {batches} batches, which no resend writes (a hand"
        " edit?): check what Kafka holds, then remove the mark or the letter"
    )


def _unmarked(error: OSError) -> str:
    return (
        f"sent to Kafka, but its re-sent mark could not be written ({error.strerror or error}):"
        " it is still listed; leave it out of the next resend (name the others), or it is"
        " stored twice"
    )


def _batches_of(letter: DeadLetter) -> list[tuple[bytes | memoryview, int]]:
    """The letter's batches and their record counts."""
    if letter.payload is not None:
        return [
            (view, header.record_count)
            for header, view in iter_batches(letter.payload, check_crc=False)
        ]
    return [(_one_record_batch(letter), 1)]


def _one_record_batch(letter: DeadLetter) -> bytes:
    """A v2 batch of the one record an earlier agent's letter holds (CRC stamped on send)."""
    timestamp = letter.timestamp_ms if letter.timestamp_ms is not None else -1
    body = b"\x00" + _varint(0) + _varint(0)  # attributes, timestamp and offset deltas
    for field_bytes in (letter.key, letter.value):
        body += _varint(-1) if field_bytes is None else _varint(len(field_bytes)) + field_bytes
    body += _varint(len(letter.headers))
    for name, value in letter.headers:
        encoded = name.encode()
        body += _varint(len(encoded)) + encoded
        body += _varint(-1) if value is None else _varint(len(value)) + value
    record = _varint(len(body)) + body
    header = struct.pack(
        ">qiibIhiqqqhii", 0, 49 + len(record), -1, 2, 0, 0, 0, timestamp, timestamp, -1, -1, -1, 1
    )
    return header + record


def _varint(value: int) -> bytes:
    return encode_uvarint((value << 1) ^ (value >> 63))  # zigzag, as a record's fields are
