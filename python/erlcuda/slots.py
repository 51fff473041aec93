"""Shared-memory files kept from job to job: Erlang's operand slots and the worker's result
buffers, each mapped once and pinned through the device where the budget allows.

A new file costs both sides: its pages are allocated and zeroed as they are first written,
Erlang's writes of a fresh file run at a fraction of the speed of writes over pages that
exist, and a fresh mapping can only be copied from through pinned staging (registering
it costs more than the copy). Files that are used again avoid all of that: the pages stay,
the mapping stays, and a registration made once lets the device copy straight from an
operand's pages and straight into a result's.

Operand slots (``OperandSlots``) are Erlang's: a slot ``s<N>`` is a set of part files
``s<N>.0``, ``s<N>.1``, ... of one part size (``erlcuda_shm_slots``), written again for
each job that takes it; a launch names the slot as it would name a job's own files. The
worker maps a slot's parts side by side into one span the first time it sees it, keeps the
mapping, and registers it the second time (a slot used once is not worth the
registration). It never unlinks a slot's files: Erlang owns them, and deletes a slot that
goes idle, or whose job ended while it may still have been read (a caller that died or
stopped waiting). A slot whose files are gone, or that no job used for ``IDLE_S``, is
unregistered and unmapped (``sweep``).

Result buffers (``ResultBuffers``) are the worker's: a file ``p<Lane>-<N>`` of whole MiBs,
its pages allocated once (so that a full ``/dev/shm`` fails here, not as a fault in the
middle of a copy), mapped and registered once. A job's vector result is written straight
into a free buffer (by the device's copy where the buffer is pinned) and given the name
Erlang reads, ``r<JobId>.0``, as a second link to the same file: Erlang reads the result
and deletes that name, and the buffer is free again once its link count is back to one.
Nothing is ever written to a file Erlang may still be reading. A buffer holds at least its
result's bytes (Erlang reads the result's length from its start). Free buffers that no
result used for ``IDLE_S`` are dropped.

Both are a lane's own: made, registered, used and dropped on the thread that owns the
device, which sweeps them between jobs and when it has been idle.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from .hostmem import Pinning
from .shm import (
    MAX_PARTS,
    FileArg,
    FileResult,
    SharedFolder,
    ShmError,
    Span,
    check_arg,
    open_regular,
    part_sizes,
    result_part_bytes,
)

__all__ = ["IDLE_S", "SLOT_PREFIX", "OperandSlots", "ResultBuffers", "ResultTarget"]

#: Erlang's operand slots are named ``s<N>`` (``erlcuda_shm_slots``); a job's own operand
#: files ``i<JobId>-<Arg>``.
SLOT_PREFIX = "s"
#: A slot or buffer that no job used for this long (seconds) is dropped.
IDLE_S = 10.0
#: How often (seconds) a lane sweeps at most.
SWEEP_S = 1.0
#: The most bytes of result buffers a lane keeps (free or in use).
RESULT_BYTES = 1 << 30


class _Slot:
    __slots__ = ("last", "name", "part_bytes", "parts", "pinned", "refused", "span", "uses")

    def __init__(self, name: str, part_bytes: int, now: float) -> None:
        self.name = name
        self.part_bytes = part_bytes
        self.span = Span(MAX_PARTS * part_bytes)
        self.parts = 0  # parts mapped, from the first
        self.pinned = 0  # bytes registered, from the start
        self.refused = False  # the last registration was refused: not tried again
        self.uses = 0
        self.last = now


class OperandSlots:
    """A lane's mappings of Erlang's operand slots (see the module doc)."""

    def __init__(self, folder: SharedFolder, pinning: Pinning | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 idle_s: float = IDLE_S) -> None:
        self._folder = folder
        self._pinning = pinning
        self._clock = clock
        self._idle_s = idle_s
        self._slots: dict[str, _Slot] = {}

    @staticmethod
    def owns(name: str) -> bool:
        """Whether a launch's file operand ``name`` is a slot (else a job's own files)."""
        digits = name[1:]
        return name[:1] == SLOT_PREFIX and digits.isascii() and digits.isdigit()

    def __len__(self) -> int:
        return len(self._slots)

    @property
    def pinned_bytes(self) -> int:
        return sum(s.pinned for s in self._slots.values())

    def open(self, arg: FileArg) -> np.ndarray:
        """The operand's elements: a read-only view of the slot's mapping, the slot mapped
        (and, once used again, registered) as needed."""
        check_arg(arg)
        count = len(part_sizes(arg.nbytes, arg.part_bytes))
        now = self._clock()
        slot = self._slots.get(arg.name)
        if slot is not None and slot.part_bytes != arg.part_bytes:
            self._drop(slot)  # a slot's part size never changes: this is another slot
            slot = None
        if slot is None:
            try:
                slot = _Slot(arg.name, arg.part_bytes, now)
            except OSError as exc:
                raise ShmError(f"shared memory: {arg.name:.80}: {exc}") from exc
            self._slots[arg.name] = slot
        while slot.parts < count:
            self._map_part(slot)
        slot.uses += 1
        slot.last = now
        if not arg.nbytes:
            return np.empty(0, arg.dtype)
        if slot.uses >= 2:
            self._pin(slot)
        return slot.span.array(arg.dtype, arg.nbytes)

    def _map_part(self, slot: _Slot) -> None:
        k = slot.parts
        name = f"{slot.name}.{k}"
        path = os.path.join(self._folder.path, name)
        try:
            fd, info = open_regular(path, os.O_RDWR)
        except OSError as exc:
            raise ShmError(f"shared memory: {name:.80}: {exc.strerror}") from exc
        try:
            if info.st_size != slot.part_bytes:
                raise ShmError(f"shared memory: {name:.80} holds {info.st_size} bytes, a "
                               f"slot's part {slot.part_bytes}")
            slot.span.map(k * slot.part_bytes, fd, slot.part_bytes, writable=True)
        except OSError as exc:
            raise ShmError(f"shared memory: {name:.80}: {exc}") from exc
        finally:
            os.close(fd)
        slot.parts = k + 1

    def _pin(self, slot: _Slot) -> None:
        """Register the slot's mapped parts, as one range (again, where it grew)."""
        want = slot.parts * slot.part_bytes
        if self._pinning is None or slot.refused or slot.pinned >= want:
            return
        if slot.pinned:
            self._pinning.unpin(slot.span.bytes(0, slot.pinned))
            slot.pinned = 0
        if self._pinning.pin(slot.span.bytes(0, want)):
            slot.pinned = want
        else:
            slot.refused = True

    def _drop(self, slot: _Slot) -> None:
        """Forget a slot: unregistered now, unmapped once no view of it is left."""
        if slot.pinned and self._pinning is not None:
            self._pinning.unpin(slot.span.bytes(0, slot.pinned))
        slot.pinned = 0
        self._slots.pop(slot.name, None)

    def sweep(self, now: float | None = None) -> None:
        """Drop the slots whose files Erlang deleted, and those idle for ``idle_s``."""
        now = self._clock() if now is None else now
        for slot in list(self._slots.values()):
            if now - slot.last > self._idle_s or not os.path.lexists(
                    os.path.join(self._folder.path, f"{slot.name}.0")):
                self._drop(slot)

    def close(self) -> None:
        for slot in list(self._slots.values()):
            self._drop(slot)


