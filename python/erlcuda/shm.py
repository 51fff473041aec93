"""Large operands and results through shared memory instead of the port's pipe.

Erlang gives each worker a folder of its own in ``/dev/shm`` (``--shm-dir``, named
``erlcuda-*``). A caller writes an operand over the threshold to files there and the launch
names them (``arg.file``); the worker maps them and unlinks them at once, so the names are
gone while the job runs and the memory with the last view of it. A result asked for in a
file (``flags.result_file``) is written into the result slot the launch names (Erlang's
file, ``slots.py``) and the record says only its size and part size; Erlang reads it
from the file it holds open.

A vector is a series of part files, ``<Name>.0``, ``<Name>.1``, ... of one size (the last one
shorter). Erlang writes an operand as up to 8 parts, each from a process of its own: a tmpfs
file is written under its inode's lock, one core at a time, and one 64 MiB file took five
times as long as eight parts written at once. The worker maps an operand's parts side by
side into one span of address space, so the backends see one contiguous read-only array.
Only regular files are used: nothing is opened through a symlink or waited on as a FIFO.

Clean-up never depends on this process ending well: a reaper (a small process of its own,
started here) waits for the worker to end, however it ends (SIGKILL included, or the node's
death, which kills the worker), and then removes the whole folder. Erlang also removes it
when it sees the worker die. A worker holds a lock on its folder's ``.lock`` for its life,
and at start removes the folders beside its own whose lock nobody holds (their worker and
reaper both died): only folders of its own user, at least a minute old, never following a
symlink. It sweeps again every minute while it lives, on a thread of its own: a folder too
young at its start (a node killed with its worker and reaper, and started again within the
minute) or left later by another node goes then, not only when a worker next starts. The
lock, not a process id, tells a live folder from a stale one, so nodes in other PID
namespaces that share the folder's parent are safe.
"""

from __future__ import annotations

import ctypes
import fcntl
import logging
import mmap
import os
import shutil
import stat
import subprocess
import sys
import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from . import elements

__all__ = ["FileArg", "FileResult", "ResultSlot", "SharedFolder", "ShmError"]

log = logging.getLogger("erlcuda.shm")

#: The prefix of every folder Erlang makes; nothing else is ever removed.
PREFIX = "erlcuda-"
#: A folder younger than this is never taken for stale: its worker may not hold its lock yet.
STALE_AFTER_S = 60.0
LOCK = ".lock"
#: Part sizes are multiples of this (Erlang's ``erlcuda_shm``).
PART_UNIT = 1 << 20
#: An operand is in this many parts at most, as Erlang cuts it: each part is a mapping of its
#: own while the job waits, and a process may hold only so many.
MAX_PARTS = elements.SHM_PARTS

_REAPER = """
import os, shutil, sys
try:
    while os.read(0, 4096):
        pass
except OSError:
    pass
shutil.rmtree(sys.argv[1], ignore_errors=True)
"""


class ShmError(Exception):
    """A shared-memory file could not be used. ``str(exc)`` is the reason sent to Erlang."""


class NoFolder(ShmError):
    """A launch named a file, and this worker has no folder: none was given, or it could not
    take it (it said so in its hello, and Erlang sends the launches after that through the
    pipe)."""


@dataclass(frozen=True, slots=True)
class FileArg:
    """A vector argument in the part files ``name.<K>`` of the worker's folder: ``nbytes``
    bytes of ``dtype`` elements, ``part_bytes`` to a file (what the launch frame says)."""

    name: str
    dtype: np.dtype[Any]
    nbytes: int
    part_bytes: int


@dataclass(frozen=True, slots=True)
class ResultSlot:
    """Where ``flags.result_file`` puts a vector result: from the start of Erlang's part
    file ``<name>.0`` of ``part_bytes`` bytes (a slot, ``slots.py``)."""

    name: str
    part_bytes: int


@dataclass(frozen=True, slots=True)
class FileResult:
    """A vector result written into its result slot: what its record carries."""

    nbytes: int
    part_bytes: int


