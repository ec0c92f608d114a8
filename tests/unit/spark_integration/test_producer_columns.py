"""Column conversions of the task-side producer (pure Arrow, no broker)."""

from __future__ import annotations

import pyarrow as pa
import pytest

from durable_producer.spark_integration.errors import InvalidPartitionError, NullValueError
from durable_producer.spark_integration.producer import (
    ANY_PARTITION,
    first_null_row,
    header_lists,
    partition_numbers,
)

HEADERS_TYPE = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))


def test_header_lists_become_key_value_pairs_per_row() -> None:
    column = pa.array(
        [[{"key": "a", "value": b"1"}, {"key": "b", "value": None}], None, []], HEADERS_TYPE
    )
    assert list(header_lists(column)) == [[("a", b"1"), ("b", None)], None, []]


def test_header_lists_of_a_sliced_column_keep_their_rows() -> None:
    column = pa.array(
        [
            [{"key": "a", "value": b"1"}],
            [{"key": "b", "value": b"2"}],
            [{"key": "c", "value": b"3"}],
        ],
        HEADERS_TYPE,
    )
    assert list(header_lists(column.slice(1, 2))) == [[("b", b"2")], [("c", b"3")]]


@pytest.mark.parametrize(
    "rows",
    [[[{"key": None, "value": b"x"}]], [[None]]],
    ids=["null header key", "null header"],
)
def test_null_header_keys_are_refused(rows: list) -> None:
    with pytest.raises(NullValueError, match="header keys must be strings"):
        list(header_lists(pa.array(rows, HEADERS_TYPE)))


def test_first_null_is_the_row_index_within_the_batch() -> None:
    assert first_null_row(pa.array([b"a", b"b", None, None], pa.binary())) == 2


def test_header_fields_are_read_by_position() -> None:
    spelt = pa.list_(pa.struct([("Key", pa.string()), ("VALUE", pa.binary())]))
    column = pa.array([[{"Key": "a", "VALUE": b"1"}]], spelt)
    assert list(header_lists(column)) == [[("a", b"1")]]


def test_null_partitions_are_left_to_the_partitioner() -> None:
    assert partition_numbers(pa.array([0, None, 3], pa.int32())) == [0, ANY_PARTITION, 3]


@pytest.mark.parametrize("negative", [-1, -2])
def test_a_negative_partition_fails_the_task(negative: int) -> None:
    """Spark's sink fails the task (IllegalArgumentException: Invalid partition); -1 is
    librdkafka's "any partition", which would have put the row anywhere without a word."""
    with pytest.raises(InvalidPartitionError) as raised:
        partition_numbers(pa.array([0, None, negative, negative], pa.int32()))
    assert str(raised.value).startswith(
        f"durable-kafka: column 'partition' has 2 negative value(s) (first {negative} at row 2"
    )
