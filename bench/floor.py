"""The floor: the least a port peer can do to run one erlcuda job, to measure erlcuda against.

Started by ``bench/erlcuda_bench.erl`` as an Erlang port opened with ``{packet, 4}``,
``binary`` and ``nouse_stdio`` (requests on fd 3, replies on fd 4), under the worker's own
interpreter and with erlcuda's Python package on ``PYTHONPATH``::

    python bench/floor.py --backend cpu|cuda|auto

One thread does everything: it selects the backend as the worker does
(``erlcuda.backends.select``), opens device 0, then reads a frame, builds the request with
``erlcuda.kernels.parse`` from numpy views of the frame's bytes, calls ``device.run`` inline
and writes the result's raw bytes in one reply frame. No ETF, no batching, no other thread.

Frames (after the 4-byte big-endian length of ``{packet, 4}``; integers little-endian):

- hello, floor -> Erlang, once at start: ``key=value`` lines in ASCII: ``floor=1``,
  ``backend=cpu|cuda``, ``reason=...``, ``device=...``, ``kernels=vector_add,reduce,...``
  (the kernel indexes requests use), or ``error=...`` when no backend could start;
- request: ``<<KernelIndex:8, NArgs:8, 0:48, Operand * NArgs>>``, each operand
  ``<<Tag:8, 0:24, Len:32/little, Bytes:Len, 0-7 zero bytes>>``: tag 0 an f32 vector
  (``Len`` bytes of little-endian f32), tag 1 a dim (``Len`` = 8, an unsigned 64-bit
  integer); the zeros pad each operand to a multiple of 8 bytes, so that every operand's
  bytes lie 8-byte aligned in the frame's buffer and numpy views them as aligned arrays
  (a misaligned view sends numpy down its slow paths, and the floor would be no floor);
- reply: ``<<0, Bytes>>`` with the result's raw bytes (a vector as little-endian f32, a
  scalar as one little-endian f64), or ``<<1, Reason/utf8>>`` when the job failed.

Like the worker, it widens both pipes to 1 MiB where Linux allows (fewer wake-ups for a
large frame), so that the floor does not lose to erlcuda on what is not its design.
End of file on fd 3 ends the program. It never writes to stdout (the node's stdout carries
the benchmark's JSON lines): stdout is pointed at stderr before anything else runs.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import io
import os
import struct
import sys
from collections.abc import Sequence
from typing import Any

import numpy as np

IN_FD, OUT_FD = 3, 4
OK, FAILED = b"\x00", b"\x01"
TAG_VECTOR, TAG_DIM = 0, 1
PIPE_SIZE = 1 << 20
#: fcntl's F_SETPIPE_SZ (Linux), where the fcntl module lacks the name.
F_SETPIPE_SZ = getattr(fcntl, "F_SETPIPE_SZ", 1031)

_length = struct.Struct(">I")
_head = struct.Struct("<BB6x")
_operand = struct.Struct("<B3xI")
_f64 = struct.Struct("<d")


class FloorError(Exception):
    """A request frame that does not follow the layout above."""


def read_into(reader: io.BufferedReader, view: memoryview) -> bool:
    """Fill ``view``; False at end of file before its first byte."""
    got = 0
    while got < view.nbytes:
        k = reader.readinto(view[got:])
        if not k:
            if got == 0:
                return False
            raise FloorError(f"end of file after {got} of {view.nbytes} bytes")
        got += k
    return True


class Frames:
    """Request frames read into one buffer, reused (and replaced by a larger one when a
    frame outgrows it): a job's views of its frame are dead once its reply is written, and
    the buffer's pages stay mapped from one frame to the next."""

    def __init__(self, fd: int) -> None:
        self._reader = io.BufferedReader(io.FileIO(fd, "rb", closefd=False),
                                         buffer_size=1 << 16)
        self._header = memoryview(bytearray(4))
        self._buf = bytearray(1 << 16)

    def next(self) -> memoryview | None:
        """The next frame's body, or ``None`` at end of file between frames."""
        if not read_into(self._reader, self._header):
            return None
        n = _length.unpack(self._header)[0]
        if n > len(self._buf):
            self._buf = bytearray(max(n, 2 * len(self._buf)))
        body = memoryview(self._buf)[:n]
        if n and not read_into(self._reader, body):
            raise FloorError("end of file inside a frame")
        return body


