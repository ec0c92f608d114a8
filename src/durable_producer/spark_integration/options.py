"""Options of the durable-kafka data source, parsed once on the driver.

The bootstrap address is deliberately *not* resolved here: the agent's address comes
from the executor pod's environment (``DURABLE_PRODUCER_BOOTSTRAP``, set by the
operator's webhook), which the driver cannot see. ``resolve_bootstrap`` runs in the task.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Mapping
from dataclasses import dataclass, field

from durable_producer.contract import AGENT_BOOTSTRAP, BOOTSTRAP_TWIN_ENV
from durable_producer.spark_integration.errors import SinkOptionError
from durable_producer.spark_integration.topic_names import check_topic_name

PRODUCER_PREFIX = "kafka."

DEFAULT_AGENT_WAIT_SECONDS = 10.0
DEFAULT_FLUSH_TIMEOUT_SECONDS = 330.0

# The partitioner of Spark's Kafka sink and of every Java producer: murmur2 of the key
# (librdkafka's own default, consistent_random, hashes with CRC32 and would put the same key
# in a different partition). Null keys go to a random partition, sticky for a short while,
# as in the Java producer.
JAVA_COMPATIBLE_PARTITIONER = "murmur2_random"

# librdkafka settings that make the task's "all acknowledged" check cheap and strict.
# Users may override any of them with a ``kafka.``-prefixed option.
DEFAULT_PRODUCER_CONFIG: dict[str, str] = {
    "partitioner": JAVA_COMPATIBLE_PARTITIONER,
    "enable.idempotence": "true",
    "acks": "all",
    "linger.ms": "5",
    "batch.num.messages": "10000",
    "queue.buffering.max.messages": "500000",
    "queue.buffering.max.kbytes": "262144",
    "delivery.report.only.error": "true",
    "client.id": "durable-kafka-spark",
}

# Settings interpreted by confluent-kafka's Python layer, which wants bools, not strings.
_PYTHON_CLIENT_BOOLEANS = ("delivery.report.only.error",)

# Options of the data source itself (compared lower-case: Spark's options are case-insensitive).
# Other options are ignored, as Spark's own Kafka sink does (Spark adds some, e.g. "path").
_OPTION_BOOTSTRAP = "bootstrap"
_OPTION_TOPIC = "topic"
_OPTION_TOMBSTONES = "tombstones"
_OPTION_AGENT_WAIT = "agentWaitSeconds"
_OPTION_FLUSH_TIMEOUT = "flushTimeoutSeconds"
KNOWN_OPTIONS = (
    _OPTION_BOOTSTRAP,
    _OPTION_TOPIC,
    _OPTION_TOMBSTONES,
    _OPTION_AGENT_WAIT,
    _OPTION_FLUSH_TIMEOUT,
    PRODUCER_PREFIX + "bootstrap.servers",
)
# How alike an unknown option must be to a known one to be taken for a misspelling of it.
_MISSPELLING_CUTOFF = 0.75


@dataclass(frozen=True)
class SinkOptions:
    """Everything a write task needs besides the data; picklable (sent to executors)."""

    bootstrap: str | None = None
    topic: str | None = None
    tombstones: bool = False
    agent_wait_seconds: float = DEFAULT_AGENT_WAIT_SECONDS
    flush_timeout_seconds: float = DEFAULT_FLUSH_TIMEOUT_SECONDS
    producer_overrides: dict[str, str] = field(default_factory=dict)

    def producer_config(self, bootstrap: str) -> dict[str, str | bool]:
        """The confluent-kafka configuration for a task writing to ``bootstrap``."""
        config: dict[str, str | bool] = {**DEFAULT_PRODUCER_CONFIG, **self.producer_overrides}
        config["bootstrap.servers"] = bootstrap
        for key in _PYTHON_CLIENT_BOOLEANS:
            if key in config:
                config[key] = _parse_bool(PRODUCER_PREFIX + key, str(config[key]))
        return config


def parse_options(options: Mapping[str, str]) -> SinkOptions:
    """Validate the ``.option(...)`` values given to ``df.write.format("durable-kafka")``."""
    lowered = {key.lower(): value for key, value in options.items()}
    for key in lowered:
        _refuse_misspelling(key)
    producer_overrides = {
        key[len(PRODUCER_PREFIX) :]: value
        for key, value in lowered.items()
        if key.startswith(PRODUCER_PREFIX)
    }
    bootstrap = lowered.get(_OPTION_BOOTSTRAP) or producer_overrides.pop("bootstrap.servers", None)
    producer_overrides.pop("bootstrap.servers", None)
    topic = lowered.get(_OPTION_TOPIC)
    if topic is not None:
        check_topic_name(topic, "option 'topic'")
    return SinkOptions(
        bootstrap=bootstrap or None,
        topic=topic,
        tombstones=_parse_bool(_OPTION_TOMBSTONES, lowered.get(_OPTION_TOMBSTONES, "false")),
        agent_wait_seconds=_parse_seconds(
            _OPTION_AGENT_WAIT, lowered.get(_OPTION_AGENT_WAIT.lower()), DEFAULT_AGENT_WAIT_SECONDS
        ),
        flush_timeout_seconds=_parse_seconds(
            _OPTION_FLUSH_TIMEOUT,
            lowered.get(_OPTION_FLUSH_TIMEOUT.lower()),
            DEFAULT_FLUSH_TIMEOUT_SECONDS,
        ),
        producer_overrides=producer_overrides,
    )


def _refuse_misspelling(key: str) -> None:
    """Refuse an unknown option that looks like a known one ("did you mean ...?").

    Other unknown options are ignored, as Spark's own Kafka sink does (Spark itself passes
    some, e.g. ``path``).
    """
    known = {name.lower(): name for name in KNOWN_OPTIONS}
    if key in known or key.startswith(PRODUCER_PREFIX):
        return
    prefix, dot, rest = key.partition(".")
    if dot and rest and difflib.get_close_matches(prefix, ["kafka"], 1, _MISSPELLING_CUTOFF):
        suggestion = PRODUCER_PREFIX + rest
    else:
        matches = difflib.get_close_matches(key, list(known), 1, _MISSPELLING_CUTOFF)
        if not matches:
            return
        suggestion = known[matches[0]]
    raise SinkOptionError(f"durable-kafka: unknown option {key!r}: did you mean {suggestion!r}?")


def resolve_bootstrap(explicit: str | None, environ: Mapping[str, str] | None = None) -> str:
    """The agent address: the option, else ``$DURABLE_PRODUCER_BOOTSTRAP``, else the default."""
    if explicit:
        return explicit
    env = os.environ if environ is None else environ
    return env.get(BOOTSTRAP_TWIN_ENV) or AGENT_BOOTSTRAP


def agent_bypass_warning(
    explicit: str | None, environ: Mapping[str, str] | None = None
) -> str | None:
    """A warning when the ``bootstrap`` option points away from this pod's agent, else None.

    Migrating from ``format("kafka")``, a kept ``kafka.bootstrap.servers`` naming the real
    brokers would write around the agent, without its durability.
    """
    env = os.environ if environ is None else environ
    agent = env.get(BOOTSTRAP_TWIN_ENV)
    if not explicit or not agent or explicit == agent:
        return None
    return (
        f"durable-kafka: writing to {explicit} (option 'bootstrap' or 'kafka.bootstrap.servers'), "
        f"not to this pod's buffer agent at {agent} (${BOOTSTRAP_TWIN_ENV}): these writes are "
        f"not buffered; drop the option to write through the agent"
    )


def bootstrap_addresses(bootstrap: str) -> list[tuple[str, int]]:
    """Split ``"host:port,host2:port"`` (optionally ``PLAINTEXT://host:port``) into pairs."""
    addresses: list[tuple[str, int]] = []
    for entry in bootstrap.split(","):
        entry = entry.strip()
        if "://" in entry:
            entry = entry.split("://", 1)[1]
        if not entry:
            continue
        host, separator, port_text = entry.rpartition(":")
        if not separator or not host or not port_text.isdigit():
            raise SinkOptionError(
                f"durable-kafka: bootstrap address {entry!r} is not of the form host:port"
            )
        addresses.append((host.strip("[]"), int(port_text)))
    if not addresses:
        raise SinkOptionError(f"durable-kafka: empty bootstrap address {bootstrap!r}")
    return addresses


def _parse_bool(name: str, text: str) -> bool:
    normalized = text.strip().lower()
    if normalized in ("true", "1", "yes"):
        return True
    if normalized in ("false", "0", "no"):
        return False
    raise SinkOptionError(f"durable-kafka: option {name!r} must be true or false, got {text!r}")


def _parse_seconds(name: str, text: str | None, default: float) -> float:
    if text is None:
        return default
    try:
        seconds = float(text)
    except ValueError:
        seconds = -1.0
    if seconds <= 0:
        raise SinkOptionError(
            f"durable-kafka: option {name!r} must be a positive number of seconds, got {text!r}"
        )
    return seconds
