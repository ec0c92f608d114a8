"""The task side of durable-kafka: Arrow record batches -> confluent-kafka -> buffer agent.

A task succeeds only when every record it produced was acknowledged (``acks=all`` by the
agent, which answers only once the batch is in its write-ahead log). Successful
deliveries generate no callbacks (``delivery.report.only.error``), so the per-row Python
work is one ``produce`` call; failures are counted and fail the task.

Nothing here depends on a running Spark: it takes ``pyarrow.RecordBatch`` objects.
"""

from __future__ import annotations

import logging
import socket
import time
from collections.abc import Iterable
from itertools import repeat
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from confluent_kafka import KafkaError, Message, Producer

from durable_producer.contract import BOOTSTRAP_TWIN_ENV
from durable_producer.spark_integration.columns import SinkColumns
from durable_producer.spark_integration.errors import (
    AgentUnreachableError,
    DeliveryError,
    InvalidPartitionError,
    MissingTopicError,
    NullValueError,
)
from durable_producer.spark_integration.options import (
    SinkOptions,
    agent_bypass_warning,
    bootstrap_addresses,
    resolve_bootstrap,
)
from durable_producer.spark_integration.task_attempts import (
    TaskAttempt,
    report_failure,
    report_start,
    report_success,
)
from durable_producer.spark_integration.topic_names import TopicNameCheck

log = logging.getLogger(__name__)

# librdkafka's "use the partitioner" partition number (RD_KAFKA_PARTITION_UA).
ANY_PARTITION = -1
_QUEUE_FULL_POLL_SECONDS = 0.05
_PROBE_RETRY_SECONDS = 0.2
_MAX_ERRORS_KEPT = 5
# Delivery errors meaning "this topic does not exist and will not be created": the agent
# answers TOPIC_AUTHORIZATION_FAILED when the cluster would not create it (as Kafka does for
# a client that may not create it), a broker UNKNOWN_TOPIC_OR_PART after its own wait.
_MISSING_TOPIC_ERRORS = frozenset(
    {
        KafkaError.TOPIC_AUTHORIZATION_FAILED,
        KafkaError.UNKNOWN_TOPIC_OR_PART,
        KafkaError._UNKNOWN_TOPIC,
    }
)


def wait_for_agent(bootstrap: str, wait_seconds: float) -> None:
    """Return once some bootstrap address accepts a TCP connection, else raise a clear error.

    Probing before creating the producer turns "no agent" into an immediate, explicit
    failure instead of records timing out minutes later.
    """
    addresses = bootstrap_addresses(bootstrap)
    deadline = time.monotonic() + wait_seconds
    last_error: OSError | None = None
    while True:
        for host, port in addresses:
            try:
                with socket.create_connection((host, port), timeout=min(1.0, wait_seconds)):
                    return
            except OSError as error:
                last_error = error
        if time.monotonic() >= deadline:
            break
        time.sleep(_PROBE_RETRY_SECONDS)
    raise AgentUnreachableError(
        f"durable-kafka: cannot connect to the buffer agent at {bootstrap} "
        f"({last_error}; waited {wait_seconds:g}s). The durable-producer buffer agent sidecar "
        f"must be running in this pod and listening there: check that the pod carries the "
        f"durable.dev/producer label and that ${BOOTSTRAP_TWIN_ENV} (or the 'bootstrap' option) "
        f"points at the agent."
    )


