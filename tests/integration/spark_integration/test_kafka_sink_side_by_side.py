"""``format("durable-kafka")`` beside Spark's own Kafka sink (``format("kafka")``,
spark-sql-kafka-0-10 from Maven Central) on the same DataFrames, against real Kafka.

Spark's sink writes straight to the broker; durable-kafka writes through the session's agent
(``kafka_endpoint``). Both must put every key on the same partition, take the same columns to
the same records, and refuse the same bad input. Where they differ on purpose, the test says
so and docs/spark.md ("Migrating from format("kafka")") explains why.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from durable_producer.local.agent_process import AgentProcess
from durable_producer.spark_integration.data_source import SHORT_NAME
from integration.spark_integration.spark_harness import KafkaEndpoint
from support.broker import ConsumedRecord, KafkaBroker, consume_all
from support.spark_kafka import SINK_FORMAT, SparkKafkaNotInstalled, sink_version

pytestmark = pytest.mark.integration

PARTITIONS = 7
KEYS = 3_000
SINKS = (SINK_FORMAT, SHORT_NAME)
QUICK_METADATA = {"kafka.max.block.ms": "5000"}
"""Spark's sink waits max.block.ms (60 s) for a missing topic or partition; 5 s here."""
HEADERS_SQL = "array<struct<key:string,value:binary>>"


@pytest.fixture(scope="module")
def spark_sink(spark: SparkSession) -> str:
    """The version of Spark's Kafka sink in the session (one line when it is not installed)."""
    missing: SparkKafkaNotInstalled | None = None
    try:
        version = sink_version()
    except SparkKafkaNotInstalled as error:
        missing = error
    if missing is not None:
        pytest.fail(str(missing), pytrace=False)
    print(f"Spark's Kafka sink {version} beside durable-kafka on pyspark {spark.version}")
    return version


def write(frame: DataFrame, sink: str, kafka_bootstrap: str, **options: str) -> None:
    """Append ``frame`` with ``sink``; Spark's sink writes to ``kafka_bootstrap``."""
    writer = frame.write.format(sink).mode("append")
    if sink == SINK_FORMAT:
        writer = writer.option("kafka.bootstrap.servers", kafka_bootstrap)
    for name, value in options.items():
        writer = writer.option(name, value)
    writer.save()


def failure(write_it: Callable[[], None]) -> str:
    """The text of the error a write must raise."""
    with pytest.raises(Exception) as raised:
        write_it()
    return str(raised.value)


# ---------------------------------------------------------------------- partitions
def sample_keys(kind: str) -> list[Any]:
    """Distinct keys: binary of 0 to 40 bytes (the empty key included), or strings with
    non-ASCII characters (the empty string included)."""
    rng = random.Random(251)
    keys: set[Any] = {b""} if kind == "binary" else {""}
    while len(keys) < KEYS:
        if kind == "binary":
            keys.add(rng.randbytes(rng.randrange(1, 41)))
        else:
            keys.add(f"ключ-{rng.randrange(10**9)}-🔑" if len(keys) % 2 else f"user-{len(keys)}")
    return sorted(keys)


@pytest.mark.parametrize("key_type", ["binary", "string"])
@pytest.mark.parametrize("partitioner", ["murmur2_random", "murmur2"])
def test_every_key_lands_on_the_partition_sparks_sink_chooses(
    spark: SparkSession,
    spark_sink: str,
    kafka_endpoint: KafkaEndpoint,
    partitioner: str,
    key_type: str,
) -> None:
    """durable-kafka's default partitioner (``murmur2_random``) and ``murmur2`` put every key
    where Spark's sink (the Java producer's murmur2) puts it; null keys go anywhere in both."""
    keys = sample_keys(key_type)
    rows = [(key, str(index)) for index, key in enumerate(keys)]
    rows += [(None, f"null-{index}") for index in range(20)]
    frame = spark.createDataFrame(rows, f"key {key_type}, value string").repartition(3)
    placed: dict[str, dict[bytes, int]] = {}
    for sink in SINKS:
        topic = kafka_endpoint.new_topic(partitions=PARTITIONS)
        options = {"kafka.partitioner": partitioner} if sink == SHORT_NAME else {}
        write(frame, sink, kafka_endpoint.read_bootstrap, topic=topic, **options)
        records = consume_all(kafka_endpoint.read_bootstrap, topic, expected=len(rows))
        assert len(records) == len(rows)
        placed[sink] = {record.value or b"": record.partition for record in records}
    keyed = [str(index).encode() for index in range(len(keys))]
    differ = [v for v in keyed if placed[SHORT_NAME][v] != placed[SINK_FORMAT][v]]
    assert differ == [], f"{len(differ)} of {len(keys)} keys on another partition"
    assert len(set(placed[SINK_FORMAT][v] for v in keyed)) == PARTITIONS


