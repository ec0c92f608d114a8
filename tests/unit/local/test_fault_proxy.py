"""The fault proxy's lost-answers mode: requests reach the server, answers never come back."""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator

import pytest

from durable_producer.local.fault_proxy import FaultProxy, ProxyMode
from durable_producer.local.ports import LOOPBACK


class EchoServer:
    """Answers every chunk with itself; keeps what it received."""

    def __init__(self) -> None:
        self._listener = socket.create_server((LOOPBACK, 0))
        self.address = f"{LOOPBACK}:{self._listener.getsockname()[1]}"
        self.received = bytearray()
        self.got = threading.Event()
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        connection, _ = self._listener.accept()
        with connection:
            while data := connection.recv(4096):
                self.received += data
                self.got.set()
                connection.sendall(data)

    def close(self) -> None:
        self._listener.close()


@pytest.fixture
def echo() -> Iterator[EchoServer]:
    server = EchoServer()
    yield server
    server.close()


def test_lost_answers_reach_the_server_and_restore_closes_the_connection(
    echo: EchoServer,
) -> None:
    with FaultProxy(echo.address) as proxy:
        host, port = proxy.address.rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=5) as client:
            client.sendall(b"one")
            assert client.recv(16) == b"one"

            proxy.lose_answers()
            assert proxy.mode is ProxyMode.ANSWERS_LOST
            echo.got.clear()
            client.sendall(b"two")
            assert echo.got.wait(5)
            assert bytes(echo.received) == b"onetwo"
            client.settimeout(0.5)
            with pytest.raises(TimeoutError):
                client.recv(16)

            proxy.restore()  # the stream lost an answer: closed, not resumed mid-way
            client.settimeout(5)
            with contextlib.suppress(ConnectionResetError):
                assert client.recv(16) == b""
