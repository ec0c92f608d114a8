"""Settings of the forwarder; the fields marked ``option`` are the agent's flags."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field

from durable_producer.buffer_agent.options import option, positive_float
from durable_producer.contract import DEFAULT_CHECKPOINT_INTERVAL_SECONDS


def non_negative_float(text: str) -> float:
    value = float(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text} must be 0 or more")
    return value


@dataclass(frozen=True, slots=True)
class ForwarderConfig:
    checkpoint_interval_s: float = field(
        default=DEFAULT_CHECKPOINT_INTERVAL_SECONDS,
        metadata=option(
            "seconds between checkpoints; bounds replayed duplicates after a crash",
            flag="--checkpoint-interval",
            parse=positive_float,
        ),
    )
    hint_interval_s: float = 1.0
    max_in_flight_records: int = 100_000
    max_in_flight_kbytes: int = 64 * 1024
    linger_ms: int = 5
    # librdkafka's own default (1 MB) would dead-letter records the cluster accepts; let the
    # broker judge (a WAL frame is at most 16 MiB by default). Override with an extra setting.
    max_message_bytes: int = 17 * 1024 * 1024
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
    unknown_topic_wait_s: float = 60.0
    reset_backoff_s: float = 1.0
    retry_backoff_s: float = 0.5
    retry_backoff_max_s: float = 5.0
    # No delivery for this long while records wait: the forwarder's state says why (health).
    stall_after_s: float = 10.0
    read_batch_frames: int = 256
    stop_flush_timeout_s: float = 5.0
