"""Validate before acknowledging: batches whose CRC holds but whose content does not (issue 15,
item 5) and illegal topic names are refused with a broker's error, never stored, never
dead-lettered later; what the agent accepts arrives in Kafka.

The batches come from a raw client (no real client sends them); the agent is a real process
forwarding to a real broker, so "not dead-lettered" is checked where it would happen.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import kafka.errors
import pytest
from confluent_kafka import KafkaError, Producer
from kafka import KafkaAdminClient
from kio.schema.errors import ErrorCode

from durable_producer.local.agent_process import AgentProcess
from durable_producer.local.broker import KafkaBroker, consume_all, create_topic
from support.ingest_harness import (
    BATCH_HEADER_SIZE,
    FakeCluster,
    RawClient,
    RunningAgent,
    produce_error,
    record_batch,
    reframe,
    with_header,
)
from support.waiting import wait_for

pytestmark = pytest.mark.integration

TOPIC = "checked"
ILLEGAL_TOPICS = ["bad topic!", "..", "x" * 250, "tópico"]


# ---------------------------------------------------------------------- item 5, end to end
def count_mismatch(good: bytes) -> bytes:
    """Header says 5 records (lastOffsetDelta 4 too), the batch holds 3."""
    return with_header(good, record_count=5, last_offset_delta=4)


def codec(number: int) -> Callable[[bytes], bytes]:
    def set_codec(good: bytes) -> bytes:
        return with_header(good, attributes=number)

    return set_codec


def truncated_record(good: bytes) -> bytes:
    """The last record loses its last bytes; batchLength and CRC fit what is left."""
    return reframe(good[:-4])


CASES: dict[str, tuple[Callable[[bytes], bytes], ErrorCode, str]] = {
    "record-count-mismatch": (count_mismatch, ErrorCode.invalid_record, "records"),
    "codec-5": (codec(5), ErrorCode.corrupt_message, "codec"),
    "codec-6": (codec(6), ErrorCode.corrupt_message, "codec"),
    "codec-7": (codec(7), ErrorCode.corrupt_message, "codec"),
    "gzip-flag-on-plain-body": (codec(1), ErrorCode.corrupt_message, "decompress"),
    "truncated-record": (truncated_record, ErrorCode.invalid_record, "records"),
}


@pytest.fixture(scope="module")
def agent(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[AgentProcess, str]]:
    scratch = tmp_path_factory.mktemp("validation")
    with KafkaBroker() as broker:
        create_topic(broker.bootstrap, TOPIC, 1)
        process = AgentProcess(
            scratch / "volume",
            broker.bootstrap,
            extra_args=["--checkpoint-interval", "0.3"],
            log_path=scratch / "agent.log",
        )
        with process:
            yield process, broker.bootstrap


def metric_sum(agent: AgentProcess, prefix: str) -> float:
    return sum(value for name, value in agent.metrics().items() if name.startswith(prefix))


@pytest.mark.parametrize("case", sorted(CASES))
def test_crc_valid_but_invalid_batches_are_refused_and_never_delivered(
    agent: tuple[AgentProcess, str], case: str
) -> None:
    process, broker = agent
    mutate, expected_error, reason = CASES[case]
    good = record_batch([b"%s-refused-%d" % (case.encode(), i) for i in range(3)])
    refused = mutate(good)
    assert len(refused) >= BATCH_HEADER_SIZE
    invalid_metric = f'durable_agent_ingest_invalid_batches_total{{reason="{reason}"}}'
    before = process.metrics()
    ingested = before.get("durable_agent_ingest_records_total", 0) + 1
    counted_invalid = before.get(invalid_metric, 0) + 1
    with RawClient(process.bootstrap) as client:
        assert client.metadata([TOPIC]).topics[0].error_code == ErrorCode.none
        assert produce_error(client.produce(TOPIC, 0, refused))[0] == expected_error
        accepted = record_batch([b"%s-accepted" % case.encode()])
        assert produce_error(client.produce(TOPIC, 0, accepted))[0] == ErrorCode.none

    def published() -> bool:  # metrics are published once a second
        metrics = process.metrics()
        counted = metrics.get(invalid_metric, 0), metrics["durable_agent_ingest_records_total"]
        assert counted <= (counted_invalid, ingested), "the invalid batch was stored"
        return counted == (counted_invalid, ingested)

    wait_for(published, timeout=10, interval=0.2, what="the refusal and the accepted batch")
    values = {record.value for record in consume_all(broker, TOPIC, timeout=30, idle=1.5)}
    assert b"%s-accepted" % case.encode() in values
    assert not any(value and b"-refused-" in value for value in values)
    time.sleep(1.0)  # a checkpoint or two: the forwarder has seen everything stored
    assert metric_sum(process, "durable_agent_dead_letters_total") == 0
    dead_letters = process.data_dir / "dead-letter" / "dead-letters.jsonl"
    assert not dead_letters.exists() or dead_letters.stat().st_size == 0


# ---------------------------------------------------------------------- illegal topic names
@pytest.fixture
def local_agent(tmp_path: Path) -> Iterator[RunningAgent]:
    with RunningAgent(tmp_path, FakeCluster({"events": 2}), default_partitions=3) as running:
        yield running


def test_illegal_topic_names_get_invalid_topic_exception_not_stored(
    local_agent: RunningAgent,
) -> None:
    """Even with a default partition count (which answers any legal unknown topic)."""
    with RawClient(local_agent.bootstrap) as client:
        topics = client.metadata([*ILLEGAL_TOPICS, "events"]).topics
        errors = {topic.name: int(topic.error_code) for topic in topics}
        for name in ILLEGAL_TOPICS:
            assert errors[name] == ErrorCode.invalid_topic_exception
            assert produce_error(client.produce(name, 0, record_batch([b"x"])))[0] == (
                ErrorCode.invalid_topic_exception
            )
        assert errors["events"] == ErrorCode.none
    assert local_agent.records() == []


def test_confluent_kafka_gets_a_final_error_at_once(local_agent: RunningAgent) -> None:
    """Before: UNKNOWN_TOPIC_OR_PARTITION, retried until message.timeout.ms (5 min default)."""
    reports: list[KafkaError | None] = []
    producer = Producer(
        {
            "bootstrap.servers": local_agent.bootstrap,
            "message.timeout.ms": 120_000,
            "log_level": 2,
        }
    )
    started = time.monotonic()
    for name in ILLEGAL_TOPICS:
        producer.produce(name, b"value", on_delivery=lambda error, _: reports.append(error))
    while len(reports) < len(ILLEGAL_TOPICS) and time.monotonic() - started < 30:
        producer.poll(0.1)
    assert len(reports) == len(ILLEGAL_TOPICS), "no delivery report within 30 s"
    assert time.monotonic() - started < 10
    for error in reports:
        assert error is not None and error.code() == KafkaError.TOPIC_EXCEPTION
        assert not error.retriable()


def test_kafka_python_reads_the_answer_as_a_non_retriable_error(
    local_agent: RunningAgent,
) -> None:
    """kafka-python's producer refuses these names itself; its admin client asks the agent."""
    admin = KafkaAdminClient(bootstrap_servers=local_agent.bootstrap)
    try:
        described = admin.describe_topics(ILLEGAL_TOPICS)
    finally:
        admin.close()
    assert {topic["name"] for topic in described} == set(ILLEGAL_TOPICS)
    for topic in described:
        error = kafka.errors.for_code(topic["error_code"])
        assert error is kafka.errors.InvalidTopicError
        assert not error.retriable
