"""Which fault the forwarder is in: "Kafka is down" is not "the agent is stuck".

``ForwarderHealth`` derives one ``ForwarderState`` from what the forwarding thread tells it.
The state and the seconds since the last delivery are computed when they are read (a metrics
scrape), so a wedged forwarding thread shows as ``stuck`` even though it updates nothing.

Error kinds (``ERROR_KINDS``): ``delivery`` (Kafka's answer refused a batch, or
InitProducerId, DescribeProducers or metadata named an error), ``transport`` (connections,
timeouts, authentication). ``fatal`` (the per-record forwarder's producer resets) is no longer
reported; its metric series stays for dashboards.

Right after a start nothing has been delivered yet: records waiting then read as
``delivering`` for up to ``stall_after_s``, unless an error came meanwhile (Kafka down when
the agent starts shows as ``kafka_unreachable`` at the first failed connection, not 10 s later).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum

__all__ = ["ErrorNote", "ForwarderHealth", "ForwarderState"]

log = logging.getLogger(__name__)
ERROR_FRESH_S = 30.0
"""An error explains a stall only if it is this recent (the forwarder's retries, at most
``retry_backoff_max_s`` apart, and its metadata refreshes repeat an error while it lasts)."""


class ForwarderState(StrEnum):
    IDLE = "idle"
    """Nothing waits to be forwarded, and nothing was delivered for ``stall_after_s``."""
    DELIVERING = "delivering"
    """Kafka acknowledged records within the last ``stall_after_s`` (or records wait for
    less than that since the forwarder started)."""
    KAFKA_UNREACHABLE = "kafka_unreachable"
    """Records wait; the client reports connection failures (Kafka down, network, TLS/SASL)."""
    KAFKA_REFUSING = "kafka_refusing"
    """Records wait; Kafka refuses them (authorization, size, producer errors): see the
    ``delivery`` errors; refused records are retried, then dead-lettered."""
    WAITING_FOR_KAFKA = "waiting_for_kafka"
    """Records are with the Kafka client, unacknowledged, and no error is reported: a hung or
    very slow broker, or errors the client retries silently (NOT_ENOUGH_REPLICAS)."""
    STUCK = "stuck"
    """Records wait in the WAL but the forwarder hands none to Kafka, or its loop stopped
    turning: the agent itself is stuck (restart it; the WAL keeps everything)."""


@dataclass(frozen=True, slots=True)
class ErrorNote:
    at: float
    name: str
    message: str


class ForwarderHealth:
    """Written by the forwarding thread, read from any thread (metrics scrapes)."""

    def __init__(
        self,
        *,
        stall_after_s: float,
        clock: Callable[[], float] = time.monotonic,
        on_error: Callable[[str, int, str], None] | None = None,
    ) -> None:
        """``on_error(kind, code, name)`` is told every error (the metrics count them)."""
        self.stall_after_s = stall_after_s
        self._clock = clock
        self._on_error = on_error
        self._lock = threading.Lock()
        now = clock()
        self.last_delivery = now
        self.delivered_once = False
        self.heartbeat = now
        self.in_flight = 0
        """Records with the Kafka client, awaiting reports."""
        self.unread = 0
        """WAL frames not yet handed to the Kafka client."""
        self.refused_waiting = 0
        """Records refused by Kafka, waiting to be produced again."""
        self.last_errors: dict[str, ErrorNote] = {}
        self._reported = ForwarderState.IDLE
        self._since = now

    # ----------------------------------------------------------------- the forwarder tells
    def delivered(self) -> None:
        self.last_delivery = self._clock()
        self.delivered_once = True

    def error(self, kind: str, code: int, name: str, message: str) -> None:
        note = ErrorNote(self._clock(), name, message)
        with self._lock:
            self.last_errors[kind] = note
        if self._on_error is not None:
            self._on_error(kind, code, name)

    def beat(self, *, in_flight: int, unread: int, refused_waiting: int) -> None:
        """Once per forwarding loop: the work that waits."""
        self.heartbeat = self._clock()
        self.in_flight = in_flight
        self.unread = unread
        self.refused_waiting = refused_waiting

    # ----------------------------------------------------------------- anyone reads
    def seconds_since_delivery(self) -> float:
        return max(0.0, self._clock() - self.last_delivery)

    def last_error(self, kind: str) -> ErrorNote | None:
        with self._lock:
            return self.last_errors.get(kind)

    def state(self) -> ForwarderState:
        now = self._clock()
        stall = self.stall_after_s
        waiting = self.in_flight or self.unread or self.refused_waiting
        if now - self.heartbeat > stall:
            return ForwarderState.STUCK if waiting else ForwarderState.IDLE
        if self.delivered_once and now - self.last_delivery < stall:
            return ForwarderState.DELIVERING
        if not waiting:
            return ForwarderState.IDLE
        recent = self._recent_errors(now)
        if not recent and not self.refused_waiting and now - self.last_delivery < stall:
            return ForwarderState.DELIVERING  # just started: nothing delivered, nothing wrong
        refused = [recent["delivery"].at] if "delivery" in recent else []
        if self.refused_waiting:
            refused.append(now)  # records wait for a retry: Kafka refused them
        transport = recent["transport"].at if "transport" in recent else None
        if refused and (transport is None or max(refused) >= transport):
            return ForwarderState.KAFKA_REFUSING
        if transport is not None:
            return ForwarderState.KAFKA_UNREACHABLE
        if self.in_flight:
            return ForwarderState.WAITING_FOR_KAFKA
        return ForwarderState.STUCK

    def _recent_errors(self, now: float) -> dict[str, ErrorNote]:
        with self._lock:
            notes = dict(self.last_errors)
        return {
            kind: note
            for kind, note in notes.items()
            if note.at >= self.last_delivery and now - note.at <= ERROR_FRESH_S
        }

    def check(self) -> None:
        """Log a change of state (one line each)."""
        state = self.state()
        if state is self._reported:
            return
        now = self._clock()
        previous, lasted = self._reported, now - self._since
        self._reported, self._since = state, now
        level = logging.INFO if state in _QUIET else logging.WARNING
        message = "forwarder state %s -> %s after %.0f s%s"
        log.log(level, message, previous.value, state.value, lasted, self._detail(state))

    def _detail(self, state: ForwarderState) -> str:
        if state in _QUIET:
            return ""
        if state not in (ForwarderState.KAFKA_UNREACHABLE, ForwarderState.KAFKA_REFUSING):
            return (
                f": {self.in_flight} records with the Kafka client, {self.unread} WAL frames"
                f" unread, nothing delivered for {self.seconds_since_delivery():.0f} s"
            )
        kind = "transport" if state is ForwarderState.KAFKA_UNREACHABLE else "delivery"
        note = self.last_error(kind)
        return "" if note is None else f": {note.name}: {note.message}"


_QUIET = (ForwarderState.IDLE, ForwarderState.DELIVERING)
