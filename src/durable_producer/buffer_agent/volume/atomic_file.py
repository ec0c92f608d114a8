"""Crash-safe replacement of small state files (caches, producer state, producer ids)."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path


def fsync_directory(directory: Path) -> None:
    """Make a rename or a newly created file in ``directory`` survive a power loss."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: Path, data: bytes) -> None:
    """Replace ``path`` with ``data`` so that a crash leaves either the old or the new content.

    Temp file in the same directory, fsync, rename over the target, fsync the directory. The
    temp file needs new blocks: on a full disk this raises ``OSError`` (ENOSPC), removes the
    temp file and leaves ``path`` as it was.
    """
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        try:
            view = memoryview(data)
            while view:
                written = os.write(fd, view)
                view = view[written:]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    fsync_directory(path.parent)
