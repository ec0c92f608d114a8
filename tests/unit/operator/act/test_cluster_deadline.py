"""Every API call of the operator has a timeout; inside api_deadline, only the time left."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator

import kubernetes
import pytest
import urllib3

from durable_producer.operator.act import cluster as cluster_module
from durable_producer.operator.act.cluster import ApiDeadlineExceeded, Cluster, api_deadline


@pytest.fixture()
def silent_server() -> Iterator[str]:
    """An 'API server' that accepts connections and never answers."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    accepted: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        listener.settimeout(0.1)
        while not stop.is_set():
            try:
                accepted.append(listener.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    finally:
        stop.set()
        thread.join(timeout=5)
        for connection in accepted:
            connection.close()
        listener.close()


def client_for(url: str) -> Cluster:
    configuration = kubernetes.client.Configuration()
    configuration.host = url
    configuration.retries = False
    return Cluster(kubernetes.client.ApiClient(configuration))


def test_inside_a_deadline_a_hanging_call_gives_up_when_the_time_is_up(
    silent_server: str,
) -> None:
    api = client_for(silent_server)

    started = time.monotonic()
    with api_deadline(0.5), pytest.raises(urllib3.exceptions.HTTPError):
        api.get_producer("default", "orders")
    elapsed = time.monotonic() - started

    assert 0.4 < elapsed < 5.0


def test_no_call_is_made_once_the_deadline_has_passed(silent_server: str) -> None:
    api = client_for(silent_server)

    with api_deadline(0.01):
        time.sleep(0.02)
        with pytest.raises(ApiDeadlineExceeded):
            api.pool_volumes("default", "orders")


def test_outside_a_deadline_calls_get_the_default_timeout() -> None:
    assert cluster_module._call_options() == {
        "_preload_content": False,
        "_request_timeout": cluster_module.DEFAULT_REQUEST_TIMEOUT_SECONDS,
    }
    with api_deadline(3):
        assert 2.5 < cluster_module._call_options()["_request_timeout"] <= 3
