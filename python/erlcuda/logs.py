"""Worker logs to Erlang: log records, and whatever native code prints, become log frames.

In port mode the worker's fds 1 and 2 are pipes (``boot.Capture``, started by ``python -m
erlcuda`` before any other import), so output from nvcc or the CUDA libraries reaches
Erlang's logger as ``{'L', Level, Text}`` frames instead of corrupting the protocol (which
uses fds 3 and 4), vanishing or going raw to the node's console.
"""

from __future__ import annotations

import logging

from . import boot, protocol
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


def _log_output(level: str, text: str) -> None:
    logging.getLogger("erlcuda.output").log(
        logging.WARNING if level == "warning" else logging.INFO, "%s", text)


def capture_std_streams() -> None:
    """Log what is written to fds 1 and 2 (stdout as info, stderr as warning): the capture
    ``python -m erlcuda`` started hands its lines over to logging, or one starts here (an
    entry point of its own, such as the tests' worker, imports the worker first)."""
    capture = boot.current()
    if capture is None:
        capture = boot.Capture()
        capture.start()
    capture.hand_over(_log_output)


def to_erlang(writer: FrameWriter, level: int = logging.INFO) -> None:
    handler = FrameLogHandler(writer)
    handler.setFormatter(logging.Formatter("%(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
