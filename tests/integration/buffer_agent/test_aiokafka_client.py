"""aiokafka's producer (``AIOKafkaProducer``, asyncio) through a real agent process that forwards
to a real Kafka broker, against the same records written straight to the broker (the control):
each codec, idempotent, headers with repeated names and null values, explicit partitions and
timestamps, null and empty keys; byte-exact in Kafka (``support.client_records``, the standard
the Java client is held to).

What the per-record forwarder could not keep (it decoded every stored record and produced it
again through librdkafka) is tested through the agent and straight to the broker alike: the
client's compression codec, CreateTime 0 and a NUL byte in a header name. The batch forwarder
(issue 27, DESIGN.md 2.1) sends the client's batches as they are and keeps all three (these
tests were strict xfails before it).

aiokafka 0.14 reports the first record's timestamp of a batch for every record of it
(``ProducerBatch.done`` reassigns ``timestamp`` inside its loop over the records), so its reports
are not used: a record's stored timestamp is checked against the one it was given, and where the
client stamped it, against the clock around the send.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections import Counter
from collections.abc import Iterator, Sequence

import pytest
from aiokafka import AIOKafkaProducer

from durable_producer.local.agent_process import AgentProcess
from support.broker import KafkaBroker
from support.client_records import (
    BASE_TIMESTAMP_MS,
    CODECS,
    KEEP_OLD_TIMESTAMPS,
    SAMPLE_PARTITIONS,
    ClientRecord,
    Outcome,
    assert_topic_holds_exactly,
    content,
    sample_records,
)
from support.kafka_fixtures import TopicFactory
from support.raw_fetch import StoredRecord, stored_batches, stored_records

pytestmark = pytest.mark.integration



@pytest.fixture(scope="module")
def agent(
    kafka_broker: KafkaBroker, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[AgentProcess]:
    work = tmp_path_factory.mktemp("aiokafka-agent")
    with AgentProcess(work / "volume", kafka_broker.bootstrap) as running:
        yield running


def aiokafka_records(topic: str) -> list[ClientRecord]:
    """The sample, but no record with neither key nor value (aiokafka asserts one of them)."""
    return [
        dataclasses.replace(record, value=b"")
        if record.key is None and record.value is None
        else record
        for record in sample_records(topic)
    ]


async def produce(bootstrap: str, records: Sequence[ClientRecord], codec: str) -> list[Outcome]:
    """Send ``records`` with an idempotent producer; each record's outcome, its timestamp the
    one the record was given (None where the client stamps it): aiokafka's report of it is wrong
    after a batch's first record (module docstring)."""
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap,
        enable_idempotence=True,
        acks="all",
        compression_type=None if codec == "none" else codec,
        linger_ms=5,
    )
    await producer.start()
    try:
        futures = [
            await producer.send(
                record.topic,
                value=record.value,
                key=record.key,
                partition=record.partition,
                timestamp_ms=record.timestamp_ms,
                headers=list(record.headers),
            )
            for record in records
        ]
        outcomes = []
        for record, future in zip(records, futures, strict=True):
            try:
                metadata = await future
            except Exception as error:  # each record's own outcome
                outcomes.append(Outcome(None, None, None, repr(error)))
            else:
                outcomes.append(
                    Outcome(metadata.partition, metadata.offset, record.timestamp_ms, None)
                )
        return outcomes
    finally:
        await producer.stop()


def now_ms() -> int:
    return time.time_ns() // 1_000_000


@pytest.mark.parametrize("codec", list(CODECS))
def test_aiokafka_producer_byte_exact_through_the_agent(
    agent: AgentProcess, kafka_broker: KafkaBroker, new_topic: TopicFactory, codec: str
) -> None:
    stored = {}
    outcomes = {}
    for name, bootstrap in (("agent", agent.bootstrap), ("direct", kafka_broker.bootstrap)):
        topic = new_topic(SAMPLE_PARTITIONS, config=KEEP_OLD_TIMESTAMPS)
        records = aiokafka_records(topic)
        started = now_ms()
        outcomes[name] = asyncio.run(produce(bootstrap, records, codec))
        stored[name] = assert_topic_holds_exactly(
            kafka_broker.bootstrap,
            topic,
            records,
            outcomes[name],
            client_clock=(started, now_ms()),
        )
    assert Counter(map(content, stored["agent"])) == Counter(map(content, stored["direct"]))
    # the client chose the same partitions for keyed records either way (the agent reports the
    # cluster's partition counts)
    placed = [
        index
        for index, record in enumerate(aiokafka_records("t"))
        if record.key is not None or record.partition is not None
    ]
    assert [outcomes["agent"][i].partition for i in placed] == [
        outcomes["direct"][i].partition for i in placed
    ]


