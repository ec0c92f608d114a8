"""A PV read that fails never refuses a pod, and leaves the claim its time (review D3).

The webhook reads the PV of each bound free volume to skip those that cannot be attached
where the pod may run. Without ``get persistentvolumes`` (HTTP 403) or when the API server
does not answer, the volume is taken as before the check, within a share of the deadline.
"""

from __future__ import annotations

import http.server
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from durable_producer.operator.act import persistent_volumes
from durable_producer.operator.act.cluster import api_deadline, time_left
from unit.operator.act.test_cluster_deadline import client_for, silent_server

__all__ = ["silent_server"]

BOUND = {"metadata": {"name": "orders-buffer-a"}, "spec": {"volumeName": "pv-a"}}
POD = {"metadata": {"name": "p"}, "spec": {"nodeSelector": {"zone": "b"}}}


class Refusing(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = b'{"kind":"Status","code":403,"message":"forbidden"}'
        self.send_response(403)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture()
def refusing_server() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Refusing)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


NODE_LOCAL_PV = (b'{"kind":"PersistentVolume","metadata":{"name":"pv-a"},"spec":{"nodeAffinity":'
                 b'{"required":{"nodeSelectorTerms":[{"matchExpressions":[{"key":'
                 b'"kubernetes.io/hostname","operator":"In","values":["node-1"]}]}]}}}}')


def node_answering(node_status: int) -> type[http.server.BaseHTTPRequestHandler]:
    """A server with a node-local PV on node-1, answering ``node_status`` for nodes."""

    class Answering(Refusing):
        def do_GET(self) -> None:
            if self.path.startswith("/api/v1/persistentvolumes/"):
                status, body = 200, NODE_LOCAL_PV
            else:
                status, body = node_status, b'{"kind":"Status","code":%d}' % node_status
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    return Answering


@pytest.mark.parametrize(("node_status", "handed_out"), [(404, False), (403, True), (200, True)])
def test_a_node_local_volume_whose_node_is_gone_is_skipped(
    monkeypatch: pytest.MonkeyPatch, node_status: int, handed_out: bool
) -> None:
    """Only a 404 for every node the PV names skips it; a refused node read takes it."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), node_answering(node_status))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        use_server(monkeypatch, f"http://127.0.0.1:{server.server_address[1]}")
        check = persistent_volumes.PlacementCheck(POD)
        with api_deadline(5):
            chosen = check.first([BOUND])
    finally:
        server.shutdown()
        server.server_close()
    assert (chosen is BOUND) is handed_out
    assert check.unplaceable == (set() if handed_out else {"orders-buffer-a"})


def use_server(monkeypatch: pytest.MonkeyPatch, url: str) -> None:
    api = client_for(url)
    monkeypatch.setattr(persistent_volumes, "cluster", lambda user_agent: api)


def test_a_refused_pv_read_hands_the_volume_out_as_before(
    monkeypatch: pytest.MonkeyPatch, refusing_server: str
) -> None:
    use_server(monkeypatch, refusing_server)
    check = persistent_volumes.PlacementCheck(POD)

    with api_deadline(5):
        assert check.first([BOUND]) is BOUND
    assert check.unplaceable == set()


def test_a_pv_read_that_hangs_uses_only_its_share_of_the_deadline(
    monkeypatch: pytest.MonkeyPatch, silent_server: str
) -> None:
    use_server(monkeypatch, silent_server)
    check = persistent_volumes.PlacementCheck(POD)

    with api_deadline(6):
        started = time.monotonic()
        assert check.first([BOUND]) is BOUND
        spent = time.monotonic() - started
        left = time_left()
    share = 6 * persistent_volumes.PV_READ_SHARE  # 3 s; the whole deadline was the defect
    assert spent < share + 1.5
    assert left is not None and left > 6 - share - 1.5  # the claim still has time


def test_without_a_pod_or_a_bound_pv_nothing_is_read(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_reads(user_agent: str) -> Any:
        raise AssertionError("nothing to read")

    monkeypatch.setattr(persistent_volumes, "cluster", no_reads)
    unbound = {"metadata": {"name": "orders-buffer-b"}, "spec": {}}
    assert persistent_volumes.PlacementCheck(POD).first([unbound]) is unbound
    assert persistent_volumes.PlacementCheck(None).first([BOUND]) is BOUND