def part_sizes(nbytes: int, part_bytes: int) -> list[int]:
    """The sizes of a vector's part files (one, maybe empty, for an empty vector)."""
    count = max(1, -(-nbytes // part_bytes))
    return [min(part_bytes, nbytes - k * part_bytes) for k in range(count)]


#: What ``_claim_stale`` answers for a stale folder with no lock file to hold.
NO_LOCK = -1


def _claim_stale(path: str) -> int | None:
    """For a folder of this user, old enough, whose lock nobody holds: its lock, now held
    here (``NO_LOCK`` where it has no lock file), to be held while it is removed, so that
    a worker starting on it meanwhile fails to take it rather than lose its folder
    unawares; ``None`` for any other path."""
    try:
        info = os.lstat(path)
    except OSError:
        return None
    if (not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid()
            or time.time() - info.st_mtime < STALE_AFTER_S):
        return None
    try:
        fd, _ = open_regular(os.path.join(path, LOCK), os.O_RDONLY)
    except FileNotFoundError:
        return NO_LOCK  # its worker never took it
    except (OSError, ShmError):
        return None  # a lock that is no regular file: not one to judge, so left alone
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return None  # held: a live worker's
    return fd


def _plain_name(name: str) -> bool:
    return bool(name) and "/" not in name and "\0" not in name and name not in (".", "..")


def check_arg(arg: FileArg) -> None:
    """``ShmError`` where a launch's file operand could not be Erlang's: a name that is no
    plain file name, parts that are not whole pages, or more parts than Erlang cuts."""
    if not _plain_name(arg.name):
        raise ShmError(f"shared memory: {arg.name!r:.80} is not a file name")
    if arg.part_bytes <= 0 or arg.part_bytes % mmap.ALLOCATIONGRANULARITY:
        raise ShmError(f"shared memory: {arg.name:.80}: parts of {arg.part_bytes} bytes "
                       f"are not whole pages")
    if arg.nbytes > arg.part_bytes * MAX_PARTS:
        raise ShmError(f"shared memory: {arg.name:.80}: {arg.nbytes} bytes in parts of "
                       f"{arg.part_bytes} is over {MAX_PARTS} parts")


class SharedFolder:
    """The worker's folder: inputs are mapped from it, results written to it."""

    def __init__(self, path: str) -> None:
        real = os.path.realpath(path)
        if not os.path.basename(real).startswith(PREFIX):
            raise ShmError(f"{path}: a shared-memory folder's name starts with {PREFIX}")
        if not os.path.isdir(real) or not os.access(real, os.W_OK | os.X_OK):
            raise ShmError(f"{path}: not a writable folder")
        self.path = real
        self._reaper: subprocess.Popen[bytes] | None = None
        self._stop_sweeps = threading.Event()
        try:
            os.chmod(real, 0o700)  # operands are the callers' data: nobody else reads them
            self._lock, _ = open_regular(os.path.join(real, LOCK), os.O_RDWR | os.O_CREAT)
            fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except (OSError, ShmError) as exc:
            raise ShmError(f"{path}: cannot take the folder's lock: {exc}") from exc

    def sweep_stale(self) -> list[str]:
        """Remove the folders beside this one that no worker holds (see above); their
        names."""
        parent = os.path.dirname(self.path)
        removed = []
        try:
            names = os.listdir(parent)
        except OSError:
            return removed
        for name in names:
            path = os.path.join(parent, name)
            held = (_claim_stale(path) if name.startswith(PREFIX) and path != self.path
                    else None)
            if held is None:
                continue
            try:
                shutil.rmtree(path, ignore_errors=True)  # never follows a symlink
            finally:
                if held != NO_LOCK:
                    os.close(held)
            removed.append(name)
        return removed

    def start_sweeps(self, every: float | None = None) -> threading.Thread:
        """Sweep the stale folders now, then every ``every`` seconds (``STALE_AFTER_S`` by
        default) until ``stop_sweeps``: a folder too young to judge now is judged again.
        The later sweeps run on the thread returned, as removing a dead worker's slots may
        take a while and no job should wait for it."""
        self._sweep_logged()
        thread = threading.Thread(target=self.sweep_every,
                                  args=(STALE_AFTER_S if every is None else every,
                                        self._stop_sweeps.wait),
                                  name="erlcuda-shm-sweep", daemon=True)
        thread.start()
        return thread

    def stop_sweeps(self) -> None:
        self._stop_sweeps.set()

    def sweep_every(self, every: float, wait: Callable[[float], bool]) -> None:
        """Sweep each time ``wait(every)`` returns false (the time passed), until it returns
        true (stopped)."""
        while not wait(every):
            try:
                self._sweep_logged()
            except Exception:  # the next sweep tries again; the thread must not end
                log.exception("sweeping the stale shared-memory folders failed")

    def _sweep_logged(self) -> None:
        for name in self.sweep_stale():
            log.info("removed the stale folder %s", name)

    def start_reaper(self) -> None:
        """Start the process that removes the folder once this one has ended."""
        self._reaper = subprocess.Popen(
            [sys.executable, "-I", "-S", "-c", _REAPER, self.path],
            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True)

    def open_input(self, arg: FileArg) -> np.ndarray:
        """The vector's elements, mapped read-only; its files are unlinked once mapped."""
        check_arg(arg)
        sizes = part_sizes(arg.nbytes, arg.part_bytes)
        paths = [os.path.join(self.path, f"{arg.name}.{k}") for k in range(len(sizes))]
        try:
            if len(sizes) == 1:
                fd = _open_part(paths[0], arg.nbytes)
                try:
                    if not arg.nbytes:
                        return np.empty(0, arg.dtype)
                    mapped = mmap.mmap(fd, arg.nbytes, prot=mmap.PROT_READ)
                    return np.frombuffer(mapped, arg.dtype)
                finally:
                    os.close(fd)
            # One part open at a time: a vector of many parts takes one descriptor, not many.
            span = Span(arg.nbytes)
            for k, (path, size) in enumerate(zip(paths, sizes, strict=True)):
                fd = _open_part(path, size)
                try:
                    span.map(k * arg.part_bytes, fd, size)
                finally:
                    os.close(fd)
            return span.array(arg.dtype)
        except OSError as exc:
            raise ShmError(f"shared memory: {arg.name:.80}: {exc}") from exc
        finally:
            for path in paths:
                _unlink(path)  # Erlang deletes them too, when the job ends

    def remove(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def open_regular(path: str, flags: int) -> tuple[int, os.stat_result]:
    """``path`` opened with ``flags`` and its status, where it is a regular file
    (``ShmError`` where it is anything else, ``OSError`` where it cannot be opened).

    Never through a symlink (``O_NOFOLLOW``), and never waiting on a FIFO planted there
    (``O_NONBLOCK``, which changes nothing for a regular file): the type is checked on the
    file opened, so nothing can be swapped in after the check.
    """
    fd = os.open(path, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o600)
    try:
        info = os.fstat(fd)
    except OSError:
        os.close(fd)
        raise
    if not stat.S_ISREG(info.st_mode):
        os.close(fd)
        raise ShmError(f"shared memory: {os.path.basename(path):.80} is not a regular file")
    return fd, info


def _open_part(path: str, size: int) -> int:
    """A part file, opened for reading and checked to hold ``size`` bytes."""
    name = os.path.basename(path)
    try:
        fd, info = open_regular(path, os.O_RDONLY)
    except OSError as exc:
        raise ShmError(f"shared memory: {name:.80}: {exc.strerror}") from exc
    held = info.st_size
    if held != size:
        os.close(fd)
        raise ShmError(f"shared memory: {name:.80} holds {held} bytes, the launch says {size}")
    return fd


_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                       ctypes.c_int, ctypes.c_long]
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_MAP_FAILED = ctypes.c_void_p(-1).value
_MAP_FIXED = 0x10  # the same on Linux and the BSDs; Python's mmap module has no MAP_FIXED
_PROT_NONE = 0


class Span:
    """Part files mapped side by side into one reserved span of address space: one
    contiguous array over all of them, and no copy. The span is unmapped when the last
    view of it goes, and never at the interpreter's exit, where a thread may still read it
    (the process's end unmaps it)."""

    def __init__(self, nbytes: int) -> None:
        self._size = -(-nbytes // mmap.PAGESIZE) * mmap.PAGESIZE
        base = _libc.mmap(None, self._size, _PROT_NONE, mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS,
                          -1, 0)
        if base in (None, _MAP_FAILED):
            raise OSError(ctypes.get_errno(),
                          f"cannot reserve {self._size} bytes of address space")
        self._base: int = base
        self._memory = (ctypes.c_char * nbytes).from_address(base)
        weakref.finalize(self._memory, _libc.munmap, base, self._size).atexit = False

    def map(self, offset: int, fd: int, size: int, *, writable: bool = False) -> None:
        """Map ``size`` bytes of ``fd`` at ``offset`` (a whole number of pages) in the
        span, shared; readable, and writable where ``writable``."""
        at = self._base + offset
        if offset % mmap.PAGESIZE or offset + size > self._size:
            raise OSError(0, f"a part at {offset} of {size} bytes is outside the span")
        prot = mmap.PROT_READ | (mmap.PROT_WRITE if writable else 0)
        got = _libc.mmap(at, size, prot, mmap.MAP_SHARED | _MAP_FIXED, fd, 0)
        if got != at:
            errno = ctypes.get_errno()
            # A failed MAP_FIXED may have unmapped the range: reserve it again, or another
            # mapping could land there and the span's munmap would take it away.
            _libc.mmap(at, size, _PROT_NONE,
                       mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | _MAP_FIXED, -1, 0)
            raise OSError(errno, f"cannot map the part at {offset}")

    def array(self, dtype: np.dtype[Any], nbytes: int | None = None) -> np.ndarray:
        """The first ``nbytes`` (all by default) as a read-only array of ``dtype``.

        Over a read-only view: the pages may be mapped read-only, where a write would
        fault, so the array must not be made writable either."""
        view = memoryview(self._memory).cast("B")
        if nbytes is not None:
            view = view[:nbytes]
        return np.frombuffer(view.toreadonly(), dtype)

    def bytes(self, start: int, stop: int) -> np.ndarray:
        """Bytes ``start`` to ``stop`` as a writable byte array (of parts mapped writable)."""
        return np.frombuffer(memoryview(self._memory).cast("B")[start:stop], np.uint8)
