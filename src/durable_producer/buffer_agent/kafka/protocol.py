"""Kafka wire protocol glue: request framing, header parsing and response encoding via kio.

Every Kafka request is ``int32 size`` + header + body. The header version follows from the API
key and version (v1 for classic versions, v2 for flexible ones); kio's generated schemas carry
the right header class for each request and response (including the ApiVersions quirk: its
response header is always v0). Only the APIs the agent implements are decoded; record batches
stay opaque bytes here (see ``record_batch``), kio's record reader is never used.
"""

from __future__ import annotations

import dataclasses
import io
import struct
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from typing import Any

from kio.index import load_request_schema, load_response_schema
from kio.serial import entity_reader, entity_writer

from durable_producer.buffer_agent.kafka.varint import encode_uvarint
from durable_producer.buffer_agent.kafka.wire_bounds import Edits, check_bounds, edited

API_PRODUCE = 0
API_FETCH = 1
API_METADATA = 3
API_FIND_COORDINATOR = 10
API_API_VERSIONS = 18
API_INIT_PRODUCER_ID = 22

SUPPORTED_API_VERSIONS: Mapping[int, tuple[int, int]] = {
    API_PRODUCE: (3, 9),  # v3 is the first with record batch format v2
    API_FETCH: (4, 10),
    API_METADATA: (0, 12),
    API_FIND_COORDINATOR: (0, 3),
    API_API_VERSIONS: (0, 4),
    API_INIT_PRODUCER_ID: (0, 4),
}
"""Exactly the versions the agent implements and advertises in ApiVersions.

Fetch and FindCoordinator are implemented as refusals (the agent is write-only and has no
groups or transactions), but must be advertised: librdkafka enables record batch v2 only if
the broker lists Produce v3 *and* Fetch v4, zstd only with Produce v7 and Fetch v10, and lz4
only with FindCoordinator v0.
"""
MAX_OTHER_REQUEST_BYTES = 1 << 20
"""A request other than Produce is at most this long: a Metadata request naming 30,000
topics fits. Each is walked (``wire_bounds``) and decoded into objects by kio on the
ingest's loop: a Metadata request of 4 MB naming 2,000,000 empty topics held it for 3.7 s
(2.7 s the walk, 1.1 s kio), and a frame may be 100 MiB."""

DEFAULT_MAX_REQUEST_FRAME_BYTES = 100 * 1024 * 1024
"""Largest size-prefixed Kafka request the listener reads (``IngestConfig.max_frame_bytes``).

Not the WAL's frame limit (``wal.config.DEFAULT_MAX_WAL_FRAME_BYTES``): a request holds the
batches of many partitions, a WAL frame those of one."""
_SIZE = struct.Struct(">i")
_HEADER_PREFIX = struct.Struct(">hhi")  # api key, api version, correlation id


class ProtocolError(Exception):
    """The peer broke the protocol; the only safe reaction is to close that connection."""


class MalformedFrame(ProtocolError):
    """Bad size prefix, truncated frame or undecodable header/body."""


@dataclass(frozen=True, slots=True)
class UnsupportedRequest(ProtocolError):
    """The API key or version is not implemented by the agent."""

    api_key: int
    api_version: int
    correlation_id: int

    def __str__(self) -> str:
        return (
            f"unsupported request: api key {self.api_key} version {self.api_version}"
            f" (correlation id {self.correlation_id})"
        )


@dataclass(frozen=True, slots=True)
class Request:
    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None
    body: Any
    """The kio request entity, e.g. ``kio.schema.produce.v9.request.ProduceRequest``."""


def peek_header(frame: bytes | memoryview) -> tuple[int, int, int]:
    """``(api_key, api_version, correlation_id)`` without decoding anything else."""
    if len(frame) < _HEADER_PREFIX.size:
        raise MalformedFrame(f"frame of {len(frame)} bytes is too short for a request header")
    api_key, api_version, correlation_id = _HEADER_PREFIX.unpack_from(frame)
    return api_key, api_version, correlation_id


def is_supported(api_key: int, api_version: int) -> bool:
    versions = SUPPORTED_API_VERSIONS.get(api_key)
    return versions is not None and versions[0] <= api_version <= versions[1]


@cache
def request_schema(api_key: int, api_version: int) -> type:
    return load_request_schema(api_key, api_version)


@cache
def response_schema(api_key: int, api_version: int) -> type:
    return load_response_schema(api_key, api_version)


def parse_request(frame: bytes | memoryview) -> Request:
    """Decode header and body of a request the agent implements.

    Raises :class:`UnsupportedRequest` for API keys/versions outside
    ``SUPPORTED_API_VERSIONS`` and :class:`MalformedFrame` for undecodable bytes. Produce
    requests are decoded by :func:`parse_produce` (record batches stay views of ``frame``);
    everything else by kio.
    """
    api_key, api_version, correlation_id = peek_header(frame)
    if not is_supported(api_key, api_version):
        raise UnsupportedRequest(api_key, api_version, correlation_id)
    if api_key == API_PRODUCE:
        return parse_produce(frame)
    if len(frame) > MAX_OTHER_REQUEST_BYTES:
        raise MalformedFrame(
            f"api key {api_key} v{api_version}: a request of {len(frame)} bytes; at most"
            f" {MAX_OTHER_REQUEST_BYTES} for any but Produce"
        )
    schema: Any = request_schema(api_key, api_version)  # a kio entity class
    try:  # lengths and counts within the frame first: kio reserves what they declare
        edits: Edits = []
        header_end = check_bounds(schema.__header_schema__, frame, 0, header=True, edits=edits)
        check_bounds(schema, frame, header_end, edits=edits)
        if edits:  # tagged fields this version does not know: skipped, as by Kafka
            frame = edited(frame, edits)
        header, header_size = _kio_read(entity_reader(schema.__header_schema__), frame, 0)
        body, body_size = _kio_read(entity_reader(schema), frame, header_size)
    except Exception as exc:  # kio raises assorted errors for truncated/invalid input
        raise MalformedFrame(
            f"cannot decode api key {api_key} v{api_version}: {type(exc).__name__}: {exc}"
        ) from None
    if header_size + body_size != len(frame):
        raise MalformedFrame(
            f"api key {api_key} v{api_version}: {len(frame) - header_size - body_size}"
            " trailing bytes after the request body"
        )
    return Request(api_key, api_version, correlation_id, header.client_id, body)


@dataclass(frozen=True, slots=True)
class PartitionProduceData:
    index: int
    records: memoryview | None


@dataclass(frozen=True, slots=True)
class TopicProduceData:
    name: str
    partition_data: tuple[PartitionProduceData, ...]


@dataclass(frozen=True, slots=True)
class ProduceRequestBody:
    """The fields of a Produce request (v3-v9) the agent uses, named as in kio's schema."""

    transactional_id: str | None
    acks: int
    timeout_ms: int
    topic_data: tuple[TopicProduceData, ...]


class WireCursor:
    """Reads Kafka primitive types from a request or a broker's answer; any overrun raises
    MalformedFrame. Nothing is reserved from a declared count: a count beyond the bytes left
    fails at the first element that does not fit."""

    __slots__ = ("buf", "end", "pos")

    def __init__(self, buf: memoryview, pos: int) -> None:
        self.buf, self.pos, self.end = buf, pos, len(buf)

    def take(self, size: int) -> memoryview:
        start = self.pos
        if size < 0 or start + size > self.end:
            raise MalformedFrame(f"field of {size} bytes at {start} overruns the frame")
        self.pos = start + size
        return self.buf[start : self.pos]

    def unpack(self, fmt: struct.Struct) -> tuple[Any, ...]:
        if self.pos + fmt.size > self.end:
            raise MalformedFrame(f"frame ends inside a field at byte {self.pos}")
        values = fmt.unpack_from(self.buf, self.pos)
        self.pos += fmt.size
        return values

    def uvarint(self) -> int:
        result = shift = 0
        buf, pos = self.buf, self.pos
        while True:
            if pos >= self.end:
                raise MalformedFrame("frame ends inside a varint")
            byte = buf[pos]
            pos += 1
            result |= (byte & 0x7F) << shift
            if not byte & 0x80:
                self.pos = pos
                return result
            shift += 7
            if shift > 28:
                raise MalformedFrame(f"varint at byte {self.pos} is longer than 5 bytes")

    def text(self, raw: memoryview) -> str:
        try:
            return str(raw, "utf-8")
        except UnicodeDecodeError:
            raise MalformedFrame(f"string before byte {self.pos} is not UTF-8") from None

    def nullable_string(self, compact: bool) -> str | None:
        length = self.uvarint() - 1 if compact else self.unpack(_INT16)[0]
        return None if length == -1 else self.text(self.take(length))

    def string(self, compact: bool) -> str:
        value = self.nullable_string(compact)
        if value is None:
            raise MalformedFrame(f"null string before byte {self.pos} where one is required")
        return value

    def array_length(self, compact: bool) -> int:
        length = self.uvarint() - 1 if compact else self.unpack(_INT32)[0]
        if length < 0:
            raise MalformedFrame(f"null array before byte {self.pos} where one is required")
        return length

    def nullable_bytes(self, compact: bool) -> memoryview | None:
        length = self.uvarint() - 1 if compact else self.unpack(_INT32)[0]
        return None if length == -1 else self.take(length)

    def skip_tagged_fields(self) -> None:
        for _ in range(self.uvarint()):
            self.uvarint()  # tag
            self.take(self.uvarint())


