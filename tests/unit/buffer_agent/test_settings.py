from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

import pytest

from durable_producer import contract
from durable_producer.buffer_agent.cli import build_parser
from durable_producer.buffer_agent.errors import SettingError
from durable_producer.buffer_agent.forward.config import ForwarderConfig
from durable_producer.buffer_agent.ingest.config import IngestConfig
from durable_producer.buffer_agent.kafka.client_config import KafkaConnectionSettings
from durable_producer.buffer_agent.options import options_of, reference_table
from durable_producer.buffer_agent.settings import (
    COMMON_OPTIONS,
    DRAIN_OPTIONS,
    RUN_OPTIONS,
    AgentConfig,
    settings_from,
    wal_frame_limit,
)
from durable_producer.buffer_agent.wal import FsyncPolicy, FullDiskPolicy, WalConfig

DOCS = Path(__file__).resolve().parents[3] / "docs" / "agent.md"
MIB = 1024 * 1024


def test_docs_reference_matches_the_code() -> None:
    text = DOCS.read_text()
    generated = re.search(r"<!-- BEGIN GENERATED[^>]*-->\n(.*)<!-- END GENERATED -->", text, re.S)
    assert generated, "docs/agent.md lost its generated settings section"
    for options in (COMMON_OPTIONS, RUN_OPTIONS, DRAIN_OPTIONS):
        assert reference_table(options) in generated.group(1), (
            "docs/agent.md is out of date: regenerate it with "
            "`python -m durable_producer.buffer_agent.settings`"
        )


def test_every_flag_has_an_environment_variable() -> None:
    environ = {
        "DURABLE_AGENT_KAFKA_BOOTSTRAP": "kafka:9092",
        "DURABLE_AGENT_FSYNC": "always",
        "DURABLE_AGENT_LISTEN": "127.0.0.1:19092",
        "DURABLE_AGENT_KAFKA_SETTING": "linger.ms=7,compression.type=lz4",
    }
    args = build_parser(environ).parse_args(["run"])
    settings = settings_from(args)
    assert settings.wal.fsync is FsyncPolicy.ALWAYS
    assert settings.ingest.port == 19092
    connection = settings.kafka
    assert connection.bootstrap_servers == "kafka:9092"
    assert dict(connection.extra) == {"linger.ms": "7", "compression.type": "lz4"}


def test_flags_override_the_environment_and_bad_values_are_explained(
    capsys: pytest.CaptureFixture[str],
) -> None:
    parser = build_parser({"DURABLE_AGENT_FSYNC": "never"})
    args = parser.parse_args(["run", "--kafka-bootstrap", "k:9092", "--fsync", "interval"])
    assert settings_from(args).wal.fsync is FsyncPolicy.INTERVAL
    with pytest.raises(SystemExit):
        parser.parse_args(["run", "--kafka-bootstrap", "k:9092", "--listen", "nonsense"])
    assert "is not HOST:PORT" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        parser.parse_args(["run"])
    assert "--kafka-bootstrap" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("listen", "metrics", "refused"),
    [
        ("127.0.0.1:19644", "0.0.0.0:19644", True),
        ("127.0.0.1:19644", "127.0.0.1:19644", True),
        ("127.0.0.1:19644", "127.0.0.2:19644", False),
        ("[::]:19644", "0.0.0.0:19644", False),
        ("[::1]:19644", "[::]:19644", True),
        ("127.0.0.1:0", "127.0.0.1:0", False),
    ],
)
def test_the_two_listeners_on_one_port_are_refused(
    listen: str, metrics: str, refused: bool
) -> None:
    """The second bind failed with "another process (another agent?) listens there"."""
    argv = ["run", "--kafka-bootstrap", "k:9092", "--listen", listen, "--metrics-listen", metrics]
    args = build_parser({}).parse_args(argv)
    if refused:
        with pytest.raises(SettingError, match="name the same port"):
            settings_from(args)
    else:
        settings_from(args)


