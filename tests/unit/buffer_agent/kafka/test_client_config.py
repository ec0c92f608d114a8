"""Kafka connection settings are validated with messages that say what to fix."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import trustme

from durable_producer.buffer_agent.kafka.client_config import (
    KafkaConfigError,
    KafkaConnectionSettings,
    build_client_config,
    parse_extra_settings,
)
from durable_producer.buffer_agent.kafka.cluster_metadata import ClusterMetadataSource
from support.tls_files import client_tls_files


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def test_plaintext_minimal() -> None:
    config = build_client_config(KafkaConnectionSettings(" kafka-0:9092 , kafka-1:9092"), {})
    assert config == {
        "bootstrap.servers": "kafka-0:9092,kafka-1:9092",
        "security.protocol": "PLAINTEXT",
    }


def test_sasl_ssl_from_mounted_secret_files(tmp_path: Path) -> None:
    authority = trustme.CA()
    issued = authority.issue_cert("app.clients.test")
    ca, cert, key = tmp_path / "ca.crt", tmp_path / "tls.crt", tmp_path / "tls.key"
    authority.cert_pem.write_to_path(str(ca))
    issued.cert_chain_pems[0].write_to_path(str(cert))
    issued.private_key_pem.write_to_path(str(key))
    password = _write(tmp_path / "password", "s3cret\n")
    settings = KafkaConnectionSettings(
        "kafka:9093",
        security_protocol="sasl_ssl",
        ssl_ca_file=ca,
        ssl_cert_file=cert,
        ssl_key_file=key,
        sasl_mechanism="scram-sha-512",
        sasl_username_env="KAFKA_USER",
        sasl_password_file=password,
        extra={"linger.ms": "20"},
    )

    config = build_client_config(settings, {"KAFKA_USER": "app"})

    assert config == {
        "bootstrap.servers": "kafka:9093",
        "security.protocol": "SASL_SSL",
        "ssl.ca.location": str(ca),
        "ssl.certificate.location": str(cert),
        "ssl.key.location": str(key),
        "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.username": "app",
        "sasl.password": "s3cret",
        "linger.ms": "20",
    }


def test_every_problem_is_reported_at_once(tmp_path: Path) -> None:
    settings = KafkaConnectionSettings(
        "no-port",
        security_protocol="SASL_SSL",
        ssl_ca_file=tmp_path / "missing-ca.crt",
        ssl_cert_file=_write(tmp_path / "tls.crt", "CERT"),
        sasl_mechanism="GSSAPI",
        sasl_password_env="UNSET_VAR",
    )

    with pytest.raises(KafkaConfigError) as raised:
        build_client_config(settings, {})

    problems = "\n".join(raised.value.problems)
    assert "'no-port' is not host:port" in problems
    assert "missing-ca.crt' does not exist" in problems
    assert "ssl_cert_file and ssl_key_file must be given together" in problems
    assert "sasl_mechanism 'GSSAPI' is not one of" in problems
    assert "SASL needs a username" in problems
    assert "'UNSET_VAR', which is not set" in problems
    assert len(raised.value.problems) == 6


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        (KafkaConnectionSettings(""), "bootstrap_servers is empty"),
        (KafkaConnectionSettings("http://k:9092"), "give host:port, without a scheme"),
        (KafkaConnectionSettings("k:9092", security_protocol="TLS"), "is not one of"),
        (
            KafkaConnectionSettings("k:9092", sasl_mechanism="PLAIN"),
            "sasl_mechanism given but security_protocol is PLAINTEXT",
        ),
        (
            KafkaConnectionSettings("k:9092", ssl_ca_file=Path("/ca")),
            "ssl_ca_file given but security_protocol is PLAINTEXT",
        ),
        (
            KafkaConnectionSettings("k:9092", security_protocol="SASL_PLAINTEXT"),
            "sasl_mechanism is required",
        ),
        (
            KafkaConnectionSettings(
                "k:9092",
                security_protocol="SASL_PLAINTEXT",
                sasl_mechanism="PLAIN",
                sasl_username="u",
                sasl_username_env="USER_VAR",
                sasl_password_env="PW",
            ),
            "conflicting SASL username sources: sasl_username, sasl_username_env",
        ),
        (
            KafkaConnectionSettings("k:9092", extra={"enable.idempotence": "false"}),
            r"'enable.idempotence' \(--kafka-setting\) is not allowed",
        ),
        (
            KafkaConnectionSettings("k:9092", extra={"message.timeout.ms": "30000"}),
            "records never expire",
        ),
        (
            KafkaConnectionSettings("k:9092", extra={"sasl.password": "x"}),
            "use sasl_password_file / sasl_password_env instead",
        ),
    ],
)
def test_invalid_settings(settings: KafkaConnectionSettings, message: str) -> None:
    with pytest.raises(KafkaConfigError, match=message):
        build_client_config(settings, {"USER_VAR": "u", "PW": "p"})


def test_empty_secret_file_is_rejected(tmp_path: Path) -> None:
    settings = KafkaConnectionSettings(
        "k:9092",
        security_protocol="SASL_PLAINTEXT",
        sasl_mechanism="PLAIN",
        sasl_username="u",
        sasl_password_file=_write(tmp_path / "pw", "\n"),
    )
    with pytest.raises(KafkaConfigError, match="is empty"):
        build_client_config(settings, {})


def test_parse_extra_settings() -> None:
    assert parse_extra_settings(["linger.ms=5", "client.id = a=b"]) == {
        "linger.ms": "5",
        "client.id": "a=b",
    }
    with pytest.raises(KafkaConfigError, match="not of the form key=value"):
        parse_extra_settings(["linger.ms"])
    with pytest.raises(KafkaConfigError, match="more than once"):
        parse_extra_settings(["a=1", "a=2"])


def test_librdkafka_rejects_a_misspelt_extra() -> None:
    """The metadata client's librdkafka raised KafkaException: a 28-line traceback of
    ``durable-agent run``, exit 1."""
    config = build_client_config(KafkaConnectionSettings("127.0.0.1:9", extra={"lingr.ms": "5"}))
    with pytest.raises(KafkaConfigError, match=r"lingr\.ms"):
        ClusterMetadataSource(config)
    ClusterMetadataSource(build_client_config(KafkaConnectionSettings("127.0.0.1:9"))).close()


def test_a_ca_file_that_is_no_certificate_is_a_setting_error(tmp_path: Path) -> None:
    """It was an ssl.SSLError traceback in every command (a Secret mounted wrong)."""
    settings = KafkaConnectionSettings(
        "k:9092", security_protocol="SSL", ssl_ca_file=_write(tmp_path / "ca.pem", "not PEM")
    )
    with pytest.raises(KafkaConfigError, match="the TLS files cannot be used"):
        build_client_config(settings, {})


def _mutual_tls(tmp_path: Path, password: str | None = None) -> KafkaConnectionSettings:
    certificate, key = client_tls_files(tmp_path, "right")
    return KafkaConnectionSettings(
        "k:9092",
        security_protocol="SSL",
        ssl_cert_file=certificate,
        ssl_key_file=key,
        ssl_key_password_file=None if password is None else _write(tmp_path / "pw", password),
    )


def test_an_encrypted_key_without_its_password_says_so(tmp_path: Path) -> None:
    """OpenSSL asked for the pass phrase on the terminal (an agent with a TTY hung at start)
    and, without one, failed with "[Errno 22] Invalid argument"."""
    settings = _mutual_tls(tmp_path)
    with pytest.raises(KafkaConfigError) as raised:
        build_client_config(settings, {})
    assert raised.value.problems == [
        f"ssl_key_file {str(settings.ssl_key_file)!r} is an encrypted key: give the file that"
        " holds its password with ssl_key_password_file"
    ]


def test_an_encrypted_key_with_a_wrong_password_says_so(tmp_path: Path) -> None:
    """It said "[SSL] PEM lib", and that the files must be PEM files."""
    settings = _mutual_tls(tmp_path, "wrong\n")
    with pytest.raises(KafkaConfigError) as raised:
        build_client_config(settings, {})
    assert raised.value.problems == [
        f"ssl_key_file {str(settings.ssl_key_file)!r} does not decrypt with the password in"
        f" ssl_key_password_file {str(tmp_path / 'pw')!r}: put the key's password in that file"
    ]


def test_an_encrypted_key_with_its_password(tmp_path: Path) -> None:
    config = build_client_config(_mutual_tls(tmp_path, "right\n"), {})
    assert config["ssl.key.password"] == "right"


def test_an_encrypted_key_of_another_certificate_is_no_password_problem(tmp_path: Path) -> None:
    (tmp_path / "other").mkdir()
    other, _ = client_tls_files(tmp_path / "other")
    settings = dataclasses.replace(_mutual_tls(tmp_path, "right"), ssl_cert_file=other)
    with pytest.raises(KafkaConfigError, match="KEY_VALUES_MISMATCH"):
        build_client_config(settings, {})


SECRET_FILES = ("sasl_username_file", "sasl_password_file", "ssl_key_password_file")


def _with_secret_file(tmp_path: Path, name: str, path: Path) -> KafkaConnectionSettings:
    """SASL_SSL settings whose ``name`` is ``path``, every other secret a good file."""
    certificate, key = client_tls_files(tmp_path)
    files = {secret: _write(tmp_path / f"{secret}.txt", "good\n") for secret in SECRET_FILES}
    files[name] = path
    return KafkaConnectionSettings(
        "k:9092",
        security_protocol="SASL_SSL",
        ssl_cert_file=certificate,
        ssl_key_file=key,
        sasl_mechanism="PLAIN",
        **files,  # type: ignore[arg-type]
    )


@pytest.mark.parametrize("name", SECRET_FILES)
def test_a_secret_file_that_is_no_utf8_text_is_a_setting_error(tmp_path: Path, name: str) -> None:
    """A file of random bytes was a UnicodeDecodeError traceback, exit 1, in run and drain."""
    path = tmp_path / "random"
    path.write_bytes(b"ab\x99\xfe" + bytes(range(256)))
    with pytest.raises(KafkaConfigError) as raised:
        build_client_config(_with_secret_file(tmp_path, name, path), {})
    assert raised.value.problems == [
        f"{name} {str(path)!r} is not UTF-8 text (byte 0x99 at offset 2): the file must hold"
        " the secret itself, as text"
    ]


@pytest.mark.parametrize("name", SECRET_FILES)
def test_a_secret_file_with_a_nul_byte_is_a_setting_error(tmp_path: Path, name: str) -> None:
    """librdkafka takes C strings: the secret was cut short at the NUL, and a password then
    failed only at the broker."""
    path = tmp_path / "binary"
    path.write_bytes(b"pass\0word")
    with pytest.raises(KafkaConfigError) as raised:
        build_client_config(_with_secret_file(tmp_path, name, path), {})
    assert raised.value.problems == [
        f"{name} {str(path)!r} holds a NUL byte: the file must hold the secret itself, as text"
    ]


@pytest.mark.parametrize("name", SECRET_FILES)
def test_a_secret_file_that_cannot_be_read_is_a_setting_error(
    tmp_path: Path, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """os.access says yes but the read fails (root where the file system says no)."""
    path = _write(tmp_path / "refusing", "secret")
    original = Path.read_text

    def read_text(self: Path, *args: object, **kwargs: object) -> str:
        if self == path:
            raise PermissionError(13, "Permission denied", str(path))
        return original(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(Path, "read_text", read_text)
    with pytest.raises(KafkaConfigError) as raised:
        build_client_config(_with_secret_file(tmp_path, name, path), {})
    assert raised.value.problems == [f"{name} {str(path)!r} cannot be read (Permission denied)"]
