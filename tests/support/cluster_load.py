"""Producer load with checkable records, and the grade of what a consumer then reads.

Every record says who sent it and when: key ``CLIENT-INDEX``, a value and headers derived
from both, an explicit timestamp (the load's start plus the index in milliseconds: a real
broker deletes records older than the topic's ``retention.ms`` within minutes, so a fixed old
base timestamp looks like loss), and a partition chosen by the index, so a consumer can tell
per client whether each acknowledged record arrived with identical content, whether the
records of each partition kept the order their client produced them in, and how many copies
of each arrived (``grade``).
"""

from __future__ import annotations

import bisect
import threading
import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Message, Producer

from durable_producer.local.topics import ConsumedRecord


def record_key(client: str, index: int) -> bytes:
    return f"{client}-{index}".encode()


def record_value(client: str, index: int, size: int) -> bytes:
    seed = f"{client}:{index}:".encode()
    return (seed * (size // len(seed) + 1))[:size]


def record_headers(client: str, index: int) -> list[tuple[str, bytes]]:
    return [("client", client.encode()), ("index", str(index).encode())]


def record_timestamp(base_ms: int, index: int) -> int:
    return base_ms + index


@dataclass
class ProducerLoad:
    """One client producing ``rate`` records a second to ``topic`` on a background thread.

    Idempotent, ``acks=all``, records that never expire: what an application that must not
    lose data would configure. ``acked`` holds the indexes the endpoint acknowledged,
    ``ack_times`` when each acknowledgement arrived (monotonic clock).
    """

    name: str
    bootstrap: str
    topic: str
    partitions: int
    rate: int
    value_size: int = 200
    settings: dict[str, Any] = field(default_factory=dict)
    base_timestamp_ms: int = field(default_factory=lambda: int(time.time() * 1000))
    acked: set[int] = field(default_factory=set)
    ack_times: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    fatal: str | None = None
    """A fatal error that ended the client (it stops producing, as an application would
    have to make a new producer)."""
    sent: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _unflushed: int = 0

    def start(self) -> ProducerLoad:
        self._thread = threading.Thread(target=self._run, name=f"load-{self.name}", daemon=True)
        self._thread.start()
        return self

    def stop(self, flush_timeout: float = 120.0) -> int:
        """Stop producing and wait for every outstanding acknowledgement; returns how many
        records were still unacknowledged at the timeout."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(flush_timeout + 30)
        return self._unflushed

    def acked_since(self, moment: float) -> float | None:
        """The first acknowledgement at or after ``moment`` (monotonic), if any."""
        with self._lock:
            return next((t for t in self.ack_times if t >= moment), None)

    def _delivered(self, error: KafkaError | None, message: Message) -> None:
        with self._lock:
            if error is None:
                key = message.key()
                assert key is not None
                self.acked.add(int(key.rsplit(b"-", 1)[1]))
                self.ack_times.append(time.monotonic())
            else:
                self.errors.append(f"{error.name()}: {error.str()}")

    def _run(self) -> None:
        producer = Producer(
            {
                "bootstrap.servers": self.bootstrap,
                "enable.idempotence": True,
                "acks": "all",
                "linger.ms": 5,
                "message.timeout.ms": 0,
                "reconnect.backoff.ms": 50,
                "reconnect.backoff.max.ms": 1000,
                "log_level": 3,
                **self.settings,
            }
        )
        started = time.monotonic()
        index = 0
        while not self._stop.is_set():
            due = int(self.rate * (time.monotonic() - started))
            while index < due:
                try:
                    producer.produce(
                        self.topic,
                        key=record_key(self.name, index),
                        value=record_value(self.name, index, self.value_size),
                        headers=record_headers(self.name, index),
                        partition=index % self.partitions,
                        timestamp=record_timestamp(self.base_timestamp_ms, index),
                        on_delivery=self._delivered,
                    )
                except BufferError:
                    break
                except KafkaException as exception:  # refused at once: the caller is told
                    self.errors.append(str(exception.args[0] if exception.args else exception))
                index += 1
            self.sent = index
            try:
                producer.poll(0.01)
            except KafkaException as exception:
                self.fatal = str(exception.args[0] if exception.args else exception)
                self._unflushed = len(producer)
                return
        try:
            self._unflushed = producer.flush(120)
        except KafkaException as exception:
            self.fatal = str(exception.args[0] if exception.args else exception)
            self._unflushed = len(producer)


@dataclass(frozen=True)
class Grade:
    """What a consumer saw of some clients' records."""

    acknowledged: int
    delivered: int
    """Distinct acknowledged-or-not records found (each counted once)."""
    lost: list[str]
    """Acknowledged records not found (keys)."""
    damaged: list[str]
    unexpected: list[str]
    """Records nobody sent."""
    duplicates: int
    """Copies beyond the first."""
    order_violations: list[str]
    """(client, partition) whose first copies are not in produce order."""
    displaced: int
    """Records that must move for every client's partition to be in order (first copies)."""
    low_watermarks: dict[int, int]

    @property
    def clean(self) -> bool:
        return not (self.lost or self.damaged or self.unexpected or self.order_violations)

    def summary(self) -> str:
        return (
            f"acknowledged {self.acknowledged}, delivered {self.delivered}, lost {len(self.lost)},"
            f" duplicates {self.duplicates}, damaged {len(self.damaged)},"
            f" out of order {self.displaced} in {len(self.order_violations)} partitions"
        )


def grade(
    consumed: Iterable[ConsumedRecord],
    loads: Iterable[ProducerLoad],
    low_watermarks: dict[int, int] | None = None,
) -> Grade:
    loads = list(loads)
    by_name = {load.name: load for load in loads}
    copies: Counter[str] = Counter()
    damaged: list[str] = []
    unexpected: list[str] = []
    first_seen: dict[tuple[str, int], list[int]] = {}
    for record in consumed:
        key = (record.key or b"").decode(errors="replace")
        client, _, number = key.rpartition("-")
        load = by_name.get(client)
        if load is None or not number.isdigit() or int(number) >= load.sent:
            unexpected.append(key)
            continue
        index = int(number)
        copies[key] += 1
        if (
            record.value != record_value(client, index, load.value_size)
            or list(record.headers) != record_headers(client, index)
            or record.timestamp_ms != record_timestamp(load.base_timestamp_ms, index)
            or record.partition != index % load.partitions
        ):
            damaged.append(key)
        if copies[key] == 1:
            first_seen.setdefault((client, record.partition), []).append(index)
    acknowledged = {record_key(load.name, i).decode() for load in loads for i in load.acked}
    lost = sorted(acknowledged - copies.keys())
    violations = [
        f"{client}/{partition}"
        for (client, partition), indexes in first_seen.items()
        if indexes != sorted(indexes)
    ]
    return Grade(
        acknowledged=len(acknowledged),
        delivered=len(copies),
        lost=lost,
        damaged=damaged,
        unexpected=unexpected,
        duplicates=sum(copies.values()) - len(copies),
        order_violations=violations,
        displaced=sum(
            len(indexes) - _longest_increasing(indexes) for indexes in first_seen.values()
        ),
        low_watermarks=dict(low_watermarks or {}),
    )


def _longest_increasing(values: list[int]) -> int:
    """Length of the longest strictly increasing subsequence (patience sorting)."""
    tails: list[int] = []
    for value in values:
        position = bisect.bisect_left(tails, value)
        if position == len(tails):
            tails.append(value)
        else:
            tails[position] = value
    return len(tails)
