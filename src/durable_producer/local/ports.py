"""The loopback address every local process listens on, and free ports on it.

A port handed to a child process is free when it is chosen and bound by the child a moment
later. Between the two, anything that asks the kernel for a port may take it: a socket bound to
port 0 (librdkafka's mock brokers, a test's own listener) and every outgoing connection's local
port come from the kernel's ephemeral range. So ``free_port`` chooses below that range, where
the kernel hands out nothing by itself, and never hands out the same port twice in a process
(a child still starting has not bound its port yet).
"""

from __future__ import annotations

import random
import socket
import threading
from pathlib import Path

LOOPBACK = "127.0.0.1"

EPHEMERAL_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
LOWEST_CHOSEN_PORT = 10000
"""Ports below are left to services with well-known numbers (9092, 9644, 2379, ...)."""
MIN_POOL = 1000
"""With fewer ports between LOWEST_CHOSEN_PORT and the ephemeral range, the kernel chooses."""
CHOICE_ATTEMPTS = 200

_handed_out: set[int] = set()
_lock = threading.Lock()
_random = random.SystemRandom()


def ephemeral_range(path: Path | None = None) -> tuple[int, int] | None:
    """The kernel's ephemeral port range (lowest, highest) from ``path`` (default
    ``EPHEMERAL_RANGE_FILE``), or ``None`` where it cannot be read (not Linux)."""
    try:
        low, high = (path or EPHEMERAL_RANGE_FILE).read_text().split()[:2]
        return int(low), int(high)
    except (OSError, ValueError):
        return None


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((LOOPBACK, port))
        except OSError:
            return False
    return True


def _kernel_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((LOOPBACK, 0))
        return int(sock.getsockname()[1])


def free_port() -> int:
    """A loopback TCP port that was free a moment ago, below the kernel's ephemeral range (no
    socket bound to port 0 and no outgoing connection takes it before the child binds it) and
    not handed out before by this process. Where the range is unknown or leaves too few ports
    below it, the kernel's choice."""
    span = ephemeral_range()
    if span is None or span[0] - LOWEST_CHOSEN_PORT < MIN_POOL:
        return _kernel_port()
    with _lock:
        if len(_handed_out) >= (span[0] - LOWEST_CHOSEN_PORT) // 2:
            _handed_out.clear()  # long runs: ports handed out long ago are free again
        for _ in range(CHOICE_ATTEMPTS):
            port = _random.randrange(LOWEST_CHOSEN_PORT, span[0])
            if port not in _handed_out and _bindable(port):
                _handed_out.add(port)
                return port
    return _kernel_port()
