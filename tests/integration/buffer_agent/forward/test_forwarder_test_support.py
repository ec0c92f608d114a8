"""The broker and fault-proxy fixtures behave as the forwarder tests rely on."""

from __future__ import annotations

import time
from collections import deque

import pytest
from confluent_kafka import KafkaError, Message, Producer

from support.broker import KafkaBroker, ProxiedBroker, consume_all, create_topic, suspended
from support.kafka_fixtures import TopicFactory

pytestmark = pytest.mark.integration


class _DeliveryWatch:
    """Delivery reports and librdkafka's idempotence and message debug lines, kept to say why
    a record was answered while the path was hung or the broker stopped (a CI run once saw
    ``flush()`` find nothing pending while the broker was SIGSTOPped; a count could not tell
    delivered from failed)."""

    def __init__(self) -> None:
        self.reports: list[tuple[bytes | None, KafkaError | None]] = []
        self.lines: deque[str] = deque(maxlen=60)

    def on_delivery(self, error: KafkaError | None, message: Message) -> None:
        self.reports.append((message.value(), error))

    def log(self, level: int, text: str, *args: object) -> None:
        self.lines.append(f"{time.monotonic():.3f} {text % args if args else text}")

    def answered(self, value: bytes) -> list[KafkaError | None]:
        return [error for answered, error in self.reports if answered == value]

    def held(self, value: bytes) -> bool:
        """Nothing reached the broker or came from it for ``value``: no report, or the client's
        own failure (a local error, below 0), which the test then produces again."""
        return all(error is not None and error.code() < 0 for error in self.answered(value))

    def explain(self) -> str:
        return f"reports {self.reports}; librdkafka:\n" + "\n".join(self.lines)


def _producer(bootstrap: str, watch: _DeliveryWatch | None = None) -> Producer:
    """An idempotent acks=all producer that never gives up on a record; with ``watch``, every
    delivery report and idempotence and message debug line kept there."""
    settings: dict[str, object] = {
        "bootstrap.servers": bootstrap,
        "enable.idempotence": True,
        "acks": "all",
        "message.timeout.ms": 0,
        "linger.ms": 5,
    }
    if watch is not None:
        settings |= {"debug": "eos,msg", "logger": watch, "on_delivery": watch.on_delivery}
    return Producer(settings)


def test_broker_round_trip_keeps_keys_headers_and_timestamps(
    kafka_broker: KafkaBroker, new_topic: TopicFactory
) -> None:
    topic = new_topic(3)
    producer = _producer(kafka_broker.bootstrap)
    for index in range(30):
        producer.produce(
            topic,
            value=b"value-%d" % index,
            key=None if index % 2 else b"",
            partition=index % 3,
            headers=[("h", b"x"), ("empty", None)],
            timestamp=1_700_000_000_123 + index,
        )
    assert producer.flush(10) == 0

    records = consume_all(kafka_broker.bootstrap, topic, expected=30)

    assert len(records) == 30
    by_value = {record.value: record for record in records}
    first = by_value[b"value-0"]
    assert first.key == b"" and first.partition == 0
    assert first.timestamp_ms == 1_700_000_000_123
    assert first.headers == (("h", b"x"), ("empty", None))
    assert by_value[b"value-1"].key is None


def test_broker_process_is_killed_on_exit() -> None:
    with KafkaBroker() as broker:
        process = broker.process
        assert process is not None and process.poll() is None
        assert (broker.data_dir / "meta.properties").is_file()
    assert process.poll() is not None
    assert not broker.work_dir.exists(), "its temporary data and log are deleted"


def test_cut_blocks_delivery_until_restore(proxied_broker: ProxiedBroker) -> None:
    create_topic(proxied_broker.bootstrap, "cut", partitions=1)
    watch = _DeliveryWatch()
    producer = _producer(proxied_broker.bootstrap, watch)
    producer.produce("cut", value=b"before")
    assert producer.flush(10) == 0
    assert watch.answered(b"before") == [None], watch.explain()

    proxied_broker.proxy.cut()
    producer.produce("cut", value=b"during")
    producer.flush(1.5)
    assert watch.held(b"during"), f"answered while the path was cut: {watch.explain()}"

    proxied_broker.proxy.restore()
    _delivered(producer, watch, "cut", b"during")
    values = [r.value for r in consume_all(proxied_broker.direct_address, "cut", expected=2)]
    assert values == [b"before", b"during"]


def test_hang_and_suspended_broker_hold_delivery(proxied_broker: ProxiedBroker) -> None:
    create_topic(proxied_broker.bootstrap, "hang", partitions=1)
    watch = _DeliveryWatch()
    producer = _producer(proxied_broker.bootstrap, watch)
    producer.produce("hang", value=b"warmup")
    assert producer.flush(10) == 0
    assert watch.answered(b"warmup") == [None], watch.explain()

    proxied_broker.proxy.hang()
    producer.produce("hang", value=b"held")
    producer.flush(1.0)
    assert watch.held(b"held"), f"answered through a hung path: {watch.explain()}"
    proxied_broker.proxy.restore()
    _delivered(producer, watch, "hang", b"held")

    assert proxied_broker.broker is not None
    with suspended(proxied_broker.broker):
        producer.produce("hang", value=b"stopped")
        started = time.monotonic()
        producer.flush(1.0)
        assert time.monotonic() - started >= 0.9, watch.explain()
        assert watch.held(b"stopped"), f"answered by a stopped broker: {watch.explain()}"
    _delivered(producer, watch, "hang", b"stopped")
    values = [r.value for r in consume_all(proxied_broker.direct_address, "hang", expected=3)]
    assert values == [b"warmup", b"held", b"stopped"]


def _delivered(producer: Producer, watch: _DeliveryWatch, topic: str, value: bytes) -> None:
    """Once the path is back, ``value`` is delivered: produced again if the client failed it
    on its own while the path was down (printed: librdkafka's doing, not the fixture's)."""
    if watch.answered(value):
        print(f"\n{value!r} failed by the client while held, produced again: {watch.explain()}")
        producer.produce(topic, value=value)
    assert producer.flush(30) == 0
    assert watch.answered(value)[-1] is None, watch.explain()
