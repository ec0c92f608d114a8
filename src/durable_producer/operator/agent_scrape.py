"""Reading the agents' backlog from their Prometheus endpoints (the pool timer publishes it).

The agent has no API access, so the operator asks each running agent over HTTP. The metric's
name comes from the contract, not from the agent's code: the operator image does not carry
the agent's dependencies.
"""

from __future__ import annotations

import urllib.request
from collections.abc import Iterable, Mapping
from typing import Any

from durable_producer.contract import BACKLOG_METRIC
from durable_producer.operator import pod_mutation

# Per agent: a slow one must not stall the pool timer for long.
METRICS_TIMEOUT_SECONDS = 1.0


def parse_backlog_bytes(exposition: str) -> int | None:
    """The backlog gauge from a Prometheus text exposition, or None when absent."""
    for line in exposition.splitlines():
        if line.startswith("#"):
            continue
        parts = line.split()
        if len(parts) >= 2 and parts[0].split("{", 1)[0] == BACKLOG_METRIC:
            try:
                return int(float(parts[1]))
            except ValueError:
                return None
    return None


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


def scrape_backlog(urls: list[str]) -> int | None:
    """Total backlog of the agents that answer; None when none does (then nothing is known)."""
    answers = []
    for url in urls:
        try:
            with urllib.request.urlopen(url, timeout=METRICS_TIMEOUT_SECONDS) as response:
                answers.append(parse_backlog_bytes(response.read().decode()))
        except (OSError, ValueError):
            continue
    known = [backlog for backlog in answers if backlog is not None]
    return sum(known) if known else None