# ---------------------------------------------------------------------- columns
def all_columns(spark: SparkSession) -> DataFrame:
    """Every column both sinks take, with nulls where they are allowed, and two they ignore.

    ``topic`` holds a role ("a" or "b"), made a topic name per sink by ``with_topics``."""
    rng = random.Random(7)
    rows = []
    for index in range(600):
        key = None if index % 5 == 0 else b"" if index % 11 == 0 else rng.randbytes(12)
        headers: list[tuple[str, bytes | None]] | None = None
        if index % 3 == 1:
            headers = [("trace", b"t-%d" % index), ("trace", b"dup"), ("none", None)]
        elif index % 3 == 2:
            headers = []
        partition = index % 3 if index % 4 == 0 else None
        role = "a" if index % 2 else "b"
        rows.append((key, b"value-%d" % index, role, partition, headers, index, "ignored"))
    schema = (
        f"key binary, value binary, topic string, partition int, headers {HEADERS_SQL},"
        " other long, note string"
    )
    return spark.createDataFrame(rows, schema).repartition(2)


def with_topics(frame: DataFrame, topics: dict[str, str]) -> DataFrame:
    mapping = F.create_map(*[F.lit(x) for pair in topics.items() for x in pair])
    return frame.withColumn("topic", mapping[F.col("topic")])


def record_content(record: ConsumedRecord, role: str) -> tuple[Any, ...]:
    """What both sinks must agree on: the partition is compared where it is not the sticky
    choice for a null key."""
    partition = record.partition if record.key is not None else None
    return (role, partition, record.key, record.value, record.headers)


def test_the_same_columns_give_the_same_records(
    spark: SparkSession, spark_sink: str, kafka_endpoint: KafkaEndpoint
) -> None:
    frame = all_columns(spark)
    explicit = {
        b"value-%d" % index: index % 3 for index in range(600) if index % 4 == 0
    }  # rows with a partition
    contents: dict[str, Counter[tuple[Any, ...]]] = {}
    for sink in SINKS:
        topics = {role: kafka_endpoint.new_topic(partitions=3) for role in ("a", "b")}
        write(with_topics(frame, topics), sink, kafka_endpoint.read_bootstrap)
        found: Counter[tuple[Any, ...]] = Counter()
        for role, topic in topics.items():
            for record in consume_all(kafka_endpoint.read_bootstrap, topic, expected=300):
                if record.value in explicit:
                    assert record.partition == explicit[record.value]
                found[record_content(record, role)] += 1
        assert sum(found.values()) == 600
        contents[sink] = found
    assert contents[SHORT_NAME] == contents[SINK_FORMAT]


def test_the_topic_option_wins_over_the_column_in_both(
    spark: SparkSession, spark_sink: str, kafka_endpoint: KafkaEndpoint
) -> None:
    frame = spark.createDataFrame(
        [("elsewhere", "v1"), ("elsewhere", "v2")], "topic string, value string"
    )
    for sink in SINKS:
        topic = kafka_endpoint.new_topic(partitions=1)
        write(frame, sink, kafka_endpoint.read_bootstrap, topic=topic)
        records = consume_all(kafka_endpoint.read_bootstrap, topic, expected=2)
        assert sorted(record.value or b"" for record in records) == [b"v1", b"v2"]


def test_a_key_column_spelt_otherwise_is_ignored_by_both(
    spark: SparkSession, spark_sink: str, kafka_endpoint: KafkaEndpoint
) -> None:
    """Both sinks look their columns up by exact name: ``Key`` is not the key."""
    frame = spark.createDataFrame([("k1", "v1"), ("k2", "v2")], "Key string, value string")
    for sink in SINKS:
        topic = kafka_endpoint.new_topic(partitions=1)
        write(frame, sink, kafka_endpoint.read_bootstrap, topic=topic)
        records = consume_all(kafka_endpoint.read_bootstrap, topic, expected=2)
        assert [record.key for record in records] == [None, None], sink


