"""Shared WAL test settings and deterministic payloads."""

from __future__ import annotations

from durable_producer.buffer_agent.wal import FsyncPolicy, WalConfig

SMALL = WalConfig(
    segment_bytes=8192, max_bytes=1 << 20, max_frame_bytes=4096, fsync=FsyncPolicy.NEVER
)


def payload_for(offset: int, size: int = 100) -> bytes:
    """Deterministic content so a test can check a frame by its offset alone."""
    seed = f"frame-{offset}-".encode()
    return (seed * (size // len(seed) + 1))[:size]