_INT16 = struct.Struct(">h")
_INT32 = struct.Struct(">i")
_ACKS_TIMEOUT = struct.Struct(">hi")
_FIRST_FLEXIBLE_PRODUCE = 9


def parse_produce(frame: bytes | memoryview) -> Request:
    """Decode a Produce request (v3-v9) without copying its record batches.

    The hot path of ingest: kio would copy every batch into a new ``bytes``; here each
    partition's ``records`` is a read-only view of ``frame``.
    """
    buf = memoryview(frame).toreadonly()
    api_key, api_version, correlation_id = peek_header(buf)
    compact = api_version >= _FIRST_FLEXIBLE_PRODUCE
    cursor = WireCursor(buf, _HEADER_PREFIX.size)
    client_id = cursor.nullable_string(compact=False)  # a classic string in every header
    if compact:
        cursor.skip_tagged_fields()
    transactional_id = cursor.nullable_string(compact)
    acks, timeout_ms = cursor.unpack(_ACKS_TIMEOUT)
    topics = []
    for _ in range(cursor.array_length(compact)):
        name = cursor.string(compact)
        partitions = []
        for _ in range(cursor.array_length(compact)):
            (index,) = cursor.unpack(_INT32)
            partitions.append(PartitionProduceData(index, cursor.nullable_bytes(compact)))
            if compact:
                cursor.skip_tagged_fields()
        topics.append(TopicProduceData(name, tuple(partitions)))
        if compact:
            cursor.skip_tagged_fields()
    if compact:
        cursor.skip_tagged_fields()
    if cursor.pos != len(buf):
        raise MalformedFrame(
            f"api key {api_key} v{api_version}: {len(buf) - cursor.pos} trailing bytes after"
            " the request body"
        )
    body = ProduceRequestBody(transactional_id, acks, timeout_ms, tuple(topics))
    return Request(api_key, api_version, correlation_id, client_id, body)


def encode_response(correlation_id: int, response: Any) -> bytes:
    """Size prefix + the response header kio's schema prescribes + the body."""
    header_schema = type(response).__header_schema__
    buffer = io.BytesIO()
    buffer.write(b"\x00\x00\x00\x00")
    entity_writer(header_schema)(buffer, header_schema(correlation_id=correlation_id))
    entity_writer(type(response))(buffer, response)
    data = buffer.getbuffer()
    _SIZE.pack_into(data, 0, len(data) - _SIZE.size)
    del data
    return buffer.getvalue()


def build(schema: type, **values: Any) -> Any:
    """Instantiate a kio entity from ``values``, dropping fields this version does not have.

    Lets one code path answer every supported version: version-specific fields are simply
    passed and ignored where the schema lacks them; missing ones take the schema default.
    """
    names = _field_names(schema)
    return schema(**{name: value for name, value in values.items() if name in names})


