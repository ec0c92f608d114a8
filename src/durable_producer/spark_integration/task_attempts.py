"""Which task attempt is writing, and the duplicates Spark's task retries produce.

With ``spark.task.maxFailures`` > 1 a failed task runs again and writes all its rows again,
also those the failed attempt had already had acknowledged: those are in Kafka twice (Kafka
has no rollback). The sink cannot tell which rows of a retry are duplicates, but it can count
them from both ends, one log line each, all prefixed ``durable-kafka:``:

- a failed attempt logs how many of its rows were acknowledged before it failed: its retry
  writes at least that many duplicates (more if rows reached the agent but their answer did
  not reach the task, e.g. when the agent was killed);
- a retried attempt logs how many rows it re-sent: at most that many duplicates;
- the driver's commit logs the rows written by retried attempts for the whole write.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TaskAttempt:
    """A Spark task's partition and attempt number (0 for the first attempt)."""

    partition: int
    attempt: int

    @classmethod
    def current(cls) -> TaskAttempt:
        """The attempt running this code (partition -1 outside a Spark task)."""
        from pyspark import TaskContext

        context = TaskContext.get()
        if context is None:
            return cls(partition=-1, attempt=0)
        return cls(partition=context.partitionId(), attempt=context.attemptNumber())

    @property
    def is_retry(self) -> bool:
        return self.attempt > 0

    def describe(self) -> str:
        return f"partition {self.partition}, attempt {self.attempt + 1}"


def report_start(task: TaskAttempt) -> None:
    if task.is_retry:
        log.warning(
            "durable-kafka: %s: retrying a failed attempt; rows an earlier attempt had "
            "acknowledged are written again (duplicates in Kafka, at-least-once)",
            task.describe(),
        )


def report_failure(task: TaskAttempt, acknowledged: int, produced: int) -> None:
    log.warning(
        "durable-kafka: %s failed after %d of %d rows produced so far were acknowledged; "
        "a retry of this task writes them again: those %d become duplicates in Kafka, and up "
        "to %d more if they reached the agent without an answer",
        task.describe(),
        acknowledged,
        produced,
        acknowledged,
        produced - acknowledged,
    )


def report_success(task: TaskAttempt, rows: int) -> None:
    if task.is_retry:
        log.warning("durable-kafka: %s: retried attempt re-sent %d rows", task.describe(), rows)


def report_retried_rows(retried: dict[int, int], total: int, what: str) -> None:
    """Driver side: ``retried`` maps partition -> rows written by a retried attempt."""
    if not retried:
        return
    log.warning(
        "durable-kafka: %s: %d of %d records were written by retried task attempts "
        "(partitions %s); rows their failed attempts had acknowledged are in Kafka twice",
        what,
        sum(retried.values()),
        total,
        sorted(retried),
    )
