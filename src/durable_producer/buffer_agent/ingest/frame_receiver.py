"""Receive size-prefixed Kafka request frames from a socket, with few copies and bounded memory.

This is the ingest hot path's first step. :class:`FrameReceiver` is an
:class:`asyncio.BufferedProtocol`: the event loop ``recv_into``-s straight into memory the
receiver hands out, so

- **small frames** (metadata, API versions, small produce requests: up to
  :data:`STAGING_BYTES` with the prefix) are received into the connection's fixed staging
  buffer and copied out as ``bytes``, which costs less than a syscall per frame;
- a **large frame** (a produce request) gets a buffer of its own and is handed on as a
  read-only ``memoryview`` of it: each frame owns its buffer, so later reads never overwrite
  a frame still being processed.

A size prefix alone costs nothing: a large frame stays in the staging buffer until its bytes
outgrow it. Its own buffer is then the frame's whole size while the shared budget is
plentiful (``RequestMemory.plentiful_for``: half of it free), so an ordinary request lands in
one buffer with no copies. Otherwise memory follows the bytes that arrive, never the size a
client announces: the buffer is sized for what has arrived plus what the kernel holds for the
socket (``socket_backlog``) and grows (at least doubling) as more arrives.

Every buffer comes out of the shared :class:`~.request_memory.RequestMemory` budget and goes
back when the next frame is asked for (the previous one is answered by then) or the
connection closes; when the budget is used up the connection stops reading until its turn
comes. Reading also pauses while ``max_buffered_bytes`` of complete frames, or
:data:`MAX_QUEUED_FRAMES` of them, wait to be processed.

Sizes are checked as soon as the 4-byte prefix is in. ``next_frame`` enforces the idle
timeout (no frame starts) and the read timeout (a started frame is not complete, however
slowly its bytes trickle in); ``send`` the write timeout (the peer stops reading).
"""

from __future__ import annotations

import asyncio
import struct
from collections import deque
from collections.abc import Callable

from durable_producer.buffer_agent.ingest.request_memory import (
    DEFAULT_REQUEST_MEMORY_BYTES,
    Claim,
    RequestMemory,
)
from durable_producer.buffer_agent.ingest.socket_backlog import unread_bytes
from durable_producer.buffer_agent.kafka.protocol import MalformedFrame

MIN_FRAME_BYTES = 8
"""Smallest possible request: api key, api version and correlation id."""

STAGING_BYTES = 16 * 1024
"""Each connection's staging buffer: frames (prefix included) up to this size are received
into it, and a large frame's first bytes wait in it."""

MAX_QUEUED_FRAMES = 16
"""Reading pauses once this many complete frames wait (plus what one staging buffer held).

A Kafka broker reads one request of a connection at a time; clients pipeline up to
``max.in.flight`` (5). Without a count, a client pipelining tiny requests and never reading the
answers had about 420k of them queued per connection (4 MiB of payload, ~45 MB of objects)."""

CHUNK_BYTES = 64 * 1024
"""A large frame's buffer is sized in multiples of this (or to the frame's exact size)."""

_SIZE = struct.Struct(">i")
_PREFIX = _SIZE.size


