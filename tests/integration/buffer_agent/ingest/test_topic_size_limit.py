"""A batch larger than its topic's ``max.message.bytes`` is refused at ingest, as Kafka would.

Through a real agent process and, as the control, straight to the same Apache Kafka broker,
with the same client settings: the answers must agree. Kafka compares the batch as sent
(compressed), so a record that fits only compressed is taken by both. Before the agent knew
the topic's limit it acknowledged the large batch, which Kafka then refused: a dead letter of
an acknowledged record.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from confluent_kafka import KafkaError, Message, Producer

from durable_producer.buffer_agent.forward.dead_letter import list_dead_letters
from durable_producer.local.agent_process import AgentProcess
from support.broker import KafkaBroker, consume_all
from support.kafka_fixtures import TopicFactory

pytestmark = pytest.mark.integration

LIMIT = 20_000


def _produce(bootstrap: str, topic: str, value: bytes, compression: str) -> str:
    """The delivery report of one record: "ok" or the error's name."""
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "enable.idempotence": True,
            "compression.type": compression,
            "message.timeout.ms": 20_000,
            "log_level": 2,
        }
    )
    outcome: list[str] = []

    def report(error: KafkaError | None, _message: Message) -> None:
        outcome.append("ok" if error is None else error.name())

    producer.produce(topic, value=value, key=b"k", partition=0, on_delivery=report)
    assert producer.flush(30) == 0
    return outcome[0]


def test_the_agent_answers_a_topics_size_limit_as_the_broker_does(
    kafka_broker: KafkaBroker, new_topic: TopicFactory, tmp_path: Path
) -> None:
    topic = new_topic(1, config={"max.message.bytes": str(LIMIT)})
    large = os.urandom(50_000)  # incompressible: too large either way
    compressible = bytes(200_000)  # fits only compressed
    with AgentProcess(tmp_path / "volume", kafka_broker.bootstrap) as agent:
        through_agent = {
            "large": _produce(agent.bootstrap, topic, large, "none"),
            "compressible": _produce(agent.bootstrap, topic, compressible, "gzip"),
        }
        assert agent.stop(timeout=60) == 0, agent.log_tail()
    direct = {
        "large": _produce(kafka_broker.bootstrap, topic, large, "none"),
        "compressible": _produce(kafka_broker.bootstrap, topic, compressible, "gzip"),
    }
    assert direct == {"large": "MSG_SIZE_TOO_LARGE", "compressible": "ok"}
    assert through_agent == direct
    values = [record.value for record in consume_all(kafka_broker.bootstrap, topic, idle=2)]
    assert values == [compressible, compressible]  # the agent's copy and the control's
    assert list_dead_letters(tmp_path / "volume" / "dead-letter") == []