class BatchProducer:
    """Produces Arrow record batches of the sink's columns; ``finish()`` waits for every ack."""

    def __init__(self, options: SinkOptions, columns: SinkColumns) -> None:
        self.bootstrap = resolve_bootstrap(options.bootstrap)
        bypass = agent_bypass_warning(options.bootstrap)
        if bypass is not None:
            log.warning(bypass)
        self.options = options
        self.columns = columns
        self.produced = 0
        self.failed = 0
        self.errors: list[str] = []
        self.missing_topics: set[str] = set()
        self.last_client_error: str | None = None
        self._topic_names = TopicNameCheck()
        wait_for_agent(self.bootstrap, options.agent_wait_seconds)
        config: dict[str, Any] = dict(options.producer_config(self.bootstrap))
        config["on_delivery"] = self._on_delivery
        config["error_cb"] = self._on_client_error
        self._producer = Producer(config)

    def _on_delivery(self, error: KafkaError | None, message: Message) -> None:
        if error is None:
            return
        self.failed += 1
        if error.code() in _MISSING_TOPIC_ERRORS:
            self.missing_topics.add(str(message.topic()))
        if len(self.errors) < _MAX_ERRORS_KEPT:
            self.errors.append(f"{message.topic()}[{message.partition()}]: {error.str()}")

    def _on_client_error(self, error: KafkaError) -> None:
        self.last_client_error = error.str()
        if error.fatal():
            self.failed += 1
            self.errors.append(f"fatal producer error: {error.str()}")

    def write_batches(self, batches: Iterable[pa.RecordBatch]) -> int:
        """Produce every row of ``batches``; return the number of rows produced."""
        for batch in batches:
            self.write_batch(batch)
        return self.produced

    def write_batch(self, batch: pa.RecordBatch) -> None:
        rows = batch.num_rows
        if rows == 0:
            return
        values = self._values(batch)
        keys = self._optional_column(batch, self.columns.key, rows)
        topics = self._topics(batch, rows)
        partitions = self._partitions(batch, rows)
        produce = self._producer.produce
        if self.columns.headers is None:
            for topic, value, key, partition in zip(topics, values, keys, partitions, strict=True):
                try:
                    produce(topic, value, key, partition)
                except BufferError:
                    self._wait_for_queue_space(topic, value, key, partition, None)
        else:
            headers = header_lists(batch.column(self.columns.headers))
            rows_with_headers = zip(topics, values, keys, partitions, headers, strict=True)
            for topic, value, key, partition, header_list in rows_with_headers:
                try:
                    produce(topic, value, key, partition, headers=header_list)
                except BufferError:
                    self._wait_for_queue_space(topic, value, key, partition, header_list)
        self.produced += rows
        self._producer.poll(0)
        self._raise_if_failed()

    def _wait_for_queue_space(
        self,
        topic: str,
        value: bytes | str | None,
        key: bytes | str | None,
        partition: int,
        headers: list[tuple[str, str | bytes | None]] | None,
    ) -> None:
        """The client's queue is full: serve callbacks until the record fits."""
        while True:
            self._producer.poll(_QUEUE_FULL_POLL_SECONDS)
            self._raise_if_failed()
            try:
                self._producer.produce(topic, value, key, partition, headers=headers)
                return
            except BufferError:
                continue

    def finish(self) -> int:
        """Wait until every produced record is acknowledged; raise ``DeliveryError`` otherwise."""
        timeout = self.options.flush_timeout_seconds
        deadline = time.monotonic() + timeout
        remaining = self._producer.flush(0)
        while remaining > 0:
            self._raise_if_failed()
            left = deadline - time.monotonic()
            if left <= 0:
                raise DeliveryError(
                    f"durable-kafka: {remaining} of {self.produced} records were not acknowledged "
                    f"by the buffer agent at {self.bootstrap} within {timeout:g}s "
                    f"(last client error: {self.last_client_error or 'none'}); "
                    f"the task fails so that Spark retries it"
                )
            remaining = self._producer.flush(min(1.0, left))
        self._raise_if_failed()
        return self.produced

    def acknowledged(self) -> int:
        """Records acknowledged so far: produced, neither failed nor still waiting."""
        return max(0, self.produced - self.failed - len(self._producer))

    def release(self) -> None:
        """Destroy the client now, its threads ended. It and this object hold each other (its
        callbacks are this object's methods), so otherwise it lives until a garbage collection:
        in a reused Spark Python worker, threads and connections piling up between collections,
        and a client still alive when a process exits can crash the exit (``exit()`` tears
        down the OpenSSL that librdkafka's threads use). Nothing of this object works after."""
        del self._producer

    def abandon(self) -> None:
        """Drop whatever is still queued (the task failed; Spark will retry it)."""
        self._producer.purge()
        self._producer.flush(0)

    def _raise_if_failed(self) -> None:
        if self.missing_topics:
            names = ", ".join(repr(name) for name in sorted(self.missing_topics))
            raise MissingTopicError(
                f"durable-kafka: topic {names} does not exist on the Kafka cluster and was not "
                f"created: the cluster does not create topics on first use "
                f"(auto.create.topics.enable=false, or the buffer agent's "
                f"allow.auto.create.topics=false), or it does not let this client use the "
                f"topic. Create the topic first (e.g. kafka-topics.sh --create --topic NAME) "
                f"or correct the name; first errors: {self.errors}"
            )
        if self.failed:
            raise DeliveryError(
                f"durable-kafka: {self.failed} of {self.produced} records were not acknowledged "
                f"by the buffer agent at {self.bootstrap}; first errors: {self.errors}; "
                f"the task fails so that Spark retries it (records already acknowledged "
                f"may be written again: delivery is at-least-once)"
            )

    def _values(self, batch: pa.RecordBatch) -> list[Any]:
        column = batch.column(self.columns.value)
        if column.null_count and not self.options.tombstones:
            raise NullValueError(
                f"durable-kafka: column {self.columns.value!r} has {column.null_count} null "
                f"value(s) (first at row {first_null_row(column)} of this batch); set the option "
                f"tombstones=true to write them as Kafka tombstones, or filter them out"
            )
        values: list[Any] = column.to_pylist()
        return values

    def _topics(self, batch: pa.RecordBatch, rows: int) -> Iterable[str]:
        if self.columns.topic is None:
            assert self.options.topic is not None
            return repeat(self.options.topic, rows)
        column = batch.column(self.columns.topic)
        if column.null_count:
            raise NullValueError(
                f"durable-kafka: column {self.columns.topic!r} has {column.null_count} null "
                f"topic(s) (first at row {first_null_row(column)} of this batch); every row needs "
                f"a topic, or set the option 'topic'"
            )
        topics: list[str] = column.to_pylist()
        self._topic_names.check_all(topics)
        return topics

    def _partitions(self, batch: pa.RecordBatch, rows: int) -> Iterable[int]:
        if self.columns.partition is None:
            return repeat(ANY_PARTITION, rows)
        return partition_numbers(batch.column(self.columns.partition))

    @staticmethod
    def _optional_column(batch: pa.RecordBatch, name: str | None, rows: int) -> Iterable[Any]:
        if name is None:
            return repeat(None, rows)
        values: list[Any] = batch.column(name).to_pylist()
        return values