class FrameReceiver(asyncio.BufferedProtocol):
    """One connection's frames, in order; see the module docstring.

    ``max_buffered_bytes`` bounds the bytes of complete frames not yet taken by
    ``next_frame`` (reading pauses above it). ``memory`` is the budget shared with the other
    connections (a private one of the default size when not given).
    """

    def __init__(
        self,
        max_frame_bytes: int,
        max_buffered_bytes: int = 4 << 20,
        *,
        memory: RequestMemory | None = None,
        on_connection_made: Callable[[FrameReceiver], None] | None = None,
    ) -> None:
        self._on_connection_made = on_connection_made
        self._memory = memory or RequestMemory(max(DEFAULT_REQUEST_MEMORY_BYTES, max_frame_bytes))
        self._max_frame_bytes = min(max_frame_bytes, self._memory.limit)
        self._max_buffered_bytes = max_buffered_bytes
        self._staging = bytearray(STAGING_BYTES)
        self._staging_view = memoryview(self._staging)
        self._start = 0  # first unconsumed byte in the staging buffer
        self._end = 0  # end of received bytes in the staging buffer
        self._large: bytearray | None = None
        self._claim: Claim | None = None  # the large frame's share of the budget
        self._large_size = 0
        self._large_filled = 0
        # (frame, bytes taken, loop time it was complete)
        self._frames: deque[tuple[bytes | memoryview, int, float]] = deque()
        self.frame_arrived = 0.0
        """Loop time at which the frame last handed out by :meth:`next_frame` was complete
        (a request's timeout counts from there, not from when it is served)."""
        self._queued_bytes = 0
        self._held = 0  # bytes taken from the budget and not given back
        self._handed_out = 0  # bytes taken for the frame next_frame returned last
        self._frame_started: float | None = None
        self._closed = False
        self._error: BaseException | None = None
        self._frame_waiter: asyncio.Future[None] | None = None
        self._read_timeout_waiter = False
        """A frame waiter waits on the idle timeout and wants to hear when a frame starts."""
        self._transport: asyncio.Transport | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._fd = -1
        self._reading_paused = False
        self._queue_full = False
        self._waiting_for_memory = False
        self._in_line = False
        self._waiter = self._memory_returned
        self._writing_paused = False
        self._drain_waiter: asyncio.Future[None] | None = None

    # ------------------------------------------------------------------ protocol callbacks
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport
        self._loop = asyncio.get_running_loop()
        sock = transport.get_extra_info("socket")
        self._fd = sock.fileno() if sock is not None else -1
        if self._on_connection_made is not None:
            self._on_connection_made(self)

    @property
    def peer(self) -> object:
        return None if self._transport is None else self._transport.get_extra_info("peername")

    def get_buffer(self, sizehint: int) -> memoryview:
        # reading is paused whenever neither buffer has room (see _update_reading)
        if self._large is not None:
            return memoryview(self._large)[self._large_filled :]
        if self._start and (self._end == STAGING_BYTES or self._end > STAGING_BYTES // 2):
            # only the start of a frame is left: move it to the front
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
                self._push(memoryview(self._large).toreadonly(), len(self._large))
                assert self._claim is not None
                self._memory.finish(self._claim)
                self._large = self._claim = None
                self._frame_started = None
            elif self._large_filled == len(self._large):
                self._grow_large()
        else:
            self._end += nbytes
            try:
                self._split_staging()
            except MalformedFrame as exc:
                self._fail(exc)
                return
        self._update_reading()

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
                self._memory.take(size)
                self._held += size
                self._push(bytes(staging[body_start : body_start + size]), size)
                start = body_start + size
                pushed = True
                continue
            if _PREFIX + size > STAGING_BYTES:
                self._start = start  # a large frame: its own buffer once its bytes outgrow these
                if self._claim is None:
                    self._claim = Claim(size)
                    self._large_size = size
                if self._start_large():
                    start = end
            break
        if start == end:
            start = end = 0
        if start == end and self._large is None:
            self._frame_started = None
        elif pushed:
            self._frame_started = self._now()  # the bytes left belong to a newer frame
        self._start, self._end = start, end

    # ------------------------------------------------------------------ large frames
    def _start_large(self, my_turn: bool = False) -> bool:
        """Move a large frame out of the staging buffer once it must; True if it was moved.
        Its buffer is the frame's whole size while the budget is plentiful, else sized for
        what has arrived or is about to."""
        received = self._end - self._start - _PREFIX
        whole = self._memory.plentiful_for(self._large_size)
        known = received
        if _PREFIX + known < STAGING_BYTES or not whole:
            known += unread_bytes(self._fd)  # a syscall: only when the answer matters
        if _PREFIX + known < STAGING_BYTES:
            return False  # what has arrived (or is about to) still fits the staging buffer
        capacity = self._large_size if whole else self._chunked(known)
        if not self._take(capacity, my_turn):
            return False
        body_start = self._start + _PREFIX
        self._large = bytearray(capacity)
        self._large[:received] = self._staging_view[body_start : self._end]
        self._large_filled = received
        return True

    def _grow_large(self, my_turn: bool = False) -> None:
        """The frame's buffer is full and the frame is not: grow it, budget allowing (to the
        frame's whole size while the budget is plentiful, else at least doubling)."""
        assert self._large is not None
        current = len(self._large)
        if self._memory.plentiful_for(self._large_size - current):
            capacity = self._large_size
        else:
            capacity = self._chunked(max(2 * current, self._large_filled + unread_bytes(self._fd)))
        if self._take(capacity - current, my_turn):
            grown = bytearray(capacity)
            grown[: self._large_filled] = self._large
            self._large = grown

    def _chunked(self, wanted: int) -> int:
        """``wanted`` rounded up to whole chunks, at most the frame's size."""
        chunks = -(-max(wanted, 1) // CHUNK_BYTES)
        return min(self._large_size, chunks * CHUNK_BYTES)

    def _take(self, size: int, my_turn: bool) -> bool:
        """Take ``size`` bytes of the budget, or wait in line for them (reading pauses)."""
        memory = self._memory
        assert self._claim is not None
        if memory.grow(self._claim, size, waiting=my_turn):
            self._held += size
            return True
        self._waiting_for_memory = True
        if not self._in_line:
            self._in_line = True
            memory.wait(self._waiter)
        return False

    def _memory_returned(self) -> bool:
        """Our turn in the budget's line: take what the frame needs, or stay first in line."""
        self._waiting_for_memory = False
        if not self._closed and self._error is None:
            if self._large is None:
                if self._start_large(my_turn=True):
                    self._start = self._end = 0
            else:
                self._grow_large(my_turn=True)
        if self._waiting_for_memory:
            return False
        self._in_line = False
        self._update_reading()
        return True

    def _update_reading(self) -> None:
        """Pause reading while frames pile up, memory is short or neither buffer has room."""
        queued_frames = len(self._frames)
        self._queue_full = (
            self._queued_bytes > self._max_buffered_bytes or queued_frames >= MAX_QUEUED_FRAMES
        ) or (
            self._queue_full
            and (
                self._queued_bytes > self._max_buffered_bytes // 2
                or queued_frames > MAX_QUEUED_FRAMES // 2
            )
        )
        pause = self._queue_full or self._waiting_for_memory or self._error is not None
        if self._transport is None or self._closed or pause == self._reading_paused:
            return
        self._reading_paused = pause
        if pause:
            self._transport.pause_reading()
        else:
            self._transport.resume_reading()

    # ------------------------------------------------------------------ frames out
    def _now(self) -> float:
        return self._loop.time() if self._loop is not None else 0.0

    def _push(self, frame: bytes | memoryview, taken: int) -> None:
        self._frames.append((frame, taken, self._now()))
        self._queued_bytes += len(frame)
        self._wake_frame_waiter()

    def release(self) -> None:
        """Give back every byte this connection holds (call once it is closed)."""
        self._closed = True
        self._frames.clear()
        self._queued_bytes = 0
        self._large = None
        self._handed_out = 0
        self._waiting_for_memory = False
        if self._in_line:
            self._in_line = False
            self._memory.cancel(self._waiter)
        if self._claim is not None:
            self._memory.forget(self._claim)
            self._claim = None
        held, self._held = self._held, 0
        self._memory.give_back(held)

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
        self._update_reading()

    def _wake_frame_waiter(self) -> None:
        if self._frame_waiter is not None and not self._frame_waiter.done():
            self._frame_waiter.set_result(None)

    # ------------------------------------------------------------------ consumer side
    @property
    def queued_frames(self) -> int:
        """Complete frames waiting for :meth:`next_frame`."""
        return len(self._frames)

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
    def held_bytes(self) -> int:
        """Bytes this connection has taken from the memory budget."""
        return self._held

    @property
    def partial_frame(self) -> bool:
        return self._large is not None or self._end > self._start

    async def next_frame(
        self, *, idle_timeout: float | None = None, read_timeout: float | None = None
    ) -> bytes | memoryview | None:
        """The next frame; ``None`` when the peer closed cleanly between frames.

        The frame returned by the previous call is taken as processed: its bytes go back
        to the memory budget. Raises :class:`MalformedFrame` for a bad size prefix or a
        connection closed inside a frame, and ``TimeoutError`` when no frame starts within
        ``idle_timeout`` seconds of the previous one or a started frame is not complete
        ``read_timeout`` seconds later.
        """
        if self._handed_out:
            self._held -= self._handed_out
            self._memory.give_back(self._handed_out)
            self._handed_out = 0
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
        frame, self._handed_out, self.frame_arrived = self._frames.popleft()
        self._queued_bytes -= len(frame)
        self._update_reading()
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
        if self._end - self._start >= _PREFIX:
            (size,) = _SIZE.unpack_from(self._staging_view, self._start)
            if _PREFIX + size > STAGING_BYTES:
                return (
                    f"connection closed inside a frame ({self._end - self._start - _PREFIX}"
                    f" of {size} bytes)"
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
        self.release()

    def abort(self) -> None:
        if self._transport is not None:
            self._transport.abort()
        self.release()
