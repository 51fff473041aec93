"""bench/cupy_peer.py, driven as bench/erlcuda_bus.erl drives it (requests on fd 3, replies
on fd 4, in ``{packet, 4}`` frames), with a stand-in ``cupy`` made here ahead of any
installed one: numpy's arrays with a ``get``, so that the peer's protocol runs anywhere."""

from __future__ import annotations

import os
import struct
import sys
from pathlib import Path

import pytest

from workerpipe import spawn_on_port_fds

ROOT = Path(__file__).resolve().parents[2]
PEER = ROOT / "bench" / "cupy_peer.py"

WORKS = '''
import numpy as np
__version__ = "0-stand-in"
class _Array(np.ndarray):
    def get(self):
        return np.asarray(self)
def asarray(a):
    return np.asarray(a).view(_Array)
'''
#: Imports, but cannot run a job (as a CuPy without a driver or compiler for it).
BROKEN = '''
__version__ = "0-broken"
def asarray(a):
    raise RuntimeError("no device")
'''


def read(fd: int, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = os.read(fd, n - len(buf))
        if not chunk:
            raise EOFError
        buf += chunk
    return buf


class Peer:
    def __init__(self, cupy_source: str, tmp_path: Path,
                 monkeypatch: pytest.MonkeyPatch) -> None:
        (tmp_path / "cupy").mkdir()
        (tmp_path / "cupy" / "__init__.py").write_text(cupy_source)
        monkeypatch.setenv("PYTHONPATH", str(tmp_path))
        self.proc, self.to_child, self.from_child = spawn_on_port_fds(
            [sys.executable, str(PEER)])
        self.hello = self.receive()

    def receive(self) -> bytes:
        return read(self.from_child, struct.unpack(">I", read(self.from_child, 4))[0])

    def send(self, body: bytes) -> None:
        os.write(self.to_child, struct.pack(">I", len(body)) + body)

    def close(self) -> int:
        os.close(self.to_child)
        status = self.proc.wait(timeout=20)
        os.close(self.from_child)
        return status


def test_it_times_each_call_and_answers_as_many_samples_as_asked(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    peer = Peer(WORKS, tmp_path, monkeypatch)
    try:
        assert peer.hello == b"reference=CuPy 0-stand-in"
        for kernel, n, reps in ((0, 1000, 3), (1, 100_000, 2), (0, 1, 1), (0, 7, 0)):
            peer.send(struct.pack("<BII", kernel, n, reps))
            samples = struct.unpack(f"<{reps}Q", peer.receive())
            assert all(s > 0 for s in samples)
    finally:
        assert peer.close() == 0


@pytest.mark.parametrize("request_body", [struct.pack("<BI", 0, 1000),  # short
                                          struct.pack("<BIII", 0, 1000, 1, 1),  # long
                                          struct.pack("<BII", 2, 1000, 1)])  # no such kernel
def test_a_frame_that_is_not_a_request_ends_it(
        request_body: bytes, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    peer = Peer(WORKS, tmp_path, monkeypatch)
    peer.send(request_body)
    with pytest.raises(EOFError):
        peer.receive()
    assert peer.close() == 1


def test_a_cupy_that_cannot_run_a_job_is_no_reference(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    peer = Peer(BROKEN, tmp_path, monkeypatch)
    assert peer.hello == b"reference=none"
    peer.send(struct.pack("<BII", 0, 1000, 1))
    with pytest.raises(EOFError):
        peer.receive()
    assert peer.close() == 1
