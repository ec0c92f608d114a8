"""An exclusive lock on a WAL directory: two agents must never write the same volume."""

from __future__ import annotations

import fcntl
import logging
import os
import socket
from pathlib import Path

from durable_producer.buffer_agent.volume.format import LOCK_FILE

from ..errors import WalLockedError
from .damage import Stray
from .quarantine import move_aside

log = logging.getLogger(__name__)


class DirectoryLock:
    """``flock`` on ``<dir>/LOCK``; released by the kernel if the process dies."""

    def __init__(self, directory: Path) -> None:
        self.path = directory / LOCK_FILE
        self._fd: int | None = None

    def acquire(self) -> None:
        if self.path.is_dir() and not self.path.is_symlink():
            target = move_aside(
                self.path.parent, Stray(self.path, "a directory, not the lock file")
            )
            log.warning("%s was a directory: moved to %s", self.path, target)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 256, 0).decode("utf-8", "replace").strip() or "unknown"
            os.close(fd)
            raise WalLockedError(
                f"WAL directory {self.path.parent} is locked by another agent ({holder}); "
                "two agents must never share a buffer volume. Stop the other agent, or give "
                "this one its own volume."
            ) from None
        me = f"pid={os.getpid()} host={socket.gethostname()}\n".encode()
        try:  # in place, then cut: on a full disk this needs no new block
            os.pwrite(fd, me, 0)
            os.ftruncate(fd, len(me))
        except OSError:
            pass  # informational only: a full or failing disk must not keep the agent down
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def current_holder(directory: Path) -> str | None:
    """Who holds the WAL lock right now (pid and host), or None if nobody does."""
    path = directory / LOCK_FILE
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return os.pread(fd, 256, 0).decode("utf-8", "replace").strip() or "unknown"
    finally:
        os.close(fd)
    return None