# ---------------------------------------------------------------------- bad input
Frame = Callable[[SparkSession], DataFrame]


def frame_of(rows: list[tuple[Any, ...]], schema: str) -> Frame:
    return lambda spark: spark.createDataFrame(rows, schema).coalesce(1)


# (case, DataFrame, options, durable-kafka's message, Spark's sink's message). Options naming
# a topic get the test's topic for "{topic}".
BAD_INPUT: list[tuple[str, Frame, dict[str, str], str, str]] = [
    (
        "no value column",
        frame_of([("k",)], "key string"),
        {"topic": "{topic}"},
        "durable-kafka: required column 'value' (binary or string) is missing",
        "Required attribute 'value' not found",
    ),
    (
        "value spelt otherwise",
        frame_of([("v",)], "VALUE string"),
        {"topic": "{topic}"},
        "column names are case-sensitive",
        "Required attribute 'value' not found",
    ),
    (
        "value of another type",
        frame_of([(1,)], "value int"),
        {"topic": "{topic}"},
        "durable-kafka: column 'value' must be of type binary or string, got int",
        "value attribute unsupported type int",
    ),
    (
        "key of another type",
        frame_of([(1, "v")], "key int, value string"),
        {"topic": "{topic}"},
        "durable-kafka: column 'key' must be of type binary or string, got int",
        "key attribute unsupported type int",
    ),
    (
        "topic of another type",
        frame_of([(1, "v")], "topic int, value string"),
        {},
        "durable-kafka: column 'topic' must be of type string, got int",
        "topic attribute unsupported type int",
    ),
    (
        "partition of another type",
        frame_of([(1, "v")], "partition bigint, value string"),
        {"topic": "{topic}"},
        "durable-kafka: column 'partition' must be of type int, got bigint",
        "partition attribute unsupported type bigint",
    ),
    (
        "headers of another type",
        frame_of([({"a": "b"}, "v")], "headers map<string,string>, value string"),
        {"topic": "{topic}"},
        "durable-kafka: column 'headers' must be of type array<struct<key:string,value:binary>>",
        "headers attribute unsupported type map<string,string>",
    ),
    (
        "headers struct in another order",
        frame_of(
            [([(b"x", "a")], "v")], "headers array<struct<value:binary,key:string>>, value string"
        ),
        {"topic": "{topic}"},
        "got array<struct<value:binary,key:string>>",
        "headers attribute unsupported type array<struct<value:binary,key:string>>",
    ),
    (
        "no topic",
        frame_of([("v",)], "value string"),
        {},
        "durable-kafka: no topic: add a string column 'topic' or set the option 'topic'",
        "topic option required when no 'topic' attribute is present",
    ),
    (
        "null topic",
        frame_of([(None, "v")], "topic string, value string"),
        {},
        "durable-kafka: column 'topic' has 1 null topic(s)",
        "contains a null topic",
    ),
    (
        "illegal topic name",
        frame_of([("v",)], "value string"),
        {"topic": "bad topic!"},
        "durable-kafka: option 'topic': 'bad topic!' is not a valid Kafka topic name",
        "InvalidTopicException: Invalid topics: [bad topic!]",
    ),
    (
        "partition beyond the topic's",
        frame_of([(5, "v")], "partition int, value string"),
        {"topic": "{topic}"},
        "Unknown partition",
        "Partition 5 of topic",
    ),
    (
        "negative partition",
        frame_of([(-1, "v")], "partition int, value string"),
        {"topic": "{topic}"},
        "durable-kafka: column 'partition' has 1 negative value(s) (first -1 at row 0",
        "Invalid partition: -1",
    ),
    (
        "null header key",
        frame_of([([(None, b"a")], "v")], f"headers {HEADERS_SQL}, value string"),
        {"topic": "{topic}"},
        "durable-kafka: column 'headers' contains a null header or a header with a null key",
        "NullPointerException",
    ),
    (
        "Java-only producer setting",
        frame_of([("v",)], "value string"),
        {"topic": "{topic}", "kafka.key.serializer": "x"},
        "durable-kafka: option 'kafka.key.serializer' = 'x' is refused by the Kafka client",
        "Kafka option 'key.serializer' is not supported",
    ),
]


