"""The columns of Spark's own Kafka sink, checked against a DataFrame's schema on the driver.

Same rules as Spark's Kafka sink: ``value`` is required; ``key``, ``partition`` and
``headers`` are optional; ``topic`` is required unless the ``topic`` option is set (the
option then wins over the column). Other columns are ignored. Names match
case-insensitively, as Spark's analyzer does by default.
"""

from __future__ import annotations

from dataclasses import dataclass

from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    DataType,
    IntegerType,
    StringType,
    StructType,
)

from durable_producer.spark_integration.errors import SinkSchemaError

KEY = "key"
VALUE = "value"
TOPIC = "topic"
PARTITION = "partition"
HEADERS = "headers"

HEADERS_TYPE_TEXT = "array<struct<key:string,value:binary>>"


@dataclass(frozen=True)
class SinkColumns:
    """Actual column names (as spelled in the DataFrame) of each sink column present."""

    value: str
    key: str | None = None
    topic: str | None = None
    partition: str | None = None
    headers: str | None = None


def resolve_columns(schema: StructType, topic_option: str | None) -> SinkColumns:
    """Check ``schema`` against the sink's columns; raise ``SinkSchemaError`` naming the culprit."""
    by_name = {field.name.lower(): field for field in schema.fields}
    value = by_name.get(VALUE)
    if value is None:
        raise SinkSchemaError(
            "durable-kafka: required column 'value' (binary or string) is missing; "
            f"the DataFrame has columns {[field.name for field in schema.fields]}"
        )
    _require_binary_or_string(VALUE, value.dataType)
    key = by_name.get(KEY)
    if key is not None:
        _require_binary_or_string(KEY, key.dataType)
    topic = by_name.get(TOPIC)
    if topic is not None and not isinstance(topic.dataType, StringType):
        raise SinkSchemaError(
            f"durable-kafka: column 'topic' must be of type string, "
            f"got {topic.dataType.simpleString()}"
        )
    if topic is None and not topic_option:
        raise SinkSchemaError(
            "durable-kafka: no topic: add a string column 'topic' or set the option 'topic'"
        )
    partition = by_name.get(PARTITION)
    if partition is not None and not isinstance(partition.dataType, IntegerType):
        raise SinkSchemaError(
            f"durable-kafka: column 'partition' must be of type int, "
            f"got {partition.dataType.simpleString()}"
        )
    headers = by_name.get(HEADERS)
    if headers is not None and not _is_headers_type(headers.dataType):
        raise SinkSchemaError(
            f"durable-kafka: column 'headers' must be of type {HEADERS_TYPE_TEXT}, "
            f"got {headers.dataType.simpleString()}"
        )
    return SinkColumns(
        value=value.name,
        key=key.name if key is not None else None,
        topic=topic.name if topic is not None and not topic_option else None,
        partition=partition.name if partition is not None else None,
        headers=headers.name if headers is not None else None,
    )


def _require_binary_or_string(column: str, data_type: DataType) -> None:
    if not isinstance(data_type, BinaryType | StringType):
        raise SinkSchemaError(
            f"durable-kafka: column {column!r} must be of type binary or string, "
            f"got {data_type.simpleString()} (cast it, e.g. CAST({column} AS STRING))"
        )


def _is_headers_type(data_type: DataType) -> bool:
    if not isinstance(data_type, ArrayType):
        return False
    element = data_type.elementType
    if not isinstance(element, StructType) or len(element.fields) != 2:
        return False
    fields = {field.name: field.dataType for field in element.fields}
    return isinstance(fields.get(KEY), StringType) and isinstance(fields.get(VALUE), BinaryType)
