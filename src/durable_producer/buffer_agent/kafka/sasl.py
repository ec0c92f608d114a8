"""SASL authentication of a broker connection: PLAIN (RFC 4616) and SCRAM-SHA-256/512 (RFC 5802,
7677), over SaslHandshake v1 and SaslAuthenticate (KIP-152)."""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
from dataclasses import dataclass
from typing import Any, Protocol

from durable_producer.buffer_agent.kafka.protocol import decode_body, encode_body

API_SASL_HANDSHAKE = 17
API_SASL_AUTHENTICATE = 36
HANDSHAKE_VERSION = 1
"""SaslHandshake v1: the exchange goes on in SaslAuthenticate requests (KIP-152)."""
HIGHEST_AUTHENTICATE_VERSION = 2
SASL_AUTHENTICATION_FAILED = 58
UNSUPPORTED_SASL_MECHANISM = 33


class SaslFailed(ConnectionError):
    """The broker refused the credentials or the mechanism (``code``: Kafka's error code,
    SASL_AUTHENTICATION_FAILED or UNSUPPORTED_SASL_MECHANISM)."""

    def __init__(self, message: str, code: int = SASL_AUTHENTICATION_FAILED) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True, slots=True)
class SaslCredentials:
    mechanism: str
    username: str
    password: str


class _Connection(Protocol):
    address: str

    def version(self, api_key: int, highest: int, lowest: int = 0) -> int: ...

    def request(self, api_key: int, api_version: int, body: bytes) -> Any: ...


async def authenticate(connection: _Connection, credentials: SaslCredentials) -> None:
    mechanism = credentials.mechanism
    handshake = encode_body(API_SASL_HANDSHAKE, HANDSHAKE_VERSION, mechanism=mechanism)
    answer = decode_body(
        API_SASL_HANDSHAKE,
        HANDSHAKE_VERSION,
        await connection.request(API_SASL_HANDSHAKE, HANDSHAKE_VERSION, handshake),
    )
    if int(answer.error_code):
        raise SaslFailed(
            f"{connection.address}: SASL mechanism {mechanism} refused (the broker offers"
            f" {', '.join(answer.mechanisms)})",
            UNSUPPORTED_SASL_MECHANISM,
        )
    version = connection.version(API_SASL_AUTHENTICATE, HIGHEST_AUTHENTICATE_VERSION)

    async def exchange(token: bytes) -> bytes:
        body = encode_body(API_SASL_AUTHENTICATE, version, auth_bytes=token)
        reply = decode_body(
            API_SASL_AUTHENTICATE,
            version,
            await connection.request(API_SASL_AUTHENTICATE, version, body),
        )
        if int(reply.error_code):
            raise SaslFailed(
                f"{connection.address}: SASL {mechanism} authentication failed:"
                f" {reply.error_message or reply.error_code}"
            )
        return bytes(reply.auth_bytes)

    if mechanism == "PLAIN":
        await exchange(f"\0{credentials.username}\0{credentials.password}".encode())
        return
    scram = ScramClient(mechanism, credentials.username, credentials.password)
    server_first = await exchange(scram.first())
    server_final = await exchange(scram.final(server_first))
    scram.verify(server_final)


class ScramClient:
    """The client side of one SCRAM exchange."""

    def __init__(self, mechanism: str, username: str, password: str, nonce: str | None = None):
        if mechanism not in ("SCRAM-SHA-256", "SCRAM-SHA-512"):
            raise SaslFailed(f"SASL mechanism {mechanism} is not supported")
        self._hash = "sha256" if mechanism.endswith("256") else "sha512"
        self._password = password.encode()
        name = username.replace("=", "=3D").replace(",", "=2C")
        self._nonce = nonce or base64.b64encode(os.urandom(18)).decode()
        self._first_bare = f"n={name},r={self._nonce}"
        self._server_signature = b""

    def first(self) -> bytes:
        return f"n,,{self._first_bare}".encode()

    def final(self, server_first: bytes) -> bytes:
        fields = dict(item.split("=", 1) for item in server_first.decode().split(","))
        nonce, salt, iterations = fields["r"], base64.b64decode(fields["s"]), int(fields["i"])
        if not nonce.startswith(self._nonce):
            raise SaslFailed("SCRAM: the server's nonce does not extend the client's")
        salted = hashlib.pbkdf2_hmac(self._hash, self._password, salt, iterations)
        client_key = self._hmac(salted, b"Client Key")
        stored_key = hashlib.new(self._hash, client_key).digest()
        without_proof = f"c=biws,r={nonce}"
        message = f"{self._first_bare},{server_first.decode()},{without_proof}".encode()
        signature = self._hmac(stored_key, message)
        proof = bytes(a ^ b for a, b in zip(client_key, signature, strict=True))
        self._server_signature = self._hmac(self._hmac(salted, b"Server Key"), message)
        return f"{without_proof},p={base64.b64encode(proof).decode()}".encode()

    def verify(self, server_final: bytes) -> None:
        fields = dict(item.split("=", 1) for item in server_final.decode().split(","))
        if "e" in fields:
            raise SaslFailed(f"SCRAM: the server refused: {fields['e']}")
        if base64.b64decode(fields.get("v", "")) != self._server_signature:
            raise SaslFailed("SCRAM: the server's signature does not match")

    def _hmac(self, key: bytes, message: bytes) -> bytes:
        return hmac.new(key, message, self._hash).digest()
