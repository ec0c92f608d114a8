"""Schema checks of the durable-kafka data source (Spark's Kafka sink columns)."""

from __future__ import annotations

import pytest
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
)

from durable_producer.spark_integration.columns import SinkColumns, resolve_columns
from durable_producer.spark_integration.errors import SinkSchemaError

HEADERS = ArrayType(
    StructType([StructField("key", StringType()), StructField("value", BinaryType())])
)


def schema(**columns: object) -> StructType:
    return StructType([StructField(name, data_type) for name, data_type in columns.items()])  # type: ignore[arg-type]


def test_all_sink_columns_are_resolved() -> None:
    resolved = resolve_columns(
        schema(
            key=BinaryType(),
            value=StringType(),
            topic=StringType(),
            partition=IntegerType(),
            headers=HEADERS,
            extra=LongType(),
        ),
        topic_option=None,
    )
    assert resolved == SinkColumns(
        value="value", key="key", topic="topic", partition="partition", headers="headers"
    )


def test_value_alone_with_topic_option_is_enough() -> None:
    assert resolve_columns(schema(value=BinaryType()), "events") == SinkColumns(value="value")


def test_topic_option_overrides_the_topic_column() -> None:
    resolved = resolve_columns(schema(value=BinaryType(), topic=StringType()), "events")
    assert resolved.topic is None


def test_column_names_are_case_sensitive_as_in_sparks_kafka_sink(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Spark's sink looks its columns up by exact name: with 'Key' it writes null keys, so
    durable-kafka ignores 'Key' too (with a warning) rather than writing other records."""
    resolved = resolve_columns(schema(value=BinaryType(), Key=StringType()), "events")
    assert resolved == SinkColumns(value="value")
    assert "column 'Key' is ignored" in caplog.text and "'key'" in caplog.text


def test_a_value_column_spelt_otherwise_is_missing_with_a_hint() -> None:
    with pytest.raises(SinkSchemaError, match=r"'value'.*missing.*\['VALUE'\].*case-sensitive"):
        resolve_columns(schema(VALUE=BinaryType()), "events")


def test_headers_are_read_by_position_with_field_names_in_any_case() -> None:
    """Spark's sink compares the headers type with array<struct<key:string,value:binary>>
    ignoring case and nullability, and reads the struct's fields by position."""
    spelt = ArrayType(
        StructType([StructField("Key", StringType()), StructField("VALUE", BinaryType())])
    )
    assert resolve_columns(schema(value=BinaryType(), headers=spelt), "events").headers == (
        "headers"
    )


def test_missing_value_column_lists_the_columns_present() -> None:
    with pytest.raises(SinkSchemaError, match=r"'value'.*missing.*\['key', 'payload'\]"):
        resolve_columns(schema(key=BinaryType(), payload=BinaryType()), "events")


def test_missing_topic_says_how_to_provide_one() -> None:
    with pytest.raises(SinkSchemaError, match="option 'topic'"):
        resolve_columns(schema(value=BinaryType()), None)


@pytest.mark.parametrize(
    ("columns", "message"),
    [
        ({"value": LongType()}, "column 'value' must be of type binary or string, got bigint"),
        (
            {"value": BinaryType(), "key": IntegerType()},
            "column 'key' must be of type binary or string, got int",
        ),
        (
            {"value": BinaryType(), "topic": BinaryType()},
            "column 'topic' must be of type string, got binary",
        ),
        (
            {"value": BinaryType(), "partition": LongType()},
            "column 'partition' must be of type int, got bigint",
        ),
        (
            {"value": BinaryType(), "headers": ArrayType(StringType())},
            r"column 'headers' must be of type array<struct<key:string,value:binary>>, "
            r"got array<string>",
        ),
        (
            {
                "value": BinaryType(),
                "headers": ArrayType(
                    StructType(
                        [StructField("key", StringType()), StructField("value", StringType())]
                    )
                ),
            },
            "column 'headers' must be of type",
        ),
        (
            {
                "value": BinaryType(),
                "headers": ArrayType(
                    StructType(
                        [StructField("value", BinaryType()), StructField("key", StringType())]
                    )
                ),
            },
            r"got array<struct<value:binary,key:string>>",
        ),
    ],
)
def test_wrong_types_name_the_column_and_the_expected_type(
    columns: dict[str, object], message: str
) -> None:
    with pytest.raises(SinkSchemaError, match=message):
        resolve_columns(schema(**columns), "events")
