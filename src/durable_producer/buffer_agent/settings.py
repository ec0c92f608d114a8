"""The agent's settings: which config fields each command offers, and the typed result.

Each component declares its own settings, defaults and help beside its code (``WalConfig``,
``IngestConfig``, ``ForwarderConfig``, ``KafkaConnectionSettings``; ``AgentConfig`` here for
the process itself). This module picks their user-facing fields into the commands, in
``--help`` order; ``options.py`` turns them into flags, ``DURABLE_AGENT_*`` environment
variables (so a Kubernetes pod spec can set them) and the reference table of docs/agent.md
(``python -m durable_producer.buffer_agent.settings`` prints it).
"""

from __future__ import annotations

import argparse
import dataclasses
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from durable_producer.buffer_agent.errors import SettingError
from durable_producer.buffer_agent.forward.config import ForwarderConfig
from durable_producer.buffer_agent.ingest.config import IngestConfig
from durable_producer.buffer_agent.ingest.metadata import MAX_DEFAULT_PARTITIONS
from durable_producer.buffer_agent.kafka.client_config import KafkaConnectionSettings
from durable_producer.buffer_agent.kafka.produce_wire import MAX_TIMEOUT_MS
from durable_producer.buffer_agent.logging_setup import LOG_FORMATS, LOG_LEVELS
from durable_producer.buffer_agent.options import (
    Option,
    host_port,
    one_of,
    option,
    options_of,
    path,
    positive_float,
    positive_int,
    reference_table,
    upper_case_of,
)
from durable_producer.buffer_agent.wal.config import DEFAULT_MAX_WAL_FRAME_BYTES, WalConfig
from durable_producer.contract import DATA_DIR, METRICS_HOST, METRICS_PORT
from durable_producer.shutdown_record import TERMINATION_MESSAGE_PATH

FRAME_HEADROOM_BYTES = 64 * 1024
"""Room in a WAL frame beside the largest batch: the frame header and the topic name."""


@dataclass(frozen=True, slots=True)
class AgentConfig:
    """The agent process itself: its volume, metrics endpoint, logs and shutdown."""

    data_dir: Path = field(
        default=Path(DATA_DIR),
        metadata=option("the buffer volume: WAL, state and dead letters live here", parse=path),
    )
    metrics_host: str = field(
        default=METRICS_HOST,
        metadata=option(
            "HOST:PORT serving /metrics, /healthz and /readyz ([::]: every IPv6 and IPv4"
            " address)",
            flag="--metrics-listen",
            parse=host_port,
            spans=("metrics_port",),
        ),
    )
    metrics_port: int = METRICS_PORT
    log_level: str = field(
        default="INFO", metadata=option(one_of(LOG_LEVELS), parse=upper_case_of(LOG_LEVELS))
    )
    log_format: str = field(
        default="text",
        metadata=option("text or json (one JSON object per line)", choices=LOG_FORMATS),
    )
    default_partitions: int | None = field(
        default=None,
        metadata=option(
            "partition count answered for a topic never seen while the "
            f"cluster is unreachable, at most {MAX_DEFAULT_PARTITIONS} (default: a retriable"
            " error until it is reachable)",
            parse=positive_int,
        ),
    )
    drain_timeout_s: float = field(
        default=25.0,
        metadata=option(
            "seconds to keep forwarding after SIGTERM before exiting "
            "(leftovers stay on the volume)",
            flag="--drain-timeout",
            parse=positive_float,
        ),
    )
    termination_message_path: Path = field(
        default=Path(TERMINATION_MESSAGE_PATH),
        metadata=option(
            "where a clean stop records whether the volume is left empty (Kubernetes'"
            " terminationMessagePath; written only if the file exists)",
            parse=Path,
        ),
    )
    drain_mode_timeout_s: float = field(
        default=600.0,
        metadata=option(
            "seconds to spend forwarding before giving up (exit code 1)",
            flag="--timeout",
            parse=positive_float,
        ),
    )

    @property
    def wal_dir(self) -> Path:
        return self.data_dir / "wal"

    @property
    def state_dir(self) -> Path:
        return self.data_dir / "state"

    @property
    def dead_letter_dir(self) -> Path:
        return self.data_dir / "dead-letter"


