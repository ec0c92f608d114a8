"""Column conversions of the task-side producer (pure Arrow, no broker)."""

from __future__ import annotations

import pyarrow as pa
import pytest

from durable_producer.spark_integration.errors import NullValueError
from durable_producer.spark_integration.producer import first_null_row, header_lists

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
