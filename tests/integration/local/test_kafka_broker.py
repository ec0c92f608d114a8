"""The single-node Apache Kafka of the demo and most tests: what it enforces that the earlier
stand-in did not, and that it survives kill -9 and a restart on its own data."""

from __future__ import annotations

import time
import uuid

import pytest
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition

from support.broker import KafkaBroker, ProxiedBroker, consume_all
from support.kafka_clients import produce_values
from support.kafka_fixtures import TopicFactory
from support.waiting import wait_for

pytestmark = pytest.mark.integration

ACKS_ALL = {"acks": "all", "enable.idempotence": True, "linger.ms": 5}


def test_the_broker_logs_through_log4j2(kafka_broker: KafkaBroker) -> None:
    log = kafka_broker.log_path.read_text(errors="replace")
    assert "Kafka Server started" in log
    assert "SLF4J: Failed to load class" not in log and "No SLF4J providers" not in log


def test_topics_are_not_created_on_request(
    kafka_broker: KafkaBroker, new_topic: TopicFactory
) -> None:
    missing = new_topic.name()
    producer = Producer({"bootstrap.servers": kafka_broker.bootstrap, "log_level": 2})
    found = producer.list_topics(missing, timeout=10).topics[missing]
    assert found.error is not None and found.error.code() == KafkaError.UNKNOWN_TOPIC_OR_PART
    time.sleep(1.0)
    assert missing not in producer.list_topics(timeout=10).topics


def test_a_topic_max_message_bytes_is_enforced(
    kafka_broker: KafkaBroker, new_topic: TopicFactory
) -> None:
    """The broker refuses a batch over the limit whole (batch-mates included: here each record
    goes alone); the client's own limit (1 MB) is not what refuses it."""
    topic = new_topic(config={"max.message.bytes": "2000"})
    small = produce_values(kafka_broker.bootstrap, topic, [b"s" * 100], ACKS_ALL)
    large = produce_values(kafka_broker.bootstrap, topic, [b"L" * 5000], ACKS_ALL)
    assert small.delivered == [b"s" * 100] and not small.errors
    assert large.errors == {"MSG_SIZE_TOO_LARGE": 1} and not large.delivered


def test_transactions_commit_and_abort_and_read_committed_filters(
    kafka_broker: KafkaBroker, new_topic: TopicFactory
) -> None:
    """Transaction state with replication factor 1 works on one node: aborted records are
    written to the log but a read_committed consumer skips them."""
    topic = new_topic()
    producer = Producer(
        {
            "bootstrap.servers": kafka_broker.bootstrap,
            "transactional.id": f"bed-{uuid.uuid4()}",
            "log_level": 2,
        }
    )
    producer.init_transactions(30)
    for value, commit in ((b"committed-1", True), (b"aborted", False), (b"committed-2", True)):
        producer.begin_transaction()
        producer.produce(topic, value)
        producer.flush(10)
        if commit:
            producer.commit_transaction(30)
        else:
            producer.abort_transaction(30)

    assert read(kafka_broker.bootstrap, topic, "read_committed", 2) == [
        b"committed-1",
        b"committed-2",
    ]
    assert read(kafka_broker.bootstrap, topic, "read_uncommitted", 3) == [
        b"committed-1",
        b"aborted",
        b"committed-2",
    ]


def read(bootstrap: str, topic: str, isolation: str, count: int) -> list[bytes]:
    """The first ``count`` values of partition 0 (or fewer after 20 s), at ``isolation``."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"bed-{uuid.uuid4()}",
            "isolation.level": isolation,
            "enable.auto.commit": False,
            "log_level": 2,
        }
    )
    values: list[bytes] = []
    try:
        consumer.assign([TopicPartition(topic, 0, 0)])
        deadline = time.monotonic() + 20
        while len(values) < count and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is not None and message.error() is None:
                values.append(message.value() or b"")
        time.sleep(0.5)  # nothing more comes
        message = consumer.poll(0.5)
        if message is not None and message.error() is None:
            values.append(message.value() or b"")
    finally:
        consumer.close()
    return values


def test_acknowledged_records_survive_kill_9_and_a_restart_on_the_same_data() -> None:
    with KafkaBroker() as broker:
        from support.broker import create_topic

        create_topic(broker.bootstrap, "kept", 2)
        values = [b"%d" % index for index in range(2000)]
        first = produce_values(broker.bootstrap, "kept", values, ACKS_ALL)
        assert len(first.delivered) == 2000 and not first.errors
        port, process = broker.client_port, broker.process
        broker.kill()
        assert process is not None and process.returncode == -9
        broker.start()
        assert broker.client_port == port
        consumed = consume_all(broker.bootstrap, "kept", expected=2000)
    assert sorted(record.value for record in consumed) == sorted(values)


def test_the_proxied_broker_is_reached_only_through_its_proxy(
    proxied_broker: ProxiedBroker,
) -> None:
    from support.broker import create_topic

    create_topic(proxied_broker.bootstrap, "through", 1)
    metadata = Producer({"bootstrap.servers": proxied_broker.bootstrap}).list_topics(timeout=10)
    assert [f"{b.host}:{b.port}" for b in metadata.brokers.values()] == [proxied_broker.bootstrap]

    proxied_broker.proxy.cut()
    cut = produce_values(
        proxied_broker.bootstrap,
        "through",
        [b"during the cut"],
        {**ACKS_ALL, "message.timeout.ms": 3000},
        flush_timeout=10,
    )
    assert cut.errors == {"_MSG_TIMED_OUT": 1}
    proxied_broker.proxy.restore()
    after = produce_values(proxied_broker.bootstrap, "through", [b"after"], ACKS_ALL)
    assert after.delivered == [b"after"]
    wait_for(
        lambda: [r.value for r in consume_all(proxied_broker.direct_address, "through")]
        == [b"after"],
        timeout=20,
        what="only the record sent after the cut",
    )