ROUTES = ["direct", "agent"]  # the control, and through the agent


def bootstrap_of(route: str, agent: AgentProcess, kafka_broker: KafkaBroker) -> str:
    return agent.bootstrap if route == "agent" else kafka_broker.bootstrap


def send_to_new_topic(
    bootstrap: str, new_topic: TopicFactory, records: Sequence[ClientRecord], codec: str = "none"
) -> str:
    """``records`` (topic and partition replaced) to a new one-partition topic: its name."""
    topic = new_topic(1, config=KEEP_OLD_TIMESTAMPS)
    batch = [dataclasses.replace(record, topic=topic, partition=0) for record in records]
    outcomes = asyncio.run(produce(bootstrap, batch, codec))
    assert [outcome.error for outcome in outcomes] == [None] * len(batch)
    return topic


def records_in(kafka_broker: KafkaBroker, topic: str, count: int) -> list[StoredRecord]:
    """The partition's records as stored, once ``count`` are there (the agent forwards
    asynchronously; 30 s at most)."""
    deadline = time.monotonic() + 30
    while True:
        found = stored_records(kafka_broker.bootstrap, topic, 0)
        if len(found) >= count or time.monotonic() > deadline:
            assert len(found) == count, f"{len(found)} of {count} records in {topic}"
            return found
        time.sleep(0.2)


@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize("codec", [codec for codec in CODECS if codec != "none"])
def test_kafka_keeps_the_aiokafka_clients_compressed_batches(
    agent: AgentProcess, kafka_broker: KafkaBroker, new_topic: TopicFactory, codec: str, route: str
) -> None:
    """The batches in Kafka are compressed with the client's codec."""
    records = [ClientRecord("", b"k%d" % i, b"value %d " % i * 20) for i in range(300)]
    topic = send_to_new_topic(bootstrap_of(route, agent, kafka_broker), new_topic, records, codec)
    records_in(kafka_broker, topic, len(records))
    batches = stored_batches(kafka_broker.bootstrap, topic, 0)
    assert {batch.header.compression for batch in batches} == {CODECS[codec]}


@pytest.mark.parametrize("route", ROUTES)
def test_create_time_zero_is_kept(
    agent: AgentProcess, kafka_broker: KafkaBroker, new_topic: TopicFactory, route: str
) -> None:
    """A record stamped 0 (the epoch) is stored with CreateTime 0."""
    records = [
        ClientRecord("", b"zero", b"v", timestamp_ms=0),
        ClientRecord("", b"one", b"v", timestamp_ms=1),
    ]
    topic = send_to_new_topic(bootstrap_of(route, agent, kafka_broker), new_topic, records)
    assert records_in(kafka_broker, topic, 2) == [
        (b"zero", b"v", (), 0, 0),
        (b"one", b"v", (), 1, 0),
    ]


@pytest.mark.parametrize("route", ROUTES)
def test_nul_in_a_header_name_is_kept(
    agent: AgentProcess, kafka_broker: KafkaBroker, new_topic: TopicFactory, route: str
) -> None:
    """A header name is a Kafka string: any UTF-8, NUL included."""
    headers = (("a\x00b", b"1"), ("plain", b"2"))
    records = [ClientRecord("", b"k", b"v", headers, timestamp_ms=BASE_TIMESTAMP_MS)]
    topic = send_to_new_topic(bootstrap_of(route, agent, kafka_broker), new_topic, records)
    assert records_in(kafka_broker, topic, 1) == [(b"k", b"v", headers, BASE_TIMESTAMP_MS, 0)]
