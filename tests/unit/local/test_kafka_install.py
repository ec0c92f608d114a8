"""Where the local Kafka's jars and java come from; one-line errors when they are missing."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from durable_producer.local import kafka_node
from durable_producer.local.kafka_node import (
    KAFKA_LIBS_ENV,
    KAFKA_VERSION,
    KafkaNotInstalled,
    java_binary,
    kafka_libs,
    new_cluster_id,
)

REPO = Path(__file__).resolve().parents[3]


def test_the_version_is_the_one_the_pom_installs() -> None:
    pom = (REPO / "scripts" / "kafka" / "pom.xml").read_text()
    assert f"<kafka.version>{KAFKA_VERSION}</kafka.version>" in pom


def test_the_slf4j_binding_is_pinned_to_log4j_core() -> None:
    pom = (REPO / "scripts" / "kafka" / "pom.xml").read_text()
    versions = re.findall(
        r"<artifactId>(log4j-core|log4j-slf4j-impl)</artifactId>\s*<version>([^<]+)</version>", pom
    )
    assert dict(versions) == {
        "log4j-core": "${log4j.version}",
        "log4j-slf4j-impl": "${log4j.version}",
    }


def test_override_folder_without_jars_is_a_one_line_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(KAFKA_LIBS_ENV, str(tmp_path))
    with pytest.raises(KafkaNotInstalled) as raised:
        kafka_libs()
    assert "\n" not in str(raised.value)
    assert KAFKA_LIBS_ENV in str(raised.value) and "make tools" in str(raised.value)


def test_override_folder_with_jars_is_used(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / f"kafka_2.13-{KAFKA_VERSION}.jar").write_bytes(b"")
    monkeypatch.setenv(KAFKA_LIBS_ENV, str(tmp_path))
    assert kafka_libs() == tmp_path


def test_not_installed_names_make_tools(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(KAFKA_LIBS_ENV, raising=False)
    monkeypatch.setattr(kafka_node, "repository_roots", lambda: [tmp_path])
    with pytest.raises(KafkaNotInstalled) as raised:
        kafka_libs()
    message = str(raised.value)
    assert "\n" not in message
    assert f"Apache Kafka {KAFKA_VERSION} is not installed" in message
    assert "run `make tools`" in message and str(tmp_path) in message


def test_java_from_java_home_first(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    java = tmp_path / "bin" / "java"
    java.parent.mkdir()
    java.write_text("#!/bin/sh\n")
    monkeypatch.setenv("JAVA_HOME", str(tmp_path))
    assert java_binary() == str(java)


def test_no_java_is_a_one_line_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("JAVA_HOME", str(tmp_path))
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(KafkaNotInstalled, match="java not found: install Java 17 or set JAVA_HOME"):
        java_binary()


def test_cluster_ids_are_kraft_uuids_that_never_start_with_a_dash() -> None:
    """StorageTool parses ``--cluster-id -abc`` as a missing value: the format failed, once in
    64 starts, when an id began with "-" (as Kafka's own Uuid.randomUuid never does)."""
    ids = {new_cluster_id() for _ in range(2000)}
    assert len(ids) == 2000
    assert all(re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_-]{21}", cluster_id) for cluster_id in ids)


def test_install_script_fails_in_one_line_without_maven(tmp_path: Path) -> None:
    done = subprocess.run(
        ["bash", str(REPO / "scripts" / "install-kafka.sh")],
        env={"PATH": "/usr/bin:/bin", "TOOLS_DIR": str(tmp_path), "MVN": "no-such-mvn"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode != 0
    assert done.stderr.strip().splitlines() == [
        "[install-kafka] error: 'no-such-mvn' not found:"
        " install Maven (Debian: apt-get install maven)"
    ]
