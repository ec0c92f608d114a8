"""Clients that pipeline tiny requests and never read the answers (review finding 5).

Requests up to the 16 KiB staging buffer were queued with no count: once the agent's answers
filled the socket, it kept reading while its send waited up to the write timeout, about 420k
ten-byte requests (~45 MB of objects) per connection. Four such connections took the real
agent process from 53 MB to 299 MB within 12 s (twice in two runs before the fix). Now
reading pauses after a few queued requests, as a broker reads one request of a connection at
a time, and the rest waits in the kernel's socket buffers (TCP backpressure).
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from durable_producer.local.agent_process import AgentProcess

pytestmark = pytest.mark.integration

CONNECTIONS = 4
REQUESTS_EACH = 500_000
SEND_SECONDS = 12.0
RSS_BOUND_MB = 160  # baseline (70-100 MB: read-ahead, kept free heap) + the 64 MiB budget

# One sender process per connection (no GIL between them): ApiVersions v0 requests (the
# smallest there is: header v1 with a null client id, 10 bytes), in bursts, never reading; a
# tiny receive buffer so the agent's answers back up at once.
SENDER = """
import socket, struct, sys, time
port, count, seconds = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
body = lambda n: struct.pack(">hhih", 18, 0, n, -1)
burst = b"".join(struct.pack(">i", 10) + body(n) for n in range(5000))
sock = socket.socket()
sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
sock.connect(("127.0.0.1", port))
sock.settimeout(0.2)
end, sent = time.monotonic() + seconds, 0
while sent < count and time.monotonic() < end:
    try:
        sock.sendall(burst)
        sent += len(burst) // 14
    except OSError:
        pass
print(sent, flush=True)
time.sleep(max(0.0, end - time.monotonic()))
"""


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmRSS for process {pid}")


def test_pipelined_tiny_requests_never_read_keep_the_agent_small(tmp_path: Path) -> None:
    flags = ["--drain-timeout", "0.5", "--log-level", "WARNING"]
    with AgentProcess(tmp_path / "volume", "127.0.0.1:1", extra_args=flags) as agent:
        assert agent.process is not None
        pid = agent.process.pid
        baseline = rss_mb(pid)
        command = [sys.executable, "-c", SENDER, str(agent.port), str(REQUESTS_EACH),
                   str(SEND_SECONDS)]  # fmt: skip
        senders = [subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
                   for _ in range(CONNECTIONS)]  # fmt: skip
        peak = baseline
        try:
            deadline = time.monotonic() + SEND_SECONDS
            while time.monotonic() < deadline:
                peak = max(peak, rss_mb(pid))
                time.sleep(0.1)
            sent = [int(sender.communicate(timeout=30)[0] or 0) for sender in senders]
        finally:
            for sender in senders:
                sender.kill()
        assert agent.is_ready(), "the agent must keep serving"
        assert peak < RSS_BOUND_MB, (
            f"agent RSS peaked at {peak:.0f} MB (baseline {baseline:.0f} MB) with"
            f" {CONNECTIONS} connections pipelining {sum(sent)} requests in all"
        )