@pytest.mark.parametrize(
    ("flag", "refused", "least_or_most", "refusal"),
    [
        ("--max-decompressed-batch-bytes", "1", "1048588", "give it at least 1048588"),
        ("--default-partitions", "100000001", "100000", "give at most 100000"),
        (
            "--fsync-interval-ms",
            "9300000000000",
            "3600000",
            "--fsync-interval-ms=9300000000000 is more than an hour: give at most 3600000",
        ),
        (
            "--request-timeout",
            "2147483.648",
            "2147483.647",
            r"--request-timeout=2147483.648 is more than a Produce request carries .*"
            r"give at most 2147483.647",
        ),
        (
            "--block-timeout",
            "1e300",
            "2147483.647",
            r"--block-timeout=1e\+300 is longer than any request waits .* at most 2147483.647",
        ),
    ],
)
def test_limits_that_refuse_or_overwhelm_clients_are_refused(
    flag: str, refused: str, least_or_most: str, refusal: str
) -> None:
    """All were taken: the first refused every compressed batch as too large, for ever; the
    second answered a metadata request with a hundred million partitions; the third ended the
    fsync thread with an OverflowError while the agent acknowledged on without fsync; the fourth
    made every Produce request fail to encode (a 32-bit millisecond field), retried for ever;
    the fifth overflowed the wait for space of a blocking append."""
    run = ["run", "--kafka-bootstrap", "k:9092", flag]
    with pytest.raises(SettingError, match=refusal):
        settings_from(build_parser({}).parse_args([*run, refused]))
    settings_from(build_parser({}).parse_args([*run, least_or_most]))


def test_a_segment_smaller_than_the_largest_batch_is_refused() -> None:
    """A frame must fit in a segment, so the WAL's frame limit was the segment: with 1 MiB
    segments a batch of up to Kafka's 1,048,588 bytes was taken by the agent's limit and then
    refused as MESSAGE_TOO_LARGE by the WAL, a gap of 12 bytes no client could know of."""
    run = ["run", "--kafka-bootstrap", "k:9092", "--segment-bytes"]
    with pytest.raises(SettingError, match="give it at least 1048588 or lower --max-batch"):
        settings_from(build_parser({}).parse_args([*run, "1048576"]))
    settings_from(build_parser({}).parse_args([*run, "1048576", "--max-batch-bytes=1048576"]))
    settings_from(build_parser({}).parse_args([*run, "1048588"]))


def test_a_request_memory_below_the_largest_batch_is_refused() -> None:
    """With --max-request-memory-bytes 1 every request was refused as too large, for ever."""
    argv = ["run", "--kafka-bootstrap", "k:9092", "--max-request-memory-bytes", "1"]
    with pytest.raises(SettingError, match="give it at least 1114124"):
        settings_from(build_parser({}).parse_args(argv))


def test_without_flags_every_part_gets_its_own_defaults() -> None:
    settings = settings_from(build_parser({}).parse_args(["run", "--kafka-bootstrap", "k:9092"]))
    assert settings.agent == AgentConfig()
    assert settings.ingest == IngestConfig()
    assert settings.forwarder == ForwarderConfig()
    assert settings.kafka == KafkaConnectionSettings("k:9092")
    assert settings.wal == WalConfig()  # the derived frame limit is the WAL's default too


def test_the_defaults_the_operator_also_renders_are_the_contracts() -> None:
    settings = settings_from(build_parser({}).parse_args(["run", "--kafka-bootstrap", "k:9092"]))
    assert settings.wal.fsync == contract.DEFAULT_FSYNC_POLICY
    assert settings.wal.full_disk_policy == contract.DEFAULT_FULL_DISK_POLICY
    assert settings.forwarder.checkpoint_interval_s == contract.DEFAULT_CHECKPOINT_INTERVAL_SECONDS
    assert (settings.ingest.host, settings.ingest.port) == (
        contract.AGENT_HOST,
        contract.KAFKA_PORT,
    )
    assert settings.agent.metrics_port == contract.METRICS_PORT
    assert settings.agent.wal_dir == Path(contract.DATA_DIR) / "wal"


