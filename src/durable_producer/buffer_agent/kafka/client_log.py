"""librdkafka's log lines, as a few readable Python log records instead of a flood.

A Kafka client given ``{"logger": ClientLog(...)}`` hands its log lines to ``ClientLog.log``
(confluent-kafka calls it from ``poll()``). Unfiltered, a 20-second outage printed 171
connection failures (every broker, every reconnect attempt). Here:

- connection failures (facility ``FAIL`` and the like) make one WARNING when a spell of
  them begins; the rest are counted, a reminder with the count is logged every
  ``reminder_s`` while the spell lasts, and ``recovered()`` (the owner saw the client
  succeed) ends the spell, once no failure was seen for ``quiet_s`` (records in flight are
  still acknowledged while brokers go down), with one INFO line saying how long it lasted
  and how many lines were suppressed;
- anything else keeps its level, at most one line per facility every ``repeat_s``
  (``log_limits.RateLimitedLog`` says how many were suppressed).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

CLIENT_LOGGER = "durable_producer.buffer_agent.kafka.client"
"""The logger librdkafka's own lines go to."""
CONNECTION_FACILITIES = frozenset({"FAIL", "REQTMOUT", "BROKERFAIL", "CONNECT", "TERMINATE"})


class ClientLog:
    """Takes the place of a ``logging.Logger`` in a librdkafka client's ``logger`` setting."""

    def __init__(
        self,
        logger: logging.Logger,
        client: str,
        *,
        on_connection_error: Callable[[str], None] | None = None,
        reminder_s: float = 300.0,
        repeat_s: float = 60.0,
        quiet_s: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``client`` names the client in every line; ``on_connection_error`` is told every
        connection failure, logged or not (the forwarder's health counts them)."""
        self._logger = logger
        self._client = client
        self._on_connection_error = on_connection_error
        self._reminder_s = reminder_s
        self._repeat_s = repeat_s
        self._quiet_s = quiet_s
        self._clock = clock
        self._spell_started: float | None = None
        self._last_failure = 0.0
        self._suppressed = 0
        self._next_reminder = 0.0
        self._last_by_facility: dict[str, tuple[float, int]] = {}

    @property
    def failing(self) -> bool:
        """A spell of connection failures is going on."""
        return self._spell_started is not None

    def log(self, level: int, msg: str, *args: object) -> None:
        """Called by confluent-kafka as ``log(level, "%s [%s] %s", facility, name, text)``."""
        facility, text = _split(msg, args)
        if facility in CONNECTION_FACILITIES:
            self._connection_error(text)
        else:
            self._limited(level, facility, text)

    def recovered(self) -> None:
        """The client worked: end a spell of connection failures with one line, if none was
        seen for ``quiet_s``."""
        started = self._spell_started
        if started is None or self._clock() - self._last_failure < self._quiet_s:
            return
        self._spell_started = None
        self._logger.info(
            "Kafka client %s: connections work again after %.0f s (%d connection error"
            " lines suppressed)",
            self._client,
            self._clock() - started,
            self._suppressed,
        )
        self._suppressed = 0

    def _connection_error(self, text: str) -> None:
        if self._on_connection_error is not None:
            self._on_connection_error(text)
        now = self._clock()
        self._last_failure = now
        if self._spell_started is None:
            self._spell_started = now
            self._suppressed = 0
            self._next_reminder = now + self._reminder_s
            self._logger.warning(
                "Kafka client %s: %s (further connection errors are counted, not logged,"
                " until a connection works again)",
                self._client,
                text,
            )
            return
        self._suppressed += 1
        if now >= self._next_reminder:
            self._next_reminder = now + self._reminder_s
            self._logger.warning(
                "Kafka client %s: connections still failing after %.0f s (%d lines"
                " suppressed); latest: %s",
                self._client,
                now - self._spell_started,
                self._suppressed,
                text,
            )

    def _limited(self, level: int, facility: str, text: str) -> None:
        now = self._clock()
        last, suppressed = self._last_by_facility.get(facility, (-self._repeat_s, 0))
        if now - last < self._repeat_s:
            self._last_by_facility[facility] = (last, suppressed + 1)
            return
        self._last_by_facility[facility] = (now, 0)
        note = f" ({suppressed} similar suppressed)" if suppressed else ""
        self._logger.log(level, "Kafka client %s: %s: %s%s", self._client, facility, text, note)


def _split(msg: str, args: tuple[object, ...]) -> tuple[str, str]:
    """(facility, text) of a librdkafka line; the thread tag (``[thrd:...]: ``) is dropped."""
    if len(args) == 3:
        facility, text = str(args[0]), str(args[2])
    else:
        facility, text = "", msg % args if args else msg
    if text.startswith("[thrd:"):
        text = text.split("]: ", 1)[-1]
    return facility, text
