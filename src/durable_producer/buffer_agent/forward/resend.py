"""Re-sending dead letters once their cause is fixed (``durable-agent dead-letters resend``).

Each selected record is produced again to its partition, with its key, value, headers and
timestamp; a success is marked in the store (``resent.jsonl``) so the letter is no longer
listed as pending.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from durable_producer.buffer_agent.forward.dead_letter import DeadLetterStore, list_dead_letters


@dataclass(slots=True)
class ResendSummary:
    resent: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)


def resend_dead_letters(
    directory: Path,
    client_config: Mapping[str, str],
    *,
    ids: Iterable[str] | None = None,
    timeout: float = 60.0,
) -> ResendSummary:
    """Produce the selected (default: all pending) dead records again, to their partition.

    Successes are marked re-sent; failures keep their entry and are reported with the
    new reason. Undecodable frames cannot be re-sent and are reported as skipped.
    """
    from confluent_kafka import Producer  # imported on use: listing needs no Kafka client

    store = DeadLetterStore(Path(directory))
    wanted = None if ids is None else set(ids)
    letters = [
        letter for letter in list_dead_letters(directory) if wanted is None or letter.id in wanted
    ]
    summary = ResendSummary()
    if wanted is not None:
        for missing in sorted(wanted - {letter.id for letter in letters}):
            summary.skipped[missing] = "no pending dead letter with this id"
    config: dict[str, Any] = {
        **client_config,
        "acks": "all",
        "enable.idempotence": True,
        "message.timeout.ms": int(timeout * 1000),
    }
    producer = Producer(config)

    def report(letter_id: str) -> Callable[[Any, Any], None]:
        def on_delivery(error: Any, _message: Any) -> None:
            if error is None:
                store.mark_resent(letter_id)
                summary.resent.append(letter_id)
            else:
                summary.failed[letter_id] = f"{error.name()}: {error.str()}"

        return on_delivery

    for letter in letters:
        if letter.is_frame:
            summary.skipped[letter.id] = "an undecodable batch cannot be re-sent record by record"
            continue
        try:
            producer.produce(
                letter.topic,
                value=letter.value,
                key=letter.key,
                partition=letter.partition,
                headers=list(letter.headers) or None,
                timestamp=letter.timestamp_ms or 0,
                on_delivery=report(letter.id),
            )
        except Exception as error:  # BufferError, KafkaException: report, do not stop
            summary.failed[letter.id] = str(error)
        producer.poll(0)
    remaining = producer.flush(timeout)
    if remaining:
        pending = [
            letter.id
            for letter in letters
            if letter.id not in summary.resent and letter.id not in summary.skipped
        ]
        for letter_id in pending:
            summary.failed.setdefault(letter_id, f"not delivered within {timeout}s")
    return summary
