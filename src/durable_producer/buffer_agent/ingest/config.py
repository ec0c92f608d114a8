"""Settings of the Kafka-protocol listener; the fields marked ``option`` are the agent's flags."""

from __future__ import annotations

from dataclasses import dataclass, field

from durable_producer.buffer_agent.kafka.protocol import DEFAULT_MAX_FRAME_BYTES
from durable_producer.buffer_agent.options import host_port, option, positive_int
from durable_producer.contract import AGENT_HOST, DEFAULT_MAX_BATCH_BYTES, KAFKA_PORT


@dataclass(frozen=True, slots=True)
class IngressConfig:
    host: str = field(
        default=AGENT_HOST,
        metadata=option(
            "HOST:PORT of the Kafka-protocol listener applications produce to",
            flag="--listen",
            parse=host_port,
            spans=("port",),
        ),
    )
    port: int = KAFKA_PORT
    advertised_host: str | None = None
    """Host clients are told to connect to; defaults to ``host``."""
    advertised_port: int | None = None
    """Port clients are told to connect to; defaults to the bound port."""
    max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES
    max_batch_bytes: int = field(
        default=DEFAULT_MAX_BATCH_BYTES,
        metadata=option(
            "largest record batch accepted from a client (Kafka's message.max.bytes)",
            parse=positive_int,
        ),
    )
    """Largest record batch accepted (Kafka's default ``message.max.bytes``)."""
    idle_timeout_s: float = 600.0
    read_timeout_s: float = 30.0
    write_timeout_s: float = 30.0
    node_id: int = 0
    cluster_id: str = "durable-producer-agent"
    snapshot_interval_s: float = 5.0
    producer_expiration_s: float = 86_400.0
    """Sequence state of a producer idle this long is dropped (Kafka's default: one day)."""
