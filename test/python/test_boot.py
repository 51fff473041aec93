"""``erlcuda.boot``: under Erlang, what the worker prints from its first line is log frames.

A worker started as Erlang starts it (fds 3 and 4 pipes, fds 1 and 2 the node's console)
whose start fails, as it does where numpy is missing, must say so through fd 4 (and so
Erlang's logger), leaving the node's console alone.
"""

from __future__ import annotations

import fcntl
import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from erlcuda import boot

pytestmark = pytest.mark.process

ROOT = Path(__file__).resolve().parents[2]
ENV = dict(os.environ, PYTHONPATH=str(ROOT / "python"))


def serve_as_erlang(*args: str) -> tuple[int, bytes, bytes]:
    """Run ``python ARGS`` (``-m erlcuda serve ...``) with fds 3 and 4 pipes, as a port with
    nouse_stdio; its exit status, its fd 1 and 2 output, and what came on fd 4."""
    to_child_r, to_child_w = os.pipe()
    from_child_r, from_child_w = os.pipe()
    # Above 4, so that moving one onto 3 or 4 never closes the other (the child keeps 3
    # and 4 alone: pass_fds, which close_fds spares after preexec_fn has run).
    high = [fcntl.fcntl(fd, fcntl.F_DUPFD, 10) for fd in (to_child_r, from_child_w)]

    def remap() -> None:
        os.dup2(high[0], 3)
        os.dup2(high[1], 4)

    done = subprocess.run([sys.executable, *args], env=ENV, pass_fds=(3, 4), preexec_fn=remap,
                          stdin=subprocess.DEVNULL, capture_output=True, timeout=60,
                          check=False)
    for fd in (to_child_r, to_child_w, from_child_w, *high):
        os.close(fd)
    with os.fdopen(from_child_r, "rb") as pipe:
        port = pipe.read()
    return done.returncode, done.stdout + done.stderr, port


def log_frames(data: bytes) -> list[tuple[str, str]]:
    """The ``{'L', Level, Text}`` frames in ``data`` (boot.log_frame's layout)."""
    logs = []
    while data:
        (size,) = struct.unpack(">I", data[:4])
        body, data = data[4:4 + size], data[4 + size:]
        assert body[:6] == b"\x83h\x03w\x01L"
        level = body[8:8 + body[7]].decode()
        rest = body[8 + body[7]:]
        assert rest[:1] == b"m"
        logs.append((level, rest[5:5 + struct.unpack(">I", rest[1:5])[0]].decode()))
    return logs


def test_an_import_that_fails_is_logged_through_the_port() -> None:
    # -S: no site-packages, so no numpy, as with a Debian python3 without python3-numpy.
    status, console, port = serve_as_erlang("-S", "-m", "erlcuda", "serve", "--backend", "cpu")
    assert status != 0
    assert console == b""
    logs = log_frames(port)
    assert any(level == "warning" and "No module named 'numpy'" in text
               for level, text in logs), logs


def test_a_usage_error_is_logged_through_the_port() -> None:
    status, console, port = serve_as_erlang("-m", "erlcuda", "serve", "--max-batch", "0")
    assert status == 2
    assert console == b""
    logs = log_frames(port)
    assert any("--max-batch" in text and "usage" in text for _, text in logs), logs


def test_a_log_frame_is_cut_at_its_bound() -> None:
    (frame,) = log_frames(boot.log_frame("info", "x" * (boot.MAX_TEXT + 10)))
    assert frame == ("info", "x" * boot.MAX_TEXT + " [cut]")


def test_nothing_is_captured_outside_a_port() -> None:
    assert boot.capture(["devices"]) is None
    assert boot.capture([]) is None
