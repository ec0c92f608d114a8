"""BrokerConnection's writing: requests go out whole and in order, their parts uncopied.

A peer that does not read stands for a slow broker: what the socket does not take stays in the
transport's buffer, a copy. Before the ordered writer (issue 28's catch-up memory), a request of
eight 1 MiB batches was joined and then buffered whole: ~8 MiB of copies per request, five
requests in flight per broker.
"""

from __future__ import annotations

import asyncio
import socket
import struct

from durable_producer.buffer_agent.kafka.connection import (
    BrokerConnection,
    BrokerUnreachable,
    Security,
)
from support.waiting import wait_for_async

MIB = 1 << 20
SMALL_SOCKET_BUFFER = 64 * 1024


async def _scenario() -> tuple[int, bytes, bytes]:
    peer: dict[str, asyncio.StreamReader] = {}
    accepted = asyncio.Event()

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer["reader"] = reader
        accepted.set()
        await asyncio.sleep(3600)

    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, SMALL_SOCKET_BUFFER)
    listener.bind(("127.0.0.1", 0))
    server = await asyncio.start_server(serve, sock=listener)
    port = listener.getsockname()[1]
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.get_extra_info("socket").setsockopt(
        socket.SOL_SOCKET, socket.SO_SNDBUF, SMALL_SOCKET_BUFFER
    )
    await accepted.wait()
    connection = BrokerConnection(reader, writer, f"127.0.0.1:{port}")
    try:
        first = [bytes([index]) * MIB for index in range(8)]
        second = [memoryview(b"\xee" * MIB), b"tail"]
        connection.request(0, 3, list(first))
        connection.request(0, 3, list(second))
        transport = writer.transport
        await wait_for_async(lambda: transport.get_write_buffer_size() > 0, 5, what="a part")
        await asyncio.sleep(0.2)  # the writer has done what it can while the peer reads nothing
        buffered = transport.get_write_buffer_size()
        expected = b"".join(_request(1, first)) + b"".join(_request(2, second))
        received = await asyncio.wait_for(peer["reader"].readexactly(len(expected)), 30)
        return buffered, received, expected
    finally:
        connection.close()
        server.close()


def _request(correlation: int, parts: list[bytes] | list[bytes | memoryview]) -> list[bytes]:
    client_id = b"durable-agent"
    header = struct.pack(">hhih", 0, 3, correlation, len(client_id)) + client_id
    size = len(header) + sum(len(part) for part in parts)
    return [struct.pack(">i", size), header, *(bytes(part) for part in parts)]


def test_a_request_is_buffered_a_part_at_a_time_and_sent_whole_in_order() -> None:
    buffered, received, expected = asyncio.run(_scenario())
    # At most about one part waits in the transport's buffer (a copy), not the request.
    assert buffered <= MIB + 64 * 1024
    assert received == expected


async def _answered(answer: bytes, api_key: int, version: int) -> tuple[BaseException, bool]:
    """A peer that answers one request with the bytes ``answer``: what the request raised,
    and whether the connection counts as closed after it."""

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read(1)
        writer.write(answer)
        await writer.drain()
        await asyncio.sleep(3600)

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    connection = BrokerConnection(reader, writer, f"127.0.0.1:{port}")
    try:
        await asyncio.wait_for(connection.request(api_key, version, b""), 10)
    except (BrokerUnreachable, TimeoutError) as error:
        return error, connection.closed
    finally:
        connection.close()
        server.close()
    raise AssertionError(f"the answer {answer!r} was taken")


def test_an_answer_too_long_for_kafka_says_it_is_no_kafka_listener() -> None:
    """An HTTP port given as a broker: "HTTP" read as a length (1.2 GB) was waited for, then
    "62 bytes read on a total of 1213486160 expected bytes"."""
    http = b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n"
    error, _ = asyncio.run(_answered(http, 18, 0))
    assert "answered with a length of 1213486160 bytes (at most 1048576): no Kafka" in str(error)


def test_an_answer_to_api_versions_is_at_most_1_mib_long() -> None:
    """ApiVersions, SASL and InitProducerId answers hold a few hundred bytes; the first ones
    are read before the broker is authenticated, and kio's objects take 20-30 times an
    answer's bytes (an ApiVersions answer of 5.7 MB took 163 MB). Other answers may be as
    long as MAX_RESPONSE_BYTES (256 MiB)."""
    length = (1 << 20) + 1
    error, closed = asyncio.run(_answered(struct.pack(">ii", length, 1), 18, 0))
    assert f"a length of {length} bytes (at most {1 << 20})" in str(error)
    assert closed


def test_an_answer_whose_header_does_not_read_fails_the_connection_at_once() -> None:
    """A flexible answer header whose tagged fields run past the answer: the read loop died
    with IndexError, the connection stayed open, and every request on it waited its whole
    timeout, for good."""
    answer = struct.pack(">ii", 6, 1) + b"\x05\x01"  # size, correlation id, tagged fields
    error, closed = asyncio.run(_answered(answer, 3, 12))
    assert isinstance(error, BrokerUnreachable) and closed
    assert "sent an answer that does not read (a varint at byte 6 runs past the end" in str(error)


def test_a_first_answer_that_does_not_read_is_a_broker_unreachable() -> None:
    """An ApiVersions answer kio cannot read raised its BufferUnderflow out of opening, past
    every caller's except clause (the forwarder's first producer id stopped the forwarder).
    This one ends before its first array's count: the walk (``wire_bounds``) refuses it now,
    before kio."""

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read(1)
        writer.write(struct.pack(">ii", 5, 1) + b"\xff")  # correlation id 1, then no answer
        await writer.drain()
        await asyncio.sleep(3600)

    async def scenario() -> BaseException:
        server = await asyncio.start_server(serve, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        try:
            await BrokerConnection.open("127.0.0.1", port, Security(), 5.0)
        except BaseException as error:
            return error
        finally:
            server.close()
        raise AssertionError("opened")

    error = asyncio.run(scenario())
    assert isinstance(error, BrokerUnreachable), repr(error)
    assert "its first answers do not read (OutOfBounds" in str(error)
