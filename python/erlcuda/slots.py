"""Shared-memory files kept from job to job: Erlang's slots, which carry operands and
results, each mapped once and pinned through the device where the budget allows.

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

A result slot is a slot of one part that a launch names for its vector result
(``flags.result_file``): the worker writes the result from the part's start (by the
device's copy where the slot is registered) and answers its size; Erlang reads it with one
``pread`` from the file it holds open, and gives the slot back once read. A slot is
Erlang's from end to end, so nothing here waits on what Erlang does with it: the next job
that takes it comes after Erlang read it.

The mappings are a lane's own: made, registered, used and dropped on the thread that owns
the device, which sweeps them between jobs and when it has been idle.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from .hostmem import Pinning
from .shm import (
    MAX_PARTS,
    FileArg,
    FileResult,
    ResultSlot,
    SharedFolder,
    ShmError,
    Span,
    check_arg,
    open_regular,
)

__all__ = ["IDLE_S", "SLOT_PREFIX", "OperandSlots", "ResultTarget"]

#: Erlang's operand slots are named ``s<N>`` (``erlcuda_shm_slots``); a job's own operand
#: files ``i<JobId>-<Arg>``.
SLOT_PREFIX = "s"
#: A slot or buffer that no job used for this long (seconds) is dropped.
IDLE_S = 10.0
#: How often (seconds) a lane sweeps at most.
SWEEP_S = 1.0
_BYTES = np.dtype("u1")


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
        #: Counts every change to what the slots map or register: what was read from them
        #: while it stays the same holds still (``settled``).
        self.changes = 0

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
        slot = self._mapped(arg)
        if not arg.nbytes:
            return np.empty(0, arg.dtype)
        return slot.span.array(arg.dtype, arg.nbytes)

    def registered(self, args: Sequence[FileArg]) -> bool:
        """Whether every operand of ``args`` lies in a slot's registered bytes (once
        ``open`` mapped them): what a device would otherwise look up by address. A slot of
        another part size than an operand's replaced the one its view came from."""
        for arg in args:
            slot = self._slots.get(arg.name)
            if slot is None or slot.part_bytes != arg.part_bytes or slot.pinned < arg.nbytes:
                return False
        return True

    def result(self, where: ResultSlot, nbytes: int) -> ResultTarget:
        """A vector result of ``nbytes`` in the result slot ``where``: a writable view of
        its part from the start. ``ShmError`` where it is no slot, or too small."""
        if not self.owns(where.name):
            raise ShmError(f"shared memory: {where.name!r:.80} is not a slot")
        if nbytes > where.part_bytes:
            raise ShmError(f"shared memory: a result of {nbytes} bytes is over its slot's "
                           f"{where.part_bytes}")
        slot = self._mapped(_whole(where))
        return ResultTarget(slot.span.bytes(0, nbytes), slot.pinned > 0, where.part_bytes)

    def _mapped(self, arg: FileArg) -> _Slot:
        """The slot ``arg`` names, its parts mapped, and registered from its second use."""
        slot = self._slots.get(arg.name)
        if slot is not None and self._ready(slot, arg):
            # mapped (a part at least) and registered whole, or never to be: its name and
            # parts were checked as they were mapped
            slot.uses += 1
            slot.last = self._clock()
            return slot
        self.changes += 1
        check_arg(arg)
        count = max(1, -(-arg.nbytes // arg.part_bytes))  # as many as ``part_sizes``
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
        if arg.nbytes and slot.uses >= 2:
            self._pin(slot)
        return slot

    def _ready(self, slot: _Slot, arg: FileArg) -> bool:
        """Whether ``arg`` lies in what ``slot`` has mapped, registered whole or never to be:
        a use that changes nothing."""
        mapped = slot.parts * slot.part_bytes
        return (slot.parts > 0 and slot.part_bytes == arg.part_bytes and arg.nbytes <= mapped
                and (slot.pinned == mapped or slot.refused or self._pinning is None))

    def settled(self, args: Sequence[FileArg], result: ResultSlot | None) -> bool:
        """Whether the slots of ``args`` and of ``result`` are mapped and registered as
        they will stay while ``changes`` does: their views, and the answer of
        ``registered``, hold for the next job that names them (``touch``)."""
        wanted = list(args)
        if result is not None:
            wanted.append(_whole(result))
        for arg in wanted:
            slot = self._slots.get(arg.name)
            if slot is None or not self._ready(slot, arg):
                return False
        return True

    def touch(self, names: Sequence[str]) -> None:
        """The slots ``names`` are used again, through views read from them before (while
        ``changes`` stayed the same): counted as ``open`` and ``result`` count a use."""
        now = self._clock()
        for name in names:
            slot = self._slots[name]
            slot.uses += 1
            slot.last = now

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
        self.changes += 1
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


def _whole(where: ResultSlot) -> FileArg:
    """A result slot as the operand its one part maps: all of its bytes."""
    return FileArg(where.name, _BYTES, where.part_bytes, where.part_bytes)


class ResultTarget:
    """A job's vector result in its result slot: write ``array`` (or ``view``), then
    ``commit`` for the record to send."""

    __slots__ = ("_part_bytes", "array", "nbytes", "pinned")

    def __init__(self, array: np.ndarray, pinned: bool, part_bytes: int) -> None:
        self.array = array
        self.nbytes = array.nbytes
        self.pinned = pinned
        self._part_bytes = part_bytes

    def view(self, dtype: np.dtype[Any]) -> np.ndarray:
        """``array`` as elements of ``dtype`` (writable)."""
        return self.array.view(dtype)

    def commit(self) -> FileResult:
        return FileResult(self.nbytes, self._part_bytes)
