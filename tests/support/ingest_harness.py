"""Run the agent's ingest in-process (own event loop thread) on a free port, for tests."""

from __future__ import annotations

import asyncio
import socket
import struct
import threading
from collections.abc import Coroutine, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, TypeVar

import crc32c
from hypothesis import strategies as st
from kafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder
from kio.serial import entity_reader

from durable_producer.buffer_agent.ingest.config import IngestConfig
from durable_producer.buffer_agent.ingest.metadata import MetadataCache
from durable_producer.buffer_agent.ingest.server import IngestServer
from durable_producer.buffer_agent.kafka.cluster_metadata import TopicFacts
from durable_producer.buffer_agent.kafka.protocol import (
    API_API_VERSIONS,
    API_METADATA,
    API_PRODUCE,
    build,
    nested_schema,
    request_schema,
    response_schema,
)
from durable_producer.buffer_agent.wal import Frame, WalConfig, WriteAheadLog
from support.kafka_wire import encode_request, produce_body, recv_exactly
from support.wal_helpers import all_frames

T = TypeVar("T")


@dataclass
class FakeCluster:
    """A MetadataSource whose answers the test controls (the real one asks Kafka)."""

    partitions: dict[str, int] = field(default_factory=dict)
    max_message_bytes: dict[str, int] = field(default_factory=dict)
    reachable: bool = True
    calls: int = 0

    def __call__(self, topics: Sequence[str]) -> Mapping[str, TopicFacts]:
        self.calls += 1
        if not self.reachable:
            raise ConnectionError("cluster unreachable (test)")
        return {
            topic: TopicFacts(self.partitions[topic], self.max_message_bytes.get(topic))
            for topic in topics
            if topic in self.partitions
        }


@dataclass(frozen=True)
class StoredRecord:
    topic: str
    partition: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...]
    timestamp_ms: int


class RunningAgent:
    """WAL + metadata cache + ingest server on a background event loop."""

    def __init__(
        self,
        data_dir: Path,
        cluster: FakeCluster,
        *,
        ingest: IngestConfig | None = None,
        wal: WalConfig | None = None,
        default_partitions: int | None = None,
    ) -> None:
        self.data_dir = data_dir
        self.cluster = cluster
        self._ingest_config = replace(ingest or IngestConfig(), host="127.0.0.1", port=0)
        self._wal_config = wal or WalConfig(
            segment_bytes=4 << 20, max_bytes=64 << 20, max_frame_bytes=2 << 20
        )
        self._default_partitions = default_partitions
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self.wal: WriteAheadLog | None = None
        self.server: IngestServer | None = None

    def run(self, coroutine: Coroutine[Any, Any, T], timeout: float = 30.0) -> T:
        future: Future[T] = asyncio.run_coroutine_threadsafe(coroutine, self._loop)
        return future.result(timeout)

    def start(self) -> RunningAgent:
        if not self._thread.is_alive():
            self._thread.start()
        self.wal = WriteAheadLog.open(self.data_dir / "wal", self._wal_config)

        async def start_server() -> IngestServer:
            metadata = MetadataCache(
                self.data_dir / "state",
                self.cluster,
                default_partitions=self._default_partitions,
                source_timeout_s=2.0,
            )
            assert self.wal is not None
            server = IngestServer(
                self.wal, metadata, self.data_dir / "state", self._ingest_config
            )
            await server.start()
            if self.cluster.reachable:  # what a real client's first Metadata request does
                await metadata.lookup(sorted(self.cluster.partitions))
            return server

        self.server = self.run(start_server())
        return self

    @property
    def bootstrap(self) -> str:
        assert self.server is not None
        return self.server.bootstrap

    def stop_server(self) -> None:
        if self.server is not None:
            self.run(self.server.stop())
            self.server = None
        if self.wal is not None:
            self.wal.close()
            self.wal = None

    def close(self) -> None:
        try:
            self.stop_server()
        finally:
            if self._thread.is_alive():
                self._loop.call_soon_threadsafe(self._loop.stop)
                self._thread.join(10)
            self._loop.close()

    def __enter__(self) -> RunningAgent:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def frames(self) -> list[Frame]:
        assert self.wal is not None
        return all_frames(self.wal)

    def records(self) -> list[StoredRecord]:
        """Every record in the WAL, decoded with kafka-python (an independent decoder)."""
        return decode_frames(self.frames())


def decode_frames(frames: Sequence[Frame]) -> list[StoredRecord]:
    records = []
    for frame in frames:
        batch = DefaultRecordBatch(bytes(frame.payload))
        assert batch.validate_crc()
        for record in batch:
            records.append(
                StoredRecord(
                    frame.topic,
                    frame.partition,
                    record.key,
                    record.value,
                    tuple((name, value) for name, value in record.headers),
                    record.timestamp,
                )
            )
    return records


