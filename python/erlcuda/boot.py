"""The worker's output from its first line: fds 1 and 2 as log frames, not the node's console.

Erlang starts ``python -m erlcuda serve`` as a port with ``nouse_stdio``: fds 0 to 2 are the
node's own, so whatever the worker prints before its logging is up (the traceback of an
import that fails where numpy is missing, argparse's usage error) would go raw to the
node's console, and again at every restart. ``python -m erlcuda`` therefore calls
``capture`` before it imports anything else: when it serves a port, fds 1 and 2 become
pipes, and a thread per pipe sends each burst of lines to Erlang as one ``{'L', Level,
Text}`` frame (stdout as info, stderr as warning), which the port owner logs through
``logger``. Once the worker's logging is up, ``logs.capture_std_streams`` hands the lines
over to it (``Capture.hand_over``), so that from then on one writer, the worker's
``FrameWriter``, writes fd 4. At exit the pipes are closed and what is left is sent.

Standard library only (Python 3.8 and later): it must run where numpy is
missing or the Python is too old for the rest of the worker, which is when it matters.
"""

from __future__ import annotations

import atexit
import os
import select
import struct
import sys
import threading
from collections.abc import Callable, Sequence

from . import portenv

__all__ = ["Capture", "capture", "current", "log_frame"]

#: The longest text one frame carries; what is over is cut, with a note.
MAX_TEXT = 64 << 10
#: After a read, how long more output is awaited before the burst is sent (seconds): the
#: interpreter prints a traceback a line at a time.
GATHER_S = 0.05
#: How long exit waits for the pumps to send what is left (seconds).
DRAIN_S = 2.0

_current: Capture | None = None


def log_frame(level: str, text: str) -> bytes:
    """A whole frame (length and ETF body) of ``{'L', Level, Text}``."""
    data = text.encode("utf-8", "replace")
    if len(data) > MAX_TEXT:
        data = data[:MAX_TEXT] + b" [cut]"
    name = level.encode("ascii")
    body = (b"\x83h\x03w\x01Lw" + bytes([len(name)]) + name
            + b"m" + struct.pack(">I", len(data)) + data)
    return struct.pack(">I", len(body)) + body


def _to_port(level: str, text: str) -> None:
    view = memoryview(log_frame(level, text))
    try:
        while view:
            view = view[os.write(4, view):]
    except OSError:
        pass  # Erlang is gone: nobody to tell


class Capture:
    """Fds 1 and 2 pointed at pipes whose lines go to ``send``."""

    def __init__(self, send: Callable[[str, str], None] = _to_port) -> None:
        self._send = send
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []

    def start(self) -> None:
        for fd, level in ((1, "info"), (2, "warning")):
            read_end, write_end = os.pipe()
            os.dup2(write_end, fd)
            os.close(write_end)
            thread = threading.Thread(target=self._pump, args=(read_end, level),
                                      name=f"erlcuda-fd{fd}", daemon=True)
            thread.start()
            self._threads.append(thread)
        sys.stdout = open(1, "w", buffering=1, closefd=False)
        sys.stderr = open(2, "w", buffering=1, closefd=False)
        atexit.register(self.finish)

    def hand_over(self, send: Callable[[str, str], None]) -> None:
        """From now on the lines go to ``send``; a burst being sent is sent first."""
        with self._lock:
            self._send = send

    def _pump(self, fd: int, level: str) -> None:
        with open(fd, "rb", buffering=0, closefd=True) as pipe:
            while True:
                chunk = pipe.read(65536)
                if not chunk:
                    return
                while len(chunk) < MAX_TEXT and select.select([pipe], [], [], GATHER_S)[0]:
                    more = pipe.read(65536)
                    if not more:
                        break
                    chunk += more
                text = chunk.decode("utf-8", "replace").rstrip("\n")
                if text:
                    with self._lock:
                        self._send(level, text)

    def finish(self) -> None:
        """Close the pipes (fds 1 and 2 go to /dev/null) and let the pumps send the rest."""
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass  # closed already: nothing left in it
        null = os.open(os.devnull, os.O_WRONLY)
        for fd in (1, 2):
            os.dup2(null, fd)
        os.close(null)
        for thread in self._threads:
            thread.join(DRAIN_S)


def capture(argv: Sequence[str]) -> Capture | None:
    """Capture fds 1 and 2 when ``argv`` serves a port (``serve``, with fds 3 and 4 open
    pipes); else leave them to the terminal, where a person reads them."""
    global _current
    if _current is not None or not argv or argv[0] != "serve":
        return _current
    try:
        portenv.check_port_fds()
    except portenv.PortEnvError:
        return None  # serve says why itself, on the terminal
    _current = Capture()
    _current.start()
    return _current


def current() -> Capture | None:
    """The capture ``capture`` started, if any."""
    return _current
