"""The buffer agent's write-ahead log: segments on the buffer volume, crash-safe.

Layout of a WAL directory::

    LOCK                         flock held by the one agent using the volume
    checkpoint                   lowest offset not yet delivered (atomic replace)
    00000000000000000000.seg     segments named by their first offset
    quarantine/                  damaged segments moved aside, each with a .json reason
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
from .log import SegmentView, WalStats, WriteAheadLog
from .reader import WalReader

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