# ---------------------------------------------------------------------- raw protocol client
def read_response(sock: socket.socket, api_key: int, version: int) -> tuple[int, Any]:
    """``(correlation_id, kio response entity)`` read from ``sock``."""
    size = struct.unpack(">i", recv_exactly(sock, 4))[0]
    data = recv_exactly(sock, size)
    schema = response_schema(api_key, version)
    header, header_size = entity_reader(schema.__header_schema__)(data, 0)
    body, _ = entity_reader(schema)(data, header_size)
    return header.correlation_id, body


class RawClient:
    """A blocking Kafka-protocol client speaking exactly what the test encodes."""

    def __init__(self, bootstrap: str, timeout: float = 10.0) -> None:
        host, port = bootstrap.rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=timeout)
        self._correlation = 0

    def request(self, api_key: int, version: int, body: object) -> Any:
        self._correlation += 1
        self.sock.sendall(encode_request(api_key, version, self._correlation, body))
        correlation_id, response = read_response(self.sock, api_key, version)
        assert correlation_id == self._correlation
        return response

    def api_versions(self, version: int = 3) -> Any:
        schema = request_schema(API_API_VERSIONS, version)
        return self.request(
            API_API_VERSIONS,
            version,
            build(schema, client_software_name="raw", client_software_version="1"),
        )

    def metadata(self, topics: Sequence[str], version: int = 9) -> Any:
        schema = request_schema(API_METADATA, version)
        topic_schema = nested_schema(schema, "MetadataRequestTopic")
        return self.request(
            API_METADATA,
            version,
            build(
                schema,
                topics=tuple(build(topic_schema, name=name) for name in topics),
                allow_auto_topic_creation=False,
                include_cluster_authorized_operations=False,
                include_topic_authorized_operations=False,
            ),
        )

    def produce(
        self,
        topic: str,
        partition: int,
        records: bytes,
        *,
        version: int = 9,
        acks: int = -1,
        transactional_id: str | None = None,
    ) -> Any:
        body = produce_body(
            topic, partition, records, version=version, acks=acks, transactional_id=transactional_id
        )
        if acks == 0:
            self._correlation += 1
            self.sock.sendall(encode_request(API_PRODUCE, version, self._correlation, body))
            return None
        return self.request(API_PRODUCE, version, body)

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> RawClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def produce_error(response: Any) -> tuple[int, int]:
    """``(error code, base offset)`` of the single partition in a produce response."""
    partition = response.responses[0].partition_responses[0]
    return int(partition.error_code), int(partition.base_offset)


def record_batch(
    values: Sequence[bytes | None],
    *,
    producer_id: int = -1,
    producer_epoch: int = -1,
    base_sequence: int = -1,
    timestamp_ms: int = 1_700_000_000_000,
) -> bytes:
    builder = DefaultRecordBatchBuilder(
        magic=2,
        compression_type=0,
        is_transactional=False,
        producer_id=producer_id,
        producer_epoch=producer_epoch,
        base_sequence=base_sequence,
        batch_size=1 << 24,
    )
    for index, value in enumerate(values):
        builder.append(index, timestamp_ms + index, None, value, [])
    return bytes(builder.build())


# ---------------------------------------------------------------------- batches made invalid
BATCH_HEADER_SIZE = 61
_HEADER_FIELDS = {  # name: (offset, struct format) in a v2 batch
    "batch_length": (8, ">i"),
    "magic": (16, ">b"),
    "attributes": (21, ">h"),
    "last_offset_delta": (23, ">i"),
    "base_timestamp": (27, ">q"),
    "max_timestamp": (35, ">q"),
    "record_count": (57, ">i"),
}


def reframe(batch: bytes | bytearray) -> bytes:
    """``batch`` with its batchLength and CRC32C made to fit its (changed) bytes: framing and
    CRC hold, whatever the content says."""
    out = bytearray(batch)
    struct.pack_into(">i", out, 8, len(out) - 12)
    struct.pack_into(">I", out, 17, crc32c.crc32c(bytes(out[21:])))
    return bytes(out)


def with_header(batch: bytes, **fields: int) -> bytes:
    """``batch`` with header fields replaced (names: ``_HEADER_FIELDS``), CRC fixed."""
    out = bytearray(batch)
    for name, value in fields.items():
        offset, fmt = _HEADER_FIELDS[name]
        struct.pack_into(fmt, out, offset, value)
    return reframe(out)


def header_field(batch: bytes, name: str) -> int:
    offset, fmt = _HEADER_FIELDS[name]
    return int(struct.unpack_from(fmt, batch, offset)[0])


def recompress(batch: bytes, codec: int) -> bytes:
    """An uncompressed ``batch`` with its records compressed with ``codec`` (0-4) by libraries
    the agent does not use (stdlib gzip, python-snappy, lz4, zstandard)."""
    import gzip

    import lz4.frame
    import snappy
    import zstandard

    assert header_field(batch, "attributes") & 0x07 == 0
    records = batch[BATCH_HEADER_SIZE:]
    compress = {
        0: bytes,
        1: gzip.compress,
        2: snappy.compress,  # raw blocks, as librdkafka writes them
        3: lz4.frame.compress,
        4: zstandard.ZstdCompressor().compress,
    }[codec]
    attributes = header_field(batch, "attributes") | codec
    return with_header(batch[:BATCH_HEADER_SIZE] + compress(records), attributes=attributes)


mutation = st.one_of(
    st.tuples(st.just("flip"), st.integers(0, 10_000), st.integers(1, 255)),
    st.tuples(st.just("truncate"), st.integers(0, 10_000), st.just(0)),
    st.tuples(st.just("append"), st.binary(min_size=1, max_size=20), st.just(0)),
    st.tuples(st.just("insert"), st.integers(0, 10_000), st.integers(0, 255)),
    st.tuples(st.just("count"), st.integers(-2, 40), st.booleans()),
    st.tuples(st.just("codec"), st.integers(0, 7), st.just(0)),
    st.tuples(st.just("timestamps"), st.sampled_from([-1, -2, 0, 2**40]), st.booleans()),
)
"""One change to a batch, for ``mutate``: framing and CRC are fixed afterwards."""


def mutate(batch: bytes, kind: str, a: Any, b: Any) -> bytes:
    """``batch`` changed as a ``mutation`` says; its CRC and length fit the result."""
    header, body = batch[:BATCH_HEADER_SIZE], bytearray(batch[BATCH_HEADER_SIZE:])
    if kind == "flip" and body:
        body[a % len(body)] ^= b
    elif kind == "truncate":
        del body[a % (len(body) + 1) :]
    elif kind == "append":
        body += a
    elif kind == "insert":
        body.insert(a % (len(body) + 1), b)
    elif kind == "count":
        fields = {"record_count": a}
        if b:  # keep the header self-consistent: only the records disagree
            fields["last_offset_delta"] = a - 1
        return with_header(batch, **fields)
    elif kind == "codec":
        attributes = header_field(batch, "attributes") & ~0x07 | a
        return with_header(batch, attributes=attributes)
    elif kind == "timestamps":
        return with_header(batch, base_timestamp=a, **({"max_timestamp": a} if b else {}))
    return reframe(header + bytes(body))


# ---------------------------------------------------------------------- connection-dropping proxy
class ResponseDroppingProxy:
    """Forwards a client to the agent; can drop the connection instead of a Produce response.

    With ``drop_produce_responses = n``, the next ``n`` produce responses are swallowed and the
    client connection is closed: the agent stored the batch, the client never heard back.
    """

    def __init__(self, target: str) -> None:
        host, port = target.rsplit(":", 1)
        self._target = (host, int(port))
        self.drop_produce_responses = 0
        self.dropped = 0
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(self) -> int:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        return int(self._server.sockets[0].getsockname()[1])

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _handle(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        agent_r, agent_w = await asyncio.open_connection(*self._target)
        api_keys: dict[int, int] = {}
        upstream = asyncio.create_task(self._upstream(client_r, agent_w, api_keys))
        try:
            while True:
                prefix = await agent_r.readexactly(4)
                data = await agent_r.readexactly(struct.unpack(">i", prefix)[0])
                correlation_id = struct.unpack_from(">i", data)[0]
                if api_keys.pop(correlation_id, None) == API_PRODUCE and (
                    self.drop_produce_responses > 0
                ):
                    self.drop_produce_responses -= 1
                    self.dropped += 1
                    return
                client_w.write(prefix + data)
                await client_w.drain()
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError):
            pass
        finally:
            upstream.cancel()
            client_w.close()
            agent_w.close()
            self._tasks.discard(task)

    @staticmethod
    async def _upstream(
        reader: asyncio.StreamReader, writer: asyncio.StreamWriter, api_keys: dict[int, int]
    ) -> None:
        try:
            while True:
                prefix = await reader.readexactly(4)
                data = await reader.readexactly(struct.unpack(">i", prefix)[0])
                api_key, _, correlation_id = struct.unpack_from(">hhi", data)
                api_keys[correlation_id] = api_key
                writer.write(prefix + data)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()
