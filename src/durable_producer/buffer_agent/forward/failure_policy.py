"""What the forwarder does about each Kafka error: the decisions only, no Kafka needed.

- records Kafka refuses with an error no retry fixes unless the cluster changes (too large,
  authorization, invalid record, policy; ``PERMANENT_ERRORS``) are produced again every
  ``retry_backoff_s`` (doubling up to ``retry_backoff_max_s``) for ``dead_letter_after_s``
  (default 120 s): ACLs propagate to every broker, a topic's ``max.message.bytes`` is raised
  back, and the records go through instead of into the dead-letter area. Refused for longer
  (a spell per partition, like unknown topics below), they go to the dead-letter area with
  the reason and the forwarder moves on; never a silent drop. Refusals the client makes
  itself (``CLIENT_REFUSALS`` raised by ``produce()``) are dead-lettered at once, and so is
  everything with
  ``dead_letter_after_s`` 0. Undecodable batches go there too (decided where the frame is
  decoded). A permanent error *reported* for a batch may have hit innocent records batched
  with the bad one: the producer is reset to send one record per request (``ISOLATE``) and
  only a record refused on its own (or refused by ``produce()`` itself) is retried or
  dead-lettered. While records wait for a retry the forwarder sends nothing newer (see
  ``forwarder``), so a record refused and later accepted keeps its place in its partition;
  only records already in flight when the refusal came back can overtake it.
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
# Raised by produce() itself with one of these, the refusal is the client's own check
# (message.max.bytes, arguments): no change on the cluster can make the record go through.
CLIENT_REFUSALS = frozenset({KafkaError._INVALID_ARG, KafkaError.MSG_SIZE_TOO_LARGE})
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
    """The verdict on one failed record; remembers since when each partition is unknown or
    refused."""

    def __init__(
        self,
        unknown_topic_wait_s: float,
        dead_letter_after_s: float = 0.0,
        *,
        longest_retry_gap_s: float = 0.0,
    ) -> None:
        """``longest_retry_gap_s``: the longest backoff between two retries of a record; a
        spell of failures does not end within it."""
        self.unknown_topic_wait_s = unknown_topic_wait_s
        self.dead_letter_after_s = dead_letter_after_s
        self.longest_retry_gap_s = longest_retry_gap_s
        # (topic, partition) -> (first, last) failure time of its current spell.
        self._unknown_since: dict[tuple[str, int], tuple[float, float]] = {}
        self._refused_since: dict[tuple[str, int], tuple[float, float]] = {}

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
            if not (synchronous or isolating):
                # The broker refused a whole batch: which of its records is at fault is
                # unknown. Send again one record per request and let the broker tell.
                return Verdict.ISOLATE
            if (synchronous and code in CLIENT_REFUSALS) or self.dead_letter_after_s <= 0:
                return Verdict.DEAD_LETTER
            return self._spell(self._refused_since, topic, partition, now, self.dead_letter_after_s)
        if code in UNKNOWN_TOPIC_ERRORS:
            return self._spell(
                self._unknown_since, topic, partition, now, self.unknown_topic_wait_s
            )
        return Verdict.RESET

    def _spell(
        self,
        spells: dict[tuple[str, int], tuple[float, float]],
        topic: str,
        partition: int,
        now: float,
        wait: float,
    ) -> Verdict:
        """Retried until the partition has failed for ``wait`` seconds; a spell ends when no
        failure was seen for that long (or for the longest retry gap, if that is longer)."""
        key = (topic, partition)
        first, last = spells.get(key, (now, now))
        if now - last > max(wait, self.longest_retry_gap_s):
            first = now
        spells[key] = (first, now)
        return Verdict.DEAD_LETTER if now - first >= wait else Verdict.RETRY