class _Buffer:
    __slots__ = ("capacity", "fd", "last", "path", "pinned", "reserved", "span")

    def __init__(self, path: str, fd: int, capacity: int, span: Span, now: float) -> None:
        self.path = path
        self.fd = fd
        self.capacity = capacity
        self.span = span
        self.pinned = False
        self.reserved = False  # taken for a result not yet linked or given back
        self.last = now

    def free(self) -> bool:
        """Not taken, and no name but its own: Erlang has read and deleted the last
        result it carried."""
        if self.reserved:
            return False
        try:
            return os.fstat(self.fd).st_nlink == 1
        except OSError:
            return False


class ResultTarget:
    """A result buffer taken for one job's vector result: write ``array``, then ``commit``
    (the record to send), or ``release`` it unused."""

    def __init__(self, pool: ResultBuffers, buffer: _Buffer, nbytes: int) -> None:
        self._pool = pool
        self._buffer = buffer
        self.nbytes = nbytes
        self.array = buffer.span.bytes(0, nbytes)

    @property
    def pinned(self) -> bool:
        return self._buffer.pinned

    def view(self, dtype: np.dtype[Any]) -> np.ndarray:
        """``array`` as elements of ``dtype`` (writable)."""
        return self.array.view(dtype)

    def commit(self, job_id: int) -> FileResult:
        """Give the buffer the result's name, ``r<JobId>.0`` (a new link: nothing standing
        there is ever written); the record. ``ShmError`` where the name cannot be made, and
        the buffer is released."""
        path = os.path.join(self._pool.folder.path, f"r{job_id}.0")
        buffer = self._buffer
        try:
            os.link(buffer.path, path, follow_symlinks=False)
        except OSError as exc:
            self.release()
            raise ShmError(f"shared memory: r{job_id}: {exc.strerror}") from exc
        buffer.reserved = False
        buffer.last = self._pool.clock()
        return FileResult(self.nbytes, result_part_bytes(self.nbytes))

    def release(self) -> None:
        self._buffer.reserved = False


