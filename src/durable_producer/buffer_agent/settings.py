"""Every setting of the agent: one table drives the command-line flags, the environment
variables (``DURABLE_AGENT_*``, so a Kubernetes pod spec can set them) and ``--help``."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from durable_producer.buffer_agent.forward.config import ForwarderConfig
from durable_producer.buffer_agent.ingest.config import IngressConfig
from durable_producer.buffer_agent.kafka.client_config import (
    KafkaConnectionSettings,
    parse_extra_settings,
)
from durable_producer.buffer_agent.wal import FsyncPolicy, FullDiskPolicy, WalConfig

MIB = 1024 * 1024
ENV_PREFIX = "DURABLE_AGENT_"


@dataclass(frozen=True, slots=True)
class Option:
    """One setting: its flag, environment variable, type, default and explanation."""

    name: str
    help: str
    default: Any = None
    type: Callable[[str], Any] = str
    choices: tuple[str, ...] | None = None
    repeatable: bool = False
    required: bool = False

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    @property
    def env(self) -> str:
        return ENV_PREFIX + self.name.upper()


def host_port(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not host:
        raise argparse.ArgumentTypeError(f"{text!r} is not HOST:PORT (e.g. 127.0.0.1:9092)")
    return host, int(port)


def positive_int(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text} must be a positive integer")
    return value


def non_negative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text} must be zero or a positive integer")
    return value


def positive_float(text: str) -> float:
    value = float(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text} must be positive")
    return value


COMMON_OPTIONS: tuple[Option, ...] = (
    Option(
        "data_dir",
        "the buffer volume: WAL, state and dead letters live here",
        "/var/lib/durable-producer",
        Path,
    ),
    Option(
        "kafka_bootstrap",
        "bootstrap servers of the real Kafka cluster (HOST:PORT,...)",
        required=True,
    ),
    Option("security_protocol", "PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL", "PLAINTEXT"),
    Option("ssl_ca_file", "CA bundle to verify the brokers (a mounted Secret)", type=Path),
    Option("ssl_cert_file", "client certificate for mutual TLS", type=Path),
    Option("ssl_key_file", "client private key for mutual TLS", type=Path),
    Option("ssl_key_password_file", "file holding the client key's password", type=Path),
    Option("sasl_mechanism", "PLAIN, SCRAM-SHA-256, SCRAM-SHA-512 or OAUTHBEARER"),
    Option("sasl_username_file", "file holding the SASL username (a mounted Secret)", type=Path),
    Option("sasl_password_file", "file holding the SASL password (a mounted Secret)", type=Path),
    Option(
        "kafka_setting",
        "extra librdkafka setting KEY=VALUE for the forwarding producer "
        "(repeatable; the env var takes a comma-separated list)",
        repeatable=True,
    ),
    Option(
        "checkpoint_interval",
        "seconds between checkpoints; bounds replayed duplicates after a crash",
        5.0,
        positive_float,
    ),
    Option("log_level", "DEBUG, INFO, WARNING or ERROR", "INFO"),
    Option(
        "log_format", "text or json (one JSON object per line)", "text", choices=("text", "json")
    ),
)

RUN_OPTIONS: tuple[Option, ...] = (
    Option(
        "listen",
        "HOST:PORT of the Kafka-protocol listener applications produce to",
        "127.0.0.1:9092",
        host_port,
    ),
    Option(
        "metrics_listen",
        "HOST:PORT serving /metrics, /healthz and /readyz",
        "0.0.0.0:9644",
        host_port,
    ),
    Option(
        "fsync",
        "always: answer after fsync (group commit); interval: fsync every "
        "--fsync-interval-ms; never: page cache only",
        "interval",
        choices=tuple(p.value for p in FsyncPolicy),
    ),
    Option("fsync_interval_ms", "fsync period of the interval policy", 100, positive_int),
    Option(
        "max_buffer_bytes",
        "size limit of the WAL; keep it below the volume size",
        1024 * MIB,
        positive_int,
    ),
    Option(
        "segment_bytes",
        "size of one WAL segment (space is freed a segment at a time)",
        64 * MIB,
        positive_int,
    ),
    Option(
        "page_cache_window_bytes",
        "WAL bytes behind the write head kept in the page cache after fsync (the forwarder's "
        "normal read window); older synced data is dropped so a busy agent reuses memory "
        "instead of growing the cache. 0 leaves caching to the kernel",
        64 * MIB,
        non_negative_int,
    ),
    Option(
        "max_batch_bytes",
        "largest record batch accepted from a client (Kafka's message.max.bytes)",
        1_048_588,
        positive_int,
    ),
    Option(
        "full_disk_policy",
        "reject: answer a full buffer with a retriable error at once; "
        "block: wait up to --block-timeout first",
        "reject",
        choices=tuple(p.value for p in FullDiskPolicy),
    ),
    Option(
        "block_timeout",
        "seconds a produce request waits for space under --full-disk-policy=block",
        5.0,
        positive_float,
    ),
    Option(
        "default_partitions",
        "partition count answered for a topic never seen while the "
        "cluster is unreachable (default: a retriable error until it is reachable)",
        type=positive_int,
    ),
    Option(
        "drain_timeout",
        "seconds to keep forwarding after SIGTERM before exiting (leftovers stay on the volume)",
        25.0,
        positive_float,
    ),
)

DRAIN_OPTIONS: tuple[Option, ...] = (
    Option(
        "timeout",
        "seconds to spend forwarding before giving up (exit code 1)",
        600.0,
        positive_float,
    ),
)


def add_options(
    parser: argparse.ArgumentParser, options: tuple[Option, ...], environ: Mapping[str, str]
) -> None:
    for option in options:
        raw = environ.get(option.env)
        default: Any = option.default
        if raw is not None:
            default = (
                [item for item in raw.split(",") if item] if option.repeatable else option.type(raw)
            )
        elif option.repeatable:
            default = []
        shown = "" if option.default is None else f" (default: {option.default})"
        parser.add_argument(
            option.flag,
            dest=option.name,
            type=option.type,
            default=default,
            choices=option.choices,
            action="append" if option.repeatable else "store",
            required=option.required and raw is None,
            help=f"{option.help}{shown} [env: {option.env}]",
        )


@dataclass(frozen=True, slots=True)
class AgentSettings:
    """The parsed settings, turned into each part's own configuration."""

    values: dict[str, Any] = field(default_factory=dict)

    @property
    def wal_dir(self) -> Path:
        return Path(self.values["data_dir"]) / "wal"

    @property
    def state_dir(self) -> Path:
        return Path(self.values["data_dir"]) / "state"

    @property
    def dead_letter_dir(self) -> Path:
        return Path(self.values["data_dir"]) / "dead-letter"

    def kafka_connection(self) -> KafkaConnectionSettings:
        v = self.values
        return KafkaConnectionSettings(
            bootstrap_servers=v["kafka_bootstrap"],
            security_protocol=v["security_protocol"],
            ssl_ca_file=v["ssl_ca_file"],
            ssl_cert_file=v["ssl_cert_file"],
            ssl_key_file=v["ssl_key_file"],
            ssl_key_password_file=v["ssl_key_password_file"],
            sasl_mechanism=v["sasl_mechanism"],
            sasl_username_file=v["sasl_username_file"],
            sasl_password_file=v["sasl_password_file"],
            extra=parse_extra_settings(v["kafka_setting"] or []),
        )

    def wal_config(self) -> WalConfig:
        v = self.values
        return WalConfig(
            segment_bytes=v.get("segment_bytes", 64 * MIB),
            max_bytes=v.get("max_buffer_bytes", 1024 * MIB),
            max_frame_bytes=min(
                v.get("segment_bytes", 64 * MIB),
                max(v.get("max_batch_bytes", 0) + 64 * 1024, 16 * MIB),
            ),
            fsync=FsyncPolicy(v.get("fsync", "interval")),
            fsync_interval_ms=v.get("fsync_interval_ms", 100),
            full_disk_policy=FullDiskPolicy(v.get("full_disk_policy", "reject")),
            block_timeout_s=v.get("block_timeout", 5.0),
            page_cache_window_bytes=v.get("page_cache_window_bytes", 64 * MIB) or None,
        )

    def ingress_config(self) -> IngressConfig:
        host, port = self.values["listen"]
        return IngressConfig(host=host, port=port, max_batch_bytes=self.values["max_batch_bytes"])

    def forwarder_config(self) -> ForwarderConfig:
        return ForwarderConfig(checkpoint_interval_s=self.values["checkpoint_interval"])


def settings_from(namespace: argparse.Namespace) -> AgentSettings:
    return AgentSettings(dict(vars(namespace)))


def reference_table(options: tuple[Option, ...]) -> str:
    """A markdown table of ``options`` for docs/agent.md (a test keeps the doc in step)."""
    lines = ["| flag | environment variable | default | meaning |", "|---|---|---|---|"]
    for option in options:
        default = (
            "(required)"
            if option.required
            else ("" if option.default is None else f"`{option.default}`")
        )
        meaning = option.help.replace("|", "\\|")
        if option.choices:
            meaning += " (one of: " + ", ".join(option.choices) + ")"
        lines.append(f"| `{option.flag}` | `{option.env}` | {default} | {meaning} |")
    return "\n".join(lines)


if __name__ == "__main__":
    print("### Common to run, drain and dead-letters resend\n")
    print(reference_table(COMMON_OPTIONS))
    print("\n### run\n")
    print(reference_table(RUN_OPTIONS))
    print("\n### drain\n")
    print(reference_table(DRAIN_OPTIONS))
