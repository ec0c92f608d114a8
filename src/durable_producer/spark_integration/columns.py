"""The columns of Spark's own Kafka sink, checked against a DataFrame's schema on the driver.

Same rules as Spark's Kafka sink (``KafkaWriter``): ``value`` is required; ``key``,
``partition`` and ``headers`` are optional; ``topic`` is required unless the ``topic`` option
is set (the option then wins over the column). Other columns are ignored. Names match exactly,
case included, as the sink looks them up (``schema.find(_.name == ...)``, not through the
analyzer): Spark writes null keys for a DataFrame whose key column is ``Key``, and so does
durable-kafka, with a warning on the driver, rather than writing other records. The headers
type is compared as Spark does (field names in any case, in the order key, value).
"""

from __future__ import annotations

import logging
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

SINK_COLUMNS = (KEY, VALUE, TOPIC, PARTITION, HEADERS)
HEADERS_TYPE_TEXT = "array<struct<key:string,value:binary>>"

log = logging.getLogger(__name__)


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
    by_name = {field.name: field for field in schema.fields}
    spelt_otherwise = {
        field.name: field.name.lower()
        for field in schema.fields
        if field.name.lower() in SINK_COLUMNS and field.name not in SINK_COLUMNS
    }
    value = by_name.get(VALUE)
    if value is None:
        hint = (
            f" (column names are case-sensitive, as in Spark's Kafka sink: rename"
            f" {sorted(spelt_otherwise)} to their lower-case names)"
            if spelt_otherwise
            else ""
        )
        raise SinkSchemaError(
            "durable-kafka: required column 'value' (binary or string) is missing; "
            f"the DataFrame has columns {[field.name for field in schema.fields]}{hint}"
        )
    for name, meant in sorted(spelt_otherwise.items()):
        log.warning(
            "durable-kafka: column %r is ignored: the sink's column is %r (names are"
            " case-sensitive, as in Spark's Kafka sink, which ignores it too); rename it",
            name,
            meant,
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
    """``array<struct<key:string,value:binary>>``, ignoring case and nullability (Spark's
    ``DataTypeUtils.sameType`` by default); the struct's fields are read by position."""
    if not isinstance(data_type, ArrayType):
        return False
    element = data_type.elementType
    if not isinstance(element, StructType) or len(element.fields) != 2:
        return False
    key, value = element.fields
    return (
        key.name.lower() == KEY
        and isinstance(key.dataType, StringType)
        and value.name.lower() == VALUE
        and isinstance(value.dataType, BinaryType)
    )
