"""Reading the agents' figures from their Prometheus endpoints (the pool timer publishes them).

The agent has no API access, so the operator asks each running agent over HTTP: its backlog,
and whether ingest exceeds the forward rate it sustains under load, with both rates. What the
answers mean is read by ``decide/agent_figures.py``.
"""

from __future__ import annotations

import urllib.request
from collections.abc import Iterable, Mapping
from typing import Any

from durable_producer.operator.decide import pod_mutation
from durable_producer.operator.decide.agent_figures import AgentFigures, agent_figures

# Per agent: a slow one must not stall the pool timer for long.
METRICS_TIMEOUT_SECONDS = 1.0


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


def scrape_agents(urls: list[str]) -> AgentFigures:
    """The figures of the agents that answer (named by URL)."""
    answers: dict[str, str] = {}
    for url in urls:
        try:
            with urllib.request.urlopen(url, timeout=METRICS_TIMEOUT_SECONDS) as response:
                answers[url] = response.read().decode()
        except (OSError, ValueError):
            continue
    return agent_figures(answers)
