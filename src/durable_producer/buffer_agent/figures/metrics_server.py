"""The agent's HTTP endpoints: ``/metrics``, ``/healthz`` and ``/readyz`` on a background thread
(the figures themselves are ``metrics.AgentMetrics``)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler

from prometheus_client import CONTENT_TYPE_LATEST

from durable_producer.buffer_agent.figures.metrics import AgentMetrics
from durable_producer.dual_stack_http import QuietHandler, http_server

log = logging.getLogger(__name__)


class MetricsServer:
    """``/metrics``, ``/healthz`` and ``/readyz`` on a background thread; port 0 picks one.

    The agent's address comes from its settings (``--metrics-listen``, default ``[::]``: every
    address, so kubelet probes reach it at the pod IP in IPv4, IPv6 and dual-stack clusters)."""

    def __init__(
        self,
        metrics: AgentMetrics,
        *,
        host: str,
        port: int = 0,
        ready: Callable[[], bool] = lambda: True,
        alive: Callable[[], bool] = lambda: True,
        before_scrape: Callable[[], None] | None = None,
    ) -> None:
        """``before_scrape`` runs before each /metrics answer (the agent brings its periodic
        figures up to date there, so one scrape never mixes a fresh and a stale count)."""
        handler = _make_handler(metrics, ready, alive, before_scrape)
        self._server = http_server(host, port, handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="metrics-http", daemon=True
        )

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    def start(self) -> MetricsServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._thread.is_alive():
            self._server.shutdown()
            self._thread.join(timeout=5)
        self._server.server_close()

    def __enter__(self) -> MetricsServer:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


def _make_handler(
    metrics: AgentMetrics,
    ready: Callable[[], bool],
    alive: Callable[[], bool],
    before_scrape: Callable[[], None] | None,
) -> type[BaseHTTPRequestHandler]:
    class Handler(QuietHandler):
        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            if path == "/metrics":
                if before_scrape is not None:
                    try:
                        before_scrape()
                    except Exception as error:  # the figures of the last update still serve
                        log.warning("could not update the metrics before a scrape: %s", error)
                self.answer(200, metrics.render(), CONTENT_TYPE_LATEST)
            elif path == "/healthz":
                self._probe(alive)
            elif path == "/readyz":
                self._probe(ready)
            else:
                self.answer(404, b"not found\n")

        def _probe(self, check: Callable[[], bool]) -> None:
            try:
                ok = bool(check())
            except Exception as error:  # a failing check means "not ready", with the reason
                self.answer(503, f"error: {error}\n".encode())
                return
            self.answer(200 if ok else 503, b"ok\n" if ok else b"not ready\n")

    return Handler
