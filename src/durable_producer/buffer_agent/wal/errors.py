"""Exceptions raised by the write-ahead log. Each message says what happened and what to do."""

from __future__ import annotations


class WalError(Exception):
    """Base class: an I/O or consistency problem in the write-ahead log."""


class WalFullError(WalError):
    """The buffer reached its size limit (or the disk is full). Retriable: nothing was written.

    The agent answers produce requests with a retriable Kafka error so clients back off; space
    returns when the forwarder delivers to Kafka and the checkpoint deletes old segments.
    """


class FrameTooLargeError(WalError):
    """A single frame exceeds ``WalConfig.max_frame_bytes``. Not retriable."""


class WalLockedError(WalError):
    """Another process holds the WAL directory. Two agents must never share a buffer volume."""


class WalClosedError(WalError):
    """The log was closed (agent shutting down); the caller should retry elsewhere or later."""


class WalFailedError(WalError):
    """An fsync or write failed in a way that makes durability unknowable; the log stops accepting.

    After a failed fsync the page cache may have dropped the dirty data (Linux marks it clean), so
    retrying the fsync could falsely report success. The agent must restart and recover from disk.
    """
