"""Settings of the forwarder; the fields marked ``option`` are the agent's flags."""

from __future__ import annotations

from dataclasses import dataclass, field

from durable_producer.buffer_agent.options import option, positive_float
from durable_producer.contract import DEFAULT_CHECKPOINT_INTERVAL_SECONDS


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
    unknown_topic_wait_s: float = 60.0
    reset_backoff_s: float = 1.0
    retry_backoff_s: float = 0.5
    read_batch_frames: int = 256
    stop_flush_timeout_s: float = 5.0