def partition_numbers(column: pa.Array) -> list[int]:
    """The ``partition`` column as librdkafka wants it: null is ``ANY_PARTITION``.

    A negative number fails the task, as in Spark's sink (the Java producer's "Invalid
    partition"): -1 is librdkafka's "any partition", which would put the row anywhere."""
    negative = pc.less(column, 0)
    count = pc.sum(negative).as_py() or 0
    if count:
        row = int(pc.index(negative, True).as_py())
        raise InvalidPartitionError(
            f"durable-kafka: column 'partition' has {count} negative value(s) (first"
            f" {column[row].as_py()} at row {row} of this batch); a partition is a number from"
            f" 0, or null to let the partitioner choose"
        )
    if column.null_count:
        column = pc.fill_null(column, ANY_PARTITION)
    partitions: list[int] = column.to_pylist()
    return partitions


def header_lists(column: pa.Array) -> list[list[tuple[str, str | bytes | None]] | None]:
    """Per row, the headers as confluent-kafka wants them: a list of (key, value) pairs.

    Converts the flattened header keys and values once, then slices per row, instead of
    building a dict per header.
    """
    entries = pc.list_flatten(column)
    keys = pc.struct_field(entries, [0])  # by position, as Spark's sink reads them
    if entries.null_count or keys.null_count:
        raise NullValueError(
            "durable-kafka: column 'headers' contains a null header or a header with a null "
            "key; header keys must be strings (header values may be null)"
        )
    values = pc.struct_field(entries, [1])
    pairs = list(zip(keys.to_pylist(), values.to_pylist(), strict=True))
    rows: list[list[tuple[str, str | bytes | None]] | None] = []
    start = 0
    for length in pc.list_value_length(column).to_pylist():
        if length is None:
            rows.append(None)
        else:
            end = start + length
            rows.append(pairs[start:end])
            start = end
    return rows


def first_null_row(column: pa.Array) -> int:
    return int(pc.index(pc.is_null(column), True).as_py())


def produce_all(
    batches: Iterable[pa.RecordBatch],
    options: SinkOptions,
    columns: SinkColumns,
    task: TaskAttempt | None = None,
) -> int:
    """Produce every row and wait for every acknowledgement; the number of rows written.

    With ``task``, a retried attempt and a failed one are reported (``task_attempts``).
    """
    if task is not None:
        report_start(task)
    producer = BatchProducer(options, columns)
    try:
        producer.write_batches(batches)
        rows = producer.finish()
    except BaseException:
        if task is not None:
            report_failure(task, producer.acknowledged(), producer.produced)
        producer.abandon()
        raise
    finally:
        producer.release()
    if task is not None:
        report_success(task, rows)
    return rows
