"""What the forwarder does about each Kafka error: the decisions only, no Kafka needed.

- non-retriable record errors (too large, authorization, invalid record; ``PERMANENT_ERRORS``)
  go to the dead-letter area with the reason and the forwarder moves on. Never a silent
  drop. Undecodable batches go there too (decided where the frame is decoded). A permanent
  error *reported* for a batch may have hit innocent records batched with the bad one: the
  producer is reset to send one record per request (``ISOLATE``) and only a record refused
  on its own (or refused by ``produce()`` itself) is dead-lettered.
- a record whose topic or partition is unknown (``UNKNOWN_TOPIC_ERRORS``) is produced again
  every ``retry_backoff_s`` (failed records of one partition are retried in the order they
  failed); still unknown after ``unknown_topic_wait_s``, it is dead-lettered.
- anything else the client reports for a record (a fatal idempotence error, an unexpected
  retriable one), and any failure of a sparse frame's report, resets the producer: a new
  (careful) producer replays from the watermark, in WAL order, so per-partition order is
  kept; re-sent records are counted (see ``progress``).
- a fatal producer error resets the producer; after a gap-less guarantee failure (a batch
  failed for good in sparse mode) the careful producer sends one record per request.

``failures`` carries these decisions out.
"""

from __future__ import annotations

from enum import Enum

from confluent_kafka import KafkaError

# Errors no retry can fix: the record goes to the dead-letter area.
PERMANENT_ERRORS = frozenset(
    {
        KafkaError.MSG_SIZE_TOO_LARGE,
        KafkaError.TOPIC_AUTHORIZATION_FAILED,
        KafkaError.INVALID_RECORD,
        KafkaError.INVALID_MSG_SIZE,
        KafkaError.RECORD_LIST_TOO_LARGE,
        KafkaError.INVALID_TIMESTAMP,
        KafkaError.POLICY_VIOLATION,
        KafkaError.TOPIC_EXCEPTION,
        KafkaError._INVALID_ARG,
    }
)
# Errors that may clear once metadata catches up: retried for a bounded time.
UNKNOWN_TOPIC_ERRORS = frozenset(
    {
        KafkaError.UNKNOWN_TOPIC_OR_PART,
        KafkaError._UNKNOWN_TOPIC,
        KafkaError._UNKNOWN_PARTITION,
    }
)


class Verdict(Enum):
    """What to do about a failed record (or a failed producer)."""

    DEAD_LETTER = "dead-letter"
    """Move the record to the dead-letter area, with the reason; carry on."""
    RETRY = "retry"
    """Produce the record again after ``retry_backoff_s``."""
    RESET = "reset"
    """Reset the producer and re-forward carefully from the watermark."""
    ISOLATE = "isolate"
    """Reset, and let the careful producer send one record per request."""


def batch_failure(code: int) -> Verdict:
    """A report speaking for several records failed (a sparse frame's report): what became
    of the others is unknown, so they are re-sent carefully; isolated if the broker refused
    for good, as innocent batch-mates may have been refused with the bad record."""
    return Verdict.ISOLATE if code in PERMANENT_ERRORS else Verdict.RESET


def fatal_error(code: int) -> Verdict:
    """The producer raised a fatal error: a new one is needed. A gap-less guarantee failure
    means a batch failed for good: judge its records one by one."""
    return Verdict.ISOLATE if code == KafkaError._GAPLESS_GUARANTEE else Verdict.RESET


class RecordFailurePolicy:
    """The verdict on one failed record; remembers since when each partition is unknown."""

    def __init__(self, unknown_topic_wait_s: float) -> None:
        self.unknown_topic_wait_s = unknown_topic_wait_s
        # (topic, partition) -> (first, last) failure time of its current unknown spell.
        self._unknown_since: dict[tuple[str, int], tuple[float, float]] = {}

    def judge(
        self,
        code: int,
        topic: str,
        partition: int,
        now: float,
        *,
        synchronous: bool,
        isolating: bool,
    ) -> Verdict:
        """``synchronous``: ``produce()`` raised (the record alone is at fault);
        ``isolating``: the producer sends one record per request (a report is about that
        record alone); ``now``: a monotonic clock reading."""
        if code in PERMANENT_ERRORS:
            if synchronous or isolating:
                return Verdict.DEAD_LETTER
            # The broker refused a whole batch: which of its records is at fault is
            # unknown. Send again one record per request and let the broker tell.
            return Verdict.ISOLATE
        if code in UNKNOWN_TOPIC_ERRORS:
            return self._unknown(topic, partition, now)
        return Verdict.RESET

    def _unknown(self, topic: str, partition: int, now: float) -> Verdict:
        """Retried until the partition has been unknown for ``unknown_topic_wait_s``; a spell
        ends when no failure was seen for that long."""
        key = (topic, partition)
        wait = self.unknown_topic_wait_s
        first, last = self._unknown_since.get(key, (now, now))
        if now - last > wait:
            first = now
        self._unknown_since[key] = (first, now)
        return Verdict.DEAD_LETTER if now - first >= wait else Verdict.RETRY
