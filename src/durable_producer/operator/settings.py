"""Operator tuning read from the environment (the Helm chart sets these variables)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

WATCH_SERVER_TIMEOUT_ENV = "DURABLE_PRODUCER_WATCH_SERVER_TIMEOUT"
DEFAULT_WATCH_SERVER_TIMEOUT_SECONDS = 300
# The client waits this much longer than the server for a watch to end before giving up on it.
CLIENT_TIMEOUT_MARGIN_SECONDS = 30


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
        """Tuning from the environment; a missing or unusable value falls back to the default."""
        raw = environ.get(WATCH_SERVER_TIMEOUT_ENV, "")
        try:
            server_timeout = int(raw)
        except ValueError:
            server_timeout = DEFAULT_WATCH_SERVER_TIMEOUT_SECONDS
        if server_timeout <= 0:
            server_timeout = DEFAULT_WATCH_SERVER_TIMEOUT_SECONDS
        return cls(watch_server_timeout=server_timeout)
