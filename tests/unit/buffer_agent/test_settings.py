from __future__ import annotations

import re
from pathlib import Path

import pytest

from durable_producer.buffer_agent.cli import build_parser
from durable_producer.buffer_agent.settings import (
    COMMON_OPTIONS,
    DRAIN_OPTIONS,
    RUN_OPTIONS,
    reference_table,
    settings_from,
)
from durable_producer.buffer_agent.wal import FsyncPolicy

DOCS = Path(__file__).resolve().parents[3] / "docs" / "agent.md"


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
    assert settings.wal_config().fsync is FsyncPolicy.ALWAYS
    assert settings.ingress_config().port == 19092
    connection = settings.kafka_connection()
    assert connection.bootstrap_servers == "kafka:9092"
    assert dict(connection.extra) == {"linger.ms": "7", "compression.type": "lz4"}


def test_flags_override_the_environment_and_bad_values_are_explained(
    capsys: pytest.CaptureFixture[str],
) -> None:
    parser = build_parser({"DURABLE_AGENT_FSYNC": "never"})
    args = parser.parse_args(["run", "--kafka-bootstrap", "k:9092", "--fsync", "interval"])
    assert settings_from(args).wal_config().fsync is FsyncPolicy.INTERVAL
    with pytest.raises(SystemExit):
        parser.parse_args(["run", "--kafka-bootstrap", "k:9092", "--listen", "nonsense"])
    assert "is not HOST:PORT" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        parser.parse_args(["run"])
    assert "--kafka-bootstrap" in capsys.readouterr().err
