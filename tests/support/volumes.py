"""Small real filesystems for full-volume tests: a size-limited tmpfs, filled to the brim."""

from __future__ import annotations

import contextlib
import errno
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest


@contextlib.contextmanager
def mounted_tmpfs(mount_point: Path, size: str) -> Iterator[Path]:
    """Mount a tmpfs of ``size`` (e.g. ``"8m"``) at ``mount_point``; skip the test with the
    reason where mounting is not permitted (not root, or no CAP_SYS_ADMIN in a container)."""
    mount_point.mkdir(parents=True, exist_ok=True)
    result = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mount_point)],
        capture_output=True,
        text=True,
    )
    if result.returncode != 0:
        pytest.skip(
            f"cannot mount a {size} tmpfs here ({result.stderr.strip() or 'mount failed'});"
            " the same paths run with injected ENOSPC/EIO in tests/unit/buffer_agent"
        )
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], check=False)


def fill(directory: Path, name: str = "filler") -> int:
    """Write a file in ``directory`` until the filesystem refuses another byte: the volume is
    then 100 % full (as when an application writes its own files to it). Returns its size."""
    path = directory / name
    written = 0
    with path.open("ab", buffering=0) as file:
        for chunk in (1 << 20, 1 << 16, 1 << 12, 1 << 9, 1):
            block = b"\0" * chunk
            while True:
                try:
                    count = file.write(block)
                except OSError as error:
                    if error.errno not in (errno.ENOSPC, errno.EDQUOT):
                        raise
                    break
                written += count or 0
                if not count or count < chunk:
                    break
    os.sync()
    return written


def free_bytes(directory: Path) -> int:
    stats = os.statvfs(directory)
    return stats.f_bavail * stats.f_frsize


def as_file_modes_apply(command: list[str]) -> list[str]:
    """``command`` run so that file modes bind it: as root, without the capabilities that
    override them (CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH; ``setpriv``); as another user, as
    it is. Skips the test where root cannot drop them."""
    if os.geteuid() != 0:
        return command
    prefix = ["setpriv", "--bounding-set", "-dac_override,-dac_read_search", "--"]
    probe = subprocess.run([*prefix, "true"], capture_output=True, text=True)
    if probe.returncode != 0:
        pytest.skip(f"cannot drop root's file-mode capabilities here: {probe.stderr.strip()}")
    return [*prefix, *command]
