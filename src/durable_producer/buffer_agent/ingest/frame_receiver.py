"""Receive size-prefixed Kafka request frames from a socket with as few copies as possible.

This is the ingress hot path's first step. With ``asyncio.StreamReader`` every produced byte
was copied three times before the WAL saw it (socket chunk -> the reader's buffer ->
``readexactly``'s bytes, plus the memmove of what stays buffered). :class:`FrameReceiver` is a
:class:`asyncio.BufferedProtocol`: the event loop ``recv_into``-s straight into memory the
receiver hands out, so

- a **large frame** (a produce request; anything that does not fit the staging buffer) is
  received into a buffer of exactly its size, allocated when its size prefix arrives, and
  handed on as a read-only ``memoryview`` of that buffer: the kernel's copy is the only one.
  Each large frame owns its buffer, so later reads can never overwrite a frame still being
  processed. Frames above :data:`PREALLOCATE_BYTES` (clients cap requests near 1 MB by
  default) start smaller and grow as their bytes arrive;
- **small frames** (metadata, API versions, small produce requests) share one fixed staging
  buffer and are copied out as ``bytes``, which costs less than a syscall per frame.

Sizes are checked as soon as the 4-byte prefix is in (a hostile prefix never makes the agent
allocate more than ``max_frame_bytes``); reading pauses while too many received bytes wait to
be processed, so a fast client cannot make the agent buffer without bound. ``next_frame``
enforces the idle timeout (no frame starts) and the read timeout (a started frame does not
complete); ``send`` enforces the write timeout when the peer stops reading its responses.
"""

from __future__ import annotations

import asyncio
import struct
from collections import deque
from collections.abc import Callable

from durable_producer.buffer_agent.kafka.protocol import MalformedFrame

MIN_FRAME_BYTES = 8
"""Smallest possible request: api key, api version and correlation id."""

STAGING_BYTES = 64 * 1024
"""Frames (prefix included) up to this size are received into the shared staging buffer."""

PREALLOCATE_BYTES = 4 * 1024 * 1024
"""A large frame's buffer starts at its full size up to this; larger ones grow as bytes arrive,
so a size prefix alone never makes the agent allocate more."""

_SIZE = struct.Struct(">i")
_PREFIX = _SIZE.size


