"""bench/floor.py, the benchmark's floor, driven as Erlang drives it: a subprocess with its
requests on fd 3 and its replies on fd 4, in ``{packet, 4}`` frames (CPU backend).

One vector_add and one reduce frame, each checked against numpy; then a frame that breaks
the layout and one whose arguments the kernel refuses get error replies and the floor keeps
serving (a padded odd-length operand, dims); end of file ends it with status 0.
"""

from __future__ import annotations

import os
import struct
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from workerpipe import spawn_on_port_fds

ROOT = Path(__file__).resolve().parents[2]
FLOOR = ROOT / "bench" / "floor.py"


class FloorPipe:
    def __init__(self) -> None:
        self.proc, self.to_child, self.from_child = spawn_on_port_fds(
            [sys.executable, str(FLOOR), "--backend", "cpu"], stdout=subprocess.PIPE)

    def send(self, body: bytes) -> None:
        os.write(self.to_child, struct.pack(">I", len(body)) + body)

    def _read(self, n: int) -> bytes:
        buf = b""
        while len(buf) < n:
            chunk = os.read(self.from_child, n - len(buf))
            assert chunk, "floor closed its output"
            buf += chunk
        return buf

    def receive(self) -> bytes:
        (n,) = struct.unpack(">I", self._read(4))
        return self._read(n)

    def close(self) -> int:
        os.close(self.to_child)
        try:
            status = self.proc.wait(timeout=20)
        finally:
            os.close(self.from_child)
        assert self.proc.stdout is not None
        assert self.proc.stdout.read() == b"", "the floor wrote to stdout"
        self.proc.stdout.close()
        return status


def request(kernel: int, *operands: np.ndarray | int) -> bytes:
    """A request frame's body: the head, then each operand, padded to 8 bytes."""
    body = struct.pack("<BB6x", kernel, len(operands))
    for v in operands:
        if isinstance(v, int):
            body += struct.pack("<B3xIQ", 1, 8, v)
        else:
            raw = v.astype("<f4").tobytes()
            body += struct.pack("<B3xI", 0, len(raw)) + raw + bytes(-len(raw) % 8)
    return body


@pytest.fixture
def floor() -> Iterator[tuple[FloorPipe, list[str]]]:
    pipe = FloorPipe()
    try:
        hello = dict(line.split("=", 1) for line in pipe.receive().decode().split("\n"))
        assert hello["floor"] == "1"
        assert hello["backend"] == "cpu", hello
        yield pipe, hello["kernels"].split(",")
    finally:
        if pipe.proc.poll() is None:
            pipe.proc.kill()
            pipe.proc.wait()


def test_floor_runs_vector_add_and_reduce(floor: tuple[FloorPipe, list[str]]) -> None:
    pipe, kernels = floor
    rng = np.random.default_rng(1)
    a = rng.standard_normal(1000).astype(np.float32)
    b = rng.standard_normal(1000).astype(np.float32)

    pipe.send(request(kernels.index("vector_add"), a, b))
    reply = pipe.receive()
    assert reply[:1] == b"\x00"
    assert len(reply) == 1 + 4 * 1000
    np.testing.assert_array_equal(np.frombuffer(reply[1:], dtype="<f4"), a + b)

    pipe.send(request(kernels.index("reduce"), a))
    reply = pipe.receive()
    assert reply[:1] == b"\x00"
    assert len(reply) == 1 + 8
    (total,) = struct.unpack("<d", reply[1:])
    assert total == pytest.approx(float(a.astype(np.float64).sum()), rel=1e-5)

    # A frame the layout refuses, and arguments the kernel refuses: an error reply each,
    # and the floor still serves.
    pipe.send(struct.pack("<BB6xB3xI", kernels.index("reduce"), 1, 9, 0))
    assert pipe.receive()[:1] == b"\x01"
    pipe.send(request(kernels.index("vector_add"), a, b[:10]))
    bad = pipe.receive()
    assert bad[:1] == b"\x01" and b"length" in bad
    # An odd length (3 floats, 12 bytes) is padded to 16; the floor's views are aligned.
    pipe.send(request(kernels.index("dot_product"), np.ones(3, dtype=np.float32),
                      np.full(3, 2.0, dtype=np.float32)))
    assert struct.unpack("<d", pipe.receive()[1:]) == (6.0,)
    # Dims: matmul of a 2x3 by a 3x2 matrix.
    a6 = np.arange(6, dtype=np.float32)
    pipe.send(request(kernels.index("matmul"), a6, a6, 2, 2, 3))
    reply = pipe.receive()
    assert reply[:1] == b"\x00"
    np.testing.assert_array_equal(np.frombuffer(reply[1:], dtype="<f4").reshape(2, 2),
                                  a6.reshape(2, 3) @ a6.reshape(3, 2))

    assert pipe.close() == 0
