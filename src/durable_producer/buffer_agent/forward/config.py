"""Settings of the forwarder; the fields marked ``option`` are the agent's flags."""

from __future__ import annotations

from dataclasses import dataclass, field

from durable_producer.buffer_agent.kafka.produce_wire import MAX_TIMEOUT_MS
from durable_producer.buffer_agent.options import (
    non_negative_float,
    option,
    positive_float,
    positive_int,
)
from durable_producer.contract import DEFAULT_CHECKPOINT_INTERVAL_SECONDS


@dataclass(frozen=True, slots=True)
class ForwarderConfig:
    checkpoint_interval_s: float = field(
        default=DEFAULT_CHECKPOINT_INTERVAL_SECONDS,
        metadata=option(
            "seconds between checkpoints; bounds what is re-sent after a crash",
            flag="--checkpoint-interval",
            parse=positive_float,
        ),
    )
    hint_interval_s: float = 1.0
    max_in_flight_bytes: int = 32 * 1024 * 1024
    """Stored batches read from the WAL and not yet acknowledged (read ahead stops here). The
    forwarder's memory while catching up is about this beyond the agent's baseline (Kafka's
    producer buffers as much by default, ``buffer.memory``); 64 MiB kept a catch-up of 1 MiB
    client batches above 128 MiB RSS for no measured gain in rate (docs/benchmarks.md)."""
    max_merge_bytes: int = 1_000_000
    """Largest batch made by merging small uncompressed client batches (within the topic's
    ``max.message.bytes``, 1,048,588 by default; halved for a topic that refuses it)."""
    request_timeout_s: float = field(
        default=30.0,
        metadata=option(
            "seconds Kafka may hold a Produce request (its acks=all timeout) before the forwarder"
            " retries it; a request a leader holds blocks its connection that long; at most"
            f" {MAX_TIMEOUT_MS / 1000} (Kafka's 32-bit milliseconds)",
            flag="--request-timeout",
            parse=positive_float,
        ),
    )
    # Records Kafka refuses with a "permanent" error are retried this long before they are
    # dead-lettered: long enough for ACL and topic-config changes to reach every broker
    # (seconds, rarely a minute) with a margin; a refusal that lasts longer is a
    # misconfiguration that needs a person, who re-sends the dead letters once it is fixed.
    dead_letter_after_s: float = field(
        default=120.0,
        metadata=option(
            "seconds a record refused with a non-retriable error (authorization, too large,"
            " policy) is retried before it goes to the dead-letter area; 0: at once",
            flag="--dead-letter-after",
            parse=non_negative_float,
        ),
    )
    dead_letter_max_bytes: int = field(
        default=256 * 1024 * 1024,
        metadata=option(
            "bytes the dead-letter area may hold; beyond it refused batches wait in the WAL",
            flag="--dead-letter-max-bytes",
            parse=positive_int,
        ),
    )
    unknown_topic_wait_s: float = field(
        default=60.0,
        metadata=option(
            "seconds the records of a topic Kafka does not know (deleted, not yet created) wait"
            " for it before they go to the dead-letter area",
            flag="--unknown-topic-wait",
            parse=non_negative_float,
        ),
    )
    retry_backoff_s: float = 0.1
    retry_backoff_max_s: float = 1.0
    """A partition's retries back off from ``retry_backoff_s``, doubling, to this: Kafka's
    producers' defaults (``retry.backoff.ms`` 100, ``retry.backoff.max.ms`` 1000, KIP-580). It
    bounds how late the first batch goes after Kafka returns from an outage (docs/benchmarks.md)."""
    metadata_interval_s: float = 5.0
    """Seconds between metadata refreshes while batches wait (leader moves, deleted topics);
    sooner after a failure that calls for one: ``retry_backoff_s`` after the previous refresh,
    doubling to ``retry_backoff_max_s`` while refreshes fail or find no leader."""
    # No delivery for this long while records wait: the forwarder's state says why (health).
    stall_after_s: float = 10.0
    read_batch_frames: int = 4096
    stop_flush_timeout_s: float = 5.0
