"""The Python side of the benchmark's erlport section (``bench/run --erlport DIR``).

erlport's ``python:call(P, erlport_peer, F, Args)`` runs these in erlport's own Python
process; Erlang binaries arrive as ``bytes`` and ``bytes`` go back as binaries. Nothing here
may print: erlport forwards a peer's stdout to the node's, which carries the benchmark's
JSON lines.
"""

from __future__ import annotations

import numpy as np


def noop() -> None:
    """The tiny call: nothing to do, ``undefined`` back."""


def vector_add(a: bytes, b: bytes) -> bytes:
    """Two little-endian f32 vectors added, as the same bytes erlcuda's vector_add returns."""
    x = np.frombuffer(a, dtype="<f4")
    y = np.frombuffer(b, dtype="<f4")
    if x.size != y.size:
        raise ValueError(f"length mismatch: {x.size} and {y.size}")
    return np.add(x, y, dtype="<f4").tobytes()
