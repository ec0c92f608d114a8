"""The buffer agent's write-ahead log: segments on the buffer volume, crash-safe.

The on-disk format (directory layout, segment and frame bytes, checkpoint, quarantine records,
and the agent's other files on the volume) is documented in ``volume/format.py``; the files of
the whole volume (atomic and slot files, state files, space) are ``volume/``'s. One job per
module:

- ``writer.py``: ``WriteAheadLog``, the log whole: offsets, size limit, checkpoint, failures,
  and what readers call (segment views, waits for data)
- ``segment_list.py``: the segments in order: writing groups of frames, rotation, roll-back
- ``segment.py``: ``Segment``, one segment file: create, append, truncate, seal, delete
- ``frame.py``: encoding and decoding frames
- ``reader.py``: ``WalReader``, tail-following reads through the log's public methods
- ``syncer.py``: fsync policies and group commit
- ``health.py``: why appends are refused (limit, full disk, failed fsync) and when they resume
- ``checkpoint.py``, ``stats.py``: the checkpoint file (a ``volume/slot_file.py``), figures
- ``log_id.py``: the log's id (``wal/id``), which marks kept outside the log name
- ``config.py``, ``errors.py``: the log's settings and its exceptions

Side room ``recovery/``: opening a directory whatever a crash left (``repair.py``, ``scan.py``,
``damage.py``, ``quarantine.py``), the directory lock (``lock.py``) and the read-only
``durable-agent wal inspect`` report (``inspect.py``).
"""

from .config import FsyncPolicy, FullDiskPolicy, WalConfig
from .errors import (
    FrameTooLargeError,
    WalClosedError,
    WalError,
    WalFailedError,
    WalFullError,
    WalLockedError,
)
from .frame import AppendItem, Frame
from .reader import WalReader
from .segment import SegmentView
from .stats import WalStats
from .writer import WriteAheadLog

__all__ = [
    "AppendItem",
    "Frame",
    "FrameTooLargeError",
    "FsyncPolicy",
    "FullDiskPolicy",
    "SegmentView",
    "WalClosedError",
    "WalConfig",
    "WalError",
    "WalFailedError",
    "WalFullError",
    "WalLockedError",
    "WalReader",
    "WalStats",
    "WriteAheadLog",
]
