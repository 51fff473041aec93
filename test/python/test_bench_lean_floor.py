"""bench/lean_floor.py, driven as Erlang drives it (requests on fd 3, replies on fd 4, in
``{packet, 4}`` frames, CPU backend), and the figures bench/run and bench/bus make of the
lone jobs set against it (``stack_bench.summarize_lone``) and of bench/bus's runs."""

from __future__ import annotations

import os
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from workerpipe import spawn_on_port_fds

ROOT = Path(__file__).resolve().parents[2]
LEAN = ROOT / "bench" / "lean_floor.py"
sys.path.insert(0, str(ROOT / "bench"))  # bench/ is no package: its scripts import so

import bus  # noqa: E402
import stack_bench  # noqa: E402


def read(fd: int, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = os.read(fd, n - len(buf))
        assert chunk, "the lean floor closed its output"
        buf += chunk
    return buf


class Floor:
    """The lean floor started as Erlang starts it; ``call`` sends one request and returns
    its answer, ``hello`` is its first reply."""

    def __init__(self, *args: str, **popen: Any) -> None:
        self.proc, self.to_child, self.from_child = spawn_on_port_fds(
            [sys.executable, str(LEAN), "--backend", "cpu", *args], **popen)
        self.hello = self.receive()

    def receive(self) -> bytes:
        return read(self.from_child, struct.unpack(">I", read(self.from_child, 4))[0])

    def call(self, body: bytes) -> bytes:
        os.write(self.to_child, struct.pack(">I", len(body)) + body)
        return self.receive()

    def close(self) -> int:
        """End its input; its exit status."""
        os.close(self.to_child)
        status = self.proc.wait(timeout=20)
        os.close(self.from_child)
        return status


def test_the_lean_floor_adds_and_sums_and_ends_with_its_input() -> None:
    floor = Floor("--max-elements", "4096", stdout=subprocess.PIPE)
    try:
        assert b"floor=lean" in floor.hello and b"backend=cpu" in floor.hello
        rng = np.random.default_rng(1)
        for n in (1, 1000, 4096):
            a, b = rng.standard_normal((2, n), dtype=np.float32)
            got = floor.call(struct.pack("<BI", 0, n) + a.tobytes() + b.tobytes())
            np.testing.assert_array_equal(np.frombuffer(got, np.float32), a + b)
            (total,) = struct.unpack("<d", floor.call(struct.pack("<BI", 1, n) + a.tobytes()))
            assert total == float(np.float32(np.sum(a, dtype=np.float64)))
    finally:
        status = floor.close()
    assert status == 0
    stdout = floor.proc.stdout
    assert stdout is not None and stdout.read() == b""  # stdout is the node's
    stdout.close()


def lone_event(kind: str, samples_us: list[float]) -> dict[str, object]:
    return {"section": "lone", "kind": kind, "samples_ns": [int(s * 1000) for s in samples_us]}


def test_lone_jobs_are_set_against_their_own_floor() -> None:
    rows = stack_bench.summarize_lone([
        lone_event("floor_add", [10.0] * 99 + [50.0]),
        lone_event("floor_reduce", [20.0] * 100),
        lone_event("binary", [11.0] * 100),
        lone_event("lists", [25.0] * 100),
        lone_event("reduce", [30.0] * 100)])
    by_kind = {r["kind"]: r for r in rows}
    assert set(by_kind) == {"binary", "lists", "reduce"}  # no binary_spin measured
    assert by_kind["binary"]["ratio"]["p50"] == pytest.approx(1.1)
    assert by_kind["binary"]["status"] == "met"
    assert by_kind["lists"]["ratio"]["p50"] == pytest.approx(2.5)
    assert by_kind["lists"]["status"] == "missed"
    assert by_kind["reduce"]["floor"] == "floor_reduce"
    assert by_kind["reduce"]["ratio"]["p50"] == pytest.approx(1.5)
    text = "\n".join(stack_bench.lone_lines(rows, 250))
    assert "Blocks of 250 jobs" in text and "**missed**" in text


def test_the_shared_memory_floor_adds_in_its_file(tmp_path: Path) -> None:
    path, most = tmp_path / "floor", 4096
    floor = Floor("--max-elements", str(most), "--shm", str(path))
    try:
        assert f"shm={path}".encode() in floor.hello
        rng = np.random.default_rng(2)
        for n in (1, 1000, most):
            a, b = rng.standard_normal((2, n), dtype=np.float32)
            with open(path, "r+b") as f:
                f.seek(0)
                f.write(a.tobytes())
                f.seek(4 * most)
                f.write(b.tobytes())
            assert floor.call(struct.pack("<BI", 2, n)) == b"k"
            with open(path, "rb") as f:
                f.seek(8 * most)
                got = np.frombuffer(f.read(4 * n), np.float32)
            np.testing.assert_array_equal(got, a + b)
    finally:
        status = floor.close()
    assert status == 0


def test_bus_sets_each_size_beside_cupy_and_judges_the_goals() -> None:
    mib = 1 << 20
    events = [
        {"section": "bus", "kernel": "vector_add", "size": n, "bytes_in": 8 * n,
         "bytes_out": 4 * n, "samples_ns": [t] * 10}
        for n, t in ((1_000, 100_000), (100_000, 2_000_000), (16_000_000, 30_000_000))
    ] + [{"section": "bus", "kernel": "reduce", "size": 16_000_000, "bytes_in": 64_000_000,
          "bytes_out": 8, "samples_ns": [8_000_000] * 10},
         {"section": "cupy", "kernel": "vector_add", "size": 1_000, "samples_ns": [80_000]},
         {"section": "cupy", "kernel": "vector_add", "size": 100_000,
          "samples_ns": [1_000_000]},
         {"section": "floors", "transport": "pipe", "kernel": "vector_add", "size": 100_000,
          "samples_ns": [1_600_000]},
         {"section": "floors", "transport": "shm", "kernel": "vector_add", "size": 100_000,
          "samples_ns": [1_250_000]},
         {"section": "floors", "transport": "shm", "kernel": "vector_add", "size": 1_000,
          "samples_ns": [50_000]},
         {"section": "transports", "transport": "pipe", "bytes": mib, "samples_ns": [3]},
         {"section": "transports", "transport": "shm", "bytes": mib, "samples_ns": [2]}]
    summary = bus.summarize({"backend": "cuda"}, events)
    rows = {(r["kernel"], r["size"]): r for r in summary["bus"]}
    assert rows[("vector_add", 1_000)]["ratio"] == pytest.approx(1.25)
    assert rows[("vector_add", 16_000_000)]["gbs"] == pytest.approx(192e6 / 30e-3 / 1e9)
    assert rows[("reduce", 16_000_000)]["gbs"] == pytest.approx(8.0)  # its input alone
    assert rows[("vector_add", 16_000_000)]["ratio"] is None  # no CuPy figure
    assert summary["transports"] == [{"bytes": mib, "pipe": bus.ms([3]), "shm": bus.ms([2]),
                                      "faster": "shm"}]
    goals = {t["target"]: t["status"] for t in bus.targets(summary, cuda=True)}
    assert goals["vector_add 1e3: p50 ÷ CuPy's p50"] == "met"  # 1.25x, at most 1.5x
    # 2x, at most 1x: missed, but the faster floor is 1.25x CuPy already
    assert goals["vector_add 1e5: p50 ÷ CuPy's p50"] == (
        "floor above: the faster lean floor is 1.25x CuPy; erlcuda 1.60x that floor")
    assert rows[("vector_add", 1_000)]["floor_ratio"] == pytest.approx(2.0)
    assert rows[("vector_add", 16_000_000)]["floor_ratio"] is None  # no floor figure
    assert goals["vector_add 1.6e7: GB/s (in + out ÷ p50)"] == "met"  # 6.4 GB/s
    assert goals["reduce 1.6e7: GB/s (in ÷ p50)"] == "missed"  # 8 GB/s
    assert goals["vector_add 1.6e7: p50 ÷ CuPy's p50"] == "not measured"
