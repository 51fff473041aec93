"""The kernel catalogue: names, argument checking and batch keys, shared by every backend.

Arguments arrive from Erlang already validated and packed as little-endian f32 binaries, but
the worker is also driven from the command line and from tests, and a port peer is never
trusted: everything is checked again here and a bad job raises ``BadArgs``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

F32 = np.dtype("<f4")

#: Largest element count accepted for one operand (2**31 - 1 keeps every index in an int32
#: loop counter on the device safe and bounds one request at 8 GiB).
MAX_ELEMENTS = 2**31 - 1

KERNELS: tuple[str, ...] = ("vector_add", "reduce", "dot_product", "matmul")


class BadArgs(ValueError):
    """A job's arguments do not fit its kernel. ``str(exc)`` is the reason sent to Erlang."""


@dataclass(frozen=True, slots=True)
class Request:
    """One validated job. ``a``/``b`` are 1-D f32 arrays; m, n, k are matmul's shape."""

    kernel: str
    a: np.ndarray
    b: np.ndarray | None = None
    m: int = 0
    n: int = 0
    k: int = 0

    @property
    def key(self) -> tuple[Any, ...]:
        """Jobs with equal keys may run together as one batched launch."""
        if self.kernel == "matmul":
            return ("matmul", self.m, self.n, self.k)
        return (self.kernel,)

    @property
    def device_bytes(self) -> int:
        """Device memory the job needs: its inputs and its output."""
        out = {"vector_add": self.a.size, "matmul": self.m * self.n}.get(self.kernel, 1)
        return 4 * (self.elements + out)

    @property
    def elements(self) -> int:
        """Input elements, used to bound the size of a batch."""
        return int(self.a.size) + (0 if self.b is None else int(self.b.size))


def as_f32(value: Any, what: str) -> np.ndarray:
    """A 1-D little-endian f32 view of a binary, or a copy of a list of numbers."""
    if isinstance(value, np.ndarray):
        if value.ndim != 1:
            raise BadArgs(f"{what}: expected a 1-D vector")
        return value.astype(F32, copy=False)
    if isinstance(value, (bytes, bytearray, memoryview)):
        nbytes = memoryview(value).nbytes
        if nbytes % 4:
            raise BadArgs(f"{what}: binary size {nbytes} is not a multiple of 4")
        return np.frombuffer(value, dtype=F32)
    if isinstance(value, list):
        for x in value:
            if isinstance(x, bool) or not isinstance(x, (int, float)):
                raise BadArgs(f"{what}: not a number: {x!r:.40}")
        try:
            with np.errstate(over="ignore"):
                array = np.asarray(value, dtype=F32)
        except OverflowError as exc:
            raise BadArgs(f"{what}: number out of range") from exc
        if not np.isfinite(array).all():
            raise BadArgs(f"{what}: number out of range for f32")
        return array
    raise BadArgs(f"{what}: expected a list of numbers or an f32 binary")


def _dim(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise BadArgs(f"{what}: expected a non-negative integer")
    if value < 0 or value > MAX_ELEMENTS:
        raise BadArgs(f"{what}: {value} out of range")
    return value


def parse(kernel: str, args: Sequence[Any]) -> Request:
    """Check ``args`` against ``kernel``; raise ``BadArgs`` with a readable reason."""
    if kernel not in KERNELS:
        raise BadArgs(f"unknown kernel {kernel!r:.40}")
    if not isinstance(args, (list, tuple)):
        raise BadArgs("args must be a list")
    arity = {"vector_add": 2, "reduce": 1, "dot_product": 2, "matmul": 5}[kernel]
    if len(args) != arity:
        raise BadArgs(f"{kernel} takes {arity} arguments, got {len(args)}")
    if kernel == "reduce":
        return Request(kernel, as_f32(args[0], "A"))
    a, b = as_f32(args[0], "A"), as_f32(args[1], "B")
    if kernel in ("vector_add", "dot_product"):
        if a.size != b.size:
            raise BadArgs(f"length mismatch: {a.size} and {b.size}")
        return Request(kernel, a, b)
    m, n, k = (_dim(args[i], name) for i, name in ((2, "M"), (3, "N"), (4, "K")))
    if m * k != a.size:
        raise BadArgs(f"A has {a.size} elements, M*K = {m * k}")
    if k * n != b.size:
        raise BadArgs(f"B has {b.size} elements, K*N = {k * n}")
    if m * n > MAX_ELEMENTS:
        raise BadArgs(f"result M*N = {m * n} is too large")
    return Request(kernel, a, b, m, n, k)
