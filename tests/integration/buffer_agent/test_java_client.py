"""The Apache Kafka Java client (kafka-clients 4.1.2, the one most users run) producing through a
real agent process that forwards to a real Kafka broker.

Each test writes the same records twice with the same settings: through the agent, and straight
to the same broker (the control). Both topics must hold exactly what the program sent, byte for
byte, on the partitions the client chose, and the same records as each other; so whatever
differs is the agent's doing. The client is ``tests/support/java/JavaProducer.java``.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer as ConfluentProducer

from durable_producer.local.agent_process import AgentProcess
from support.broker import KafkaBroker, consume_all, create_topic
from support.client_records import (
    CODECS,
    KEEP_OLD_TIMESTAMPS,
    SAMPLE_PARTITIONS,
    SAMPLE_RECORDS,
    ClientRecord,
    assert_topic_holds_exactly,
    content,
    sample_records,
)
from support.java_client import JavaClientNotInstalled, JavaProducer, JavaRun, compiled_classes
from support.kafka_fixtures import TopicFactory
from support.raw_fetch import stored_batches
from support.waiting import wait_for, wait_until_still

pytestmark = pytest.mark.integration



@pytest.fixture(scope="module")
def java_classes() -> Path:
    """The compiled program (once per content); one line when the client is not installed."""
    missing: JavaClientNotInstalled | None = None
    try:
        return compiled_classes()
    except JavaClientNotInstalled as error:
        missing = error
    pytest.fail(str(missing), pytrace=False)


@pytest.fixture(scope="module")
def agent(
    kafka_broker: KafkaBroker, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[AgentProcess]:
    """One agent for the module, forwarding to the run's broker."""
    work = tmp_path_factory.mktemp("java-agent")
    with AgentProcess(work / "volume", kafka_broker.bootstrap) as running:
        yield running


def produce_both_ways(
    topics: TopicFactory,
    agent: AgentProcess,
    kafka: KafkaBroker,
    work: Path,
    settings: dict[str, str | int | bool],
) -> tuple[tuple[str, JavaRun], tuple[str, JavaRun]]:
    """The same records through the agent and straight to the broker: (topic, run) of each."""
    runs = []
    for name, bootstrap in (("agent", agent.bootstrap), ("direct", kafka.bootstrap)):
        topic = topics(SAMPLE_PARTITIONS, config=KEEP_OLD_TIMESTAMPS)
        producer = JavaProducer({**settings, "bootstrap.servers": bootstrap}, work / name)
        runs.append((topic, producer.send(sample_records(topic))))
    return runs[0], runs[1]


@pytest.mark.parametrize("codec", list(CODECS))
def test_idempotent_java_producer_byte_exact_through_the_agent(
    java_classes: Path,
    agent: AgentProcess,
    kafka_broker: KafkaBroker,
    new_topic: TopicFactory,
    tmp_path: Path,
    codec: str,
) -> None:
    settings: dict[str, str | int | bool] = {
        "enable.idempotence": True,  # the Java client's default since 3.0, with acks=all
        "acks": "all",
        "compression.type": codec,
        "linger.ms": 5,
    }
    (via_agent, agent_run), (direct, direct_run) = produce_both_ways(
        new_topic, agent, kafka_broker, tmp_path, settings
    )
    sent = sample_records(via_agent)
    through_agent = assert_topic_holds_exactly(
        kafka_broker.bootstrap, via_agent, sent, agent_run.outcomes
    )
    control = assert_topic_holds_exactly(
        kafka_broker.bootstrap, direct, sample_records(direct), direct_run.outcomes
    )
    # the client chose the same partitions for keyed records either way (the agent reports the
    # cluster's partition counts), and the two topics hold the same records
    for record, via, straight in zip(sent, agent_run.outcomes, direct_run.outcomes, strict=True):
        if record.key is not None or record.partition is not None:
            assert via.partition == straight.partition
    assert Counter(map(content, through_agent)) == Counter(map(content, control))
    assert len(agent_run.outcomes) == SAMPLE_RECORDS