def encode_body(api_key: int, api_version: int, **values: Any) -> bytes:
    """A request body through kio's writer (fields this version lacks are dropped)."""
    schema = request_schema(api_key, api_version)
    buffer = io.BytesIO()
    entity_writer(schema)(buffer, build(schema, **values))
    return buffer.getvalue()


def decode_body(api_key: int, api_version: int, data: bytes) -> Any:
    """A response body (the bytes after its header) through kio's reader, once its counts and
    lengths are known to fit its bytes (``OutOfBounds``, a ValueError, if not; any failure of
    kio's reader is a ValueError, a panic of its native code included)."""
    schema = response_schema(api_key, api_version)
    edits: Edits = []
    check_bounds(schema, data, 0, edits=edits)
    if edits:  # a newer broker's tagged fields or error codes: read as Kafka's clients do
        data = edited(data, edits)
    body: Any = _kio_read(entity_reader(schema), data, 0)[0]
    return body


def _kio_read(reader: Any, data: bytes | memoryview, pos: int) -> Any:
    """``reader`` at ``pos``; a panic of kio's native code (pyo3's PanicException, a
    BaseException: a failed allocation under memory pressure) as a ValueError, which every
    reader's caller handles."""
    try:
        return reader(data, pos)
    except BaseException as error:
        if type(error).__name__ != "PanicException":
            raise
        raise ValueError(f"kio's reader failed: {error}") from None


@cache
def _field_names(schema: type) -> frozenset[str]:
    return frozenset(field.name for field in dataclasses.fields(schema))


def nested_schema(schema: type, name: str) -> type:
    """A nested entity class from the same generated module, e.g. ``MetadataResponseTopic``."""
    nested: type = getattr(sys.modules[schema.__module__], name)
    return nested


@dataclass(frozen=True, slots=True)
class PartitionResult:
    index: int
    error_code: int
    base_offset: int
    error_message: str | None = None


_PARTITION_FIXED = struct.Struct(">ihqq")  # index, error code, base offset, log append time
_INT64 = struct.Struct(">q")
_INT32 = struct.Struct(">i")
_INT16 = struct.Struct(">h")


def encode_produce_response(
    correlation_id: int, version: int, topics: list[tuple[str, list[PartitionResult]]]
) -> bytes:
    """A Produce v3..v9 response, hand-encoded: it is the hot path, kio's writer is generic.

    Byte-for-byte what kio writes for the same values (a unit test holds it to that).
    """
    flexible = version >= 9
    parts: list[bytes] = [b"", _INT32.pack(correlation_id)]
    if flexible:
        parts.append(b"\x00")  # response header v1: no tagged fields
    parts.append(encode_uvarint(len(topics) + 1) if flexible else _INT32.pack(len(topics)))
    for name, partitions in topics:
        encoded_name = name.encode()
        if flexible:
            parts += (
                encode_uvarint(len(encoded_name) + 1),
                encoded_name,
                encode_uvarint(len(partitions) + 1),
            )
        else:
            parts += (_INT16.pack(len(encoded_name)), encoded_name, _INT32.pack(len(partitions)))
        for partition in partitions:
            parts.append(
                _PARTITION_FIXED.pack(
                    partition.index, partition.error_code, partition.base_offset, -1
                )
            )
            if version >= 5:
                parts.append(_INT64.pack(-1))  # log start offset
            if version >= 8:
                message = partition.error_message
                encoded = None if message is None else message.encode()
                if flexible:
                    parts.append(b"\x01")  # record_errors: empty compact array
                    parts.append(
                        b"\x00" if encoded is None else encode_uvarint(len(encoded) + 1) + encoded
                    )
                    parts.append(b"\x00")  # partition tagged fields
                else:
                    parts.append(_INT32.pack(0))
                    parts.append(
                        _INT16.pack(-1) if encoded is None else _INT16.pack(len(encoded)) + encoded
                    )
        if flexible:
            parts.append(b"\x00")  # topic tagged fields
    parts.append(_INT32.pack(0))  # throttle time
    if flexible:
        parts.append(b"\x00")
    size = sum(len(part) for part in parts)
    parts[0] = _INT32.pack(size)
    return b"".join(parts)
