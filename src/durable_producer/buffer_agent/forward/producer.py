"""The forwarder's confluent-kafka producers: their settings, creation and disposal.

Every producer is idempotent with ``acks=all`` and records that never expire
(``message.timeout.ms=0``: librdkafka retries for ever and keeps per-partition order). The
sparse one has ``enable.gapless.guarantee`` (``delivery`` explains why); the careful one does
not, and may send one record per request (``isolate``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Producer

from durable_producer.buffer_agent.forward.config import ForwarderConfig
from durable_producer.buffer_agent.forward.health import ForwarderHealth
from durable_producer.buffer_agent.kafka.client_log import CLIENT_LOGGER, ClientLog

log = logging.getLogger(__name__)


def producer_config(
    client_config: Mapping[str, Any],
    config: ForwarderConfig,
    *,
    careful: bool = False,
    isolate: bool = False,
) -> dict[str, Any]:
    """The validated connection settings plus the settings the no-loss promise relies on.

    Sparse mode (the default) needs ``enable.gapless.guarantee``; careful mode must not have
    it (one bad record would stop the producer instead of being dead-lettered), and
    ``isolate`` sends one record per request so the broker judges each record alone.
    """
    settings = {
        "linger.ms": config.linger_ms,
        "message.max.bytes": config.max_message_bytes,
        **client_config,
        "acks": "all",
        "enable.idempotence": True,
        "enable.gapless.guarantee": not careful,
        "message.timeout.ms": 0,
        "queue.buffering.max.messages": config.max_in_flight_records,
        "queue.buffering.max.kbytes": config.max_in_flight_kbytes,
    }
    if careful and isolate:
        settings["batch.num.messages"] = 1
    return settings


class ProducerFactory:
    """Makes the forwarder's producers; their fatal errors go to ``on_fatal``.

    confluent-kafka (2.16) raises a fatal error from ``poll()`` rather than calling
    ``error_cb``: poll with ``serve_reports`` to pass such errors to ``on_fatal`` too.
    """

    def __init__(
        self,
        client_config: Mapping[str, Any],
        config: ForwarderConfig,
        on_fatal: Callable[[KafkaError], None],
        *,
        health: ForwarderHealth | None = None,
    ) -> None:
        """``health`` is told every other error the client reports (connections, timeouts,
        authentication); the client's log lines go through ``client_log``."""
        self._client_config = dict(client_config)
        self._config = config
        self._sparse_config = producer_config(client_config, config)
        self._on_fatal = on_fatal
        self._health = health
        self.client_log = ClientLog(
            logging.getLogger(CLIENT_LOGGER), "forwarder", on_connection_error=self._connection_log
        )

    def create(self, *, careful: bool, isolate: bool) -> Producer:
        settings = self._sparse_config
        if careful:
            settings = producer_config(
                self._client_config, self._config, careful=True, isolate=isolate
            )
        extra: dict[str, Any] = {"error_cb": self._error_cb}
        if "logger" not in settings:
            extra["logger"] = self.client_log
        return Producer({**settings, **extra})

    def _error_cb(self, error: KafkaError) -> None:
        if error.fatal():
            self._on_fatal(error)
            return
        log.debug("Kafka client: %s", error)
        if self._health is not None:
            self._health.error("transport", error.code(), error.name(), error.str())

    def _connection_log(self, text: str) -> None:
        if self._health is not None:
            self._health.error("transport", KafkaError._TRANSPORT, "_TRANSPORT", text)


def serve_reports(
    producer: Producer, timeout: float, on_fatal: Callable[[KafkaError], None]
) -> None:
    """``poll()``: serve delivery reports. A fatal producer error surfaces here:
    confluent-kafka (2.16) raises it from ``poll()`` rather than calling ``error_cb``."""
    try:
        producer.poll(timeout)
    except KafkaException as exception:
        error = exception.args[0] if exception.args else None
        if not isinstance(error, KafkaError) or not error.fatal():
            raise
        on_fatal(error)


def discard(producer: Producer) -> None:
    """Drop whatever a producer still holds; its reports belong to nobody any more."""
    producer.purge(in_queue=True, in_flight=True)
    try:
        producer.poll(0)
    except KafkaException as exception:  # a fatal error it had not reported yet
        log.debug("discarded producer: %s", exception)
