"""Reading the agents' figures from their Prometheus endpoints (the pool timer publishes them).

The agent has no API access, so the operator asks each running agent over HTTP: its backlog,
and whether ingest exceeds the forward rate it sustains under load, with both rates. What the
answers mean is read by ``decide/agent_figures.py``. The agents are asked concurrently from a
small pool, the whole round bounded in time (D5).
"""

from __future__ import annotations

import concurrent.futures
import time
import urllib.request
from collections.abc import Iterable, Mapping
from typing import Any

from durable_producer.operator.decide import pod_mutation
from durable_producer.operator.decide.agent_figures import AgentFigures, agent_figures

# Per agent: a slow one must not stall the pool timer for long.
METRICS_TIMEOUT_SECONDS = 1.0
# Agents are asked concurrently, at most this many at a time (per pool run)...
SCRAPE_WORKERS = 16
# ...and a pool run waits this long in all for their answers; the agents that have not
# answered by then (a default-deny NetworkPolicy drops every scrape: docs/operator.md) are
# left out of this run's figures. Serially, 200 silent agents held the timer 200 s (D5).
SCRAPE_BUDGET_SECONDS = 5.0


def agent_metrics_urls(pods: Iterable[Mapping[str, Any]], metrics_port: int) -> list[str]:
    """Metrics endpoints of the running agents, from the pods' IPs."""
    urls = []
    for pod in pods:
        status = pod.get("status") or {}
        address = status.get("podIP")
        if status.get("phase") != "Running" or not address or not pod_mutation.is_injected(pod):
            continue
        host = f"[{address}]" if ":" in str(address) else address
        urls.append(f"http://{host}:{metrics_port}/metrics")
    return sorted(urls)


def _scrape(url: str, deadline: float) -> str | None:
    """One agent's metrics text, or None (no answer in time, refused, not HTTP)."""
    timeout = min(METRICS_TIMEOUT_SECONDS, deadline - time.monotonic())
    if timeout <= 0:
        return None
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            text: str = response.read().decode()
            return text
    except (OSError, ValueError):
        return None


def scrape_agents(
    urls: list[str], *, workers: int = SCRAPE_WORKERS, budget: float = SCRAPE_BUDGET_SECONDS
) -> AgentFigures:
    """The figures of the agents that answer (named by URL) within ``budget`` seconds in all,
    asked ``workers`` at a time."""
    answers: dict[str, str] = {}
    if not urls:
        return agent_figures(answers)
    deadline = time.monotonic() + budget
    pool = concurrent.futures.ThreadPoolExecutor(
        max_workers=min(workers, len(urls)), thread_name_prefix="agent-scrape"
    )
    try:
        futures = {pool.submit(_scrape, url, deadline): url for url in urls}
        done, _ = concurrent.futures.wait(futures, timeout=budget)
        for future in done:
            text = future.result()
            if text is not None:
                answers[futures[future]] = text
    finally:
        # Scrapes not started are dropped; those under way end within their socket timeout.
        pool.shutdown(wait=False, cancel_futures=True)
    return agent_figures(answers)
