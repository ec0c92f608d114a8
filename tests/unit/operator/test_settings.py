"""The operator's settings, read from its environment once at startup."""

from __future__ import annotations

import pytest

from durable_producer.operator.model import model
from durable_producer.operator.model.installation import PoolPolicy
from durable_producer.operator.settings import (
    AGENT_IMAGE_PULL_SECRETS_ENV,
    ALL_FEATURES,
    FEATURES_ENV,
    POOL_INTERVAL_ENV,
    WATCH_SERVER_TIMEOUT_ENV,
    WEBHOOK_CERT_FILE_ENV,
    WEBHOOK_KEY_FILE_ENV,
    WEBHOOK_PORT_ENV,
    WEBHOOK_TIMEOUT_ENV,
    OperatorConfig,
    OperatorFeatures,
    OperatorTuning,
    WebhookSettings,
    agent_image_from_environ,
    pool_interval_from_environ,
    pool_policy_from_environ,
)


def test_agent_image_falls_back_to_the_operator_environment() -> None:
    agent = model.AgentSidecarSettings()
    installed = agent_image_from_environ({model.AGENT_IMAGE_ENV: "reg/agent:1.2"})
    assert agent_image_from_environ({}).image_for(agent) == model.DEFAULT_AGENT_IMAGE
    assert installed.image_for(agent) == "reg/agent:1.2"
    pinned = model.AgentSidecarSettings(image="mine/agent:9", image_pull_policy="Always")
    assert installed.image_for(pinned) == "mine/agent:9"
    never = agent_image_from_environ({model.AGENT_IMAGE_PULL_POLICY_ENV: "Never"})
    assert never.pull_policy_for(pinned) == "Always"
    assert never.pull_policy_for(agent) == "Never"
    bogus = agent_image_from_environ({model.AGENT_IMAGE_PULL_POLICY_ENV: "bogus"})
    assert bogus.pull_policy_for(agent) == "IfNotPresent"


@pytest.mark.parametrize(
    ("raw", "expected"), [(None, 300), ("120", 120), ("0", 300), ("-3", 300), ("soon", 300)]
)
def test_watch_timeouts_from_environment(raw: str | None, expected: int) -> None:
    environ = {} if raw is None else {WATCH_SERVER_TIMEOUT_ENV: raw}
    tuning = OperatorTuning.from_environ(environ)
    assert tuning.watch_server_timeout == expected
    assert tuning.watch_client_timeout > tuning.watch_server_timeout


@pytest.mark.parametrize(
    ("raw", "expected"),
    [("5", 5.0), ("0", 0.0), ("nonsense", 60.0), ("-1", 60.0), ("inf", 60.0), ("nan", 60.0)],
)
def test_policy_from_environment(raw: str, expected: float) -> None:
    policy = pool_policy_from_environ({"DURABLE_PRODUCER_POOL_DRAIN_GRACE_SECONDS": raw})

    assert policy.drain_grace_seconds == expected
    assert policy.idle_ttl_seconds == PoolPolicy().idle_ttl_seconds


def test_a_drain_timeout_of_zero_keeps_the_default() -> None:
    """Taken, it rendered drain Jobs with --timeout=0, which the agent refuses: the volume's
    backlog was never drained."""
    policy = pool_policy_from_environ({"DURABLE_PRODUCER_POOL_DRAIN_TIMEOUT_SECONDS": "0"})

    assert policy.drain_timeout_seconds == PoolPolicy().drain_timeout_seconds > 0


@pytest.mark.parametrize(
    ("raw", "expected"),
    [(None, 10.0), ("0.5", 0.5), ("0", 10.0), ("-2", 10.0), ("soon", 10.0), ("inf", 10.0)],
)
def test_pool_interval_is_positive(raw: str | None, expected: float) -> None:
    environ = {} if raw is None else {POOL_INTERVAL_ENV: raw}

    assert pool_interval_from_environ(environ) == expected


def test_webhook_is_served_only_with_both_certificate_files() -> None:
    both = {WEBHOOK_CERT_FILE_ENV: "/tls/tls.crt", WEBHOOK_KEY_FILE_ENV: "/tls/tls.key"}

    assert WebhookSettings.from_environ(both).enabled
    assert not WebhookSettings.from_environ({WEBHOOK_CERT_FILE_ENV: "/tls/tls.crt"}).enabled
    assert not WebhookSettings.from_environ({}).enabled
    assert WebhookSettings.from_environ({WEBHOOK_PORT_ENV: "x"}).port == 9443


def test_one_config_holds_every_setting() -> None:
    environ = {
        WATCH_SERVER_TIMEOUT_ENV: "120",
        WEBHOOK_PORT_ENV: "10443",
        POOL_INTERVAL_ENV: "3",
        "DURABLE_PRODUCER_POOL_IDLE_TTL_SECONDS": "9",
        model.AGENT_IMAGE_ENV: "reg/agent:1.2",
    }

    config = OperatorConfig.from_environ(environ)

    assert config.tuning.watch_server_timeout == 120
    assert config.webhook.port == 10443 and not config.webhook.enabled
    assert config.pool_interval_seconds == 3.0
    assert config.pool.idle_ttl_seconds == 9.0
    assert config.agent_image.image == "reg/agent:1.2"
    assert OperatorConfig.from_environ({}) == OperatorConfig()


@pytest.mark.parametrize(("raw", "pool", "spark"), [
    (None, True, True),  # unset: a development run with full access
    ("podAudit,volumePool,drainJobs,sparkPodTemplates", True, True),
    ("drainJobs,podAudit,volumePool", True, False),
    ("sparkPodTemplates", False, True),
    ("volumePool,drainJobs", False, False),  # the pool needs its three flags
    ("", False, False),
    (" podAudit , volumePool,drainJobs,bogus", True, False),
])  # fmt: skip
def test_features_from_environment(raw: str | None, pool: bool, spark: bool) -> None:
    environ = {} if raw is None else {FEATURES_ENV: raw}

    features = OperatorFeatures.from_environ(environ)

    assert (features.volume_pool, features.spark_pod_templates) == (pool, spark)
    assert features.enabled <= set(ALL_FEATURES)


@pytest.mark.parametrize(("raw", "timeout", "budget"), [
    (None, 10.0, 8.0), ("4", 4.0, 2.0), ("1", 1.0, 0.5), ("0", 10.0, 8.0), ("x", 10.0, 8.0),
    ("inf", 10.0, 8.0), ("nan", 10.0, 8.0),
])  # fmt: skip
def test_admission_api_budget_stays_under_the_webhook_timeout(
    raw: str | None, timeout: float, budget: float
) -> None:
    webhook = WebhookSettings.from_environ({} if raw is None else {WEBHOOK_TIMEOUT_ENV: raw})

    assert (webhook.timeout_seconds, webhook.api_budget_seconds) == (timeout, budget)
    assert webhook.api_budget_seconds < webhook.timeout_seconds


def test_the_webhook_listens_on_every_address_family_by_default() -> None:
    assert WebhookSettings().addr == ""  # kopf: None, every interface (IPv4 and IPv6)


def test_agent_pull_secrets_from_environment() -> None:
    image = agent_image_from_environ({AGENT_IMAGE_PULL_SECRETS_ENV: "a, b,,a"})

    assert image.pull_secrets == ("a", "b")
    assert agent_image_from_environ({}).pull_secrets == ()
