"""The kopf handlers: all in handlers.py, registered unconditionally, configured at startup."""

from __future__ import annotations

import asyncio
import logging
import re
from pathlib import Path

import kopf
import pytest

from durable_producer.operator import admission, handlers, startup
from durable_producer.operator.settings import OperatorConfig, WebhookSettings

OPERATOR_DIR = Path(handlers.__file__).parent
KOPF_REGISTRATION = re.compile(r"\bkopf\.(on\.\w+|timer|daemon|index)\(")


def test_every_kopf_handler_is_declared_in_handlers_py() -> None:
    declaring = {
        path.name
        for path in OPERATOR_DIR.glob("*.py")
        if KOPF_REGISTRATION.search(path.read_text())
    }

    assert declaring == {"handlers.py"}


def test_import_registers_each_handler_once_and_one_delete_handler() -> None:
    registry = kopf.get_default_registry()
    changing = {
        (handler.id, str(handler.reason.value) if handler.reason else "resume")
        for handler in registry._changing.get_all_handlers()
    }
    webhooks = [handler.id for handler in registry._webhooks.get_all_handlers()]
    startup_handlers = [handler.id for handler in registry._activities.get_all_handlers()]

    assert changing == {
        ("reconcile_durable_producer", "create"), ("reconcile_durable_producer", "update"),
        ("reconcile_durable_producer", "resume"), ("spark-templates", "create"),
        ("spark-templates", "update"), ("spark-templates", "resume"),
        ("drain-volumes", "delete"),
    }  # fmt: skip
    assert webhooks == [admission.MUTATION_WEBHOOK_ID]  # whether or not a certificate is set
    assert "start_operator" in startup_handlers


def test_handlers_read_the_config_the_startup_handler_left_in_the_memo() -> None:
    memo = kopf.Memo()
    with pytest.raises(kopf.PermanentError, match="startup did not run"):
        handlers.config_of(memo)

    memo[handlers.CONFIG_KEY] = OperatorConfig(pool_interval_seconds=3.0)

    assert handlers.config_of(memo).pool_interval_seconds == 3.0


def test_startup_configures_kopf_from_the_settings() -> None:
    settings = kopf.OperatorSettings()
    config = OperatorConfig.from_environ({"DURABLE_PRODUCER_WATCH_SERVER_TIMEOUT": "120"})

    startup.configure_kopf(settings, config, logging.getLogger("test"))

    assert settings.persistence.finalizer == startup.FINALIZER
    assert settings.watching.server_timeout == 120
    assert settings.watching.client_timeout == config.tuning.watch_client_timeout
    assert settings.admission.managed is None  # the chart owns the webhook configuration


def test_with_a_certificate_kopf_serves_the_webhook() -> None:
    webhook = WebhookSettings(addr="127.0.0.1", port=10443, certfile="c.crt", keyfile="c.key")

    server = admission.webhook_server(webhook)

    assert isinstance(server, kopf.WebhookServer)
    assert (server.addr, server.port, server.certfile, server.pkeyfile) == (
        "127.0.0.1", 10443, "c.crt", "c.key")  # fmt: skip


def test_without_a_certificate_the_webhook_server_serves_nothing(
    caplog: pytest.LogCaptureFixture,
) -> None:
    settings = kopf.OperatorSettings()
    startup.configure_kopf(settings, OperatorConfig(), logging.getLogger("test"))
    server = settings.admission.server
    assert isinstance(server, admission.NoWebhookServer)
    assert "pods are not mutated" in caplog.text

    async def first_config() -> object:
        configs = server(lambda *args, **kwargs: None)  # type: ignore[arg-type]
        return await asyncio.wait_for(anext(configs), timeout=0.2)

    with pytest.raises(TimeoutError):  # it never offers kopf a client configuration
        asyncio.run(first_config())
