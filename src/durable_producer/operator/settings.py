"""The operator's settings: read once from the environment when the operator starts.

The Helm chart sets these variables. ``OperatorConfig.from_environ`` is called by the startup
handler in handlers.py, which hands the result to every handler through kopf's memo; no
module reads the environment at import time. A missing or unusable value falls back to its
default (the operator must start even with a bad value in a Helm override).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from durable_producer.operator.model.installation import (
    DEFAULT_PULL_POLICY,
    AgentImage,
    PoolPolicy,
)
from durable_producer.operator.model.model import (
    AGENT_IMAGE_ENV,
    AGENT_IMAGE_PULL_POLICY_ENV,
    DEFAULT_AGENT_IMAGE,
    PULL_POLICIES,
)

WATCH_SERVER_TIMEOUT_ENV = "DURABLE_PRODUCER_WATCH_SERVER_TIMEOUT"
DEFAULT_WATCH_SERVER_TIMEOUT_SECONDS = 300
# The client waits this much longer than the server for a watch to end before giving up on it.
CLIENT_TIMEOUT_MARGIN_SECONDS = 30

WEBHOOK_ADDR_ENV = "DURABLE_PRODUCER_WEBHOOK_ADDR"
WEBHOOK_PORT_ENV = "DURABLE_PRODUCER_WEBHOOK_PORT"
WEBHOOK_CERT_FILE_ENV = "DURABLE_PRODUCER_WEBHOOK_CERT_FILE"
WEBHOOK_KEY_FILE_ENV = "DURABLE_PRODUCER_WEBHOOK_KEY_FILE"
WEBHOOK_TIMEOUT_ENV = "DURABLE_PRODUCER_WEBHOOK_TIMEOUT_SECONDS"
# Empty: every address of every family (IPv4 and IPv6), so IPv6-only clusters reach it too.
DEFAULT_WEBHOOK_ADDR = ""
DEFAULT_WEBHOOK_PORT = 9443
# The chart's webhook.timeoutSeconds (the API server's own default is 10 s too).
DEFAULT_WEBHOOK_TIMEOUT_SECONDS = 10.0
# Kept back from the webhook timeout for the review's way to the operator, our own work and
# the answer's way back. With 1 s, a burst of 200 pod creates on a loaded machine
# (benchmarks/admission_bench.py) had 155 of the operator's refusals arrive after the API
# server had given up (a webhook timeout, no message); with 2 s, 3 (D5).
WEBHOOK_ANSWER_MARGIN_SECONDS = 2.0
MINIMUM_ADMISSION_API_SECONDS = 0.5

FEATURES_ENV = "DURABLE_PRODUCER_FEATURES"
# The chart's rbac.features.* flags; DURABLE_PRODUCER_FEATURES lists the ones switched on.
POD_AUDIT = "podAudit"
VOLUME_POOL = "volumePool"
DRAIN_JOBS = "drainJobs"
SPARK_POD_TEMPLATES = "sparkPodTemplates"
ALL_FEATURES = (POD_AUDIT, VOLUME_POOL, DRAIN_JOBS, SPARK_POD_TEMPLATES)
# The volume pool lists pods (which volumes are in use), claims PVCs and drains them with
# Jobs: it works with all three flags or not at all.
VOLUME_POOL_FEATURES = (POD_AUDIT, VOLUME_POOL, DRAIN_JOBS)

AGENT_IMAGE_PULL_SECRETS_ENV = "DURABLE_PRODUCER_AGENT_IMAGE_PULL_SECRETS"

POOL_INTERVAL_ENV = "DURABLE_PRODUCER_POOL_INTERVAL_SECONDS"
DEFAULT_POOL_INTERVAL_SECONDS = 10.0

# kopf's peering identity, read by kopf itself (the chart sets it to the pod's name, so the
# peering object names the replicas); documented here, never read by our code.
KOPF_IDENTITY_ENV = "POD_ID"
METRICS_ADDR_ENV = "DURABLE_PRODUCER_METRICS_ADDR"
METRICS_PORT_ENV = "DURABLE_PRODUCER_METRICS_PORT"
PEERING_LIFETIME_ENV = "DURABLE_PRODUCER_PEERING_LIFETIME_SECONDS"
# How long a replica's peering record counts as alive without a keep-alive: the longest a
# standby waits before it runs the handlers of a leader that died without a word (kill -9,
# node lost). kopf's own default is 60 s; keep-alives are sent 5-10 s before it runs out.
DEFAULT_PEERING_LIFETIME_SECONDS = 20
MINIMUM_PEERING_LIFETIME_SECONDS = 2


@dataclass(frozen=True)
class OperatorTuning:
    """Timeouts for kopf's watches and API requests, in seconds."""

    watch_server_timeout: int = DEFAULT_WATCH_SERVER_TIMEOUT_SECONDS
    connect_timeout: int = 30
    request_timeout: int = 60

    @property
    def watch_client_timeout(self) -> int:
        return self.watch_server_timeout + CLIENT_TIMEOUT_MARGIN_SECONDS

    @classmethod
    def from_environ(cls, environ: Mapping[str, str]) -> OperatorTuning:
        raw = environ.get(WATCH_SERVER_TIMEOUT_ENV, "")
        try:
            server_timeout = int(raw)
        except ValueError:
            server_timeout = DEFAULT_WATCH_SERVER_TIMEOUT_SECONDS
        if server_timeout <= 0:
            server_timeout = DEFAULT_WATCH_SERVER_TIMEOUT_SECONDS
        return cls(watch_server_timeout=server_timeout)


