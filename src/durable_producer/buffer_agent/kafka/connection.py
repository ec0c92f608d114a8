"""One connection to a Kafka broker (asyncio): TLS, SASL, ApiVersions, pipelined requests.

``BrokerConnection.open`` connects, wraps TLS when asked, authenticates (SASL PLAIN or
SCRAM-SHA-256/512 through SaslHandshake v1 and SaslAuthenticate, ``sasl.py``) and learns the
broker's API version ranges. ``request`` sends one request and returns a future of the response
body's bytes: requests are pipelined and Kafka answers a connection's requests in order, so the
responses are matched first in, first out (the correlation id is checked). One writer task
puts the requests on the socket in order, a part at a time, waiting for the socket between
parts (``_write_loop``): a request's parts (the stored batches) are neither joined nor copied
whole into the transport's buffer, which holds about one part at a time. Any failure of the
connection fails every pending request with ``BrokerUnreachable`` and closes it; the owner
(``cluster_client``) opens a new one when it next needs that broker.

Bodies are encoded by the caller (kio's writer, or ``produce_wire`` for Produce); responses are
returned as the bytes after the response header.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import struct
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from durable_producer.buffer_agent.kafka.protocol import (
    API_API_VERSIONS,
    API_INIT_PRODUCER_ID,
    decode_body,
    request_schema,
)
from durable_producer.buffer_agent.kafka.sasl import (
    API_SASL_AUTHENTICATE,
    API_SASL_HANDSHAKE,
    SaslCredentials,
    authenticate,
)
from durable_producer.buffer_agent.kafka.varint import read_uvarint

_SIZE = struct.Struct(">i")
_HEADER = struct.Struct(">hhi")
_CLIENT_ID = b"durable-agent"
MAX_RESPONSE_BYTES = 256 * 1024 * 1024
"""The longest answer read: a length beyond it is no Kafka answer (an HTTP server's
"HTTP/1.1" read as a length is 1.2 GB, which the reader waited for)."""
MAX_SMALL_ANSWER_BYTES = 1024 * 1024
"""The longest answer to ApiVersions, SASL and InitProducerId, which hold a few hundred bytes:
the first ones are read before the broker is authenticated, and kio's objects take 20-30
times an answer's bytes (an ApiVersions answer of 5.7 MB took 163 MB)."""
API_VERSIONS_VERSION = 0
"""ApiVersions v0, the one every broker answers, asked first on every connection."""
_SMALL_ANSWERS = frozenset(
    {API_API_VERSIONS, API_SASL_HANDSHAKE, API_SASL_AUTHENTICATE, API_INIT_PRODUCER_ID}
)


class BrokerUnreachable(ConnectionError):
    """The broker could not be reached, or the connection failed with requests pending."""


class UndecodableAnswer(ConnectionError):
    """An answer that does not decode: the request's fate is unknown, as if the connection
    had dropped (it is closed)."""


def decode_answer(
    connection: BrokerConnection,
    api_key: int,
    version: int,
    data: bytes,
    read: Callable[[int, bytes], Any] | None = None,
) -> Any:
    """``data``, an answer on ``connection``, through kio's reader, or ``read(version, data)``
    (Produce answers: ``produce_wire.read_answer``); ``UndecodableAnswer`` (and the connection
    closed) if it cannot be read."""
    try:
        return decode_body(api_key, version, data) if read is None else read(version, data)
    except Exception as error:  # kio's reader raises many kinds on bytes it cannot read
        connection.close()
        raise UndecodableAnswer(
            f"broker {connection.address}: its answer (API {api_key} v{version}) does not"
            f" decode ({type(error).__name__}: {error})"
        ) from None


class EncryptedKeyError(ValueError):
    """The client key is encrypted and no password was given (``password_given`` False), or
    the password given does not decrypt it."""

    def __init__(self, password_given: bool) -> None:
        self.password_given = password_given
        super().__init__(
            "the client key does not decrypt with the password given"
            if password_given
            else "the client key is encrypted and no password was given"
        )


def _load_client_certificate(
    tls: ssl.SSLContext, certificate: str, key: str | None, password: str | None
) -> None:
    """``load_cert_chain`` that never lets OpenSSL ask for an encrypted key's pass phrase:
    without a password it prompted on the terminal and waited (an agent with a TTY hung at
    start) or, without one, failed with "[Errno 22] Invalid argument"."""
    asked = False

    def key_password() -> str:  # called only for an encrypted key
        nonlocal asked
        asked = True
        if password is None:
            raise EncryptedKeyError(password_given=False)
        return password

    try:
        tls.load_cert_chain(certificate, key, key_password)
    except ssl.SSLError as error:
        # The key was asked for its password, so it is encrypted; a key that decrypts but
        # belongs to another certificate fails with KEY_VALUES_MISMATCH instead.
        if asked and error.reason != "KEY_VALUES_MISMATCH":
            raise EncryptedKeyError(password_given=True) from None
        raise