def test_flags_that_set_derived_values() -> None:
    args = build_parser({}).parse_args(
        [
            "run",
            "--kafka-bootstrap=k:9092",
            "--listen=0.0.0.0:19092",
            "--metrics-listen=127.0.0.1:19644",
            "--page-cache-window-bytes=0",
            "--max-batch-bytes=20000000",
            "--segment-bytes=100000000",
            "--full-disk-policy=block",
            "--data-dir=/volume",
        ]
    )
    settings = settings_from(args)
    assert (settings.ingest.host, settings.ingest.port) == ("0.0.0.0", 19092)
    assert (settings.agent.metrics_host, settings.agent.metrics_port) == ("127.0.0.1", 19644)
    assert settings.wal.page_cache_window_bytes is None
    assert settings.ingest.max_batch_bytes == 20_000_000
    assert settings.wal.max_frame_bytes == 20_000_000 + 64 * 1024
    assert settings.wal.full_disk_policy is FullDiskPolicy.BLOCK
    assert settings.agent.dead_letter_dir == Path("/volume/dead-letter")


def test_the_wal_frame_limit_follows_the_batch_limit_within_bounds() -> None:
    assert wal_frame_limit(1_048_588, 64 * MIB) == WalConfig().max_frame_bytes
    assert wal_frame_limit(20 * MIB, 64 * MIB) == 20 * MIB + 64 * 1024
    assert wal_frame_limit(20 * MIB, 8 * MIB) == 8 * MIB


def test_drain_and_resend_keep_the_defaults_of_run_only_settings() -> None:
    environ = {"DURABLE_AGENT_SEGMENT_BYTES": "1048576", "DURABLE_AGENT_TIMEOUT": "7"}
    drain = settings_from(build_parser(environ).parse_args(["drain", "--kafka-bootstrap=k:1"]))
    assert drain.agent.drain_mode_timeout_s == 7.0
    assert drain.wal == WalConfig()


def test_drain_reads_the_wal_with_the_policy_it_was_written_with() -> None:
    """Recovery reports a corrupt complete tail frame as lost under `always` only."""
    environ = {"DURABLE_AGENT_FSYNC": "always"}
    drain = settings_from(build_parser(environ).parse_args(["drain", "--kafka-bootstrap=k:1"]))
    assert drain.wal == WalConfig(fsync=FsyncPolicy.ALWAYS)
    resend = build_parser(environ).parse_args(
        ["dead-letters", "resend", "--kafka-bootstrap=k:1", "--kafka-setting=a=b", "id-1"]
    )
    assert dict(settings_from(resend).kafka.extra) == {"a": "b"}
    assert resend.ids == ["id-1"]


def test_every_user_facing_field_is_offered_by_a_command() -> None:
    offered = {(o.config, o.fields) for o in (*COMMON_OPTIONS, *RUN_OPTIONS, *DRAIN_OPTIONS)}
    for config in (AgentConfig, KafkaConnectionSettings, WalConfig, IngestConfig, ForwarderConfig):
        for declared in options_of(config):
            assert (declared.config, declared.fields) in offered, declared.flag
    for command in (RUN_OPTIONS, DRAIN_OPTIONS):  # each flag once per command
        flags = [o.flag for o in (*COMMON_OPTIONS, *command)]
        assert len(flags) == len(set(flags))


def test_help_shows_each_default_and_variable(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        build_parser({}).parse_args(["run", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "(default: interval) [env: DURABLE_AGENT_FSYNC]" in text
    assert "(default: 127.0.0.1:9092) [env: DURABLE_AGENT_LISTEN]" in text
    assert f"(default: {contract.DATA_DIR}) [env: DURABLE_AGENT_DATA_DIR]" in text
    assert "list) [env: DURABLE_AGENT_KAFKA_SETTING]" in text  # no default shown
    assert "{always,interval,never}" in text


def test_a_changed_default_changes_the_generated_reference() -> None:
    (fsync,) = options_of(WalConfig, "fsync")
    assert "| `--fsync` | `DURABLE_AGENT_FSYNC` | `interval` |" in reference_table((fsync,))
    changed = replace(fsync, default=FsyncPolicy.ALWAYS)
    assert "| `--fsync` | `DURABLE_AGENT_FSYNC` | `always` |" in reference_table((changed,))


@pytest.mark.parametrize(
    "command", [["drain"], ["dead-letters", "resend", "id-1"], ["run"]]
)
def test_every_forwarding_command_refuses_a_request_timeout_kafka_cannot_carry(
    command: list[str],
) -> None:
    argv = [*command, "--kafka-bootstrap=k:1", "--request-timeout=2147484"]
    with pytest.raises(SettingError, match="--request-timeout=2147484 is more than"):
        settings_from(build_parser({}).parse_args(argv))