# A strict xfail through the per-record forwarder (it stored the records uncompressed); the
# batch forwarder keeps the client's batches as they are (issue 27).
@pytest.mark.parametrize("codec", [codec for codec in CODECS if codec != "none"])
def test_kafka_keeps_the_java_clients_compressed_batches(
    java_classes: Path,
    agent: AgentProcess,
    kafka_broker: KafkaBroker,
    new_topic: TopicFactory,
    tmp_path: Path,
    codec: str,
) -> None:
    """The batches in Kafka are the client's: compressed with its codec (today: none; zstd
    batches of 190 records, 1,885 B from the client, were stored as 15,563 B)."""
    topic = new_topic(1)
    records = [
        ClientRecord(topic, b"k%d" % i, b"value %d " % i * 20, partition=0) for i in range(300)
    ]
    settings = {"bootstrap.servers": agent.bootstrap, "compression.type": codec, "linger.ms": 50}
    assert JavaProducer(settings, tmp_path).send(records).errors == []
    assert len(consume_all(kafka_broker.bootstrap, topic, expected=len(records))) == len(records)
    batches = stored_batches(kafka_broker.bootstrap, topic, 0)
    assert {batch.header.compression for batch in batches} == {CODECS[codec]}


def test_plain_java_producer_through_the_agent(
    java_classes: Path,
    agent: AgentProcess,
    kafka_broker: KafkaBroker,
    new_topic: TopicFactory,
    tmp_path: Path,
) -> None:
    """Idempotence off, acks=1: what clients older than Kafka 3.0 defaulted to."""
    settings: dict[str, str | int | bool] = {
        "enable.idempotence": False,
        "acks": "1",
        "compression.type": "lz4",
        "max.in.flight.requests.per.connection": 1,
    }
    (via_agent, agent_run), (direct, direct_run) = produce_both_ways(
        new_topic, agent, kafka_broker, tmp_path, settings
    )
    assert_topic_holds_exactly(
        kafka_broker.bootstrap, via_agent, sample_records(via_agent), agent_run.outcomes
    )
    assert_topic_holds_exactly(
        kafka_broker.bootstrap, direct, sample_records(direct), direct_run.outcomes
    )


def test_transactional_java_producer_is_refused_at_once(
    java_classes: Path, agent: AgentProcess, tmp_path: Path
) -> None:
    """initTransactions() fails at once with TransactionalIdAuthorizationException (the Java
    client's own text for the agent's TRANSACTIONAL_ID_AUTHORIZATION_FAILED on FindCoordinator:
    it does not show a broker's error message), and the agent's log says why."""
    producer = JavaProducer(
        {"bootstrap.servers": agent.bootstrap, "transactional.id": "java-tx-1"}, tmp_path
    )
    raised = producer.init_transactions()
    assert raised is not None
    assert raised["class"] == (
        "org.apache.kafka.common.errors.TransactionalIdAuthorizationException"
    )
    assert raised["message"] == "Transactional Id authorization failed."
    assert "transactions are not supported through a durable buffer" in agent.log_tail(20_000)


# ---------------------------------------------------------------------- a full buffer
FULL_BUFFER_BYTES = 1024 * 1024
FULL_BUFFER_AGENT_ARGS = [
    "--max-buffer-bytes",
    str(FULL_BUFFER_BYTES),
    "--segment-bytes",
    "262144",
    "--max-batch-bytes",
    "65536",
    "--checkpoint-interval",
    "0.5",
]
REFUSING = 'durable_agent_refusing_appends{reason="buffer_limit"}'
PACED_RATE = 1000  # records a second of 200 B: the 1 MiB buffer is full after about 5 s
PACED_RECORDS = 30_000  # 30 s of sending: it goes on after Kafka is back
SETTLE_SECONDS = 2.5
EXPIRED_KINDS = {"TimeoutException", "NotEnoughReplicasException"}
"""What the Java client reports for a record that expired while a real cluster refused it."""
SHORT_DELIVERY_TIMEOUT = {"delivery.timeout.ms": 6000, "request.timeout.ms": 5000}
"""Shorter than the refusals: records expire while the buffer is full."""


