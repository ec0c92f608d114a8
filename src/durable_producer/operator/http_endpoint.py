"""The operator's own HTTP endpoint: ``/metrics`` (metrics.py) and ``/readyz``.

``/readyz`` answers 200 only once this replica can do its part: the startup handler has
registered the handlers of the features switched on, and, when the webhook is served, kopf's
webhook server is listening with the mounted certificate loaded (``ReadyWebhookServer``
reports that). The chart's readiness probe asks it, so the webhook Service sends admission
reviews only to replicas that can answer them, and a rolling update waits for each new
replica before it stops an old one. Liveness stays kopf's own ``/healthz`` (``--liveness``).

The server runs on a daemon thread and binds every address of both families (one dual-stack
socket on ``::``, IPv4 only on a kernel without IPv6), so a kubelet probe at the pod IP
reaches it in IPv4, IPv6 and dual-stack clusters.
"""

from __future__ import annotations

import contextvars
import threading
import time
from collections.abc import AsyncIterator
from http.server import ThreadingHTTPServer
from typing import Any

import kopf
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from durable_producer.dual_stack_http import ANY_ADDRESS_V6, QuietHandler, http_server
from durable_producer.operator import metrics


class Readiness:
    """What /readyz waits for; set by the startup handler and the webhook server."""

    def __init__(self) -> None:
        self.handlers_registered = threading.Event()
        self.webhook_serving = threading.Event()
        self.webhook_expected = False

    def reset(self) -> None:
        self.handlers_registered.clear()
        self.webhook_serving.clear()
        self.webhook_expected = False

    def problems(self) -> list[str]:
        """Why this replica is not ready; empty: ready."""
        problems = []
        if not self.handlers_registered.is_set():
            problems.append("the startup handler has not registered the handlers yet")
        if self.webhook_expected and not self.webhook_serving.is_set():
            problems.append("the webhook server is not listening with its certificate yet")
        return problems


READINESS = Readiness()


_review_received: contextvars.ContextVar[float | None] = contextvars.ContextVar(
    "durable_producer_review_received", default=None
)


def review_received() -> float:
    """When the admission review being answered arrived (``time.monotonic()``), as the
    webhook server saw it; now, outside a review the server received."""
    received = _review_received.get()
    return time.monotonic() if received is None else received


class ReadyWebhookServer(kopf.WebhookServer):
    """kopf's webhook server, telling READINESS once it listens with its certificate, and
    noting each review's arrival (``review_received``: the admission deadline starts there).

    kopf yields the client configuration after the TLS context is built from the files and
    the socket is listening (and again after it reloads renewed certificate files)."""

    async def __call__(self, fn: kopf.WebhookFn) -> AsyncIterator[kopf.WebhookClientConfig]:
        async def timed(
            request: Any,  # kopf.WebhookFn's Request (kopf does not export the type)
            *,
            webhook: str | None = None,
            headers: kopf.Headers | None = None,
            sslpeer: kopf.SSLPeer | None = None,
        ) -> Any:
            # Set in the request's own task: kopf's handlers (and the threads it copies the
            # context into) see it.
            token = _review_received.set(time.monotonic())
            try:
                return await fn(request, webhook=webhook, headers=headers, sslpeer=sslpeer)
            finally:
                _review_received.reset(token)

        async for client_config in super().__call__(timed):
            READINESS.webhook_serving.set()
            yield client_config


class _Handler(QuietHandler):
    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        if path == "/metrics":
            self.answer(200, generate_latest(metrics.REGISTRY), CONTENT_TYPE_LATEST)
        elif path == "/readyz":
            problems = READINESS.problems()
            body = ("ready\n" if not problems else "not ready: " + "; ".join(problems) + "\n")
            self.answer(503 if problems else 200, body.encode(), "text/plain; charset=utf-8")
        else:
            self.answer(404, b"not found: /metrics or /readyz\n", "text/plain; charset=utf-8")


def _server(addr: str, port: int) -> ThreadingHTTPServer:
    return http_server(addr or ANY_ADDRESS_V6, port, _Handler)


def start(addr: str, port: int) -> ThreadingHTTPServer:
    """Serve /metrics and /readyz on a daemon thread (it ends with the process)."""
    server = _server(addr, port)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="operator-http", daemon=True).start()
    return server
