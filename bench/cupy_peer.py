"""CuPy from numpy, as a port of the bench node, so that its blocks take turns with erlcuda's.

Started as an Erlang port with ``{packet, 4}``, ``binary`` and ``nouse_stdio`` (requests on
fd 3, replies on fd 4)::

    python bench/cupy_peer.py

The first reply is a hello: ``reference=CuPy <version>``, or ``reference=none`` where CuPy
cannot be imported or cannot run both jobs on a small vector (the node then runs no
reference). A request ``<<Kernel:8, Count:32/little, Reps:32/little>>`` (kernel 0:
vector_add, 1: reduce) runs that job ``Reps`` times on numpy operands of ``Count`` f32s made
here (once a size), each run timed on its own, and is answered with the ``Reps`` times in
nanoseconds (u64, little-endian). A job is what a Python user writes: ``cp.asarray`` of
each numpy operand, the kernel, ``.get()`` (reduce: ``float(x.sum())``). Anything else on
the port (another length, another kernel) ends the peer: only the node talks to it. The
operands are the node's (``vec/2`` in ``bench/erlcuda_bus.erl``: small integers, exact in
f32).

Timed here, not in the node: a Python user's wall time, without the port's round trip.
"""

from __future__ import annotations

import os
import struct
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))  # even under PYTHONSAFEPATH
from lean_floor import read_exactly, reply  # bench/ is not a package

_length = struct.Struct(">I")
_request = struct.Struct("<BII")
#: The node's operand pattern: ``((i mod 65536) * seed) mod 97``.
_BLOCK, _MOD = 65536, 97


def operands(n: int) -> tuple[np.ndarray, np.ndarray]:
    i = np.arange(n, dtype=np.int64) % _BLOCK
    return (i % _MOD).astype(np.float32), ((i * 2) % _MOD).astype(np.float32)


def jobs(cp: Any, n: int) -> list[Callable[[], object]]:
    a, b = operands(n)
    return [lambda: (cp.asarray(a) + cp.asarray(b)).get(),
            lambda: float(cp.asarray(a).sum())]


def timed(job: Callable[[], object], reps: int) -> np.ndarray:
    samples = np.empty(reps, "<u8")
    for k in range(reps):
        t0 = time.perf_counter_ns()
        job()
        samples[k] = time.perf_counter_ns() - t0
    return samples


def load() -> Any:
    """CuPy, once it has run both jobs on a small vector; ``None`` where it cannot."""
    try:
        import cupy as cp

        for job in jobs(cp, 4):
            job()
    except Exception:  # no CuPy, or no driver, device or compiler for it: no reference
        return None
    return cp


def serve() -> int:
    cp = load()
    reply(f"reference={'CuPy ' + cp.__version__ if cp else 'none'}".encode())
    cache: dict[int, list[Callable[[], object]]] = {}
    request = memoryview(bytearray(_request.size))
    header = memoryview(bytearray(4))
    while read_exactly(header):
        size = _length.unpack(header)[0]
        if cp is None or size != _request.size or not read_exactly(request):
            return 1  # only the node talks to this port: anything else is its bug
        kernel, n, reps = _request.unpack(request)
        if kernel not in (0, 1):
            return 1
        if n not in cache:
            cache.clear()  # one size at a time: the largest takes 128 MB of operands
            cache[n] = jobs(cp, n)
        reply(timed(cache[n][kernel], reps))
    return 0


def main() -> int:
    os.dup2(2, 1)  # nothing may reach stdout, which the node shares with its JSON lines
    sys.stdout = sys.stderr
    return serve()


if __name__ == "__main__":
    sys.exit(main())
