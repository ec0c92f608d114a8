"""Kafka wire protocol glue: request framing, header parsing and response encoding via kio.

Every Kafka request is ``int32 size`` + header + body. The header version follows from the API
key and version (v1 for classic versions, v2 for flexible ones); kio's generated schemas carry
the right header class for each request and response (including the ApiVersions quirk: its
response header is always v0). Only the APIs the agent implements are decoded; record batches
stay opaque bytes here (see ``record_batch``), kio's record reader is never used.
"""

from __future__ import annotations

import asyncio
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

DEFAULT_MAX_FRAME_BYTES = 100 * 1024 * 1024
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


async def read_frame(
    reader: asyncio.StreamReader,
    max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
    *,
    idle_timeout: float | None = None,
    read_timeout: float | None = None,
) -> bytes | None:
    """Read one size-prefixed frame; ``None`` on a clean end of stream between frames.

    The size is checked before the body is read, so a hostile prefix never makes the agent
    allocate or wait for more than ``max_frame_bytes``. ``idle_timeout`` bounds the wait for
    a frame to start, ``read_timeout`` the time to receive the rest of it once started
    (``TimeoutError`` on expiry).
    """
    try:
        async with asyncio.timeout(idle_timeout):
            first = await reader.read(1)
        if not first:
            return None
        async with asyncio.timeout(read_timeout):
            prefix = first + await reader.readexactly(_SIZE.size - 1)
            (size,) = _SIZE.unpack(prefix)
            if size < _HEADER_PREFIX.size:
                raise MalformedFrame(f"frame size {size} is smaller than a request header")
            if size > max_frame_bytes:
                raise MalformedFrame(
                    f"frame size {size} exceeds the limit of {max_frame_bytes} bytes"
                )
            return await reader.readexactly(size)
    except asyncio.IncompleteReadError as exc:
        raise MalformedFrame(
            f"connection closed inside a frame ({len(exc.partial)} of {exc.expected} bytes)"
        ) from None


def peek_header(frame: bytes) -> tuple[int, int, int]:
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


def parse_request(frame: bytes) -> Request:
    """Decode header and body of a request the agent implements.

    Raises :class:`UnsupportedRequest` for API keys/versions outside
    ``SUPPORTED_API_VERSIONS`` and :class:`MalformedFrame` for undecodable bytes.
    """
    api_key, api_version, correlation_id = peek_header(frame)
    if not is_supported(api_key, api_version):
        raise UnsupportedRequest(api_key, api_version, correlation_id)
    schema = request_schema(api_key, api_version)
    try:
        header, header_size = entity_reader(schema.__header_schema__)(frame, 0)
        body, body_size = entity_reader(schema)(frame, header_size)
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


@cache
def _field_names(schema: type) -> frozenset[str]:
    return frozenset(field.name for field in dataclasses.fields(schema))


def nested_schema(schema: type, name: str) -> type:
    """A nested entity class from the same generated module, e.g. ``MetadataResponseTopic``."""
    return getattr(sys.modules[schema.__module__], name)


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


def _uvarint(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


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
    parts.append(_uvarint(len(topics) + 1) if flexible else _INT32.pack(len(topics)))
    for name, partitions in topics:
        encoded_name = name.encode()
        if flexible:
            parts += (_uvarint(len(encoded_name) + 1), encoded_name, _uvarint(len(partitions) + 1))
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
                        b"\x00" if encoded is None else _uvarint(len(encoded) + 1) + encoded
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
