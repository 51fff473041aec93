"""Large operands and results through shared memory instead of the port's pipe.

Erlang gives each worker a folder of its own in ``/dev/shm`` (``--shm-dir``, named
``erlcuda-*``). A caller writes an operand over the threshold to a file there and the launch
names it (``arg.file``); the worker maps it and unlinks it at once, so the name is gone while
the job runs and the memory with the last view of it. A result asked for in a file
(``flags.result_file``) is written to ``r<JobId>`` and the record says only its size; the
caller's side reads and deletes it.

Clean-up never depends on this process ending well: a reaper (a small process of its own,
started here) waits for the worker to end, however it ends (SIGKILL included, or the node's
death, which kills the worker), and then removes the whole folder. Erlang also removes it
when it sees the worker die. A worker holds a lock on its folder's ``.lock`` for its life,
and at start removes the folders beside its own whose lock nobody holds (their worker and
reaper both died): only folders of its own user, at least a minute old, never following a
symlink. The lock, not a process id, tells a live folder from a stale one, so nodes in other
PID namespaces that share the folder's parent are safe.
"""

from __future__ import annotations

import fcntl
import mmap
import os
import shutil
import stat
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["FileArg", "FileResult", "SharedFolder", "ShmError"]

#: The prefix of every folder Erlang makes; nothing else is ever removed.
PREFIX = "erlcuda-"
#: A folder younger than this is never taken for stale: its worker may not hold its lock yet.
STALE_AFTER_S = 60.0
LOCK = ".lock"

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


@dataclass(frozen=True, slots=True)
class FileArg:
    """A vector argument in the file ``name`` of the worker's folder: ``nbytes`` bytes of
    ``dtype`` elements (what the launch frame says)."""

    name: str
    dtype: np.dtype[Any]
    nbytes: int


@dataclass(frozen=True, slots=True)
class FileResult:
    """A vector result written to ``r<JobId>``: what its record carries."""

    nbytes: int


def _stale(path: str) -> bool:
    """Whether ``path`` is a folder of this user, old enough, whose lock nobody holds."""
    try:
        info = os.lstat(path)
    except OSError:
        return False
    if (not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid()
            or time.time() - info.st_mtime < STALE_AFTER_S):
        return False
    try:
        fd = os.open(os.path.join(path, LOCK), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return True  # its worker never took it
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return False  # held: a live worker's
    finally:
        os.close(fd)
    return True


def _plain_name(name: str) -> bool:
    return bool(name) and "/" not in name and "\0" not in name and name not in (".", "..")


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
        try:
            os.chmod(real, 0o700)  # operands are the callers' data: nobody else reads them
            self._lock = os.open(os.path.join(real, LOCK),
                                 os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
            fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
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
            if name.startswith(PREFIX) and path != self.path and _stale(path):
                shutil.rmtree(path, ignore_errors=True)  # never follows a symlink
                removed.append(name)
        return removed

    def start_reaper(self) -> None:
        """Start the process that removes the folder once this one has ended."""
        self._reaper = subprocess.Popen(
            [sys.executable, "-I", "-S", "-c", _REAPER, self.path],
            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True)

    def open_input(self, arg: FileArg) -> np.ndarray:
        """The file's elements, mapped read-only; the name is unlinked once mapped."""
        if not _plain_name(arg.name):
            raise ShmError(f"shared memory: {arg.name!r:.80} is not a file name")
        path = os.path.join(self.path, arg.name)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError as exc:
            raise ShmError(f"shared memory: {arg.name:.80}: {exc.strerror}") from exc
        try:
            size = os.fstat(fd).st_size
            if size != arg.nbytes:
                raise ShmError(f"shared memory: {arg.name:.80} holds {size} bytes, the launch "
                               f"says {arg.nbytes}")
            mapped = mmap.mmap(fd, size, prot=mmap.PROT_READ) if size else b""
        except OSError as exc:
            raise ShmError(f"shared memory: {arg.name:.80}: {exc}") from exc
        finally:
            os.close(fd)
        try:
            os.unlink(path)
        except OSError:
            pass  # Erlang removes it too, when the job ends
        return np.frombuffer(mapped, arg.dtype)

    def write_result(self, job_id: int, result: np.ndarray) -> FileResult:
        """Write ``result``'s bytes to ``r<JobId>``, a new file; its size for the record."""
        path = os.path.join(self.path, f"r{job_id}")
        data = memoryview(np.ascontiguousarray(result)).cast("B")
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                         | os.O_CLOEXEC, 0o600)
        except OSError as exc:
            raise ShmError(f"shared memory: r{job_id}: {exc.strerror}") from exc
        try:
            done = 0
            while done < len(data):
                done += os.write(fd, data[done:])
        except OSError as exc:
            os.close(fd)
            _unlink(path)
            raise ShmError(f"shared memory: writing r{job_id}: {exc.strerror}") from exc
        os.close(fd)
        return FileResult(len(data))

    def remove(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass
