"""A large job's copies in chunks on two streams: straight from and into pinned host memory,
staged through pinned chunks where the host memory is not pinned.

A lone large job on one stream copies all of its input in, computes, and copies all of its
output back, one after the other, and a staged copy first packs every byte into pinned
staging. In chunks on two streams, the copy engine that reads the host (host to device)
works on chunk ``i + 1`` while the kernel runs on chunk ``i`` and the other copy engine
writes chunk ``i - 1`` back, and staging packs one chunk while the previous one is copied.
Host memory that is registered (``hostmem.Pinning``: an operand slot, a result buffer) is
copied from and into directly, with no packing at all; other host memory is packed into
pinned chunks, two per operand and two for the result, each reused once the copy that read
or wrote it has finished (an event per chunk).

A fresh mapping (a job's own operand file, mapped once) can be registered for the one job
(``register``) where ``register_min`` says that pays: registering costs a walk over every
page, which ``calibrate`` times against the staged copy once per device.

This module takes the driver as an argument (``pycuda.driver``, or the test double
``test/python/cudadouble.py``) and launches through a callback, so that its ordering can be
checked on a machine without a GPU.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..hostmem import Pinning

#: Bytes per chunk of each operand: small enough that the first chunk's copy starts soon
#: and the chunks overlap, large enough that each copy runs at the bus's speed.
CHUNK_BYTES = 8 << 20
#: Jobs whose operands are smaller than this run as one copy in, one launch, one copy out.
PIPELINE_MIN = 4 << 20
#: Operands smaller than this are never looked for among the registered ranges: shared
#: memory carries nothing so small.
PINNED_MIN = 64 << 10
#: ``register_min`` where registering a fresh mapping for one job never pays.
NEVER = 1 << 62
#: The sizes ``calibrate`` compares the two ways at (bytes).
CALIBRATION_SIZES = (4 << 20, 32 << 20)

#: ``compute(start, count, stream)``: queue the kernel on elements ``start`` to
#: ``start + count`` of the job, on ``stream``.
Compute = Callable[[int, int, Any], None]
#: ``pack(dst, src)``: copy host bytes (in parallel where large).
Pack = Callable[[np.ndarray, np.ndarray], None]


@dataclass(frozen=True, slots=True)
class Upload:
    """An operand to copy in: ``host``'s elements to device address ``ptr``. ``pinned``:
    whether ``host`` is pinned memory (``None``: as the device's ``Pinning`` says)."""

    ptr: int
    host: np.ndarray
    pinned: bool | None = None


@dataclass(frozen=True, slots=True)
class Download:
    """A result to copy out: device address ``ptr``'s elements into ``host``; ``pinned`` as
    for ``Upload`` (the device's own pinned staging says ``True``)."""

    ptr: int
    host: np.ndarray
    pinned: bool | None = None


class Chunks:
    """Pinned chunk buffers, grown on demand: ``get(key, nbytes)`` is a byte array of at
    least ``nbytes`` for each key (an operand's or the result's, and which of its two)."""

    def __init__(self, allocate: Callable[[int], np.ndarray]) -> None:
        self._allocate = allocate
        self._buffers: dict[Any, np.ndarray] = {}

    def get(self, key: Any, nbytes: int) -> np.ndarray:
        buffer = self._buffers.get(key)
        if buffer is None or buffer.nbytes < nbytes:
            self._buffers[key] = buffer = self._allocate(nbytes)
        return buffer[:nbytes]

    def close(self, free: Callable[[np.ndarray], None]) -> None:
        for buffer in self._buffers.values():
            free(buffer)
        self._buffers.clear()


class Pipeline:
    """One device's chunked copies (see the module doc), on its two streams."""

    def __init__(self, driver: Any, streams: Sequence[Any], chunks: Chunks,
                 pinning: Pinning | None, pack: Pack) -> None:
        self._drv = driver
        self._streams = list(streams)
        self._chunks = chunks
        self._pinning = pinning
        self._pack = pack
        self._events: dict[Any, Any] = {}
        self.register_min = NEVER
        self.staged = 0  # chunks copied through staging, for tests and info
        self.direct = 0  # chunks copied straight from or into host memory

    def run(self, count: int, uploads: Sequence[Upload], compute: Compute | None,
            download: Download | None, itemsize: int = 4) -> None:
        """Copy ``count`` elements of each upload in, run ``compute`` on each chunk, and
        copy the result out, in chunks over the streams; returns when all is done."""
        temporary = [u.host for u in uploads if u.pinned is None and self._register(u.host)]
        if (download is not None and download.pinned is None
                and self._register(download.host)):
            temporary.append(download.host)
        try:
            self._run(count, uploads, compute, download, itemsize)
        finally:
            for host in temporary:
                self._unregister(host)

    def _run(self, count: int, uploads: Sequence[Upload], compute: Compute | None,
             download: Download | None, itemsize: int) -> None:
        step = max(1, CHUNK_BYTES // itemsize)
        starts = range(0, count, step)
        direct_in = [self._pinned(u.host, u.pinned) for u in uploads]
        direct_out = download is not None and self._pinned(download.host, download.pinned)
        pending: tuple[int, int, int] | None = None  # a staged result chunk to unpack
        for i, start in enumerate(starts):
            n = min(step, count - start)
            slot = i % len(self._streams)
            stream = self._streams[slot]
            for k, upload in enumerate(uploads):
                self._upload(upload, start, n, itemsize, stream, slot, k, direct_in[k])
            if compute is not None:
                compute(start, n, stream)
            if download is not None:
                self._download(download, start, n, itemsize, stream, slot, direct_out)
                if not direct_out:
                    if pending is not None:
                        self._unpack(download, *pending, itemsize)
                    pending = (slot, start, n)
        if pending is not None and download is not None:
            self._unpack(download, *pending, itemsize)
        for stream in self._streams[: len(starts)]:  # a job of one chunk used one stream
            stream.synchronize()

    def _upload(self, upload: Upload, start: int, n: int, itemsize: int, stream: Any,
                slot: int, k: int, direct: bool) -> None:
        src = upload.host[start : start + n]
        at = upload.ptr + start * itemsize
        if direct:
            self._drv.memcpy_htod_async(at, src, stream)
            self.direct += 1
            return
        event = self._event(("in", k, slot))
        event.synchronize()  # this chunk buffer's last copy has read it
        staged = self._chunks.get(("in", k, slot), n * itemsize)
        self._pack(staged, src.view(np.uint8))
        self._drv.memcpy_htod_async(at, staged, stream)
        event.record(stream)
        self.staged += 1

    def _download(self, download: Download, start: int, n: int, itemsize: int,
                  stream: Any, slot: int, direct: bool) -> None:
        at = download.ptr + start * itemsize
        if direct:
            self._drv.memcpy_dtoh_async(download.host[start : start + n], at, stream)
            self.direct += 1
            return
        staged = self._chunks.get(("out", slot), n * itemsize)
        self._drv.memcpy_dtoh_async(staged, at, stream)
        self._event(("out", slot)).record(stream)
        self.staged += 1

    def _unpack(self, download: Download, slot: int, start: int, n: int,
                itemsize: int) -> None:
        self._event(("out", slot)).synchronize()
        staged = self._chunks.get(("out", slot), n * itemsize)
        self._pack(download.host[start : start + n].view(np.uint8), staged)

    def _event(self, key: Any) -> Any:
        """The event recorded after the last copy through chunk buffer ``key``."""
        event = self._events.get(key)
        if event is None:
            self._events[key] = event = self._drv.Event()
        return event

    # -- host memory -------------------------------------------------------------------------

    def _pinned(self, host: np.ndarray, pinned: bool | None) -> bool:
        if pinned is not None:
            return pinned
        return self._pinning is not None and self._pinning.covers(host)

    def _register(self, host: np.ndarray) -> bool:
        """Register ``host`` for this job alone, where it is a fresh mapping large enough
        that registering pays (``register_min``); whether it was."""
        if (self._pinning is None or host.nbytes < self.register_min
                or not _mapped(host) or self._pinning.covers(host)):
            return False
        view = _whole_pages(host)
        return view is not None and self._pinning.pin(view)

    def _unregister(self, host: np.ndarray) -> None:
        assert self._pinning is not None
        view = _whole_pages(host)
        if view is not None:
            self._pinning.unpin(view)

    # -- choosing ----------------------------------------------------------------------------

    def calibrate(self, ptr: int, sizes: Sequence[int] = CALIBRATION_SIZES,
                  clock: Callable[[], float] = time.perf_counter) -> list[Timing]:
        """Time, at each size, copying a fresh mapping in through staging against
        registering it, copying it straight in and unregistering it (device address
        ``ptr`` holds the largest); set ``register_min`` to the smallest size from which
        registering was faster at every size timed, and return the timings."""
        timings = [self._time(ptr, size, clock) for size in sizes]
        self.register_min = choose_register_min(timings)
        return timings

    def _time(self, ptr: int, size: int, clock: Callable[[], float]) -> Timing:
        """One size's timings, each on a mapping of its own of the same file: fresh, as a
        job's operand file is when the worker maps it (written, but not yet mapped)."""
        saved = self.register_min

        def copy_in(host: np.ndarray) -> None:
            self.run(size, [Upload(ptr, host)], None, None, itemsize=1)

        def copy_out(host: np.ndarray) -> None:
            self.run(size, [], None, Download(ptr, host), itemsize=1)

        def timed(copy: Callable[[np.ndarray], None], host: np.ndarray) -> float:
            t0 = clock()
            copy(host)
            return clock() - t0

        with FreshFile(size) as file:
            try:
                self.register_min = NEVER
                copy_in(file.map())  # the chunk buffers made, not timed
                copy_out(file.map())
                staged_in = timed(copy_in, file.map())
                staged_out = timed(copy_out, file.map())
                self.register_min = 0  # registered for the one copy
                registered_in = timed(copy_in, file.map())
                self.register_min = NEVER
                pinned_in, pinned_out = (self._pinned_copy(copy, file.map(), timed)
                                         for copy in (copy_in, copy_out))
            finally:
                self.register_min = saved
        return Timing(size, staged_in, registered_in, pinned_in, staged_out, pinned_out)

    def _pinned_copy(self, copy: Callable[[np.ndarray], None], host: np.ndarray,
                     timed: Callable[..., float]) -> float:
        """A copy's seconds from or into memory registered beforehand (as a slot or a result
        buffer is); NaN where it could not be registered."""
        view = _whole_pages(host)
        if self._pinning is None or view is None or not self._pinning.pin(view):
            return float("nan")
        try:
            return timed(copy, host)
        finally:
            self._pinning.unpin(view)


@dataclass(frozen=True, slots=True)
class Timing:
    """One size's copies (seconds): in through staging, in registered for the copy, in from
    memory registered before; out through staging, out into memory registered before."""

    nbytes: int
    staged_s: float
    registered_s: float
    pinned_s: float = float("nan")
    staged_out_s: float = float("nan")
    pinned_out_s: float = float("nan")


def choose_register_min(timings: Sequence[Timing]) -> int:
    """The smallest size from which registering for one copy beat staging at every larger
    size timed; ``NEVER`` where it never did."""
    best = NEVER
    for timing in sorted(timings, key=lambda t: t.nbytes, reverse=True):
        if timing.registered_s >= timing.staged_s:
            break
        best = timing.nbytes
    return best


class FreshFile:
    """A shared-memory file of ``nbytes`` written once, as Erlang writes an operand, and
    mapped afresh as often as asked (``map``): each mapping's pages are the file's, not yet
    in this process's page tables."""

    def __init__(self, nbytes: int) -> None:
        self.nbytes = nbytes
        self._fd = os.memfd_create("erlcuda-calibration", os.MFD_CLOEXEC)
        self._maps: list[mmap.mmap] = []
        try:
            chunk = b"\1" * min(nbytes, 1 << 20)
            done = 0
            while done < nbytes:
                done += os.write(self._fd, chunk[: nbytes - done])
        except OSError:
            os.close(self._fd)
            raise

    def map(self) -> np.ndarray:
        memory = mmap.mmap(self._fd, self.nbytes, flags=mmap.MAP_SHARED,
                           prot=mmap.PROT_READ | mmap.PROT_WRITE)
        self._maps.append(memory)
        return np.frombuffer(memory, np.uint8)

    def __enter__(self) -> FreshFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self._maps.clear()  # unmapped as their last views go
        os.close(self._fd)


def _mapped(host: np.ndarray) -> bool:
    """Whether ``host`` is memory of a file mapping (``mmap``, or a ``shm.Span``'s), whose
    pages its mapping covers to the end of the last one: nothing else is registered."""
    base: object = host
    while isinstance(base, np.ndarray):
        base = base.base
    if isinstance(base, memoryview):
        base = base.obj
    return isinstance(base, (mmap.mmap, ctypes.Array))


def _whole_pages(host: np.ndarray) -> np.ndarray | None:
    """``host``'s memory through the end of its last page, where it starts a page (a
    mapping's memory does, and its mapping covers whole pages); else ``None``. Read-only
    where ``host`` is (its pages may be mapped so: registered read-only, then)."""
    start = host.ctypes.data
    if start % mmap.PAGESIZE or not host.nbytes:
        return None
    size = -(-host.nbytes // mmap.PAGESIZE) * mmap.PAGESIZE
    view = np.frombuffer((ctypes.c_char * size).from_address(start), np.uint8)
    if not host.flags.writeable:
        view.flags.writeable = False
    return view
