"""Host memory a device copies straight from and into: ranges registered as pinned
(page-locked) memory, within one budget for the whole worker.

A GPU copies from pinned memory at the bus's speed and from pageable memory through the
driver's own staging, several times slower; erlcuda's staging buffers are pinned for that
reason, at the cost of one more copy of every byte. Shared-memory files that are mapped
again and again (operand slots and result buffers, ``slots.py``) are worth registering
once, so that the device reads operands straight from the file's pages and writes results
into them. Registering costs time (the kernel walks and locks every page), so a range is
registered only where it pays (``Device.pinning``'s user decides) and for as long as it
stays mapped.

Pinned pages cannot be swapped or reclaimed: a host pinned beyond its means stalls or
kills other processes. ``Budget`` bounds the bytes registered at once for the whole
worker (``DEFAULT_LIMIT``: an eighth of the machine's memory, at most 4 GiB; ``serve
--pin-limit`` sets it, 0 turns registration off); a registration that would go over it is
simply not made, and the copy is staged as before.

``Pinning`` is one device's view: the ranges it registered, which a copy asks about
(``covers``). Its ``Pinner`` does the registering (the cuda backend's wraps
``cuMemHostRegister``; tests use a double), on the thread that owns the device.
"""

from __future__ import annotations

import os
import threading
import weakref
from collections.abc import Callable
from typing import Protocol

import numpy as np

__all__ = ["DEFAULT_LIMIT", "Addresses", "Budget", "PinError", "Pinner", "Pinning", "address",
           "default_limit"]

#: The most bytes of host memory the worker keeps registered at once, by default.
MAX_DEFAULT_LIMIT = 4 << 30


class PinError(Exception):
    """A range could not be registered (the driver refused it)."""


class Pinner(Protocol):
    """Registers host memory with a device's driver."""

    def pin(self, view: np.ndarray) -> Callable[[], None]:
        """Register ``view``'s bytes (a contiguous byte array of whole pages); the function
        that undoes it. Raises ``PinError``."""
        ...


def address(array: np.ndarray) -> int:
    """Where ``array``'s first element lies in host memory (without ``ctypes.data``'s
    object made for each call)."""
    return int(array.__array_interface__["data"][0])


class Addresses:
    """``address``, remembered for arrays that come again and again: the views of its slots
    that a lane runs one lone job after another on. Looked up by identity through a weak
    reference, so that an array gone is never taken for a new one given its id, and the
    cache keeps no mapping alive; only views are remembered, whose data never moves (an
    array that owns its data may be resized)."""

    #: Arrays remembered at most; all are forgotten when it is reached.
    LIMIT = 64

    def __init__(self) -> None:
        self._known: dict[int, tuple[weakref.ref[np.ndarray], int]] = {}

    def __call__(self, array: np.ndarray) -> int:
        known = self._known.get(id(array))
        if known is not None and known[0]() is array:
            return known[1]
        at = address(array)
        if array.base is not None:
            if len(self._known) >= self.LIMIT:
                self._known.clear()
            self._known[id(array)] = (weakref.ref(array), at)
        return at


def default_limit(ram: int | None = None) -> int:
    """An eighth of the machine's memory, at most ``MAX_DEFAULT_LIMIT``."""
    if ram is None:
        try:
            ram = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (ValueError, OSError):
            ram = 8 << 30
    return min(max(ram, 0) // 8, MAX_DEFAULT_LIMIT)


class Budget:
    """Bytes registered at once, over every device of the worker: at most ``limit``."""

    def __init__(self, limit: int) -> None:
        self.limit = max(0, limit)
        self.used = 0
        self.peak = 0
        self._lock = threading.Lock()

    def take(self, nbytes: int) -> bool:
        with self._lock:
            if self.used + nbytes > self.limit:
                return False
            self.used += nbytes
            self.peak = max(self.peak, self.used)
            return True

    def give(self, nbytes: int) -> None:
        with self._lock:
            self.used = max(0, self.used - nbytes)


#: The worker's budget (``cli`` sets its limit from ``--pin-limit``).
DEFAULT_LIMIT = default_limit()
BUDGET = Budget(DEFAULT_LIMIT)


class Pinning:
    """The ranges one device registered: pinned with ``pin``, released with ``unpin`` (or
    all at once with ``close``), asked about with ``covers``. Used by the device's own
    thread only."""

    def __init__(self, pinner: Pinner, budget: Budget = BUDGET) -> None:
        self._pinner = pinner
        self._budget = budget
        # start address -> (end address, unpin)
        self._ranges: dict[int, tuple[int, Callable[[], None]]] = {}
        self.pins = 0  # registrations made, for info and tests
        self.failures = 0

    @property
    def bytes(self) -> int:
        return sum(end - start for start, (end, _) in self._ranges.items())

    @property
    def count(self) -> int:
        return len(self._ranges)

    def pin(self, view: np.ndarray) -> bool:
        """Register ``view`` (contiguous bytes): ``False`` where the budget has no room or
        the driver refused, and nothing is registered."""
        start = view.ctypes.data
        nbytes = view.nbytes
        if nbytes == 0 or start in self._ranges or not self._budget.take(nbytes):
            return False
        try:
            unpin = self._pinner.pin(view)
        except PinError:
            self._budget.give(nbytes)
            self.failures += 1
            return False
        self._ranges[start] = (start + nbytes, unpin)
        self.pins += 1
        return True

    def unpin(self, view: np.ndarray) -> None:
        """Undo ``pin(view)``; nothing where ``view`` is not registered."""
        start = view.ctypes.data
        entry = self._ranges.pop(start, None)
        if entry is None:
            return
        end, unpin = entry
        try:
            unpin()
        finally:
            self._budget.give(end - start)

    def covers(self, array: np.ndarray) -> bool:
        """Whether all of ``array``'s bytes lie in one registered range."""
        if not self._ranges:
            return False
        start = array.ctypes.data
        end = start + array.nbytes
        for low, (high, _) in self._ranges.items():
            if low <= start and end <= high:
                return True
        return False

    def close(self) -> None:
        """Undo every registration (before the device's context goes)."""
        for start in list(self._ranges):
            end, unpin = self._ranges.pop(start)
            try:
                unpin()
            except Exception:
                pass  # a lost context: the driver releases its pins with it
            finally:
                self._budget.give(end - start)
