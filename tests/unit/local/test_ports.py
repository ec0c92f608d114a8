"""Ports handed to child processes: never one the kernel may give away before the child binds it.

A CI run failed once because a mock cluster's control port, chosen with a socket bound to port
0 and released, was taken (by one of librdkafka's mock brokers, also bound to port 0, or by an
outgoing connection) before the child bound it: "Address already in use".
"""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from durable_producer.local import ports
from durable_producer.local.ports import LOOPBACK, LOWEST_CHOSEN_PORT, ephemeral_range, free_port


def test_ports_are_below_the_kernels_ephemeral_range_and_never_handed_out_twice() -> None:
    span = ephemeral_range()
    if span is None:
        pytest.skip("no /proc/sys/net/ipv4/ip_local_port_range here")
    chosen = [free_port() for _ in range(300)]
    assert all(LOWEST_CHOSEN_PORT <= port < span[0] for port in chosen), sorted(chosen)[-5:]
    assert len(set(chosen)) == len(chosen)


def test_sockets_bound_to_port_zero_never_get_a_handed_out_port() -> None:
    if ephemeral_range() is None:
        pytest.skip("no /proc/sys/net/ipv4/ip_local_port_range here")
    chosen = {free_port() for _ in range(50)}
    kernel_given: list[socket.socket] = []
    try:
        for _ in range(500):  # as the mock brokers and outgoing connections get theirs
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            kernel_given.append(sock)
            sock.bind((LOOPBACK, 0))
        assert not chosen & {sock.getsockname()[1] for sock in kernel_given}
    finally:
        for sock in kernel_given:
            sock.close()


def test_a_port_something_listens_on_is_skipped(monkeypatch: pytest.MonkeyPatch) -> None:
    if ephemeral_range() is None:
        pytest.skip("no /proc/sys/net/ipv4/ip_local_port_range here")
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        port, spare = free_port(), free_port()
        taken.bind((LOOPBACK, port))
        taken.listen()
        ports._handed_out.difference_update({port, spare})
        draws = iter([port, port, spare])
        monkeypatch.setattr(ports._random, "randrange", lambda low, high: next(draws))
        assert free_port() == spare


def test_without_the_range_the_kernel_chooses(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(ports, "EPHEMERAL_RANGE_FILE", tmp_path / "missing")
    assert ephemeral_range(tmp_path / "missing") is None
    port = free_port()
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((LOOPBACK, port))  # free a moment ago
