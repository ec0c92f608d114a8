"""A confluent-kafka producer run to completion: what was delivered and which errors came back."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import KafkaError, Message, Producer


@dataclass
class Deliveries:
    delivered: list[bytes] = field(default_factory=list)
    errors: Counter[str] = field(default_factory=Counter)


def produce_values(
    bootstrap: str,
    topic: str,
    values: Iterable[bytes],
    settings: Mapping[str, Any] | None = None,
    *,
    partition: int | None = None,
    flush_timeout: float = 60.0,
) -> Deliveries:
    """Produce ``values`` (each its own key too) and flush; the delivery reports, by outcome."""
    producer = Producer({"bootstrap.servers": bootstrap, "log_level": 2, **(settings or {})})
    outcome = Deliveries()

    def report(error: KafkaError | None, message: Message) -> None:
        if error is None:
            outcome.delivered.append(message.value() or b"")
        else:
            outcome.errors[error.name()] += 1

    for value in values:
        extra = {} if partition is None else {"partition": partition}
        while True:
            try:
                producer.produce(topic, value, key=value, on_delivery=report, **extra)
                break
            except BufferError:
                producer.poll(0.05)
        producer.poll(0)
    remaining = producer.flush(flush_timeout)
    if remaining:
        outcome.errors["not flushed"] += remaining
    return outcome