class FrameReceiver(asyncio.BufferedProtocol):
    """One connection's frames, in order; see the module docstring.

    ``max_buffered_bytes`` bounds the bytes received but not yet taken by ``next_frame``
    (reading pauses above it); a single frame larger than that is still received whole.
    """

    def __init__(
        self,
        max_frame_bytes: int,
        max_buffered_bytes: int = 4 << 20,
        *,
        on_connection_made: Callable[[FrameReceiver], None] | None = None,
    ) -> None:
        self._on_connection_made = on_connection_made
        self._max_frame_bytes = max_frame_bytes
        self._max_buffered_bytes = max_buffered_bytes
        self._staging = bytearray(STAGING_BYTES)
        self._staging_view = memoryview(self._staging)
        self._start = 0  # first unconsumed byte in the staging buffer
        self._end = 0  # end of received bytes in the staging buffer
        self._large: bytearray | None = None
        self._large_size = 0
        self._large_filled = 0
        self._frames: deque[bytes | memoryview] = deque()
        self._queued_bytes = 0
        self._frame_started: float | None = None
        self._closed = False
        self._error: BaseException | None = None
        self._frame_waiter: asyncio.Future[None] | None = None
        self._read_timeout_waiter = False
        """A frame waiter waits on the idle timeout and wants to hear when a frame starts."""
        self._transport: asyncio.Transport | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._reading_paused = False
        self._writing_paused = False
        self._drain_waiter: asyncio.Future[None] | None = None

    # ------------------------------------------------------------------ protocol callbacks
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport
        self._loop = asyncio.get_running_loop()
        if self._on_connection_made is not None:
            self._on_connection_made(self)

    @property
    def peer(self) -> object:
        return None if self._transport is None else self._transport.get_extra_info("peername")

    def get_buffer(self, sizehint: int) -> memoryview:
        if self._large is not None:
            if self._large_filled == len(self._large):
                self._grow_large()
            return memoryview(self._large)[self._large_filled :]
        if self._start and self._end > STAGING_BYTES // 2:
            # only the start of a frame that fits is left: move it to the front
            partial = bytes(self._staging_view[self._start : self._end])
            self._staging_view[: len(partial)] = partial
            self._start, self._end = 0, len(partial)
        return self._staging_view[self._end :]

    def buffer_updated(self, nbytes: int) -> None:
        if self._frame_started is None:
            self._frame_started = self._now()
            if self._read_timeout_waiter:
                self._wake_frame_waiter()  # re-arm the wait with the (shorter) read timeout
        if self._large is not None:
            self._large_filled += nbytes
            if self._large_filled == self._large_size:
                self._push(memoryview(self._large).toreadonly())
                self._large = None
                self._frame_started = None
        else:
            self._end += nbytes
            try:
                self._split_staging()
            except MalformedFrame as exc:
                self._fail(exc)
                return
        if self._queued_bytes > self._max_buffered_bytes and not self._reading_paused:
            assert self._transport is not None
            self._transport.pause_reading()
            self._reading_paused = True

    def _split_staging(self) -> None:
        staging, start, end = self._staging_view, self._start, self._end
        pushed = False
        while end - start >= _PREFIX:
            (size,) = _SIZE.unpack_from(staging, start)
            if size < MIN_FRAME_BYTES:
                raise MalformedFrame(f"frame size {size} is smaller than a request header")
            if size > self._max_frame_bytes:
                raise MalformedFrame(
                    f"frame size {size} exceeds the limit of {self._max_frame_bytes} bytes"
                )
            body_start = start + _PREFIX
            if end - body_start >= size:
                self._push(bytes(staging[body_start : body_start + size]))
                start = body_start + size
                pushed = True
                continue
            if _PREFIX + size > STAGING_BYTES:
                # a large frame: its own buffer, seeded with the part already received
                received = end - body_start
                self._large = bytearray(min(size, PREALLOCATE_BYTES))
                self._large[:received] = staging[body_start:end]
                self._large_size = size
                self._large_filled = received
                start = end
            break
        if start == end:
            start = end = 0
        if start == end and self._large is None:
            self._frame_started = None
        elif pushed:
            self._frame_started = self._now()  # the bytes left belong to a newer frame
        self._start, self._end = start, end

    def _now(self) -> float:
        return self._loop.time() if self._loop is not None else 0.0

    def _grow_large(self) -> None:
        """Double the buffer of a frame larger than PREALLOCATE_BYTES as its bytes arrive."""
        assert self._large is not None
        grown = bytearray(min(self._large_size, 2 * len(self._large)))
        grown[: self._large_filled] = self._large
        self._large = grown

    def _push(self, frame: bytes | memoryview) -> None:
        self._frames.append(frame)
        self._queued_bytes += len(frame)
        self._wake_frame_waiter()

    def eof_received(self) -> bool:
        self._closed = True
        self._wake_frame_waiter()
        return True  # keep the transport open: requests received before EOF get answers

    def connection_lost(self, exc: Exception | None) -> None:
        self._closed = True
        self._wake_frame_waiter()
        if self._drain_waiter is not None and not self._drain_waiter.done():
            self._drain_waiter.set_exception(ConnectionResetError("connection lost"))

    def pause_writing(self) -> None:
        self._writing_paused = True

    def resume_writing(self) -> None:
        self._writing_paused = False
        if self._drain_waiter is not None and not self._drain_waiter.done():
            self._drain_waiter.set_result(None)

    def _fail(self, error: BaseException) -> None:
        self._error = error
        self._wake_frame_waiter()
        if self._transport is not None:
            self._transport.pause_reading()

    def _wake_frame_waiter(self) -> None:
        if self._frame_waiter is not None and not self._frame_waiter.done():
            self._frame_waiter.set_result(None)

    # ------------------------------------------------------------------ consumer side
    @property
    def buffered_bytes(self) -> int:
        """Bytes received and held: queued frames plus the frame being received."""
        return (
            self._queued_bytes
            + self._end
            - self._start
            + self._large_filled * bool(self._large is not None)
        )

    @property
    def partial_frame(self) -> bool:
        return self._large is not None or self._end > self._start

    async def next_frame(
        self, *, idle_timeout: float | None = None, read_timeout: float | None = None
    ) -> bytes | memoryview | None:
        """The next frame; ``None`` when the peer closed cleanly between frames.

        Raises :class:`MalformedFrame` for a bad size prefix or a connection closed inside a
        frame, and ``TimeoutError`` when no frame starts within ``idle_timeout`` seconds of
        the previous one or a started frame is not complete ``read_timeout`` seconds later.
        """
        loop = asyncio.get_running_loop()
        waiting_since = loop.time()
        while not self._frames:
            if self._error is not None:
                raise self._error
            if self._closed:
                if self.partial_frame:
                    raise MalformedFrame(self._truncation())
                return None
            deadline = self._deadline(waiting_since, idle_timeout, read_timeout)
            if deadline is not None and deadline <= loop.time():
                raise TimeoutError("no complete frame before the idle or read timeout")
            self._frame_waiter = loop.create_future()
            self._read_timeout_waiter = read_timeout is not None and self._frame_started is None
            try:
                async with asyncio.timeout_at(deadline):
                    await self._frame_waiter
            except TimeoutError:
                pass  # the loop above decides which timeout, if any, expired
            finally:
                self._frame_waiter = None
                self._read_timeout_waiter = False
        frame = self._frames.popleft()
        self._queued_bytes -= len(frame)
        if self._reading_paused and self._queued_bytes <= self._max_buffered_bytes // 2:
            self._reading_paused = False
            if self._transport is not None and not self._closed:
                self._transport.resume_reading()
        return frame

    def _deadline(
        self, waiting_since: float, idle_timeout: float | None, read_timeout: float | None
    ) -> float | None:
        if self._frame_started is not None:
            return None if read_timeout is None else self._frame_started + read_timeout
        return None if idle_timeout is None else waiting_since + idle_timeout

    def _truncation(self) -> str:
        if self._large is not None:
            return (
                f"connection closed inside a frame ({self._large_filled} of"
                f" {self._large_size} bytes)"
            )
        return f"connection closed inside a frame ({self._end - self._start} bytes received)"

    async def send(self, data: bytes, *, timeout: float | None = None) -> None:
        """Write ``data``; wait (up to ``timeout``) while the peer is not reading."""
        if self._transport is None or self._transport.is_closing():
            raise ConnectionResetError("connection closed")
        self._transport.write(data)
        if not self._writing_paused:
            return
        self._drain_waiter = asyncio.get_running_loop().create_future()
        try:
            async with asyncio.timeout(timeout):
                await self._drain_waiter
        finally:
            self._drain_waiter = None

    def close(self) -> None:
        if self._transport is not None:
            self._transport.close()

    def abort(self) -> None:
        if self._transport is not None:
            self._transport.abort()