class ResultBuffers:
    """A lane's result buffers (see the module doc); ``limit``: their bytes at most."""

    def __init__(self, folder: SharedFolder, lane: int, pinning: Pinning | None = None,
                 limit: int = RESULT_BYTES, clock: Callable[[], float] = time.monotonic,
                 idle_s: float = IDLE_S) -> None:
        self.folder = folder
        self.clock = clock
        self._idle_s = idle_s
        self._lane = lane
        self._pinning = pinning
        self._limit = limit
        self._buffers: list[_Buffer] = []
        self._made = 0

    def __len__(self) -> int:
        return len(self._buffers)

    @property
    def bytes(self) -> int:
        return sum(b.capacity for b in self._buffers)

    @property
    def pinned_bytes(self) -> int:
        return sum(b.capacity for b in self._buffers if b.pinned)

    def take(self, nbytes: int) -> ResultTarget | None:
        """A buffer for a result of ``nbytes``: a free one of about its size, else a new
        one; ``None`` where there is none to have (the result then goes the old way)."""
        if nbytes <= 0:
            return None
        size = result_part_bytes(nbytes)
        fits = [b for b in self._buffers if nbytes <= b.capacity <= 2 * size and b.free()]
        buffer = min(fits, key=lambda b: b.capacity) if fits else self._make(size)
        if buffer is None:
            return None
        buffer.reserved = True
        buffer.last = self.clock()
        return ResultTarget(self, buffer, nbytes)

    def _make(self, capacity: int) -> _Buffer | None:
        if self.bytes + capacity > self._limit:
            self._evict(capacity)
            if self.bytes + capacity > self._limit:
                return None
        path = os.path.join(self.folder.path, f"p{self._lane}-{self._made}")
        self._made += 1
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                         | os.O_CLOEXEC, 0o600)
        except OSError:
            return None
        try:
            os.posix_fallocate(fd, 0, capacity)  # a full /dev/shm fails here, not mid-copy
            span = Span(capacity)
            span.map(0, fd, capacity, writable=True)
        except OSError:
            os.close(fd)
            _unlink(path)
            return None
        buffer = _Buffer(path, fd, capacity, span, self.clock())
        if self._pinning is not None:
            buffer.pinned = self._pinning.pin(span.bytes(0, capacity))
        self._buffers.append(buffer)
        return buffer

    def _evict(self, room: int) -> None:
        """Drop free buffers, the largest first, until ``room`` more bytes fit."""
        for buffer in sorted(self._buffers, key=lambda b: -b.capacity):
            if self.bytes + room <= self._limit:
                return
            if buffer.free():
                self._drop(buffer)

    def _drop(self, buffer: _Buffer) -> None:
        if buffer.pinned and self._pinning is not None:
            self._pinning.unpin(buffer.span.bytes(0, buffer.capacity))
        buffer.pinned = False
        os.close(buffer.fd)
        _unlink(buffer.path)
        self._buffers.remove(buffer)

    def sweep(self, now: float | None = None) -> None:
        """Drop the free buffers that no result used for ``idle_s``."""
        now = self.clock() if now is None else now
        for buffer in list(self._buffers):
            if now - buffer.last > self._idle_s and buffer.free():
                self._drop(buffer)

    def close(self) -> None:
        """Drop every buffer (a result Erlang has not read yet keeps its own name)."""
        for buffer in list(self._buffers):
            buffer.reserved = False
            self._drop(buffer)


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass
