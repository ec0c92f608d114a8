"""Kafka connection settings -> a validated confluent-kafka (librdkafka) configuration.

Secrets are never passed inline in a resource: TLS material comes as file paths and SASL
credentials as files or environment variables, which is how Kubernetes Secrets are
mounted. Every problem found is reported at once, with the setting's name, so the agent
fails at start with a message that says what to fix.
"""

from __future__ import annotations

import os
import ssl
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from durable_producer.buffer_agent.kafka.connection import EncryptedKeyError, Security
from durable_producer.buffer_agent.options import one_of, option

SECURITY_PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
SASL_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")

# Settings the forwarder owns: changing them would break the no-loss / ordering promise.
FORWARDER_OWNED_SETTINGS = {
    "acks": "the forwarder always uses acks=all",
    "request.required.acks": "the forwarder always uses acks=all",
    "enable.idempotence": "the forwarder always produces idempotently",
    "message.timeout.ms": "records never expire in the forwarder (message.timeout.ms=0)",
    "delivery.timeout.ms": "records never expire in the forwarder (message.timeout.ms=0)",
    "transactional.id": "the forwarder does not use transactions",
}

# Settings this module derives from the structured fields; set them there, not as extras.
STRUCTURED_SETTINGS = {
    "bootstrap.servers": "bootstrap_servers",
    "metadata.broker.list": "bootstrap_servers",
    "security.protocol": "security_protocol",
    "ssl.ca.location": "ssl_ca_file",
    "ssl.certificate.location": "ssl_cert_file",
    "ssl.key.location": "ssl_key_file",
    "ssl.key.password": "ssl_key_password_file",
    "sasl.mechanism": "sasl_mechanism",
    "sasl.mechanisms": "sasl_mechanism",
    "sasl.username": "sasl_username / sasl_username_file / sasl_username_env",
    "sasl.password": "sasl_password_file / sasl_password_env",
}


class KafkaConfigError(ValueError):
    """The Kafka connection settings are unusable; the message lists every problem."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = problems
        super().__init__("invalid Kafka connection settings: " + "; ".join(problems))


EXTRA_FLAG = "--kafka-setting"
"""The flag (and ``DURABLE_AGENT_KAFKA_SETTING``) that gives extra librdkafka settings."""


def parse_extra_settings(items: Iterable[str]) -> dict[str, str]:
    """``["linger.ms=5", "compression.type=lz4"]`` -> a dict; raises on malformed items."""
    settings: dict[str, str] = {}
    problems = []
    for item in items:
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or not key:
            problems.append(f"Kafka setting {item!r} ({EXTRA_FLAG}) is not of the form key=value")
            continue
        if key in settings:
            problems.append(f"Kafka setting {key!r} ({EXTRA_FLAG}) is given more than once")
        settings[key] = value.strip()
    if problems:
        raise KafkaConfigError(problems)
    return settings


@dataclass(frozen=True, slots=True)
class KafkaConnectionSettings:
    """How the forwarder reaches the real cluster; the ``option`` fields are agent flags."""

    bootstrap_servers: str = field(
        metadata=option(
            "bootstrap servers of the real Kafka cluster (HOST:PORT,...)",
            flag="--kafka-bootstrap",
        )
    )
    security_protocol: str = field(default="PLAINTEXT", metadata=option(one_of(SECURITY_PROTOCOLS)))
    ssl_ca_file: Path | None = field(
        default=None,
        metadata=option("CA bundle to verify the brokers (a mounted Secret)", parse=Path),
    )
    ssl_cert_file: Path | None = field(
        default=None, metadata=option("client certificate for mutual TLS", parse=Path)
    )
    ssl_key_file: Path | None = field(
        default=None, metadata=option("client private key for mutual TLS", parse=Path)
    )
    ssl_key_password_file: Path | None = field(
        default=None, metadata=option("file holding the client key's password", parse=Path)
    )
    sasl_mechanism: str | None = field(
        default=None,
        metadata=option("PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512"),
    )
    sasl_username: str | None = None
    sasl_username_file: Path | None = field(
        default=None,
        metadata=option("file holding the SASL username (a mounted Secret)", parse=Path),
    )
    sasl_username_env: str | None = None
    sasl_password_file: Path | None = field(
        default=None,
        metadata=option("file holding the SASL password (a mounted Secret)", parse=Path),
    )
    sasl_password_env: str | None = None
    extra: Mapping[str, str] = field(
        default_factory=dict,
        metadata=option(
            "extra librdkafka setting KEY=VALUE for the agent's metadata client; the"
            " forwarder, a Kafka client of its own, takes only the connection and security"
            " settings (repeatable; the env var takes a comma-separated list)",
            flag=EXTRA_FLAG,
            repeatable=True,
            collect=parse_extra_settings,
        ),
    )


def build_client_config(
    settings: KafkaConnectionSettings, environ: Mapping[str, str] | None = None
) -> dict[str, str]:
    """Validate ``settings`` and return the librdkafka configuration for them."""
    environ = os.environ if environ is None else environ
    problems: list[str] = []
    config: dict[str, str] = {}

    servers = _check_bootstrap(settings.bootstrap_servers, problems)
    if servers:
        config["bootstrap.servers"] = servers

    protocol = settings.security_protocol.strip().upper()
    if protocol not in SECURITY_PROTOCOLS:
        problems.append(
            f"security_protocol {settings.security_protocol!r} is not one of"
            f" {', '.join(SECURITY_PROTOCOLS)}"
        )
    config["security.protocol"] = protocol
    uses_tls = protocol in ("SSL", "SASL_SSL")
    uses_sasl = protocol in ("SASL_PLAINTEXT", "SASL_SSL")

    _add_tls(settings, uses_tls, config, problems)
    _add_sasl(settings, uses_sasl, environ, config, problems)
    _add_extras(settings.extra, config, problems)
    if uses_tls and not problems:
        _check_tls_files(config, settings.ssl_key_password_file, problems)

    if problems:
        raise KafkaConfigError(problems)
    return config


def _check_tls_files(
    config: Mapping[str, str], password_file: Path | None, problems: list[str]
) -> None:
    """Load the TLS files as the forwarder will (a CA file that is no PEM certificate was an
    SSLError traceback in every command; an encrypted key without its password, OpenSSL's
    pass phrase prompt)."""
    try:
        Security.from_client_config(config)
    except EncryptedKeyError as error:
        key = config.get("ssl.key.location")
        problems.append(
            f"ssl_key_file {key!r} does not decrypt with the password in ssl_key_password_file"
            f" {str(password_file)!r}: put the key's password in that file"
            if error.password_given
            else f"ssl_key_file {key!r} is an encrypted key: give the file that holds its"
            " password with ssl_key_password_file"
        )
    except (ssl.SSLError, OSError, ValueError) as error:
        problems.append(
            f"the TLS files cannot be used ({error}): ssl_ca_file, ssl_cert_file and"
            " ssl_key_file must be PEM files, ssl_key_password_file the key's password"
        )


def _check_bootstrap(servers: str, problems: list[str]) -> str:
    entries = [entry.strip() for entry in servers.split(",") if entry.strip()]
    if not entries:
        problems.append("bootstrap_servers is empty: give host:port[,host:port...]")
        return ""
    for entry in entries:
        if "://" in entry:
            problems.append(f"bootstrap server {entry!r}: give host:port, without a scheme")
            continue
        host, sep, port = entry.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            problems.append(f"bootstrap server {entry!r} is not host:port")
    return ",".join(entries)


def _add_tls(
    settings: KafkaConnectionSettings, uses_tls: bool, config: dict[str, str], problems: list[str]
) -> None:
    tls_files = {
        "ssl_ca_file": (settings.ssl_ca_file, "ssl.ca.location"),
        "ssl_cert_file": (settings.ssl_cert_file, "ssl.certificate.location"),
        "ssl_key_file": (settings.ssl_key_file, "ssl.key.location"),
    }
    given = [name for name, (path, _) in tls_files.items() if path is not None]
    if settings.ssl_key_password_file is not None:
        given.append("ssl_key_password_file")
    if not uses_tls:
        if given:
            problems.append(
                f"{', '.join(given)} given but security_protocol is"
                f" {settings.security_protocol}: use SSL or SASL_SSL"
            )
        return
    for name, (path, librdkafka_name) in tls_files.items():
        if path is not None and _check_readable(name, path, problems):
            config[librdkafka_name] = str(path)
    if (settings.ssl_cert_file is None) != (settings.ssl_key_file is None):
        problems.append("ssl_cert_file and ssl_key_file must be given together (client TLS auth)")
    if settings.ssl_key_password_file is not None:
        if settings.ssl_key_file is None:
            problems.append("ssl_key_password_file given without ssl_key_file")
        password = _read_secret_file(
            "ssl_key_password_file", settings.ssl_key_password_file, problems
        )
        if password is not None:
            config["ssl.key.password"] = password


def _add_sasl(
    settings: KafkaConnectionSettings,
    uses_sasl: bool,
    environ: Mapping[str, str],
    config: dict[str, str],
    problems: list[str],
) -> None:
    username_sources = {
        "sasl_username": settings.sasl_username,
        "sasl_username_file": settings.sasl_username_file,
        "sasl_username_env": settings.sasl_username_env,
    }
    password_sources = {
        "sasl_password_file": settings.sasl_password_file,
        "sasl_password_env": settings.sasl_password_env,
    }
    given_user = [name for name, value in username_sources.items() if value is not None]
    given_password = [name for name, value in password_sources.items() if value is not None]
    if not uses_sasl:
        given = given_user + given_password
        if settings.sasl_mechanism is not None:
            given.insert(0, "sasl_mechanism")
        if given:
            problems.append(
                f"{', '.join(given)} given but security_protocol is"
                f" {settings.security_protocol}: use SASL_PLAINTEXT or SASL_SSL"
            )
        return

    mechanism = (settings.sasl_mechanism or "").strip().upper()
    if not mechanism:
        problems.append(
            f"sasl_mechanism is required with SASL (one of {', '.join(SASL_MECHANISMS)})"
        )
    elif mechanism not in SASL_MECHANISMS:
        problems.append(
            f"sasl_mechanism {settings.sasl_mechanism!r} is not one of {', '.join(SASL_MECHANISMS)}"
        )
    else:
        config["sasl.mechanism"] = mechanism

    username = _one_secret(
        "username",
        given_user,
        settings.sasl_username,
        settings.sasl_username_file,
        settings.sasl_username_env,
        environ,
        problems,
    )
    password = _one_secret(
        "password",
        given_password,
        None,
        settings.sasl_password_file,
        settings.sasl_password_env,
        environ,
        problems,
    )
    if username is not None:
        config["sasl.username"] = username
    if password is not None:
        config["sasl.password"] = password


def _one_secret(
    what: str,
    given: list[str],
    literal: str | None,
    path: Path | None,
    env_name: str | None,
    environ: Mapping[str, str],
    problems: list[str],
) -> str | None:
    """Exactly one source of a SASL credential; returns its value or records a problem."""
    if not given:
        problems.append(f"SASL needs a {what}: give sasl_{what}_file or sasl_{what}_env")
        return None
    if len(given) > 1:
        problems.append(f"conflicting SASL {what} sources: {', '.join(given)}; give only one")
        return None
    if literal is not None:
        return literal
    if path is not None:
        return _read_secret_file(f"sasl_{what}_file", path, problems)
    assert env_name is not None
    value = environ.get(env_name)
    if value is None:
        problems.append(f"sasl_{what}_env names {env_name!r}, which is not set")
        return None
    if not value:
        problems.append(f"environment variable {env_name!r} (SASL {what}) is empty")
        return None
    return value


def _check_readable(name: str, path: Path, problems: list[str]) -> bool:
    if not path.exists():
        problems.append(f"{name} {str(path)!r} does not exist")
        return False
    if not path.is_file():
        problems.append(f"{name} {str(path)!r} is not a file")
        return False
    if not os.access(path, os.R_OK):
        problems.append(f"{name} {str(path)!r} is not readable")
        return False
    return True


def _read_secret_file(name: str, path: Path, problems: list[str]) -> str | None:
    """A mounted Secret key; one trailing newline (as editors and `echo` add) is dropped."""
    if not _check_readable(name, path, problems):
        return None
    try:
        value = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as error:
        byte = error.object[error.start]
        problems.append(
            f"{name} {str(path)!r} is not UTF-8 text (byte {byte:#04x} at offset {error.start}):"
            " the file must hold the secret itself, as text"
        )
        return None
    except OSError as error:
        problems.append(f"{name} {str(path)!r} cannot be read ({error.strerror or error})")
        return None
    if "\0" in value:
        problems.append(
            f"{name} {str(path)!r} holds a NUL byte: the file must hold the secret itself, as text"
        )
        return None
    if value.endswith("\n"):
        value = value[:-1].removesuffix("\r")
    if not value:
        problems.append(f"{name} {str(path)!r} is empty")
        return None
    return value


def _add_extras(extra: Mapping[str, str], config: dict[str, str], problems: list[str]) -> None:
    for key, value in extra.items():
        if key in FORWARDER_OWNED_SETTINGS:
            problems.append(
                f"Kafka setting {key!r} ({EXTRA_FLAG}) is not allowed:"
                f" {FORWARDER_OWNED_SETTINGS[key]}"
            )
        elif key in STRUCTURED_SETTINGS:
            problems.append(
                f"Kafka setting {key!r} ({EXTRA_FLAG}) conflicts with a structured setting: use"
                f" {STRUCTURED_SETTINGS[key]} instead"
            )
        else:
            config[key] = value
