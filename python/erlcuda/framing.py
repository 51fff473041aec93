"""Frames on the port's pipes: a 4-byte big-endian length, then that many bytes.

This is what an Erlang port opened with ``{packet, 4}`` reads and writes. Both ends take a
``max_frame`` limit (default ``contract.MAX_FRAME``, what 4 length bytes can say).
"""

from __future__ import annotations

import errno
import os
import select
import struct
import threading
import time
from collections.abc import Callable, Sequence

from . import contract

__all__ = ["MAX_FRAME", "FrameError", "FrameReader", "FrameWriter", "frame_size"]

#: The largest frame ``{packet, 4}`` can describe.
MAX_FRAME = contract.MAX_FRAME

_header = struct.Struct(">I")


class FrameError(Exception):
    """A frame could not be read or written (truncated, over the limit, or a closed pipe)."""


class FrameReader:
    """Reads frames from a file descriptor, each into a buffer of its own.

    Decoded binaries are memoryviews into a frame's buffer and stay valid while jobs hold
    them, so a buffer is never reused while any view of it lives. A header only announces a
    size: memory is committed as the bytes arrive, never up front (a lone ``FF FF FF FF``
    would otherwise cost 4 GiB before one byte of the body). Small frames get a ``bytearray``
    of their size; a large one is read into a free pooled buffer, or else into one that grows
    as its bytes come and then joins the pool, whose pages are already mapped when it is
    reused (a fresh 128 MB buffer costs tens of thousands of page faults as it is filled).
    A pooled buffer that no frame used for ``POOL_IDLE_S`` is dropped: under a mix of frame
    sizes the pool otherwise kept one buffer for every size seen, up to ``POOL_BYTES``, and
    the worker's memory rose in steps for as long as a load ran.
    """

    #: Frames at least this large use the pool; smaller ones are allocated at their size.
    POOL_MIN = 1 << 20
    #: Pooled bytes kept at most, free or in use.
    POOL_BYTES = 1 << 30
    #: A pooled buffer unused for this long (seconds) is dropped.
    POOL_IDLE_S = 10.0
    #: A growing frame's bytes are read through a scratch buffer of this size.
    CHUNK = 1 << 20

    #: Bytes read ahead from the pipe at most: small frames come in one system call.
    READ_AHEAD = 1 << 16

    def __init__(self, fd: int, *, max_frame: int = MAX_FRAME,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._fd = fd
        self._max_frame = max_frame
        self._pool: list[bytearray] = []
        # The pooled buffers handed out since the last sweep (by id), and when the next is.
        self._used: set[int] = set()
        self._clock = clock
        self._sweep_at = clock() + self.POOL_IDLE_S
        self._scratch: bytearray | None = None
        # Bytes read ahead and not yet handed out: self._ahead[self._lo:self._hi].
        self._ahead = bytearray(self.READ_AHEAD)
        self._ahead_view = memoryview(self._ahead)
        self._lo = self._hi = 0
        self._large = False  # whether the last frame's body bypassed the read-ahead buffer
        self._poll = select.poll()
        self._poll.register(fd, select.POLLIN)

    def pending(self) -> bool:
        """Whether a frame has begun to arrive: ``read`` then waits only for its rest.

        After a small frame this costs no system call where the last read took everything
        then in the pipe (it came back short of ``READ_AHEAD``): what is not read ahead had
        not arrived a moment ago, and a lone job does not pay a ``poll`` to learn that. The
        pipe is asked after a read that filled the read-ahead buffer (the pipe may hold
        more, and a blocked writer refills it at once) and after a large frame, read
        straight into its buffer.
        """
        if self._hi > self._lo:
            return True
        if not self._large and self._hi < self.READ_AHEAD:
            return False
        try:
            return bool(self._poll.poll(0))
        except OSError as e:
            raise FrameError(f"poll failed: {e}") from e

    def wait(self, timeout: float | None) -> bool:
        """Whether there are bytes to read (or the end of the input), waiting up to
        ``timeout`` seconds for them (``None``: as long as it takes; 0: not at all)."""
        if self._hi > self._lo:
            return True
        try:
            return bool(self._poll.poll(None if timeout is None else int(timeout * 1000)))
        except OSError as e:
            raise FrameError(f"poll failed: {e}") from e

    def read(self) -> bytearray | memoryview | None:
        """Return the next frame's body, or ``None`` on end of file between frames."""
        if self._hi == self._lo:
            # One read brings what the pipe holds: most often whole small frames.
            try:
                self._lo, self._hi = 0, os.readv(self._fd, [self._ahead_view])
            except OSError as e:
                raise FrameError(f"read failed: {e}") from e
            if not self._hi:
                return None
        lo, hi = self._lo, self._hi
        if hi - lo >= 4:
            n = _header.unpack_from(self._ahead, lo)[0]
            end = lo + 4 + n
            if end <= hi and n <= self._max_frame:
                # A frame read ahead whole (under READ_AHEAD, so no pooled buffer).
                self._lo = end
                self._large = False
                self._sweep_due()
                return self._ahead[lo + 4 : end]
        return self._read_slow()

    def _read_slow(self) -> bytearray | memoryview | None:
        header = bytearray(4)
        got = self._fill(header)
        if got == 0:
            return None
        if got < 4:
            raise FrameError(f"end of file inside a frame header ({got} of 4 bytes)")
        n = _header.unpack(header)[0]
        if n > self._max_frame:
            raise FrameError(f"frame of {n} bytes is over the {self._max_frame} byte limit")
        self._sweep_due()
        self._large = n - (self._hi - self._lo) >= self.READ_AHEAD
        if n < self.POOL_MIN:
            body: bytearray | memoryview = bytearray(n)
            got = self._fill(body)
        else:
            pooled = self._free_pooled(n)
            if pooled is not None:
                body = pooled
                got = self._fill(body)
            else:
                grown = self._grow(n)
                body, got = memoryview(grown), len(grown)
        if got < n:
            raise FrameError(f"end of file inside a frame ({got} of {n} bytes)")
        return body

    def _free_pooled(self, n: int) -> memoryview | None:
        """A view of ``n`` bytes of a pooled buffer that no live view uses any more."""
        for buf in self._pool:
            if n <= len(buf) <= 2 * n and _unused(buf):
                self._used.add(id(buf))
                return memoryview(buf)[:n]
        return None

    def _sweep_due(self) -> None:
        """Sweep the pool where a sweep is due: on every frame, large or small."""
        if self._pool and self._clock() >= self._sweep_at:
            self._sweep()

    def _sweep(self) -> None:
        """Drop the pooled buffers that no frame used since the last sweep and no view
        holds."""
        self._pool = [b for b in self._pool if id(b) in self._used or not _unused(b)]
        self._used.clear()
        self._sweep_at = self._clock() + self.POOL_IDLE_S

    def _grow(self, n: int) -> bytearray:
        """Up to ``n`` bytes read into a buffer that grows with what arrives."""
        if self._scratch is None:
            self._scratch = bytearray(self.CHUNK)
        buf = bytearray()
        with memoryview(self._scratch) as scratch:
            while len(buf) < n:
                want = min(n - len(buf), len(scratch))
                k = self._fill(scratch[:want])
                # A bytearray grows its storage geometrically (realloc), so what this copies
                # adds up to about the frame's size, once.
                buf += scratch[:k]
                if k < want:
                    break  # end of file
        if len(buf) == n:
            self._adopt(buf)
        return buf

    def _adopt(self, buf: bytearray) -> None:
        """Keep ``buf`` in the pool, dropping free buffers to stay within ``POOL_BYTES``."""
        n = len(buf)
        if sum(map(len, self._pool)) + n > self.POOL_BYTES:
            free = [b for b in self._pool if _unused(b)]
            for b in sorted(free, key=len, reverse=True):
                if sum(map(len, self._pool)) + n <= self.POOL_BYTES:
                    break
                self._pool.remove(b)
        if sum(map(len, self._pool)) + n <= self.POOL_BYTES:
            self._pool.append(buf)
            self._used.add(id(buf))

    def _fill(self, buf: bytearray | memoryview) -> int:
        """Read into ``buf`` until it is full or the file ends; return the bytes read.

        What was read ahead comes first; a large rest is read straight into ``buf``, a small
        one through the read-ahead buffer, which may then hold the start of the next frame.
        """
        got = 0
        with memoryview(buf) as view:
            n = len(view)
            while got < n:
                ahead = self._hi - self._lo
                if ahead:
                    k = min(ahead, n - got)
                    view[got : got + k] = self._ahead_view[self._lo : self._lo + k]
                    self._lo += k
                    got += k
                    continue
                try:
                    if n - got >= self.READ_AHEAD:
                        k = os.readv(self._fd, [view[got:]])
                        got += k
                    else:
                        self._lo = 0
                        self._hi = k = os.readv(self._fd, [self._ahead_view])
                except OSError as e:
                    raise FrameError(f"read failed: {e}") from e
                if not k:
                    break
        return got

    def close(self) -> None:
        """Stop reading (the file descriptor itself stays open)."""
        try:
            self._poll.unregister(self._fd)
        except KeyError:
            pass  # closed before
        self._lo = self._hi = 0


def _unused(buf: bytearray) -> bool:
    """Whether no memoryview of ``buf`` is alive: a bytearray with exports cannot resize."""
    try:
        buf.append(0)
    except BufferError:
        return False
    del buf[-1]
    return True


def frame_size(chunks: Sequence[bytes | memoryview]) -> int:
    """The length of the frame body made of ``chunks``."""
    return sum(len(c) if type(c) is bytes else memoryview(c).nbytes for c in chunks)


def _iov_max() -> int:
    try:
        n = os.sysconf("SC_IOV_MAX")
    except (ValueError, OSError):
        n = -1
    return n if n > 0 else 1024


class FrameWriter:
    """Writes frames to a file descriptor with ``os.writev``; safe to share between threads.

    ``max_frame`` is the largest body written (at most ``MAX_FRAME``, what the header holds).
    """

    def __init__(self, fd: int, *, max_frame: int = MAX_FRAME) -> None:
        if not 0 <= max_frame <= MAX_FRAME:
            raise ValueError(f"max_frame must be within 0..{MAX_FRAME}")
        self._fd = fd
        self.max_frame = max_frame
        self._lock = threading.Lock()
        self._iov_max = _iov_max()

    def write(self, chunks: Sequence[bytes | memoryview]) -> None:
        """Write one frame whose body is the concatenation of ``chunks``."""
        self.write_many((chunks,))

    def write_many(self, frames: Sequence[Sequence[bytes | memoryview]]) -> None:
        """Write several frames, in order and together, in as few system calls as possible.

        Each frame is checked on its own: one over ``max_frame`` is left out, every other
        frame is written, and then ``FrameError`` names what was left out. Callers that owe
        a reply for each frame check ``frame_size`` against ``max_frame`` first.
        """
        bufs: list[bytes | memoryview] = []
        sizes: list[int] = []
        oversized: list[str] = []
        for index, chunks in enumerate(frames):
            at = len(bufs)
            bufs.append(b"")  # the header, filled in once the body's length is known
            sizes.append(4)
            total = 0
            for chunk in chunks:
                if type(chunk) is not bytes:
                    chunk = memoryview(chunk)
                    if chunk.format != "B" or chunk.ndim != 1:
                        chunk = chunk.cast("B")
                n = len(chunk)
                if n:
                    bufs.append(chunk)
                    sizes.append(n)
                    total += n
            if total > self.max_frame:
                del bufs[at:], sizes[at:]
                oversized.append(f"frame {index} of {total} bytes")
                continue
            bufs[at] = _header.pack(total)
        with self._lock:
            self._writev_all(bufs, sizes)
        if oversized:
            raise FrameError(f"over the {self.max_frame} byte limit, not written: "
                             + ", ".join(oversized))

    def write_sized(self, chunks: Sequence[bytes | memoryview], size: int) -> None:
        """Write one frame of ``size`` bytes (at most ``max_frame``, which the caller
        checked) made of ``chunks``, bytes or 1-D byte memoryviews: ``write`` without its
        per-chunk checks, for the one-record frames of lone jobs."""
        if size > self.max_frame:
            raise FrameError(f"over the {self.max_frame} byte limit, not written: "
                             f"a frame of {size} bytes")
        bufs: list[bytes | memoryview] = [_header.pack(size), *chunks]
        with self._lock:
            try:
                written = os.writev(self._fd, bufs)
            except OSError:
                written = 0  # _writev_all retries, or says what it was
            if written == size + 4:
                return
            sizes = [len(c) for c in bufs]
            while written >= sizes[0]:  # what was written in part, left out
                written -= sizes.pop(0)
                bufs.pop(0)
            if written:
                bufs[0] = memoryview(bufs[0])[written:]
                sizes[0] -= written
            self._writev_all(bufs, sizes)

    def _writev_all(self, bufs: list[bytes | memoryview], sizes: list[int]) -> None:
        i = 0
        while i < len(bufs):
            try:
                written = os.writev(self._fd, bufs[i : i + self._iov_max])
            except InterruptedError:
                continue
            except OSError as e:
                if isinstance(e, BrokenPipeError) or e.errno == errno.EPIPE:
                    raise FrameError("the reading end of the pipe is closed") from e
                raise FrameError(f"write failed: {e}") from e
            # Skip the buffers written in full, then trim the one written in part.
            while i < len(bufs) and written >= sizes[i]:
                written -= sizes[i]
                i += 1
            if written:
                bufs[i] = memoryview(bufs[i])[written:]
                sizes[i] -= written