@dataclass(frozen=True, slots=True)
class AgentSettings:
    """Everything a command was given, as each part's own configuration."""

    agent: AgentConfig
    kafka: KafkaConnectionSettings
    wal: WalConfig
    ingest: IngestConfig
    forwarder: ForwarderConfig


COMMON_OPTIONS: tuple[Option, ...] = (
    *options_of(AgentConfig, "data_dir"),
    *options_of(KafkaConnectionSettings),
    *options_of(
        ForwarderConfig,
        "checkpoint_interval_s",
        "request_timeout_s",
        "dead_letter_after_s",
        "dead_letter_max_bytes",
        "unknown_topic_wait_s",
    ),
    *options_of(AgentConfig, "log_level", "log_format"),
)
"""Options of run, drain and dead-letters resend."""

RUN_OPTIONS: tuple[Option, ...] = (
    *options_of(IngestConfig, "host"),
    *options_of(AgentConfig, "metrics_host"),
    *options_of(
        WalConfig,
        "fsync",
        "fsync_interval_ms",
        "max_bytes",
        "segment_bytes",
        "page_cache_window_bytes",
    ),
    *options_of(
        IngestConfig,
        "max_batch_bytes",
        "max_decompressed_batch_bytes",
        "max_request_memory_bytes",
        "max_connections",
        "idle_timeout_s",
        "read_timeout_s",
    ),
    *options_of(WalConfig, "full_disk_policy", "block_timeout_s"),
    *options_of(
        AgentConfig, "default_partitions", "drain_timeout_s", "termination_message_path"
    ),
)

DRAIN_OPTIONS: tuple[Option, ...] = (
    *options_of(AgentConfig, "drain_mode_timeout_s"),
    # The policy the WAL was written with: recovery reports a complete frame with a bad CRC
    # at the tail as lost under `always` (it was acknowledged), as a torn write otherwise.
    *options_of(WalConfig, "fsync"),
)


def settings_from(args: argparse.Namespace) -> AgentSettings:
    """The typed settings of a parsed command line; what the command has no flag for keeps
    its default. Raises KafkaConfigError for a malformed ``--kafka-setting`` and
    SettingError, naming the flags, for values that do not fit together."""
    given = vars(args)
    ingest = _config(IngestConfig, given)
    wal = _config(WalConfig, given)
    wal = dataclasses.replace(
        wal, max_frame_bytes=wal_frame_limit(ingest.max_batch_bytes, wal.segment_bytes)
    )
    agent = _config(AgentConfig, given)
    forwarder = _config(ForwarderConfig, given)
    _check_forwarder(forwarder)
    if "max_buffer_bytes" in given:  # commands that write the WAL (run)
        _check_wal(wal)
        _check_ports(ingest, agent)
        _check_ingest(ingest, agent, wal)
    return AgentSettings(
        agent=agent,
        kafka=_config(KafkaConnectionSettings, given),
        wal=wal,
        ingest=ingest,
        forwarder=forwarder,
    )


def _check_forwarder(forwarder: ForwarderConfig) -> None:
    """A request timeout Kafka's Produce request cannot carry: every request failed to encode
    (struct.error), was counted as a lost answer and retried, for ever."""
    if int(forwarder.request_timeout_s * 1000) > MAX_TIMEOUT_MS:
        raise SettingError(
            f"--request-timeout={forwarder.request_timeout_s:.15g} is more than a Produce request"
            f" carries (a 32-bit count of milliseconds): give at most {MAX_TIMEOUT_MS / 1000}"
        )


