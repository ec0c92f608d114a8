"""Keys land on the partition Spark's own Kafka sink (the Java producer) would choose.

The expected partition comes from an independent murmur2: kafka-python's port of the Java
client's ``Utils.murmur2``, with the Java producer's ``toPositive(murmur2(key)) % partitions``.
"""

from __future__ import annotations

import random
from collections import Counter

import pytest
from kafka.partitioner.default import murmur2
from pyspark.sql import SparkSession

from durable_producer.spark_integration.data_source import SHORT_NAME
from integration.spark_integration.spark_harness import KafkaEndpoint
from support.broker import consume_all

pytestmark = pytest.mark.integration

PARTITIONS = 7
KEYS = 10_000


def java_partition(key: bytes, partitions: int) -> int:
    """``BuiltInPartitioner.partitionForKey`` of the Java producer."""
    return (murmur2(key) & 0x7FFFFFFF) % partitions


def sample_keys() -> list[bytes]:
    """ASCII, unicode, binary and empty keys of 0 to 40 bytes; all distinct."""
    rng = random.Random(19)
    keys: set[bytes] = {b""}
    while len(keys) < KEYS:
        kind = len(keys) % 4
        if kind == 0:
            keys.add(f"user-{rng.randrange(10**9)}".encode())
        elif kind == 1:
            keys.add(f"ключ-{rng.randrange(10**6)}-🔑".encode())
        elif kind == 2:
            keys.add(rng.randbytes(rng.randrange(1, 41)))
        else:
            keys.add(str(rng.randrange(10**12)).encode())
    return sorted(keys)


def test_keyed_rows_land_where_the_java_producer_puts_them(
    spark: SparkSession, kafka_endpoint: KafkaEndpoint
) -> None:
    topic = kafka_endpoint.new_topic(partitions=PARTITIONS)
    keys = sample_keys()
    rows = [(key, f"row-{index}".encode()) for index, key in enumerate(keys)]
    rows += [(None, f"null-{index}".encode()) for index in range(50)]
    frame = spark.createDataFrame(rows, "key binary, value binary").repartition(4)
    frame.write.format(SHORT_NAME).option("topic", topic).mode("append").save()

    records = consume_all(kafka_endpoint.read_bootstrap, topic, expected=len(rows), timeout=120)
    assert len(records) == len(rows)
    keyed = [record for record in records if record.key is not None]
    assert len(keyed) == KEYS
    wrong = [
        (record.key, record.partition, java_partition(record.key, PARTITIONS))
        for record in keyed
        if record.partition != java_partition(record.key, PARTITIONS)
    ]
    assert wrong == [], f"{len(wrong)} of {KEYS} keys on another partition than Java's"
    assert b"" in {record.key for record in keyed}  # the empty key is hashed, not random
    spread = Counter(record.partition for record in keyed)
    assert sorted(spread) == list(range(PARTITIONS))
    nulls = [record for record in records if record.key is None]
    assert len(nulls) == 50
    assert all(0 <= record.partition < PARTITIONS for record in nulls)