@dataclass(frozen=True, slots=True)
class Security:
    """How to reach the brokers: TLS context and SASL credentials (None: plaintext, none)."""

    tls: ssl.SSLContext | None = None
    sasl: SaslCredentials | None = None

    @staticmethod
    def from_client_config(config: Mapping[str, Any]) -> Security:
        """From the validated librdkafka-style settings (``client_config``)."""
        protocol = str(config.get("security.protocol", "PLAINTEXT")).upper()
        tls = None
        if protocol in ("SSL", "SASL_SSL"):
            tls = ssl.create_default_context(cafile=config.get("ssl.ca.location"))
            certificate = config.get("ssl.certificate.location")
            if certificate:
                _load_client_certificate(
                    tls,
                    certificate,
                    config.get("ssl.key.location"),
                    config.get("ssl.key.password"),
                )
        sasl = None
        if protocol in ("SASL_PLAINTEXT", "SASL_SSL"):
            sasl = SaslCredentials(
                str(config.get("sasl.mechanism", "PLAIN")).upper(),
                str(config.get("sasl.username", "")),
                str(config.get("sasl.password", "")),
            )
        return Security(tls, sasl)


def flexible_request(api_key: int, api_version: int) -> bool:
    return bool(getattr(request_schema(api_key, api_version), "__flexible__", False))


