"""The installs of the Kafka Java client and of Spark's Kafka sink (scripts/install-*.sh on
scripts/lib/maven-jars.sh): versions defined once, one-line errors."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from durable_producer.local.kafka_node import KAFKA_VERSION
from support.client_records import ClientRecord
from support.java_client import JAVA_CLIENT_LIBS, JavaClientNotInstalled, record_line
from support.spark_kafka import SINK_ARTIFACT

REPO = Path(__file__).resolve().parents[3]
SCRIPTS = REPO / "scripts"


def run_script(name: str, tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(SCRIPTS / name)],
        env={"PATH": "/usr/bin:/bin", "TOOLS_DIR": str(tmp_path), **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_the_java_client_is_the_release_of_the_brokers() -> None:
    """The client pom has no Kafka version of its own: the script passes the broker pom's."""
    pom = (SCRIPTS / "java-client" / "pom.xml").read_text()
    assert "<kafka.version>" not in pom
    assert "<version>${kafka.version}</version>" in pom
    assert JAVA_CLIENT_LIBS.parent.name == KAFKA_VERSION


def test_the_spark_sink_version_is_not_written_in_its_pom() -> None:
    """Its version follows the installed pyspark (the script passes it)."""
    pom = (SCRIPTS / "spark-kafka" / "pom.xml").read_text()
    versions = re.findall(r"<artifactId>([^<]+)</artifactId>\s*<version>([^<]+)</version>", pom)
    assert versions[1:] == [(SINK_ARTIFACT, "${spark.kafka.version}")]  # [0]: the pom itself


@pytest.mark.parametrize("script", ["install-java-client.sh", "install-spark-kafka.sh"])
def test_install_fails_in_one_line_without_maven(script: str, tmp_path: Path) -> None:
    done = run_script(script, tmp_path, MVN="no-such-mvn", PYTHON=sys.executable)
    assert done.returncode != 0
    tag = script.removesuffix(".sh")
    assert done.stderr.strip().splitlines() == [
        f"[{tag}] error: 'no-such-mvn' not found: install Maven (Debian: apt-get install maven)"
    ]


def test_spark_sink_install_without_pyspark_names_make_venv(tmp_path: Path) -> None:
    done = run_script("install-spark-kafka.sh", tmp_path, PYTHON=str(tmp_path / "no-python"))
    assert done.returncode != 0
    assert done.stderr.strip().splitlines() == [
        f"[install-spark-kafka] error: no pyspark in {tmp_path / 'no-python'}:"
        " run `make venv` first (or set PYTHON)"
    ]


def test_records_are_written_for_the_java_program_without_ambiguity() -> None:
    """Null and empty differ; header names and values survive any bytes (base64 has no ':')."""
    record = ClientRecord(
        "t", None, b"", (("h", b"\x00=:,\t"), ("h", None), ("", b"")), partition=3, timestamp_ms=7
    )
    fields = record_line(record).split("\t")
    assert fields[:5] == ["t", "3", "7", "-", ""]
    assert fields[5].split(",") == ["aA==:AD06LAk=", "aA==:-", ":"]


def test_a_missing_client_is_a_one_line_error(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from support import java_client

    monkeypatch.setattr(java_client, "JAVA_CLIENT_LIBS", tmp_path)
    with pytest.raises(JavaClientNotInstalled) as raised:
        java_client.java_client_libs()
    assert "\n" not in str(raised.value) and "run `make tools`" in str(raised.value)
