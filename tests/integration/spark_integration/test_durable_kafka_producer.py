"""The task-side producer against a real broker, without Spark: Arrow batches in, records out."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pyarrow as pa
import pytest

from durable_producer.spark_integration import producer as producer_module
from durable_producer.spark_integration.columns import SinkColumns
from durable_producer.spark_integration.errors import AgentUnreachableError, NullValueError
from durable_producer.spark_integration.options import SinkOptions
from durable_producer.spark_integration.producer import produce_all
from support.broker import consume_all, free_port
from support.threads import clients_freed

pytestmark = pytest.mark.integration

HEADERS_TYPE = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))
ALL_COLUMNS = SinkColumns(
    value="value", key="key", topic="topic", partition="partition", headers="headers"
)


@pytest.fixture()
def destroyed(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """The tasks' producers freed so far, the collector off: a task's client is destroyed, not
    left to the collector or to the process's exit (which a live librdkafka client can crash)."""
    with clients_freed(monkeypatch, producer_module, "Producer") as freed:
        yield freed


def test_every_column_arrives_as_written(kafka_endpoint, destroyed: list[int]) -> None:
    topic = kafka_endpoint.new_topic(partitions=2)
    batch = pa.record_batch(
        {
            "key": pa.array([b"k0", None, b"k2"], pa.binary()),
            "value": pa.array(["v0", "v1", "v2"], pa.string()),
            "topic": pa.array([topic] * 3),
            "partition": pa.array([1, 0, None], pa.int32()),
            "headers": pa.array(
                [[{"key": "h", "value": b"x"}, {"key": "n", "value": None}], None, []],
                HEADERS_TYPE,
            ),
        }
    )
    options = SinkOptions(bootstrap=kafka_endpoint.write_bootstrap)
    assert produce_all([batch, batch.slice(1, 1)], options, ALL_COLUMNS) == 4
    assert len(destroyed) == 1

    records = consume_all(kafka_endpoint.read_bootstrap, topic, expected=4)
    by_value: dict[bytes | None, list] = {}
    for record in records:
        by_value.setdefault(record.value, []).append(record)
    assert sorted(by_value) == [b"v0", b"v1", b"v2"]
    assert len(by_value[b"v1"]) == 2
    (v0,) = by_value[b"v0"]
    assert (v0.key, v0.partition, v0.headers) == (b"k0", 1, (("h", b"x"), ("n", None)))
    assert {(r.key, r.partition, r.headers) for r in by_value[b"v1"]} == {(None, 0, ())}
    assert by_value[b"v2"][0].key == b"k2"


def test_tombstones_are_written_only_when_enabled(kafka_endpoint, destroyed: list[int]) -> None:
    topic = kafka_endpoint.new_topic(partitions=1)
    batch = pa.record_batch({"key": [b"a", b"b"], "value": pa.array([b"1", None], pa.binary())})
    columns = SinkColumns(value="value", key="key")
    options = SinkOptions(bootstrap=kafka_endpoint.write_bootstrap, topic=topic)
    with pytest.raises(
        NullValueError, match=r"column 'value' has 1 null value\(s\) \(first at row 1"
    ):
        produce_all([batch], options, columns)
    assert len(destroyed) == 1  # a failed task's client too

    tombstones = SinkOptions(bootstrap=kafka_endpoint.write_bootstrap, topic=topic, tombstones=True)
    assert produce_all([batch], tombstones, columns) == 2
    records = consume_all(kafka_endpoint.read_bootstrap, topic, expected=2)
    assert [(r.key, r.value) for r in records] == [(b"a", b"1"), (b"b", None)]


def test_null_topic_and_null_header_key_are_refused(kafka_endpoint) -> None:
    options = SinkOptions(bootstrap=kafka_endpoint.write_bootstrap)
    null_topic = pa.record_batch({"value": [b"v"], "topic": pa.array([None], pa.string())})
    with pytest.raises(NullValueError, match="null topic"):
        produce_all([null_topic], options, SinkColumns(value="value", topic="topic"))

    null_header_key = pa.record_batch(
        {"value": [b"v"], "headers": pa.array([[{"key": None, "value": b"x"}]], HEADERS_TYPE)}
    )
    with pytest.raises(NullValueError, match="header keys must be strings"):
        produce_all(
            [null_header_key],
            SinkOptions(bootstrap=kafka_endpoint.write_bootstrap, topic="t"),
            SinkColumns(value="value", headers="headers"),
        )


def test_unreachable_agent_fails_fast_naming_the_address() -> None:
    address = f"127.0.0.1:{free_port()}"
    options = SinkOptions(bootstrap=address, topic="t", agent_wait_seconds=0.5)
    started = time.monotonic()
    with pytest.raises(AgentUnreachableError) as raised:
        produce_all([pa.record_batch({"value": [b"v"]})], options, SinkColumns(value="value"))
    assert time.monotonic() - started < 5
    message = str(raised.value)
    assert f"cannot connect to the buffer agent at {address}" in message
    assert "buffer agent sidecar must be running" in message