@dataclass(frozen=True)
class WebhookSettings:
    """Where kopf's webhook server listens, with the certificate the chart mounts.

    No certificate configured means no webhook server (e.g. the operator runs without the
    webhook feature); kopf's own self-signed generation needs oscrypto, whose released
    version cannot load OpenSSL 3, so certificates always come from files.
    """

    addr: str = DEFAULT_WEBHOOK_ADDR
    port: int = DEFAULT_WEBHOOK_PORT
    certfile: str | None = None
    keyfile: str | None = None
    timeout_seconds: float = DEFAULT_WEBHOOK_TIMEOUT_SECONDS

    @property
    def enabled(self) -> bool:
        return bool(self.certfile and self.keyfile)

    @property
    def api_budget_seconds(self) -> float:
        """How long one admission may spend on API calls: under the API server's timeout."""
        return max(
            self.timeout_seconds - WEBHOOK_ANSWER_MARGIN_SECONDS, MINIMUM_ADMISSION_API_SECONDS
        )

    @classmethod
    def from_environ(cls, environ: Mapping[str, str]) -> WebhookSettings:
        try:
            port = int(environ.get(WEBHOOK_PORT_ENV, str(DEFAULT_WEBHOOK_PORT)))
        except ValueError:
            port = DEFAULT_WEBHOOK_PORT
        try:
            timeout = float(environ.get(WEBHOOK_TIMEOUT_ENV, str(DEFAULT_WEBHOOK_TIMEOUT_SECONDS)))
        except ValueError:
            timeout = DEFAULT_WEBHOOK_TIMEOUT_SECONDS
        return cls(
            addr=environ.get(WEBHOOK_ADDR_ENV, DEFAULT_WEBHOOK_ADDR),
            port=port,
            certfile=environ.get(WEBHOOK_CERT_FILE_ENV) or None,
            keyfile=environ.get(WEBHOOK_KEY_FILE_ENV) or None,
            timeout_seconds=timeout if _positive(timeout) else DEFAULT_WEBHOOK_TIMEOUT_SECONDS,
        )


@dataclass(frozen=True)
class OperatorFeatures:
    """Which optional features the installation allows (the chart's rbac.features.*).

    The operator registers a feature's handlers only when it is on, so a feature switched off
    in the chart's RBAC is never attempted (no 403 loops, no finalizer that cannot finish).
    Unset: every feature (a development run with full access); unknown names are ignored.
    """

    enabled: frozenset[str] = frozenset(ALL_FEATURES)

    @property
    def volume_pool(self) -> bool:
        """Volume pool, drain Jobs and pod audit: the webhook, the pool timer, drain on delete."""
        return all(name in self.enabled for name in VOLUME_POOL_FEATURES)

    @property
    def spark_pod_templates(self) -> bool:
        return SPARK_POD_TEMPLATES in self.enabled

    @classmethod
    def from_environ(cls, environ: Mapping[str, str]) -> OperatorFeatures:
        raw = environ.get(FEATURES_ENV)
        if raw is None:
            return cls()
        names = {name.strip() for name in raw.split(",")}
        return cls(enabled=frozenset(name for name in ALL_FEATURES if name in names))


# PoolPolicy field -> the environment variable the Helm chart sets it with.
POOL_ENV: dict[str, str] = {
    "claim_grace_seconds": "DURABLE_PRODUCER_POOL_CLAIM_GRACE_SECONDS",
    "drain_grace_seconds": "DURABLE_PRODUCER_POOL_DRAIN_GRACE_SECONDS",
    "idle_ttl_seconds": "DURABLE_PRODUCER_POOL_IDLE_TTL_SECONDS",
    "drain_timeout_seconds": "DURABLE_PRODUCER_POOL_DRAIN_TIMEOUT_SECONDS",
    "pending_volume_seconds": "DURABLE_PRODUCER_POOL_PENDING_VOLUME_SECONDS",
    "drain_retry_max_seconds": "DURABLE_PRODUCER_POOL_DRAIN_RETRY_MAX_SECONDS",
    "agent_start_grace_seconds": "DURABLE_PRODUCER_POOL_AGENT_START_GRACE_SECONDS",
}


