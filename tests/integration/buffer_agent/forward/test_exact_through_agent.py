"""Through a real agent into Apache Kafka, every record is what the client sent, byte for byte.

Each case sends the same records twice with the same client and settings: through an agent
process (``durable-agent run``) to one topic, and straight to the broker, the control, to
another. Both topics are then read as the broker stores them (raw Fetch, decoded with
kafka-python's record reader, independent of the agent's code) and must hold the same records
in the same order per partition: key, value, headers, timestamp and timestamp type, and the
client's compression codec. The per-record forwarder this replaced decoded every record and
produced it again through librdkafka: it dropped the codec, wrote CreateTime 0 as the
forwarding time and cut a header key at its first NUL byte.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import pytest
from aiokafka import AIOKafkaProducer
from confluent_kafka import Producer
from kafka import KafkaProducer
from kafka.record.default_records import DefaultRecordBatch

from durable_producer.buffer_agent.kafka.record_batch import parse_batch_header
from durable_producer.local.agent_process import AgentProcess
from support.batch_builder import SampleRecord, build_batch
from support.broker import KafkaBroker
from support.ingest_harness import RawClient, produce_error
from support.kafka_fixtures import TopicFactory
from support.raw_fetch import raw_batches
from support.waiting import wait_for

pytestmark = pytest.mark.integration

PARTITIONS = 3
CODECS = {"none": 0, "gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}
BASE_TIMESTAMP = 1_700_000_000_000
KEEP = {"retention.ms": "-1"}
"""The records' timestamps are old on purpose (0, 2023): time-based retention would delete
them from any rolled segment at the broker's next retention check."""


@dataclass(frozen=True)
class Sent:
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes], ...]
    timestamp_ms: int
    partition: int


Stored = tuple[bytes | None, bytes | None, tuple[tuple[str, bytes | None], ...], int, int]
"""key, value, headers, timestamp, timestamp type: one record as the broker keeps it."""


@pytest.fixture(scope="module")
def agent(kafka_broker: KafkaBroker, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """One agent process for the module; yields its bootstrap address."""
    data = tmp_path_factory.mktemp("exact")
    with AgentProcess(data / "volume", kafka_broker.bootstrap, log_path=data / "agent.log") as a:
        yield a.bootstrap


def _records(count: int) -> list[Sent]:
    """Keys null, empty or set; values null, empty, binary and compressible; headers none,
    repeated names, empty values, non-ASCII names; timestamps in order and out of order."""
    records = []
    for i in range(count):
        key = None if i % 5 == 0 else b"" if i % 5 == 1 else b"key-\x00-%d" % i
        value = (
            None
            if i % 7 == 3 and key is not None  # some clients refuse a record of neither
            else b""
            if i % 7 == 4
            else bytes(range(256)) + b"record %d " % i + b"compressible " * (i % 40)
        )
        headers: tuple[tuple[str, bytes], ...] = ()
        if i % 3 == 1:
            headers = (("trace", b"t-%d" % i), ("trace", b""), ("gr\u00fc\u00dfe", b"\xff\x00"))
        timestamp = BASE_TIMESTAMP + i * 11 - (5_000 if i % 9 == 8 else 0)
        records.append(Sent(key, value, headers, timestamp, i % PARTITIONS))
    return records


# ------------------------------------------------------------------------------- the clients
def _confluent(bootstrap: str, topic: str, records: Sequence[Sent], codec: str) -> None:
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "enable.idempotence": True,
            "compression.type": codec,
            "linger.ms": 5,
            "log_level": 2,
        }
    )
    failures: list[str] = []
    for record in records:
        producer.produce(
            topic,
            value=record.value,
            key=record.key,
            partition=record.partition,
            timestamp=record.timestamp_ms,
            headers=list(record.headers),
            on_delivery=lambda error, _m: error is None or failures.append(str(error)),
        )
    assert producer.flush(30) == 0
    assert not failures, failures


def _kafka_python(bootstrap: str, topic: str, records: Sequence[Sent], codec: str) -> None:
    producer = KafkaProducer(
        bootstrap_servers=bootstrap,
        enable_idempotence=True,
        acks="all",
        compression_type=None if codec == "none" else codec,
        linger_ms=5,
    )
    futures = [
        producer.send(
            topic,
            value=record.value,
            key=record.key,
            partition=record.partition,
            timestamp_ms=record.timestamp_ms,
            headers=list(record.headers),
        )
        for record in records
    ]
    producer.flush(30)
    for future in futures:
        future.get(timeout=1)
    producer.close(5)