class BrokerConnection:
    def __init__(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, address: str
    ) -> None:
        self.address = address
        self._reader = reader
        self._writer = writer
        self._pending: deque[tuple[int, bool, int, asyncio.Future[bytes]]] = deque()
        """Requests sent, in order: (correlation id, a flexible answer header, the answer's
        longest, its future)."""
        self._outbox: deque[list[bytes | memoryview]] = deque()
        self._outbox_ready = asyncio.Event()
        self._correlation = 0
        self.versions: dict[int, tuple[int, int]] = {}
        self.closed = False
        loop = asyncio.get_running_loop()
        self._read_task = loop.create_task(self._read_loop())
        self._write_task = loop.create_task(self._write_loop())

    @classmethod
    async def open(
        cls, host: str, port: int, security: Security, timeout_s: float
    ) -> BrokerConnection:
        address = f"{host}:{port}"
        try:
            reader, writer = await asyncio.wait_for(
                asyncio.open_connection(host, port, ssl=security.tls, limit=MAX_RESPONSE_BYTES),
                timeout_s,
            )
        except (OSError, TimeoutError, ssl.SSLError) as error:
            raise BrokerUnreachable(f"cannot connect to {address}: {error}") from None
        connection = cls(reader, writer, address)
        try:
            asked = connection.request(API_API_VERSIONS, API_VERSIONS_VERSION, b"")
            body = await asyncio.wait_for(asked, timeout_s)
            answer = decode_body(API_API_VERSIONS, API_VERSIONS_VERSION, body)
            if int(answer.error_code):
                raise BrokerUnreachable(f"{address}: ApiVersions failed: {answer.error_code}")
            connection.versions = {
                int(key.api_key): (int(key.min_version), int(key.max_version))
                for key in answer.api_keys
            }
            if security.sasl is not None:
                await asyncio.wait_for(authenticate(connection, security.sasl), timeout_s)
        except BaseException as error:
            connection.close()
            if isinstance(error, TimeoutError):
                raise BrokerUnreachable(f"{address}: no answer within {timeout_s} s") from None
            if isinstance(error, Exception) and not isinstance(error, OSError):
                raise BrokerUnreachable(  # kio's errors on an answer that does not read, ...
                    f"{address}: its first answers do not read ({type(error).__name__}: {error})"
                ) from None
            raise
        return connection

    def version(self, api_key: int, highest: int, lowest: int = 0) -> int:
        """The highest version both sides speak, at most ``highest``; ValueError if none."""
        low, high = self.versions.get(api_key, (0, -1))
        chosen = min(high, highest)
        if chosen < max(low, lowest):
            raise ValueError(f"broker {self.address} speaks no usable version of API {api_key}")
        return chosen

    def request(
        self, api_key: int, api_version: int, body: bytes | list[bytes | memoryview]
    ) -> asyncio.Future[bytes]:
        """Send a request; its future holds the response body. ``body`` may be a list of
        parts, written without joining them."""
        future: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
        if self.closed:
            future.set_exception(BrokerUnreachable(f"connection to {self.address} is closed"))
            return future
        self._correlation = (self._correlation + 1) & 0x7FFFFFFF
        flexible = flexible_request(api_key, api_version)
        header = _HEADER.pack(api_key, api_version, self._correlation) + (
            _SIZE.pack(len(_CLIENT_ID))[2:] + _CLIENT_ID
        )
        if flexible:
            header += b"\x00"
        parts = [body] if isinstance(body, bytes) else body
        size = len(header) + sum(len(part) for part in parts)
        self._send([_SIZE.pack(size) + header, *parts])
        # The ApiVersions response header is always v0, whatever the request's version.
        flexible_response = flexible and api_key != API_API_VERSIONS
        limit = MAX_SMALL_ANSWER_BYTES if api_key in _SMALL_ANSWERS else MAX_RESPONSE_BYTES
        self._pending.append((self._correlation, flexible_response, limit, future))
        return future

    def _send(self, parts: list[bytes | memoryview]) -> None:
        """Queue a request's parts for ``_write_loop`` (requests go out in this order)."""
        self._outbox.append(parts)
        self._outbox_ready.set()

    async def _write_loop(self) -> None:
        """Write the queued requests in order, a part at a time; after each part, wait while
        the transport's buffer is above its high-water mark. Python 3.11's ``writelines``
        joins the parts into one copy of the request, and whatever the socket does not take at
        once is copied again into the transport's buffer: with five requests of a few MiB in
        flight that was tens of MiB of copies of batches the forwarder already holds."""
        writer, outbox, ready = self._writer, self._outbox, self._outbox_ready
        try:
            while True:
                while not outbox:
                    if self.closed:
                        return
                    ready.clear()
                    await ready.wait()
                for part in outbox.popleft():
                    if self.closed:
                        break
                    writer.write(part)
                    await writer.drain()
        except Exception as error:  # the connection is lost (drain raises what the reader saw)
            self._fail(error)

    @property
    def in_flight(self) -> int:
        return len(self._pending)

    async def drain(self) -> None:
        """Wait while the socket's write buffer is above its high-water mark."""
        await self._writer.drain()

    async def _read_loop(self) -> None:
        reader = self._reader
        try:
            while True:
                (size,) = _SIZE.unpack(await reader.readexactly(4))
                if not self._pending:
                    raise BrokerUnreachable(f"{self.address} sent a response nobody asked for")
                correlation, flexible, limit, future = self._pending[0]  # fails if it does not read
                if not 4 <= size <= limit:
                    raise BrokerUnreachable(
                        f"{self.address} answered with a length of {size} bytes (at most"
                        f" {limit}): no Kafka answer (is it a Kafka listener, speaking the"
                        " agent's --security-protocol?)"
                    )
                data = await reader.readexactly(size)
                (received,) = _SIZE.unpack_from(data)
                if received != correlation:
                    raise BrokerUnreachable(
                        f"{self.address} answered correlation id {received},"
                        f" expected {correlation}"
                    )
                data = data[_skip_tagged_fields(data, 4) if flexible else 4 :]
                self._pending.popleft()
                if not future.done():
                    future.set_result(data)
        except (OSError, EOFError, asyncio.IncompleteReadError, BrokerUnreachable) as error:
            self._fail(error)
        except (ValueError, struct.error) as error:  # a response header that does not read
            reason = f"{self.address} sent an answer that does not read ({error})"
            self._fail(BrokerUnreachable(reason))
        except asyncio.CancelledError:
            self._fail(BrokerUnreachable(f"connection to {self.address} closed"))
            raise

    def _fail(self, error: BaseException) -> None:
        reason = (
            error
            if isinstance(error, BrokerUnreachable)
            else BrokerUnreachable(f"connection to {self.address} lost: {error or type(error)}")
        )
        self.closed = True
        self._outbox.clear()
        self._outbox_ready.set()
        while self._pending:
            future = self._pending.popleft()[3]
            if not future.done():
                future.set_exception(reason)
        with contextlib.suppress(Exception):
            self._writer.close()

    def close(self) -> None:
        if not self.closed:
            self._fail(BrokerUnreachable(f"connection to {self.address} closed"))
        self._read_task.cancel()
        self._write_task.cancel()


def _skip_tagged_fields(data: bytes, pos: int) -> int:
    count, pos = read_uvarint(data, pos)
    for _ in range(count):
        _, pos = read_uvarint(data, pos)
        size, pos = read_uvarint(data, pos)
        pos += size
    return pos
