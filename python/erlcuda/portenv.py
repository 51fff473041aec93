"""What ``serve`` needs from its process: Erlang's pipes on fds 3 and 4, and a parent to live for.

Erlang starts the worker as a port with ``nouse_stdio``: requests on fd 3, replies on fd 4.
Started from a shell, those fds are closed, and the first pipes the worker makes (to capture
its own stdout and stderr) would become fds 3 and 4: it would read its own output and hang
silently. ``check_port_fds`` refuses that before any fd is made.

A worker outlives its node if the node halts while the worker cannot read the end of fd 3
(stopped by SIGSTOP, say): ``die_with_parent`` has the kernel kill it when its parent dies.
On Linux "parent" means the thread that started it (Erlang's erl_child_setup has one), so a
program that starts the worker from a thread must keep that thread for the worker's life.

``keep_freed_memory`` has glibc's malloc keep what the worker frees for reuse: by default
every batch's megabyte-sized arrays are new mappings or a heap trimmed and grown again, and
the page faults of a large batch cost more than its work. What is kept is bounded: every
thread shares one arena, and ``HeapTrim``'s thread gives every free page back
(``malloc_trim``) every ``TRIM_EVERY_S``, under load or idle, so the worker's memory under a
long load stays near what its frame reader's pool (``framing.FrameReader``) holds.

``settle_heap`` takes what start-up made out of the cyclic collector's walks. A collection
walks every object tracked in the generations it collects, with the GIL held, so that no
other thread runs Python meanwhile: every device's lane and the port's threads wait. Start-up
(the modules, the backend, the compiled kernels) leaves tens of thousands of such objects,
which live as long as the worker: walked by the middle generation's collection that
promotes them and by every full collection after, they make each such collection a pause
that one job on any device pays, a small job held up by another device's large one. Frozen
once the devices are open (``gc.freeze``, after one collection), they are never walked
again; they are still freed by their reference counts, but a cycle among them that is
dropped later is never collected. Objects made later are collected as before, though a
full collection then comes more often: the collector puts one off until its oldest
generation has grown by a quarter, which a small generation does sooner.
"""

from __future__ import annotations

import ctypes
import gc
import os
import signal
import stat
import sys
import threading
import time
from collections.abc import Callable
from typing import cast

__all__ = ["HeapTrim", "PortEnvError", "check_port_fds", "die_with_parent",
           "keep_freed_memory", "settle_heap"]

PORT_FDS = (3, 4)
#: ``prctl(PR_SET_PDEATHSIG, sig)``: the signal the kernel sends when the parent dies.
_PR_SET_PDEATHSIG = 1
#: ``mallopt`` parameters (glibc's malloc.h) and the values ``keep_freed_memory`` sets:
#: blocks under 64 MiB come from the heap, and the heap is trimmed only past 256 MiB free;
#: one arena for every thread (the GIL already serializes nearly all of the worker's
#: allocations, and an arena per device thread kept free memory of its own in each).
_M_TRIM_THRESHOLD, _M_TOP_PAD, _M_MMAP_THRESHOLD, _M_ARENA_MAX = -1, -2, -3, -8
_MALLOPT = ((_M_MMAP_THRESHOLD, 64 << 20), (_M_TRIM_THRESHOLD, 256 << 20),
            (_M_TOP_PAD, 16 << 20), (_M_ARENA_MAX, 1))
TRIM_EVERY_S = 10.0
TRIM_SLACK = 0


class PortEnvError(Exception):
    """The process is not set up as an Erlang port's worker."""


def _describe(fd: int) -> str | None:
    """Why ``fd`` is not a pipe or a socket, or ``None`` when it is one."""
    try:
        mode = os.fstat(fd).st_mode
    except OSError:
        return f"fd {fd} is not open"
    if stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode):
        return None
    return f"fd {fd} is not a pipe or a socket"


def check_port_fds() -> None:
    """Raise ``PortEnvError`` unless fds 3 and 4 are open pipes or sockets."""
    problems = [why for fd in PORT_FDS if (why := _describe(fd)) is not None]
    if problems:
        raise PortEnvError(
            f"{'; '.join(problems)}. `python -m erlcuda serve` runs under Erlang: the "
            "erlcuda OTP application starts it as a port with nouse_stdio, requests on fd 3 "
            "and replies on fd 4. To try the worker by hand, use `python -m erlcuda devices` "
            "or `python -m erlcuda run KERNEL`.")


def die_with_parent(parent: int | None = None) -> None:
    """Have this process killed when its parent dies; exit at once if it already has.

    ``parent`` is the parent's pid as read before (default: read now). On Linux the kernel
    sends SIGKILL, which also ends a stopped process; elsewhere a thread polls the parent.
    """
    if parent is None:
        parent = os.getppid()
    if sys.platform.startswith("linux"):
        # The interpreter's own symbols include libc's (find_library would run ldconfig).
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
            _watch(parent)  # best effort: prctl refused
    else:
        _watch(parent)
    # The parent may have died before prctl took effect: then no signal will ever come.
    if os.getppid() != parent:
        os._exit(1)


def _watch(parent: int, period: float = 1.0) -> None:
    def poll() -> None:
        while os.getppid() == parent:
            time.sleep(period)
        os._exit(1)

    threading.Thread(target=poll, name="erlcuda-parent", daemon=True).start()


def keep_freed_memory() -> bool:
    """Tune glibc's malloc to reuse freed memory (see above); whether it took effect."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False  # not glibc (musl has no mallopt)
    return all(mallopt(param, value) == 1 for param, value in _MALLOPT)


def settle_heap() -> None:
    """Collect what start-up left unreachable, then freeze the rest (see above)."""
    gc.collect()
    gc.freeze()


class HeapTrim:
    """At most every ``every_s`` seconds, gives the heap's free pages back to the OS but
    ``slack`` bytes (``malloc_trim``): called, it says whether it trimmed; ``start`` calls it
    from a thread of its own, so that an idle worker gives back what its last batch freed.
    glibc locks the arena as it trims it, and ctypes lets go of the GIL meanwhile."""

    def __init__(self, every_s: float = TRIM_EVERY_S, slack: int = TRIM_SLACK,
                 trim: Callable[[int], object] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if trim is None:
            trim = _malloc_trim()
        self._trim = trim
        self._every = every_s
        self._slack = slack
        self._clock = clock
        self._next = clock() + every_s

    def __call__(self) -> bool:
        now = self._clock()
        if self._trim is None or now < self._next:
            return False
        self._next = now + self._every
        self._trim(self._slack)
        return True

    def start(self) -> threading.Thread | None:
        """Trim every period from a daemon thread; ``None`` where there is no malloc_trim."""
        if self._trim is None:
            return None

        def run() -> None:
            while True:
                time.sleep(max(self._next - self._clock(), 0.0))
                self()

        thread = threading.Thread(target=run, name="erlcuda-trim", daemon=True)
        thread.start()
        return thread


def _malloc_trim() -> Callable[[int], object] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return None  # not glibc
    trim.argtypes = [ctypes.c_size_t]
    return cast(Callable[[int], object], trim)
