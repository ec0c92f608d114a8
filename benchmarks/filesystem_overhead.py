"""What a freshly made filesystem lets a non-root process write, by volume size.

    sudo .venv/bin/python benchmarks/filesystem_overhead.py [--sizes-gib 1,2,5,10,50,100]

For each size it makes a sparse file, formats it the way Kubernetes formats a new volume
(``mkfs.ext4 -F -m0`` and ``mkfs.xfs -f``, as ``k8s.io/mount-utils`` does; plus plain
``mkfs.ext4`` with its default 5 % of blocks reserved for root, for comparison), mounts it
with ``mount -o loop`` and reads ``statvfs``: ``f_bavail * f_frsize`` is what a non-root
process may write. It then fills the filesystem with 64 MiB files (``posix_fallocate``, so
nothing is written) until one no longer fits, to check that ``f_bavail`` is really what
segment files can use. Prints a Markdown table; ``volume_budget.filesystem_overhead_bytes``
is fitted to it (docs/wal.md, "Space budget"). Needs root, ``mkfs.ext4`` and ``mkfs.xfs``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from durable_producer.volume_budget import filesystem_overhead_bytes

GIB = 1 << 30
MIB = 1 << 20
FILL_FILE_BYTES = 64 * MIB

FORMATS: dict[str, list[str]] = {
    "ext4 -m0 (Kubernetes)": ["mkfs.ext4", "-q", "-F", "-m0"],
    "xfs (Kubernetes)": ["mkfs.xfs", "-q", "-f"],
    "ext4 (mkfs default, 5 % for root)": ["mkfs.ext4", "-q", "-F"],
}


@dataclass(frozen=True, slots=True)
class Measurement:
    filesystem: str
    volume_bytes: int
    available_bytes: int
    filled_bytes: int


def measure(image: Path, mount_point: Path, filesystem: str, size: int) -> Measurement | None:
    """None when the filesystem cannot be made that small (xfs needs 300 MiB)."""
    image.unlink(missing_ok=True)
    with image.open("wb") as handle:
        handle.truncate(size)
    made = subprocess.run([*FORMATS[filesystem], str(image)], capture_output=True)
    if made.returncode != 0:
        image.unlink()
        return None
    subprocess.run(["mount", "-o", "loop", str(image), str(mount_point)], check=True)
    try:
        stats = os.statvfs(mount_point)
        available = stats.f_bavail * stats.f_frsize
        target = mount_point / "fill"
        target.mkdir()
        os.chmod(target, 0o777)
        os.setegid(65534)  # fill as a non-root user: root may write into reserved blocks
        os.seteuid(65534)
        try:
            filled = fill(target)
        finally:
            os.seteuid(0)
            os.setegid(0)
    finally:
        subprocess.run(["umount", str(mount_point)], check=True)
        image.unlink()
    return Measurement(filesystem, size, available, filled)


def fill(directory: Path) -> int:
    """Bytes of 64 MiB files that fit in ``directory``."""
    count = 0
    while True:
        fd = os.open(directory / f"{count:06d}", os.O_WRONLY | os.O_CREAT, 0o644)
        try:
            os.posix_fallocate(fd, 0, FILL_FILE_BYTES)
        except OSError:
            return count * FILL_FILE_BYTES
        finally:
            os.close(fd)
        count += 1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes-gib", default="1,2,5,10,50,100")
    parser.add_argument("--dir", type=Path, default=None, help="where the sparse images go")
    args = parser.parse_args()
    sizes = [int(float(text) * GIB) for text in args.sizes_gib.split(",")]
    work = Path(tempfile.mkdtemp(dir=args.dir, prefix="fs-overhead-"))
    os.chmod(work, 0o755)
    mount_point = work / "mnt"
    mount_point.mkdir()
    rows = []
    try:
        for size in sizes:
            for filesystem in FORMATS:
                row = measure(work / "image", mount_point, filesystem, size)
                if row is not None:
                    rows.append(row)
                    print(row, flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print()
    print(
        "| volume | filesystem | available to non-root (statvfs) | overhead | 64 MiB files that"
        " fit | model overhead |"
    )
    print("|---:|---|---:|---:|---:|---:|")
    for row in rows:
        overhead = row.volume_bytes - row.available_bytes
        model = filesystem_overhead_bytes(row.volume_bytes)
        print(
            f"| {row.volume_bytes / GIB:g} GiB | {row.filesystem} | {row.available_bytes:,} |"
            f" {overhead / MIB:,.1f} MiB ({100 * overhead / row.volume_bytes:.2f} %) |"
            f" {row.filled_bytes // FILL_FILE_BYTES} | {model / MIB:,.1f} MiB |"
        )


if __name__ == "__main__":
    main()