def _aiokafka(bootstrap: str, topic: str, records: Sequence[Sent], codec: str) -> None:
    async def run() -> None:
        producer = AIOKafkaProducer(
            bootstrap_servers=bootstrap,
            enable_idempotence=True,
            compression_type=None if codec == "none" else codec,
            linger_ms=5,
        )
        await producer.start()
        try:
            futures = [
                await producer.send(
                    topic,
                    value=record.value,
                    key=record.key,
                    partition=record.partition,
                    timestamp_ms=record.timestamp_ms,
                    headers=list(record.headers),
                )
                for record in records
            ]
            await asyncio.gather(*futures)
        finally:
            await producer.stop()

    asyncio.run(run())


Client = Callable[[str, str, Sequence[Sent], str], None]
CLIENTS: dict[str, Client] = {
    "confluent-kafka": _confluent,
    "kafka-python": _kafka_python,
    "aiokafka": _aiokafka,
}


# ------------------------------------------------------------------------------- reading back
def _stored(bootstrap: str, topic: str, partitions: int, count: int) -> dict[int, list[Stored]]:
    """Each partition's records as stored, once ``count`` records are there (30 s at most)."""
    found: dict[int, list[Stored]] = {}

    def complete() -> bool:
        found.clear()
        for partition in range(partitions):
            found[partition] = [
                (r.key, r.value, tuple(r.headers), r.timestamp, r.timestamp_type)
                for batch in raw_batches(bootstrap, topic, partition)
                for r in DefaultRecordBatch(batch)
            ]
        return sum(len(records) for records in found.values()) >= count

    wait_for(complete, 30, interval=0.5, what=f"{count} records in {topic}")
    return found


def _codecs_sent(client: str, codec: str) -> set[int]:
    """The codecs ``client`` writes batches with when asked for ``codec``. kafka-python sends a
    batch uncompressed where compressing does not make it smaller (its ``_maybe_compress``):
    a small batch, as a loaded machine's timing makes them (a batch of one empty record), goes
    uncompressed, through the agent and straight to Kafka alike (seen once in a fresh clone's
    CI, on the direct side)."""
    return {CODECS[codec], 0} if client == "kafka-python" else {CODECS[codec]}


def _codecs(bootstrap: str, topic: str, partitions: int) -> set[int]:
    return {
        parse_batch_header(batch).compression
        for partition in range(partitions)
        for batch in raw_batches(bootstrap, topic, partition)
    }


def _both_ways(
    kafka_broker: KafkaBroker,
    agent: str,
    new_topic: TopicFactory,
    send: Callable[[str, str], None],
    count: int,
    partitions: int = PARTITIONS,
) -> tuple[dict[int, list[Stored]], dict[int, list[Stored]], str, str]:
    """``send(bootstrap, topic)`` through the agent and straight to Kafka; both as stored."""
    through, direct = new_topic(partitions, config=KEEP), new_topic(partitions, config=KEEP)
    send(agent, through)
    send(kafka_broker.bootstrap, direct)
    bootstrap = kafka_broker.bootstrap
    return (
        _stored(bootstrap, through, partitions, count),
        _stored(bootstrap, direct, partitions, count),
        through,
        direct,
    )


# ------------------------------------------------------------------------------- the tests
@pytest.mark.parametrize("codec", list(CODECS))
@pytest.mark.parametrize("client", list(CLIENTS))
def test_each_client_and_codec_arrives_byte_exact(
    kafka_broker: KafkaBroker, agent: str, new_topic: TopicFactory, client: str, codec: str
) -> None:
    records = _records(120)
    through, direct, through_topic, direct_topic = _both_ways(
        kafka_broker,
        agent,
        new_topic,
        lambda bootstrap, topic: CLIENTS[client](bootstrap, topic, records, codec),
        len(records),
    )
    assert through == direct
    sent = {
        p: [(r.key, r.value, r.headers, r.timestamp_ms) for r in records if r.partition == p]
        for p in range(PARTITIONS)
    }
    assert {p: [stored[:4] for stored in found] for p, found in through.items()} == sent
    expected = _codecs_sent(client, codec)
    assert CODECS[codec] in _codecs(kafka_broker.bootstrap, through_topic, PARTITIONS) <= expected
    assert CODECS[codec] in _codecs(kafka_broker.bootstrap, direct_topic, PARTITIONS) <= expected


