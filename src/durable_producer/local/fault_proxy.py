"""A TCP proxy that tests control to simulate network faults between a client and Kafka.

Runs an asyncio loop in a background thread. Modes:

- ``restore()``: forward bytes both ways (the default).
- ``cut()``: close every open connection and accept-then-close new ones, as if the
  broker were unreachable.
- ``hang()``: keep connections open (and accept new ones) but stop moving bytes, as if
  packets were being dropped; ``restore()`` lets the held bytes through again.
- ``lose_answers()``: requests reach the broker, its answers are dropped (an asymmetric
  fault: the broker acts on what the client never hears about); ``restore()`` then closes
  the connections, whose streams lost bytes mid-answer.

Start it before the broker so the broker can advertise ``proxy.address``; point it at
the broker with ``proxy.target = broker.direct_address`` (or pass ``target``).
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import threading
from collections.abc import Coroutine
from typing import Any, Self, TypeVar

from .ports import LOOPBACK
from .process import Managed

T = TypeVar("T")
CHUNK_SIZE = 64 * 1024


class ProxyMode(enum.Enum):
    FORWARD = "forward"
    CUT = "cut"
    HANG = "hang"
    ANSWERS_LOST = "answers-lost"


class FaultProxy(Managed):
    """The proxy on a loopback port (``address``), forwarding to ``target``; modes above."""

    def __init__(self, target: str | None = None, *, listen_port: int = 0) -> None:
        self.target = target
        self._listen_port = listen_port
        self._mode = ProxyMode.FORWARD
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="fault-proxy", daemon=True
        )
        self._server: asyncio.Server | None = None
        self._flowing: asyncio.Event | None = None
        self._connections: set[asyncio.Task[None]] = set()
        self._writers: set[asyncio.StreamWriter] = set()
        self.port = 0
        self.connections_accepted = 0
        self.bytes_forwarded = 0

    @property
    def address(self) -> str:
        return f"{LOOPBACK}:{self.port}"

    @property
    def mode(self) -> ProxyMode:
        return self._mode

    def start(self) -> Self:
        self._thread.start()
        self._call(self._start_server())
        return self

    async def _start_server(self) -> None:
        self._flowing = asyncio.Event()
        self._flowing.set()
        self._server = await asyncio.start_server(self._handle, LOOPBACK, self._listen_port)
        self.port = int(self._server.sockets[0].getsockname()[1])

    def _call(self, coroutine: Coroutine[Any, Any, T], timeout: float = 10.0) -> T:
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result(timeout)

    def cut(self) -> None:
        """Drop all connections and refuse service to new ones until ``restore()``."""
        self._call(self._set_mode(ProxyMode.CUT))

    def hang(self) -> None:
        """Stop moving bytes on open and new connections until ``restore()``."""
        self._call(self._set_mode(ProxyMode.HANG))

    def lose_answers(self) -> None:
        """Forward requests, drop the answers, until ``restore()``."""
        self._call(self._set_mode(ProxyMode.ANSWERS_LOST))

    def restore(self) -> None:
        self._call(self._set_mode(ProxyMode.FORWARD))

    async def _set_mode(self, mode: ProxyMode) -> None:
        assert self._flowing is not None
        leaving_lost = self._mode is ProxyMode.ANSWERS_LOST and mode is not ProxyMode.ANSWERS_LOST
        self._mode = mode
        if leaving_lost:  # the open streams lost bytes mid-answer
            await self._close_all_connections()
        if mode in (ProxyMode.FORWARD, ProxyMode.ANSWERS_LOST):
            self._flowing.set()
            return
        self._flowing.clear()
        if mode is ProxyMode.CUT:
            await self._close_all_connections()

    async def _close_all_connections(self) -> None:
        for writer in list(self._writers):
            with contextlib.suppress(Exception):
                writer.transport.abort()
        tasks = list(self._connections)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _handle(
        self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter
    ) -> None:
        self.connections_accepted += 1
        if self._mode is ProxyMode.CUT or self.target is None:
            client_writer.transport.abort()
            return
        task = asyncio.current_task()
        assert task is not None
        self._connections.add(task)
        self._writers.add(client_writer)
        upstream_writer: asyncio.StreamWriter | None = None
        try:
            host, port = self.target.rsplit(":", 1)
            upstream_reader, upstream_writer = await asyncio.open_connection(host, int(port))
            self._writers.add(upstream_writer)
            await asyncio.gather(
                self._pump(client_reader, upstream_writer),
                self._pump(upstream_reader, client_writer, answers=True),
            )
        except (OSError, asyncio.IncompleteReadError, asyncio.CancelledError):
            # A cut cancels this handler: ending quietly keeps asyncio from logging the
            # cancellation as an error of the server's connection callback.
            pass
        finally:
            for writer in (client_writer, upstream_writer):
                if writer is not None:
                    self._writers.discard(writer)
                    with contextlib.suppress(Exception):
                        writer.transport.abort()
            self._connections.discard(task)

    async def _pump(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, *, answers: bool = False
    ) -> None:
        assert self._flowing is not None
        while True:
            await self._flowing.wait()
            data = await reader.read(CHUNK_SIZE)
            if not data:
                writer.transport.abort()
                return
            await self._flowing.wait()
            if answers and self._mode is ProxyMode.ANSWERS_LOST:
                continue
            writer.write(data)
            await writer.drain()
            self.bytes_forwarded += len(data)

    def stop(self) -> None:
        if not self._thread.is_alive():
            return
        with contextlib.suppress(Exception):
            self._call(self._shutdown())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        self._loop.close()

    async def _shutdown(self) -> None:
        if self._server is not None:
            self._server.close()
        await self._close_all_connections()
        if self._server is not None:
            await self._server.wait_closed()

    def close(self) -> None:
        self.stop()