@pytest.mark.parametrize(
    ("make_frame", "options", "ours", "theirs"),
    [pytest.param(*case[1:], id=case[0]) for case in BAD_INPUT],
)
def test_bad_input_is_refused_by_both(
    spark: SparkSession,
    spark_sink: str,
    kafka_endpoint: KafkaEndpoint,
    make_frame: Frame,
    options: dict[str, str],
    ours: str,
    theirs: str,
) -> None:
    topic = kafka_endpoint.new_topic(partitions=2)
    frame = make_frame(spark)
    given = {name: value.format(topic=topic) for name, value in options.items()}
    bootstrap = kafka_endpoint.read_bootstrap
    ours_failed = failure(lambda: write(frame, SHORT_NAME, bootstrap, **given))
    theirs_failed = failure(lambda: write(frame, SINK_FORMAT, bootstrap, **given, **QUICK_METADATA))
    assert ours in ours_failed
    assert theirs in theirs_failed
    assert consume_all(kafka_endpoint.read_bootstrap, topic, timeout=5, idle=1) == []


@pytest.fixture
def agent_to_a_cluster_without_auto_creation(
    kafka_broker: KafkaBroker, tmp_path: Path
) -> Iterator[AgentProcess]:
    """An agent in front of the run's broker, which does not create topics on first use."""
    with AgentProcess(tmp_path / "volume", kafka_broker.bootstrap) as agent:
        yield agent


def test_a_topic_the_cluster_does_not_create_fails_both(
    spark: SparkSession,
    spark_sink: str,
    kafka_broker: KafkaBroker,
    agent_to_a_cluster_without_auto_creation: AgentProcess,
) -> None:
    """Spark's sink after ``max.block.ms`` (60 s by default); durable-kafka within seconds."""
    frame = frame_of([("v",)], "value string")(spark)
    topic = "never-created"
    ours = failure(
        lambda: write(
            frame,
            SHORT_NAME,
            "",
            topic=topic,
            bootstrap=agent_to_a_cluster_without_auto_creation.bootstrap,
        )
    )
    theirs = failure(
        lambda: write(frame, SINK_FORMAT, kafka_broker.bootstrap, topic=topic, **QUICK_METADATA)
    )
    assert f"durable-kafka: topic '{topic}' does not exist on the Kafka cluster" in ours
    assert f"Topic {topic} not present in metadata after 5000 ms" in theirs


# ---------------------------------------------------------------------- differences on purpose
def test_null_values_are_tombstones_in_sparks_sink_and_need_tombstones_true_in_ours(
    spark: SparkSession, spark_sink: str, kafka_endpoint: KafkaEndpoint
) -> None:
    """docs/spark.md: a null value is more often a bug than a delete."""
    frame = spark.createDataFrame([("k", None)], "key string, value string")
    bootstrap = kafka_endpoint.read_bootstrap
    refused = failure(
        lambda: write(frame, SHORT_NAME, bootstrap, topic=kafka_endpoint.new_topic(1))
    )
    assert "durable-kafka: column 'value' has 1 null value(s)" in refused
    assert "tombstones=true" in refused
    for sink, options in ((SINK_FORMAT, {}), (SHORT_NAME, {"tombstones": "true"})):
        topic = kafka_endpoint.new_topic(partitions=1)
        write(frame, sink, bootstrap, topic=topic, **options)
        [record] = consume_all(bootstrap, topic, expected=1)
        assert (record.key, record.value) == (b"k", None), sink


def test_the_default_save_mode_works_only_in_sparks_sink(
    spark: SparkSession, spark_sink: str, kafka_endpoint: KafkaEndpoint
) -> None:
    """PySpark refuses ErrorIfExists for every Python data source: ``mode("append")``."""
    frame = spark.createDataFrame([("v",)], "value string")
    topic = kafka_endpoint.new_topic(partitions=1)
    bootstrap = kafka_endpoint.read_bootstrap
    frame.write.format(SINK_FORMAT).option("kafka.bootstrap.servers", bootstrap).option(
        "topic", topic
    ).save()
    refused = failure(lambda: frame.write.format(SHORT_NAME).option("topic", topic).save())
    assert 'cannot be written in the "ErrorIfExists" mode' in refused
    assert len(consume_all(bootstrap, topic, expected=1)) == 1