@pytest.mark.parametrize("client", ["kafka-python", "aiokafka"])
def test_create_time_zero_and_a_nul_in_a_header_key_are_kept(
    kafka_broker: KafkaBroker, agent: str, new_topic: TopicFactory, client: str
) -> None:
    """librdkafka cannot send either (0 means "now"; header names end at NUL): these
    clients can, and the agent must not lose what they sent."""
    records = [
        Sent(b"zero", b"created at 0", (), 0, 0),
        Sent(b"nul", b"header name with NUL", (("a\x00b", b"v"), ("\x00", b"")), 5, 0),
        Sent(b"both", b"x", (("k\x00", b"\x00"),), 0, 0),
    ]
    through, direct, _, _ = _both_ways(
        kafka_broker,
        agent,
        new_topic,
        lambda bootstrap, topic: CLIENTS[client](bootstrap, topic, records, "none"),
        len(records),
        partitions=1,
    )
    assert through == direct
    assert [(k, v, h, ts) for k, v, h, ts, _ in through[0]] == [
        (r.key, r.value, r.headers, r.timestamp_ms) for r in records
    ]


def _raw_send(bootstrap: str, topic: str, batches: Sequence[bytes]) -> None:
    with RawClient(bootstrap) as client:
        client.metadata([topic])  # the agent learns the partition count
        for batch in batches:
            assert produce_error(client.produce(topic, 0, batch))[0] == 0


def test_a_timestamp_of_minus_one_inside_a_batch_arrives_as_sent(
    kafka_broker: KafkaBroker, agent: str, new_topic: TopicFactory
) -> None:
    """Review finding 1: a record whose timestamp is -1 (NO_TIMESTAMP) behind one that has a
    timestamp, in consecutive uncompressed batches the forwarder merges into one."""
    batches = [
        build_batch([SampleRecord(b"a", b"1", 5), SampleRecord(b"b", b"2", -1)]),
        build_batch([SampleRecord(b"c", b"3", -1), SampleRecord(b"d", b"4", 7)]),
        build_batch([SampleRecord(b"e", b"5", BASE_TIMESTAMP), SampleRecord(b"f", b"6", -1)]),
    ]
    through, direct, _, _ = _both_ways(
        kafka_broker,
        agent,
        new_topic,
        lambda bootstrap, topic: _raw_send(bootstrap, topic, batches),
        6,
        partitions=1,
    )
    assert through == direct
    assert [stored[3] for stored in through[0]] == [5, -1, -1, 7, BASE_TIMESTAMP, -1]


def _log_bytes(broker: KafkaBroker, topic: str) -> int:
    return sum(path.stat().st_size for path in broker.data_dir.glob(f"{topic}-*/*.log"))


@pytest.mark.parametrize("codec", ["gzip", "zstd"])
def test_compressed_batches_stay_compressed_in_the_brokers_log(
    kafka_broker: KafkaBroker, agent: str, new_topic: TopicFactory, codec: str
) -> None:
    """The bytes in the broker's log directory through the agent are those of a direct
    producer, a fraction of the records' size (the per-record forwarder stored them
    uncompressed: about the records' own size)."""
    records = [
        Sent(
            b"k%d" % i,
            b'{"user": %d, "event": "page_view", "path": "/catalog/items/%d", "agent": "%s"}'
            % (i, i % 50, b"Mozilla/5.0 (X11; Linux x86_64) " * 8),
            (),
            BASE_TIMESTAMP + i,
            0,
        )
        for i in range(4000)
    ]
    uncompressed = sum(len(r.key or b"") + len(r.value or b"") for r in records)
    through, direct, through_topic, direct_topic = _both_ways(
        kafka_broker,
        agent,
        new_topic,
        lambda bootstrap, topic: _confluent(bootstrap, topic, records, codec),
        len(records),
        partitions=1,
    )
    assert through == direct
    on_disk = _log_bytes(kafka_broker, through_topic)
    direct_on_disk = _log_bytes(kafka_broker, direct_topic)
    print(
        f"\n{codec}: records {uncompressed} B, broker log through the agent {on_disk} B,"
        f" direct {direct_on_disk} B"
    )
    assert on_disk <= direct_on_disk * 1.1 + 4096
    assert on_disk * 5 < uncompressed
    assert _codecs(kafka_broker.bootstrap, through_topic, 1) == {CODECS[codec]}