def _check_ingest(ingest: IngestConfig, agent: AgentConfig, wal: WalConfig) -> None:
    """Limits that would refuse, for ever, what a client may rightly send, or answer a client
    with more than it can take."""
    if wal.max_frame_bytes < ingest.max_batch_bytes:
        raise SettingError(
            f"--segment-bytes={wal.segment_bytes} cannot hold the largest batch"
            f" (--max-batch-bytes={ingest.max_batch_bytes}): give it at least"
            f" {ingest.max_batch_bytes} or lower --max-batch-bytes"
        )
    least = ingest.max_batch_bytes + FRAME_HEADROOM_BYTES  # the request's own bytes too
    if ingest.max_request_memory_bytes < least:
        raise SettingError(
            f"--max-request-memory-bytes={ingest.max_request_memory_bytes} leaves no room"
            f" for a request with the largest batch (--max-batch-bytes="
            f"{ingest.max_batch_bytes}): give it at least {least}"
        )
    if ingest.max_decompressed_batch_bytes < ingest.max_batch_bytes:
        raise SettingError(
            f"--max-decompressed-batch-bytes={ingest.max_decompressed_batch_bytes} would refuse"
            f" compressed batches that are taken uncompressed (--max-batch-bytes="
            f"{ingest.max_batch_bytes}): give it at least {ingest.max_batch_bytes}"
        )
    if (agent.default_partitions or 0) > MAX_DEFAULT_PARTITIONS:
        raise SettingError(
            f"--default-partitions={agent.default_partitions} is more than a metadata answer"
            f" carries to a client: give at most {MAX_DEFAULT_PARTITIONS}, the real topics' count"
        )


def _check_ports(ingest: IngestConfig, agent: AgentConfig) -> None:
    """The two listeners on one port: the second bind failed, blaming "another process"."""
    hosts = {ingest.host, agent.metrics_host}
    meet = len(hosts) == 1 or any(  # a wildcard meets its own family (IPv6 binds V6ONLY)
        wildcard in hosts and all(_family(host) == _family(wildcard) for host in hosts)
        for wildcard in ("0.0.0.0", "::")
    )
    if ingest.port and ingest.port == agent.metrics_port and meet:
        raise SettingError(
            f"--listen {ingest.host}:{ingest.port} and --metrics-listen"
            f" {agent.metrics_host}:{agent.metrics_port} name the same port: give each its own"
        )


def _family(host: str) -> str:
    return "6" if ":" in host else "4" if host.replace(".", "").isdigit() else host


def _check_wal(wal: WalConfig) -> None:
    """WalConfig.validate's problems, with each field named by the flag that sets it."""
    try:
        wal.validate()
    except ValueError as error:
        message = in_flags(str(error), WalConfig).replace(
            "max_frame_bytes=", "the WAL frame limit (from --max-batch-bytes)="
        )
        raise SettingError(message) from None


def in_flags(message: str, config: type[Any]) -> str:
    """``message`` with the name of each of ``config``'s fields that has a flag (and an
    underscore: ``host`` or ``extra`` may be plain words) replaced by the flag."""
    for declared in options_of(config):
        name = declared.fields[0]
        if "_" in name:
            message = re.sub(rf"\b{name}\b", declared.flag, message)
    return message


def wal_frame_limit(max_batch_bytes: int, segment_bytes: int) -> int:
    """``--max-batch-bytes`` also sizes WAL frames: room for the largest batch and its frame
    header, never below the WAL's default frame limit nor above one segment."""
    return min(
        segment_bytes, max(max_batch_bytes + FRAME_HEADROOM_BYTES, DEFAULT_MAX_WAL_FRAME_BYTES)
    )


Config = TypeVar("Config")


def _config(config: type[Config], given: dict[str, Any]) -> Config:
    values: dict[str, Any] = {}
    for declared in options_of(config):
        if declared.dest in given:
            values.update(declared.field_values(given[declared.dest]))
    return config(**values)


if __name__ == "__main__":
    print("### Common to run, drain and dead-letters resend\n")
    print(reference_table(COMMON_OPTIONS))
    print("\n### run\n")
    print(reference_table(RUN_OPTIONS))
    print("\n### drain\n")
    print(reference_table(DRAIN_OPTIONS))
