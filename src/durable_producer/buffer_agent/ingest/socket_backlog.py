"""How many received bytes the kernel holds for a socket, not yet read (``FIONREAD``).

The frame receiver sizes a large request's buffer for what has arrived plus this, so a
request sent at once is received into one buffer without growing it, while memory still
follows the bytes that arrived, never a size a client announced.
"""

from __future__ import annotations

import struct

try:
    import fcntl
    import termios

    _FIONREAD: int | None = termios.FIONREAD
except ImportError:  # pragma: no cover - not a Unix
    _FIONREAD = None

_COUNT = struct.Struct("i")


def unread_bytes(fd: int) -> int:
    """Bytes waiting in ``fd``'s receive queue; 0 when unknown (no FIONREAD, an error)."""
    if _FIONREAD is None or fd < 0:
        return 0
    try:
        return int(_COUNT.unpack(fcntl.ioctl(fd, _FIONREAD, b"\0\0\0\0"))[0])
    except OSError:
        return 0
