"""A topic the cluster does not have: the agent does what the cluster would do.

The broker here runs with ``auto.create.topics.enable=true`` (Kafka's own default): it creates
a topic when a Metadata request allows it and answers UNKNOWN_TOPIC_OR_PARTITION when the
request does not. The agent's own ``allow.auto.create.topics=false`` stands in for a cluster
that does not create topics.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import KafkaError, Message, Producer

from durable_producer.buffer_agent.kafka.cluster_metadata import ClusterMetadataSource, TopicFacts
from durable_producer.local.agent_process import AgentProcess
from durable_producer.local.process import poll_until
from support.broker import KafkaBroker, consume_all, create_topic, free_port

pytestmark = pytest.mark.integration

NO_AUTO_CREATE = {"allow.auto.create.topics": "false"}
# Kafka 4.1 answers the Metadata request that makes it create a topic with
# UNKNOWN_TOPIC_OR_PARTITION (not LEADER_NOT_AVAILABLE), and creates the topic (tansu hid this):
# cluster_metadata asks again for creation_wait_s before it calls the topic missing.


@pytest.fixture(scope="module")
def broker() -> Iterator[KafkaBroker]:
    with KafkaBroker(auto_create_topics=True) as running:
        yield running


def test_source_reports_existing_created_and_missing_topics(broker: KafkaBroker) -> None:
    create_topic(broker.bootstrap, "existing", 3)
    create_topic(broker.bootstrap, "small", 1, config={"max.message.bytes": "20000"})
    creating = ClusterMetadataSource({"bootstrap.servers": broker.bootstrap})
    facts = creating(["existing", "small", "made-on-request"])
    assert facts["existing"] == TopicFacts(3, 1048588)  # the broker's default
    assert facts["small"] == TopicFacts(1, 20000)
    counts = {topic: found.partitions for topic, found in facts.items()}
    listing = ClusterMetadataSource({"bootstrap.servers": broker.bootstrap})
    created = poll_until(lambda: "made-on-request" in listing([]), timeout=10, interval=0.2)
    # 1 once created; 0 if it was still being created after creation_wait_s
    assert counts.get("made-on-request") in (0, 1), (
        f"reported as missing ({counts}); created by the broker all the same: {created}"
    )

    refusing = ClusterMetadataSource({"bootstrap.servers": broker.bootstrap, **NO_AUTO_CREATE})
    assert refusing(["existing", "never-made"]) == {"existing": TopicFacts(3, 1048588)}
    assert "never-made" not in ClusterMetadataSource({"bootstrap.servers": broker.bootstrap})([])


def test_source_unreachable_cluster_is_a_connection_error() -> None:
    source = ClusterMetadataSource({"bootstrap.servers": f"127.0.0.1:{free_port()}"}, 0.5)
    with pytest.raises(ConnectionError):
        source(["any"])


def produce_one(bootstrap: str, topic: str) -> tuple[KafkaError | None, float]:
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    outcome: list[KafkaError | None] = []

    def delivered(error: KafkaError | None, _message: Message) -> None:
        outcome.append(error)

    started = time.monotonic()
    producer.produce(topic, b"value", b"key", on_delivery=delivered)
    assert producer.flush(60) == 0
    return outcome[0], time.monotonic() - started


def test_agent_lets_a_new_topic_through_when_the_cluster_creates_it(
    broker: KafkaBroker, tmp_path: Path
) -> None:
    with AgentProcess(tmp_path / "volume", broker.bootstrap) as agent:
        error, seconds = produce_one(agent.bootstrap, "auto-created")
        forwarded = consume_all(broker.bootstrap, "auto-created", expected=1)
    assert error is None
    assert seconds < 20  # no metadata retries: before, a new topic took 31 s to fail
    assert [record.value for record in forwarded] == [b"value"]


def test_agent_fails_fast_when_the_cluster_would_not_create_the_topic(
    broker: KafkaBroker, tmp_path: Path
) -> None:
    extra = [
        arg
        for name, value in NO_AUTO_CREATE.items()
        for arg in ("--kafka-setting", f"{name}={value}")
    ]
    with AgentProcess(tmp_path / "volume", broker.bootstrap, extra_args=extra) as agent:
        error, seconds = produce_one(agent.bootstrap, "not-created")
        log = agent.log_path.read_text()
    assert error is not None
    assert error.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
    assert not error.retriable()
    assert seconds < 20  # before: 31 s
    assert "neither has it nor creates it on request: create it first" in log
