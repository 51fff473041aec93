"""Frames on the port's pipes: a 4-byte big-endian length, then that many bytes.

This is what an Erlang port opened with ``{packet, 4}`` reads and writes.
"""

from __future__ import annotations

import errno
import io
import os
import struct
import threading
from collections.abc import Sequence

__all__ = ["MAX_FRAME", "FrameError", "FrameReader", "FrameWriter"]

#: The largest frame ``{packet, 4}`` can describe.
MAX_FRAME = (1 << 32) - 1

_header = struct.Struct(">I")


class FrameError(Exception):
    """A frame could not be read or written (truncated, over the limit, or a closed pipe)."""


class FrameReader:
    """Reads frames from a file descriptor, each into a buffer of its own.

    Decoded binaries are memoryviews into a frame's buffer and stay valid while jobs hold
    them, so a buffer is never reused while any view of it lives. Small frames get a fresh
    ``bytearray``; large ones come from a small pool of buffers whose pages are already
    mapped (a fresh 128 MB buffer costs tens of thousands of page faults as it is filled).
    """

    #: Frames at least this large use the pool.
    POOL_MIN = 1 << 20
    #: Pooled bytes kept at most, free or in use.
    POOL_BYTES = 1 << 30

    def __init__(self, fd: int, *, max_frame: int = MAX_FRAME) -> None:
        # What open(fd, "rb", buffering=65536, closefd=False) builds, spelled out for typing.
        self._file = io.BufferedReader(io.FileIO(fd, "rb", closefd=False), buffer_size=65536)
        self._max_frame = max_frame
        self._pool: list[bytearray] = []

    def read(self) -> bytearray | memoryview | None:
        """Return the next frame's body, or ``None`` on end of file between frames."""
        header = bytearray(4)
        got = self._fill(header)
        if got == 0:
            return None
        if got < 4:
            raise FrameError(f"end of file inside a frame header ({got} of 4 bytes)")
        n = _header.unpack(header)[0]
        if n > self._max_frame:
            raise FrameError(f"frame of {n} bytes is over the {self._max_frame} byte limit")
        body: bytearray | memoryview = bytearray(n) if n < self.POOL_MIN else self._pooled(n)
        got = self._fill(body)
        if got < n:
            raise FrameError(f"end of file inside a frame ({got} of {n} bytes)")
        return body

    def _pooled(self, n: int) -> memoryview:
        """A view of ``n`` bytes of a pooled buffer that no live view uses any more."""
        for buf in self._pool:
            if n <= len(buf) <= 2 * n and _unused(buf):
                return memoryview(buf)[:n]
        buf = bytearray(n)
        if sum(map(len, self._pool)) + n > self.POOL_BYTES:
            free = [b for b in self._pool if _unused(b)]
            for b in sorted(free, key=len, reverse=True):
                if sum(map(len, self._pool)) + n <= self.POOL_BYTES:
                    break
                self._pool.remove(b)
        if sum(map(len, self._pool)) + n <= self.POOL_BYTES:
            self._pool.append(buf)
        return memoryview(buf)[:n]

    def _fill(self, buf: bytearray | memoryview) -> int:
        """Read into ``buf`` until it is full or the file ends; return the bytes read."""
        got = 0
        with memoryview(buf) as view:
            while got < len(buf):
                try:
                    k = self._file.readinto(view[got:])
                except OSError as e:
                    raise FrameError(f"read failed: {e}") from e
                if not k:
                    break
                got += k
        return got

    def close(self) -> None:
        """Close the reader (the file descriptor itself stays open)."""
        self._file.close()


def _unused(buf: bytearray) -> bool:
    """Whether no memoryview of ``buf`` is alive: a bytearray with exports cannot resize."""
    try:
        buf.append(0)
    except BufferError:
        return False
    del buf[-1]
    return True


def _iov_max() -> int:
    try:
        n = os.sysconf("SC_IOV_MAX")
    except (ValueError, OSError):
        n = -1
    return n if n > 0 else 1024


class FrameWriter:
    """Writes frames to a file descriptor with ``os.writev``; safe to share between threads."""

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self._lock = threading.Lock()
        self._iov_max = _iov_max()

    def write(self, chunks: Sequence[bytes | memoryview]) -> None:
        """Write one frame whose body is the concatenation of ``chunks``."""
        self.write_many((chunks,))

    def write_many(self, frames: Sequence[Sequence[bytes | memoryview]]) -> None:
        """Write several frames, in order and together, in as few system calls as possible."""
        bufs: list[bytes | memoryview] = []
        sizes: list[int] = []
        for chunks in frames:
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
            if total > MAX_FRAME:
                raise FrameError(f"frame of {total} bytes does not fit a 4-byte length")
            bufs[at] = _header.pack(total)
        with self._lock:
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
