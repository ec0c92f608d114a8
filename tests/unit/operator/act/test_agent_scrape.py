"""The pool timer's scrapes of the agents: concurrent, bounded in time in all (D5)."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from durable_producer.contract import BACKLOG_METRIC
from durable_producer.operator.act import agent_scrape

BACKLOG_TEXT = f"{BACKLOG_METRIC} 123\n"


@pytest.fixture()
def silent_port() -> Iterator[int]:
    """Takes connections and never answers (a NetworkPolicy that drops, a hung agent)."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1024)
    try:
        yield int(listener.getsockname()[1])
    finally:
        listener.close()


@pytest.fixture()
def answering_url() -> Iterator[str]:
    class Metrics(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = BACKLOG_TEXT.encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Metrics)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/metrics"
    finally:
        server.shutdown()
        server.server_close()


def silent_urls(port: int, count: int) -> list[str]:
    # One silent listener stands for them all: a URL each (an agent is named by its URL).
    return [f"http://127.0.0.1:{port}/metrics?agent={index}" for index in range(count)]


def test_silent_agents_are_asked_at_once_not_one_second_each(silent_port: int) -> None:
    """Serially, 20 agents behind a default-deny NetworkPolicy held the timer 20 s."""
    urls = silent_urls(silent_port, 20)

    started = time.monotonic()
    agent_scrape.scrape_agents(urls)
    elapsed = time.monotonic() - started

    assert elapsed < 4 * agent_scrape.METRICS_TIMEOUT_SECONDS, elapsed


def test_the_whole_round_ends_within_its_budget_however_many_agents_are_silent(
    silent_port: int,
) -> None:
    urls = silent_urls(silent_port, 40)

    started = time.monotonic()
    agent_scrape.scrape_agents(urls, workers=2, budget=1.5)

    assert time.monotonic() - started < 5.0  # 20 rounds of the timeout without the budget


def test_the_agents_that_answer_are_counted_among_silent_ones(
    silent_port: int, answering_url: str
) -> None:
    figures = agent_scrape.scrape_agents([*silent_urls(silent_port, 5), answering_url],
                                         budget=3.0)

    assert (figures.answered, figures.backlog_bytes) == (1, 123)


def test_no_agents_no_figures() -> None:
    assert agent_scrape.scrape_agents([]).backlog_bytes is None
