"""``try_binding``: what the agent checks of ``--listen`` before its WAL opens."""

from __future__ import annotations

import errno
import socket

import pytest

from durable_producer.buffer_agent.ingest.server import try_binding


def test_a_free_port_is_bound_and_let_go() -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        port = holder.getsockname()[1]
    try_binding("127.0.0.1", port)
    try_binding("localhost", port)  # every address of the name, and each let go again
    with socket.socket() as again:
        again.bind(("127.0.0.1", port))


def test_a_port_in_use_and_a_name_that_does_not_resolve_raise_as_listening_would() -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        with pytest.raises(OSError) as in_use:
            try_binding("127.0.0.1", holder.getsockname()[1])
    assert in_use.value.errno == errno.EADDRINUSE
    with pytest.raises(socket.gaierror):
        try_binding("nosuchhost.invalid", 0)