def write_frame(fd: int, *parts: bytes | memoryview) -> None:
    size = sum(memoryview(p).nbytes for p in parts)
    views = [memoryview(_length.pack(size)), *(memoryview(p).cast("B") for p in parts)]
    while views:
        n = os.writev(fd, views)
        while views and n >= views[0].nbytes:
            n -= views[0].nbytes
            views.pop(0)
        if views and n:
            views[0] = views[0][n:]


def operands(frame: memoryview) -> tuple[int, list[Any]]:
    """The kernel index and the operands (numpy f32 views and ints) of a request frame."""
    size = frame.nbytes
    if size < _head.size:
        raise FloorError(f"request shorter than its {_head.size}-byte head")
    kernel, count = _head.unpack_from(frame)
    args: list[Any] = []
    at = _head.size
    for _ in range(count):
        if at + _operand.size > size:
            raise FloorError("operand header past the end of the frame")
        tag, n = _operand.unpack_from(frame, at)
        at += _operand.size
        if at + n > size:
            raise FloorError("operand past the end of the frame")
        if tag == TAG_VECTOR:
            args.append(np.frombuffer(frame[at : at + n], dtype="<f4"))
        elif tag == TAG_DIM and n == 8:
            args.append(int.from_bytes(frame[at : at + n], "little"))
        else:
            raise FloorError(f"bad operand tag {tag} (length {n})")
        at += -(-n // 8) * 8  # and the padding
    if at != size:
        raise FloorError(f"{size - at} bytes after the last operand")
    return kernel, args


def result_bytes(result: Any) -> bytes | memoryview:
    if isinstance(result, np.ndarray):
        return memoryview(np.ascontiguousarray(result, dtype="<f4"))
    return _f64.pack(float(result))


def serve(backend_kind: str) -> int:
    from erlcuda import kernels
    from erlcuda.backends import BackendError, select

    for fd in (IN_FD, OUT_FD):
        with contextlib.suppress(OSError):  # not a pipe, or over pipe-max-size
            fcntl.fcntl(fd, F_SETPIPE_SZ, PIPE_SIZE)
    frames = Frames(IN_FD)
    names: Sequence[str] = kernels.KERNELS
    try:
        backend, reason = select(backend_kind, cpu_devices=1)
        device = backend.open(0)  # in this thread, which runs every job
    except BackendError as exc:
        write_frame(OUT_FD, f"floor=1\nerror={exc.message}".encode())
        return 1
    hello = (f"floor=1\nbackend={backend.name}\nreason={reason}\n"
             f"device={device.info().get('name', '?')}\nkernels={','.join(names)}")
    write_frame(OUT_FD, hello.encode())
    try:
        while (frame := frames.next()) is not None:
            try:
                index, args = operands(frame)
                if index >= len(names):
                    raise FloorError(f"no kernel {index}")
                kernel = names[index]
                request = kernels.parse(kernel, args)
                (result,) = device.execute([request])
                reply = result_bytes(result)
            except (FloorError, kernels.BadArgs, BackendError) as exc:
                write_frame(OUT_FD, FAILED, str(exc).encode())
                continue
            write_frame(OUT_FD, OK, reply)
    finally:
        device.close()
        backend.close()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    # Nothing may reach stdout, which the node shares with the benchmark's JSON lines.
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    parser = argparse.ArgumentParser(prog="floor.py", description=__doc__.split("\n")[0])
    parser.add_argument("--backend", choices=("auto", "cpu", "cuda"), default="auto")
    args = parser.parse_args(argv)
    return serve(args.backend)


if __name__ == "__main__":
    sys.exit(main())
