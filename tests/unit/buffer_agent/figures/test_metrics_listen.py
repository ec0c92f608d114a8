"""The agent's metrics endpoint is reachable over IPv4 and IPv6 by default (kubelet probes
come to the pod IP, of whichever family the cluster uses)."""

from __future__ import annotations

import errno
import socket
import urllib.request
from http.server import ThreadingHTTPServer

import pytest

from durable_producer import dual_stack_http
from durable_producer.buffer_agent.cli import build_parser
from durable_producer.buffer_agent.figures.metrics import AgentMetrics
from durable_producer.buffer_agent.figures.metrics_server import MetricsServer
from durable_producer.buffer_agent.options import host_port
from durable_producer.buffer_agent.settings import AgentConfig
from durable_producer.contract import METRICS_HOST


def healthy(url: str) -> bool:
    with urllib.request.urlopen(url, timeout=2) as response:
        return response.status == 200


def ipv6_loopback_available() -> bool:
    if not socket.has_ipv6:
        return False
    try:
        with socket.socket(socket.AF_INET6) as probe:
            probe.bind(("::1", 0))
        return True
    except OSError:
        return False


def test_the_default_address_is_every_address_of_both_families() -> None:
    args = build_parser({"DURABLE_AGENT_KAFKA_BOOTSTRAP": "k:9092"}).parse_args(["run"])

    assert AgentConfig().metrics_host == METRICS_HOST == "::"
    assert args.metrics_listen == ("::", 9644)


@pytest.mark.skipif(not ipv6_loopback_available(), reason="this machine has no IPv6 loopback")
def test_the_default_address_answers_ipv4_and_ipv6() -> None:
    with MetricsServer(AgentMetrics(), host=METRICS_HOST, port=0) as server:
        assert healthy(f"http://127.0.0.1:{server.port}/healthz")
        assert healthy(f"http://[::1]:{server.port}/healthz")


def test_without_ipv6_the_default_address_falls_back_to_ipv4(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    class NoIPv6(ThreadingHTTPServer):
        def __init__(self, *args: object, **kwargs: object) -> None:
            raise OSError(errno.EAFNOSUPPORT, "Address family not supported by protocol")

    monkeypatch.setattr(dual_stack_http, "_IPv6HTTPServer", NoIPv6)

    with MetricsServer(AgentMetrics(), host=METRICS_HOST, port=0) as server:
        assert healthy(f"http://127.0.0.1:{server.port}/healthz")


def test_a_given_ipv4_address_is_bound_as_given() -> None:
    with MetricsServer(AgentMetrics(), host="127.0.0.1", port=0) as server:
        assert healthy(f"http://127.0.0.1:{server.port}/healthz")


@pytest.mark.parametrize(("text", "expected"), [
    ("[::]:9644", ("::", 9644)), ("[::1]:1", ("::1", 1)), ("0.0.0.0:9644", ("0.0.0.0", 9644)),
    (":::9644", ("::", 9644)),
])  # fmt: skip
def test_host_port_takes_ipv6_hosts_in_brackets(text: str, expected: tuple[str, int]) -> None:
    assert host_port(text) == expected
