"""Leadership among replicas (startup.py): kopf peering priority and record lifetime."""

from __future__ import annotations

import kopf

from durable_producer.operator import startup
from durable_producer.operator.settings import OperatorConfig, ServingSettings


def test_the_replica_that_started_first_has_the_highest_priority() -> None:
    early = startup.leadership_priority(1_700_000_000_000_000_000)
    later = startup.leadership_priority(1_700_000_000_000_001_000)  # one microsecond later

    assert early > later
    assert abs(early) < 2**53  # a JSON number the API server and kopf keep exactly


def test_peering_gets_the_priority_the_lifetime_and_quiet_keepalives() -> None:
    settings = kopf.OperatorSettings()
    config = OperatorConfig(serving=ServingSettings(peering_lifetime_seconds=15))

    startup.configure_peering(settings, config, 1_700_000_000_000_000_000)

    assert settings.peering.priority == startup.leadership_priority(1_700_000_000_000_000_000)
    assert settings.peering.lifetime == 15
    assert settings.peering.stealth is True


def test_a_priority_given_on_the_command_line_is_kept() -> None:
    settings = kopf.OperatorSettings()
    settings.peering.priority = 666  # kopf run --dev

    startup.configure_peering(settings, OperatorConfig(), 1)

    assert settings.peering.priority == 666


def test_serving_settings_from_the_environment() -> None:
    assert ServingSettings.from_environ({}) == ServingSettings(
        metrics_addr="", metrics_port=None, peering_lifetime_seconds=20)
    assert ServingSettings.from_environ({
        "DURABLE_PRODUCER_METRICS_PORT": "8081", "DURABLE_PRODUCER_METRICS_ADDR": "::1",
        "DURABLE_PRODUCER_PEERING_LIFETIME_SECONDS": "30",
    }) == ServingSettings(metrics_addr="::1", metrics_port=8081, peering_lifetime_seconds=30)
    assert ServingSettings.from_environ({
        "DURABLE_PRODUCER_METRICS_PORT": "x", "DURABLE_PRODUCER_PEERING_LIFETIME_SECONDS": "0",
    }) == ServingSettings(metrics_port=None, peering_lifetime_seconds=2)
    assert ServingSettings.from_environ(
        {"DURABLE_PRODUCER_METRICS_PORT": "70000"}).metrics_port is None
