"""Worker logs to Erlang: log records, and whatever native code prints, become log frames.

In port mode the worker's fds 1 and 2 are pipes read by a thread here, so output from nvcc
or the CUDA libraries reaches Erlang's logger as ``{'L', Level, Line}`` frames instead of
corrupting the protocol (which uses fds 3 and 4) or vanishing.
"""

from __future__ import annotations

import logging
import os
import sys
import threading

from . import protocol
from .framing import FrameError, FrameWriter

_LEVELS = (
    (logging.ERROR, "error"),
    (logging.WARNING, "warning"),
    (logging.INFO, "info"),
    (0, "debug"),
)


class FrameLogHandler(logging.Handler):
    def __init__(self, writer: FrameWriter) -> None:
        super().__init__()
        self.writer = writer

    def emit(self, record: logging.LogRecord) -> None:
        level = next(name for floor, name in _LEVELS if record.levelno >= floor)
        try:
            text = self.format(record)
            self.writer.write(protocol.encode_log(level, text))
        except FrameError:
            pass  # Erlang is gone; nobody to tell
        except Exception:
            self.handleError(record)


def _pump(fd: int, level: str) -> None:
    logger = logging.getLogger("erlcuda.output")
    with open(fd, "rb", closefd=True) as pipe:
        for raw in pipe:
            line = raw.decode("utf-8", "replace").rstrip("\n")
            if line:
                logger.log(logging.WARNING if level == "warning" else logging.INFO, "%s", line)


def capture_std_streams() -> None:
    """Point fds 1 and 2 at pipes whose lines are logged (stdout as info, stderr as warning)."""
    for fd, level in ((1, "info"), (2, "warning")):
        read_end, write_end = os.pipe()
        os.dup2(write_end, fd)
        os.close(write_end)
        threading.Thread(target=_pump, args=(read_end, level), name=f"erlcuda-fd{fd}",
                         daemon=True).start()
    sys.stdout = open(1, "w", buffering=1, closefd=False)
    sys.stderr = open(2, "w", buffering=1, closefd=False)


def to_erlang(writer: FrameWriter, level: int = logging.INFO) -> None:
    handler = FrameLogHandler(writer)
    handler.setFormatter(logging.Formatter("%(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
