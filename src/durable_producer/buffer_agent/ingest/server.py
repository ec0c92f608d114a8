"""The agent's Kafka-protocol listener: a tiny local "broker" in front of the WAL.

It answers what producers need and nothing else, each API in the module named:

- **ApiVersions**, **Metadata**, **InitProducerId**, and the refused **Fetch** and
  **FindCoordinator** (advertised only because librdkafka derives its record-format and
  compression support from them): ``answers``.
- **Produce** (v3+, record batch magic 2): ``produce``; batches are validated, checked for
  idempotent sequence (``sequences``) and appended to the WAL, and the response is sent only
  once they are stored, with the durability the WAL's fsync policy promises. ``acks=0``
  requests get no response at all.
- Producer ids: ``producer_ids``; sequence state across restarts: ``producer_state``.

Unknown API keys or versions (other than ApiVersions, answered UNSUPPORTED_VERSION) and
malformed frames close that connection only, as a Kafka broker does: there is no generic error
response to send.

Each connection is served by its own task; requests of one connection are answered in order.
Whatever clients do, memory stays bounded: request bytes come out of one shared budget
(``request_memory``, ``max_request_memory_bytes``) as they arrive, never as a size prefix
announces them (``frame_receiver``); at most ``max_connections`` are served (more are closed on
arrival, with a rate-limited log line); a connection that starts no request for
``idle_timeout_s``, or takes longer than ``read_timeout_s`` to send one it started, is closed.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from kio.schema.errors import ErrorCode

from durable_producer.buffer_agent.ingest.answers import Answers, api_versions_body
from durable_producer.buffer_agent.ingest.config import IngestConfig
from durable_producer.buffer_agent.ingest.frame_receiver import FrameReceiver
from durable_producer.buffer_agent.ingest.metadata import MetadataCache
from durable_producer.buffer_agent.ingest.produce import ProduceHandler
from durable_producer.buffer_agent.ingest.producer_ids import ProducerIdAllocator
from durable_producer.buffer_agent.ingest.producer_state import ProducerState
from durable_producer.buffer_agent.ingest.request_memory import RequestMemory
from durable_producer.buffer_agent.ingest.stats import IngestStats
from durable_producer.buffer_agent.kafka.protocol import (
    API_API_VERSIONS,
    API_FETCH,
    API_FIND_COORDINATOR,
    API_INIT_PRODUCER_ID,
    API_METADATA,
    API_PRODUCE,
    SUPPORTED_API_VERSIONS,
    MalformedFrame,
    Request,
    UnsupportedRequest,
    encode_response,
    parse_request,
    peek_header,
)
from durable_producer.buffer_agent.log_limits import RateLimitedLog
from durable_producer.buffer_agent.process_tuning import (
    TRIM_AFTER_PEAK_BYTES,
    TRIM_INTERVAL_S,
    release_free_memory,
)
from durable_producer.buffer_agent.volume.state_file import StateDamage
from durable_producer.buffer_agent.wal import WalError, WriteAheadLog

log = logging.getLogger(__name__)

TRIM_AFTER_CLOSED = 32
"""Connections closed since the last trim that make the next close schedule one."""
TRIM_DELAY_S = 2.0

_Handler = Callable[[Request], Awaitable[Any]]
"""An API's handler: a kio response entity to encode, bytes already encoded, or None."""


def try_binding(host: str, port: int) -> None:
    """Bind each address ``listen`` will (as asyncio's ``create_server`` does: every address
    the name resolves to, IPv6 ones V6ONLY) and let it go again, without listening: raises the
    ``OSError`` (``socket.gaierror`` for a name that does not resolve) ``listen`` would."""
    for family, kind, proto, _, address in socket.getaddrinfo(
        host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    ):
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                probe.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            probe.bind(address)


class IngestServer:
    """Serve the Kafka protocol on ``config.host:config.port`` into ``wal``.

    ``start()`` restores producer state (snapshot + WAL replay) and starts listening;
    ``stop()`` closes the listener and every connection and writes a final snapshot. Call
    :meth:`snapshot_producer_state` before checkpointing the WAL (see ``producer_state``).
    """

    def __init__(
        self,
        wal: WriteAheadLog,
        metadata: MetadataCache,
        state_dir: Path,
        config: IngestConfig | None = None,
        *,
        producer_id_block: int = 1000,
    ) -> None:
        self._wal = wal
        self._metadata = metadata
        self._config = config or IngestConfig()
        self.stats = IngestStats()
        self.request_memory = RequestMemory(self._config.max_request_memory_bytes, self.stats)
        state_dir = Path(state_dir)
        self._producer_ids = ProducerIdAllocator(state_dir, producer_id_block)
        self._producer_state = ProducerState(wal, state_dir)
        self._answers = Answers(
            self._config, metadata, self._producer_ids, self.stats, lambda: self.port
        )
        self._produce = ProduceHandler(
            self._config, wal, metadata, self._producer_state, self.stats
        )
        self._handlers: dict[int, _Handler] = {
            API_API_VERSIONS: self._answers.api_versions,
            API_METADATA: self._answers.metadata,
            API_INIT_PRODUCER_ID: self._answers.init_producer_id,
            API_PRODUCE: self._produce.handle,
            API_FETCH: self._answers.fetch,
            API_FIND_COORDINATOR: self._answers.find_coordinator,
        }
        self._server: asyncio.Server | None = None
        self._connections: set[asyncio.Task[None]] = set()
        self._snapshot_task: asyncio.Task[None] | None = None
        self._refusal_log = RateLimitedLog(log)
        self._closed_since_trim = 0
        self._last_trim = float("-inf")
        self._trim_handle: asyncio.TimerHandle | None = None

    @property
    def config(self) -> IngestConfig:
        return self._config

    @config.setter
    def config(self, config: IngestConfig) -> None:
        """Takes effect for the next request (tests change the advertised port this way)."""
        self._config = self._answers.config = self._produce.config = config

    # ------------------------------------------------------------------ lifecycle
    @property
    def port(self) -> int:
        if self._server is None or not self._server.sockets:
            raise RuntimeError("ingress server is not listening")
        return int(self._server.sockets[0].getsockname()[1])

    @property
    def bootstrap(self) -> str:
        return f"{self._config.host}:{self.port}"

    async def start(self) -> None:
        """:meth:`restore`, then :meth:`listen`."""
        await self.restore()
        await self.listen()

    async def restore(self) -> None:
        """Rebuild sequence state from the snapshot and the WAL (before anything checkpoints
        the WAL: the forwarder starts after this). Raises ``WalError`` if the WAL cannot be
        read."""
        try:
            await asyncio.to_thread(self._producer_state.restore)
        except OSError as error:
            raise WalError(
                f"could not read the WAL to restore the producers' sequence state ({error});"
                " check the volume"
            ) from error
        self._producer_ids.ensure_above(self._producer_state.sequences.max_producer_id())

    @property
    def state_damage(self) -> list[StateDamage]:
        """State files found unusable at start (each fell back; see ``volume/state_file.py``)."""
        found = (self._producer_ids.damage, self._producer_state.damage, self._metadata.damage)
        return [damage for damage in found if damage is not None]

    async def listen(self) -> None:
        """Accept connections (raises ``OSError`` if the address cannot be listened on)."""
        if not self._producer_state.restored:
            await self.restore()
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            self._new_connection, self._config.host, self._config.port
        )
        self._snapshot_task = asyncio.create_task(self._snapshot_periodically())
        log.info("agent ingress listening on %s", self.bootstrap)

    async def stop(self) -> None:
        if self._trim_handle is not None:
            self._trim_handle.cancel()
        if self._server is not None:
            self._server.close()
        if self._snapshot_task is not None:
            self._snapshot_task.cancel()
            await asyncio.gather(self._snapshot_task, return_exceptions=True)
        for task in list(self._connections):
            task.cancel()
        await asyncio.gather(*self._connections, return_exceptions=True)
        await self._produce.finish_appends()  # their batches belong in the last snapshot
        if self._server is not None:
            await self._server.wait_closed()
            self._server = None
        await self._metadata.close()
        if not self._wal.closed:
            await self.snapshot_producer_state()

    async def __aenter__(self) -> IngestServer:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()

    # ------------------------------------------------------------------ producer state
    async def snapshot_producer_state(self) -> None:
        """Persist sequence state with the WAL offset from which a restart must replay."""
        await self._producer_state.snapshot(self._config.producer_expiration_s)

    async def _snapshot_periodically(self) -> None:
        while True:
            await asyncio.sleep(self._config.snapshot_interval_s)
            if self._producer_state.dirty:
                try:
                    await self.snapshot_producer_state()
                except OSError as exc:
                    log.warning("cannot write the producer state snapshot: %s", exc)

    # ------------------------------------------------------------------ connections
    def _new_connection(self) -> FrameReceiver:
        return FrameReceiver(
            self._config.max_frame_bytes,
            memory=self.request_memory,
            on_connection_made=self._connected,
        )

    def _connected(self, receiver: FrameReceiver) -> None:
        limit = self._config.max_connections
        if len(self._connections) >= limit:
            self.stats.refused_connections += 1
            self._refusal_log.warning(
                "max_connections",
                "closing a new connection from %s: %d connections are open, the limit"
                " (--max-connections)",
                receiver.peer,
                limit,
            )
            receiver.abort()
            return
        task = asyncio.get_running_loop().create_task(self._serve_connection(receiver))
        self._connections.add(task)

    async def _serve_connection(self, receiver: FrameReceiver) -> None:
        task = asyncio.current_task()
        assert task is not None
        self.stats.connections_total += 1
        self.stats.connections_open += 1
        peer = receiver.peer
        try:
            await self._serve_requests(receiver, peer)
        except asyncio.CancelledError:
            pass
        except (MalformedFrame, UnsupportedRequest) as exc:
            self.stats.dropped_connections[type(exc).__name__] += 1
            self._refusal_log.warning(
                type(exc).__name__, "closing connection from %s: %s", peer, exc
            )
        except TimeoutError:
            self.stats.dropped_connections["timeout"] += 1
            if receiver.partial_frame:
                self._refusal_log.warning(
                    "read_timeout",
                    "closing connection from %s: a request was not complete %g s after its"
                    " first byte (--request-read-timeout)",
                    peer,
                    self._config.read_timeout_s,
                )
            else:
                log.info("closing connection from %s: idle or write timeout", peer)
        except (ConnectionError, OSError):
            self.stats.dropped_connections["connection_error"] += 1
        except Exception:
            self.stats.dropped_connections["internal_error"] += 1
            log.exception("closing connection from %s after an internal error", peer)
        finally:
            self.stats.connections_open -= 1
            self._connections.discard(task)
            receiver.close()
            self._connection_closed()

    def _connection_closed(self) -> None:
        """After a burst of closed connections or a request-memory peak, give freed memory
        back to the kernel (``process_tuning.release_free_memory``), at most every
        TRIM_INTERVAL_S, so RSS returns near its baseline once hostile clients leave."""
        self._closed_since_trim += 1
        burst = self._closed_since_trim >= TRIM_AFTER_CLOSED
        if self._trim_handle is not None or not (
            burst or self.request_memory.peak >= TRIM_AFTER_PEAK_BYTES
        ):
            return
        loop = asyncio.get_running_loop()
        delay = max(TRIM_DELAY_S, self._last_trim + TRIM_INTERVAL_S - loop.time())
        self._trim_handle = loop.call_later(delay, self._trim)

    def _trim(self) -> None:
        self._trim_handle = None
        self._closed_since_trim = 0
        self._last_trim = asyncio.get_running_loop().time()
        self.request_memory.reset_peak()
        release_free_memory()

    async def _serve_requests(self, receiver: FrameReceiver, peer: object) -> None:
        config = self._config
        while True:
            frame = await receiver.next_frame(
                idle_timeout=config.idle_timeout_s, read_timeout=config.read_timeout_s
            )
            if frame is None:
                return
            self.stats.requests += 1
            response = await self._handle_frame(frame, peer, receiver.frame_arrived)
            if response is not None:
                await receiver.send(response, timeout=config.write_timeout_s)

    # ------------------------------------------------------------------ dispatch
    async def _handle_frame(
        self, frame: bytes | memoryview, peer: object, arrived: float
    ) -> bytes | None:
        """The answer to one request (``arrived``: loop time the frame was complete)."""
        api_key, api_version, correlation_id = peek_header(frame)
        if api_key == API_API_VERSIONS and api_version > SUPPORTED_API_VERSIONS[api_key][1]:
            self._refusal_log.warning(
                "api_versions_version",
                "ApiVersions v%d from %s is not supported; answering UNSUPPORTED_VERSION",
                api_version,
                peer,
            )
            return encode_response(
                correlation_id, api_versions_body(0, ErrorCode.unsupported_version)
            )
        request = parse_request(frame)
        if api_key == API_PRODUCE:
            return await self._produce.handle(request, arrived)
        response = await self._handlers[api_key](request)
        if response is None or isinstance(response, bytes):
            return response  # no response (acks=0) or already encoded (Produce)
        return encode_response(correlation_id, response)
