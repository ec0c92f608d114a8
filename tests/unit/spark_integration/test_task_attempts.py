"""Duplicates from Spark task retries: counted in the log lines of attempts and commits."""

from __future__ import annotations

import logging

import pytest

from durable_producer.spark_integration.columns import SinkColumns
from durable_producer.spark_integration.data_source import (
    DurableKafkaBatchWriter,
    DurableKafkaCommitMessage,
)
from durable_producer.spark_integration.options import SinkOptions
from durable_producer.spark_integration.task_attempts import (
    TaskAttempt,
    report_failure,
    report_start,
    report_success,
)


def test_outside_spark_the_attempt_is_a_first_one() -> None:
    assert TaskAttempt.current() == TaskAttempt(partition=-1, attempt=0)
    assert not TaskAttempt.current().is_retry


def test_first_attempts_say_nothing_retries_and_failures_count_rows(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING)
    first, retry = TaskAttempt(3, 0), TaskAttempt(3, 1)
    report_start(first)
    report_success(first, 10)
    assert caplog.messages == []
    report_failure(first, acknowledged=400, produced=1000)
    report_start(retry)
    report_success(retry, 5000)
    assert caplog.messages[0] == (
        "durable-kafka: partition 3, attempt 1 failed after 400 of 1000 rows produced so far "
        "were acknowledged; a retry of this task writes them again: those 400 become "
        "duplicates in Kafka, and up to 600 more if they reached the agent without an answer"
    )
    assert "partition 3, attempt 2: retrying a failed attempt" in caplog.messages[1]
    assert caplog.messages[2] == (
        "durable-kafka: partition 3, attempt 2: retried attempt re-sent 5000 rows"
    )


def test_commit_counts_rows_written_by_retried_attempts(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    writer = DurableKafkaBatchWriter(SinkOptions(topic="t"), SinkColumns(value="value"))
    writer.commit(
        [
            DurableKafkaCommitMessage(partition_id=0, records=100, attempt=0),
            DurableKafkaCommitMessage(partition_id=1, records=70, attempt=2),
            None,
        ]
    )
    assert "durable-kafka: write: 170 records acknowledged" in caplog.messages
    assert (
        "durable-kafka: write: 70 of 170 records were written by retried task attempts "
        "(partitions [1]); rows their failed attempts had acknowledged are in Kafka twice"
    ) in caplog.messages