def paced_records(topic: str) -> list[ClientRecord]:
    return [
        ClientRecord(topic, b"%d" % index, bytes([index % 251]) * 200, partition=index % 2)
        for index in range(PACED_RECORDS)
    ]


@pytest.mark.parametrize(
    "delivery",
    [
        pytest.param({}, id="default-delivery-timeout"),
        pytest.param(SHORT_DELIVERY_TIMEOUT, id="records-expire"),
    ],
)
def test_java_producer_rides_out_a_full_buffer(
    java_classes: Path, proxied_broker: Any, tmp_path: Path, delivery: dict[str, int]
) -> None:
    """Kafka cut off, the agent's 1 MiB WAL fills and it refuses (NOT_ENOUGH_REPLICAS): the Java
    client logs each refused batch as a retry and keeps them (with its default 120 s delivery
    timeout), or expires them (delivery timeout shorter than the refusals) with a
    TimeoutException, or with the refusal's NotEnoughReplicasException for a batch whose time
    ran out while a retry was out, as against a real cluster refusing; never an epoch or
    sequence error. Once Kafka is back the same producer goes on, and every record it was told was
    delivered is in Kafka once; none it was not told of."""
    topic = "java-full"
    create_topic(proxied_broker.bootstrap, topic, 2)
    with AgentProcess(
        tmp_path / "volume",
        proxied_broker.bootstrap,
        extra_args=FULL_BUFFER_AGENT_ARGS,
        log_path=tmp_path / "agent.log",
    ) as agent:
        wait_for(lambda: agent_knows_topic(agent, topic), what="the agent to learn the topic")
        proxied_broker.proxy.cut()
        producer = JavaProducer(
            {"bootstrap.servers": agent.bootstrap, "linger.ms": 5, **delivery}, tmp_path / "java"
        )
        sending = producer.start_send(paced_records(topic), rate=PACED_RATE)
        try:
            wait_for(lambda: agent.metrics().get(REFUSING) == 1, 60, 0.2, "the buffer full")
            held = wait_until_still(  # the last batches that fit answered; > 1 progress line
                lambda: sending.progress()["acked"], SETTLE_SECONDS, timeout=60,
                what="the acknowledged count",
            )
            time.sleep(12 if delivery else 8)
            assert 0 < sending.progress()["acked"] == held, "nothing is accepted while full"
            assert "NOT_ENOUGH_REPLICAS" in sending.log()
            proxied_broker.proxy.restore()
            restored_at = sending.progress()["sent"]
            run = sending.wait(180)
        finally:
            sending.close()
        assert agent.stop() == 0, "the agent forwards everything and stops"
    retries = [line for line in run.log.splitlines() if "NOT_ENOUGH_REPLICAS" in line]
    assert retries and all(" WARN " in line and "retrying" in line for line in retries)
    kinds = Counter(error.split(":")[0].rsplit(".", 1)[-1] for error in run.errors)
    if delivery:
        # expired waiting (TimeoutException), or while a retry was out: its answer's exception
        assert set(kinds) <= EXPIRED_KINDS and kinds["TimeoutException"], kinds
        expired = [error for error in run.errors if "TimeoutException" in error]
        assert "ms has passed since batch creation" in expired[0]
    else:
        assert run.errors == []
    acknowledged = set(run.acknowledged)
    assert all(
        index in acknowledged for index in range(restored_at + 2 * PACED_RATE, PACED_RECORDS)
    )
    stored = consume_all(proxied_broker.direct_address, topic, timeout=60, idle=2)
    keys = Counter(int(record.key or b"-1") for record in stored)
    assert set(keys) == acknowledged, "Kafka holds exactly the acknowledged records"
    assert max(keys.values()) == 1, "no record twice"
    for record in stored:
        assert record.value == bytes([int(record.key or b"-1") % 251]) * 200


def agent_knows_topic(agent: AgentProcess, topic: str) -> bool:
    metadata = ConfluentProducer({"bootstrap.servers": agent.bootstrap}).list_topics(topic, 5)
    return metadata.topics[topic].error is None