POOL_POSITIVE = frozenset({"drain_timeout_seconds"})
"""PoolPolicy fields that 0 leaves unusable: a drain Job's ``--timeout`` must be positive."""


def _positive(value: float) -> bool:
    return math.isfinite(value) and value > 0


def pool_policy_from_environ(environ: Mapping[str, str]) -> PoolPolicy:
    """Each field from its POOL_ENV variable; unusable, infinite or negative values (0 too,
    for POOL_POSITIVE) keep the default."""
    defaults = PoolPolicy()
    values: dict[str, Any] = {}
    for name, variable in POOL_ENV.items():
        raw = environ.get(variable)
        default = getattr(defaults, name)
        try:
            value = type(default)(raw) if raw is not None else default
        except ValueError:
            value = default
        usable = _positive(value) or (value == 0 and name not in POOL_POSITIVE)
        values[name] = value if usable else default
    return PoolPolicy(**values)


def pool_interval_from_environ(environ: Mapping[str, str]) -> float:
    """Seconds between two runs of the volume-pool timer (positive)."""
    try:
        interval = float(environ.get(POOL_INTERVAL_ENV, str(DEFAULT_POOL_INTERVAL_SECONDS)))
    except ValueError:
        return DEFAULT_POOL_INTERVAL_SECONDS
    return interval if _positive(interval) else DEFAULT_POOL_INTERVAL_SECONDS


def agent_image_from_environ(environ: Mapping[str, str]) -> AgentImage:
    """The chart's ``agent.image``: image, pull policy (an unknown one: IfNotPresent) and pull
    secrets (comma-separated, each name once)."""
    pull_policy = environ.get(AGENT_IMAGE_PULL_POLICY_ENV)
    secrets = environ.get(AGENT_IMAGE_PULL_SECRETS_ENV, "").split(",")
    return AgentImage(
        image=environ.get(AGENT_IMAGE_ENV) or DEFAULT_AGENT_IMAGE,
        pull_policy=pull_policy if pull_policy in PULL_POLICIES else DEFAULT_PULL_POLICY,
        pull_secrets=tuple(dict.fromkeys(name.strip() for name in secrets if name.strip())),
    )


@dataclass(frozen=True)
class ServingSettings:
    """The operator's own HTTP endpoint (/metrics, /readyz) and its peering keep-alives.

    No port (``DURABLE_PRODUCER_METRICS_PORT`` unset or 0): no endpoint, e.g. a development
    run; the chart always sets one (its readiness probe asks /readyz there).
    """

    metrics_addr: str = ""  # empty: every address, IPv6 and IPv4
    metrics_port: int | None = None
    peering_lifetime_seconds: int = DEFAULT_PEERING_LIFETIME_SECONDS

    @classmethod
    def from_environ(cls, environ: Mapping[str, str]) -> ServingSettings:
        try:
            port: int | None = int(environ.get(METRICS_PORT_ENV, "0"))
        except ValueError:
            port = None
        try:
            lifetime = int(environ.get(PEERING_LIFETIME_ENV, str(DEFAULT_PEERING_LIFETIME_SECONDS)))
        except ValueError:
            lifetime = DEFAULT_PEERING_LIFETIME_SECONDS
        return cls(
            metrics_addr=environ.get(METRICS_ADDR_ENV, ""),
            metrics_port=port if port and 0 < port < 65536 else None,
            peering_lifetime_seconds=max(lifetime, MINIMUM_PEERING_LIFETIME_SECONDS),
        )


@dataclass(frozen=True)
class OperatorConfig:
    """Everything the operator reads from its environment, read once at startup."""

    tuning: OperatorTuning = field(default_factory=OperatorTuning)
    webhook: WebhookSettings = field(default_factory=WebhookSettings)
    pool: PoolPolicy = field(default_factory=PoolPolicy)
    pool_interval_seconds: float = DEFAULT_POOL_INTERVAL_SECONDS
    agent_image: AgentImage = field(default_factory=AgentImage)
    features: OperatorFeatures = field(default_factory=OperatorFeatures)
    serving: ServingSettings = field(default_factory=ServingSettings)

    @classmethod
    def from_environ(cls, environ: Mapping[str, str]) -> OperatorConfig:
        return cls(
            tuning=OperatorTuning.from_environ(environ),
            webhook=WebhookSettings.from_environ(environ),
            pool=pool_policy_from_environ(environ),
            pool_interval_seconds=pool_interval_from_environ(environ),
            agent_image=agent_image_from_environ(environ),
            features=OperatorFeatures.from_environ(environ),
            serving=ServingSettings.from_environ(environ),
        )
