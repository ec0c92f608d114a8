"""Settings of the Kafka-protocol listener; the fields marked ``option`` are the agent's flags."""

from __future__ import annotations

from dataclasses import dataclass, field

from durable_producer.buffer_agent.ingest.request_memory import DEFAULT_REQUEST_MEMORY_BYTES
from durable_producer.buffer_agent.kafka.protocol import DEFAULT_MAX_REQUEST_FRAME_BYTES
from durable_producer.buffer_agent.kafka.record_validate import DEFAULT_MAX_DECOMPRESSED_BYTES
from durable_producer.buffer_agent.options import host_port, option, positive_float, positive_int
from durable_producer.contract import AGENT_HOST, DEFAULT_MAX_BATCH_BYTES, KAFKA_PORT


@dataclass(frozen=True, slots=True)
class IngestConfig:
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
    max_frame_bytes: int = DEFAULT_MAX_REQUEST_FRAME_BYTES
    max_batch_bytes: int = field(
        default=DEFAULT_MAX_BATCH_BYTES,
        metadata=option(
            "largest record batch accepted from a client (Kafka's message.max.bytes)",
            parse=positive_int,
        ),
    )
    """Largest record batch accepted (Kafka's default ``message.max.bytes``)."""
    max_decompressed_batch_bytes: int = field(
        default=DEFAULT_MAX_DECOMPRESSED_BYTES,
        metadata=option(
            "largest size a compressed record batch may decompress to (larger ones are"
            " refused with MESSAGE_TOO_LARGE), at least --max-batch-bytes",
            parse=positive_int,
        ),
    )
    max_request_memory_bytes: int = field(
        default=DEFAULT_REQUEST_MEMORY_BYTES,
        metadata=option(
            "memory for requests being received or processed, all connections together;"
            " connections wait for their turn beyond it (also the largest request accepted)",
            parse=positive_int,
        ),
    )
    max_connections: int = field(
        default=512,
        metadata=option(
            "client connections served at once; more are closed on arrival",
            parse=positive_int,
        ),
    )
    idle_timeout_s: float = field(
        default=600.0,
        metadata=option(
            "seconds a connection may stay without starting a request (Kafka's"
            " connections.max.idle.ms)",
            flag="--idle-timeout",
            parse=positive_float,
        ),
    )
    read_timeout_s: float = field(
        default=30.0,
        metadata=option(
            "seconds a client has to send the rest of a request once its first byte arrived",
            flag="--request-read-timeout",
            parse=positive_float,
        ),
    )
    write_timeout_s: float = 30.0
    node_id: int = 0
    cluster_id: str = "durable-producer-agent"
    snapshot_interval_s: float = 5.0
    producer_expiration_s: float = 900.0
    """Sequence state of a producer idle this long is dropped. Kafka keeps it a day, but only
    a client's retry needs it, and clients give a record up after their delivery timeout
    (librdkafka 300 s, Java 120 s); a forgotten producer's next batch is accepted as a
    broker accepts an unknown producer. Spark makes a producer per task: a day of them held
    hundreds of MB."""
