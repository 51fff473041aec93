"""The kernel catalogue: argument checking and batch keys, shared by every backend.

The catalogue itself is ``contract.KERNELS`` (from ``contract.json``): each kernel's params,
in order, are vectors of an element type or dims (non-negative integers), a vector's length
may be tied to a product of other params, and a vector result's length is such a product.
``parse`` checks a job against that declaration alone, so a kernel added there is checked
here without code of its own.

Arguments arrive from Erlang already validated and packed as little-endian f32 binaries, but
the worker is also driven from the command line and from tests, and a port peer is never
trusted: everything is checked again here and a bad job raises ``BadArgs``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from . import contract

F32 = np.dtype("<f4")

#: Largest element count of one operand or result (2**31 - 1 keeps every index in an int32
#: loop counter on the device safe and bounds one request at 8 GiB).
MAX_ELEMENTS = contract.MAX_ELEMENTS

KERNELS: tuple[str, ...] = tuple(contract.KERNELS)

#: numpy dtypes of the contract's element types.
DTYPES: dict[str, np.dtype[Any]] = {"f32": F32}

# Request carries up to two vectors (a, b) and three dims (m, n, k), filled in param order.
_VECTOR_FIELDS = ("a", "b")
_DIM_FIELDS = ("m", "n", "k")


class BadArgs(ValueError):
    """A job's arguments do not fit its kernel. ``str(exc)`` is the reason sent to Erlang."""


@dataclass(frozen=True, slots=True)
class Request:
    """One validated job. ``a``/``b`` are its vectors and m, n, k its dims, in param order."""

    kernel: str
    a: np.ndarray
    b: np.ndarray | None = None
    m: int = 0
    n: int = 0
    k: int = 0

    @property
    def key(self) -> tuple[Any, ...]:
        """Jobs with equal keys may run together as one batched launch: same kernel and dims."""
        return (self.kernel, self.m, self.n, self.k)

    @property
    def device_bytes(self) -> int:
        """Device memory the job needs: its inputs and its output."""
        return 4 * (self.elements + self.result_elements)

    @property
    def elements(self) -> int:
        """Input elements, used to bound the size of a batch."""
        return int(self.a.size) + (0 if self.b is None else int(self.b.size))

    @property
    def result_elements(self) -> int:
        """Elements of the result: 1 for a scalar."""
        result = contract.KERNELS[self.kernel].result
        if result.kind != "vector":
            return 1
        return _product(result.length, _sizes(self))


def _sizes(request: Request) -> dict[str, int]:
    """Each param's size by name: a vector's length, a dim's value."""
    spec = contract.KERNELS[request.kernel]
    vectors = iter(_VECTOR_FIELDS)
    dims = iter(_DIM_FIELDS)
    sizes = {}
    for p in spec.params:
        value = getattr(request, next(vectors) if p.kind == "vector" else next(dims))
        sizes[p.name] = int(value.size) if p.kind == "vector" else int(value)
    return sizes


def _product(names: Sequence[str], sizes: dict[str, int]) -> int:
    return math.prod(sizes[name] for name in names)


def _check_catalogue() -> None:
    """Fail at import, not at the first job, when the contract outgrows ``Request``."""
    for spec in contract.KERNELS.values():
        kinds = [p.kind for p in spec.params]
        if kinds.count("vector") > len(_VECTOR_FIELDS) or kinds.count("dim") > len(_DIM_FIELDS):
            raise RuntimeError(f"contract: {spec.name} has more params than Request holds")
        if not kinds or kinds[0] != "vector":
            raise RuntimeError(f"contract: {spec.name} must take a vector first")
        names = {p.name for p in spec.params}
        for p in (*spec.params, spec.result):
            if p.kind not in ("vector", "dim") and not (p is spec.result and p.kind == "scalar"):
                raise RuntimeError(f"contract: {spec.name}.{p.name}: unknown kind {p.kind!r}")
            if p.kind == "vector" and p.type not in DTYPES:
                raise RuntimeError(f"contract: {spec.name}.{p.name}: no dtype for {p.type!r}")
            if not set(p.length) <= names:
                raise RuntimeError(f"contract: {spec.name}.{p.name}: length names an unknown "
                                   f"param in {p.length}")


_check_catalogue()


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


def _vector(value: Any, what: str, dtype: np.dtype[Any]) -> np.ndarray:
    # f32 is the only element type today; another one needs its own conversion here.
    if dtype != F32:
        raise BadArgs(f"{what}: unsupported element type {dtype}")
    array = as_f32(value, what)
    if array.size > MAX_ELEMENTS:
        raise BadArgs(f"{what}: {array.size} elements, over the {MAX_ELEMENTS} limit")
    return array


def _dim(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise BadArgs(f"{what}: expected a non-negative integer")
    if value < 0 or value > MAX_ELEMENTS:
        raise BadArgs(f"{what}: {value} out of range")
    return value


def _length_error(name: str, size: int, length: tuple[str, ...], sizes: dict[str, int],
                  vectors: set[str]) -> BadArgs:
    if len(length) == 1 and length[0] in vectors:
        return BadArgs(f"length mismatch: {length[0]} has {sizes[length[0]]} elements, "
                       f"{name} has {size}")
    return BadArgs(f"{name} has {size} elements, {'*'.join(length)} = {_product(length, sizes)}")


def parse(kernel: str, args: Sequence[Any]) -> Request:
    """Check ``args`` against ``kernel``'s declaration; raise ``BadArgs`` with a readable reason."""
    spec = contract.KERNELS.get(kernel)
    if spec is None:
        raise BadArgs(f"unknown kernel {kernel!r:.40}")
    if not isinstance(args, (list, tuple)):
        raise BadArgs("args must be a list")
    if len(args) != spec.arity:
        raise BadArgs(f"{kernel} takes {spec.arity} arguments, got {len(args)}")
    # Every param first, then the lengths, which may name params that come later.
    values: dict[str, Any] = {}
    for p, arg in zip(spec.params, args, strict=True):
        if p.kind == "vector":
            values[p.name] = _vector(arg, p.name, DTYPES[p.type or ""])
        else:
            values[p.name] = _dim(arg, p.name)
    sizes = {name: int(v.size) if isinstance(v, np.ndarray) else v for name, v in values.items()}
    vectors = {p.name for p in spec.params if p.kind == "vector"}
    for p in spec.params:
        if p.length and sizes[p.name] != _product(p.length, sizes):
            raise _length_error(p.name, sizes[p.name], p.length, sizes, vectors)
    if spec.result.kind == "vector" and spec.result.length:
        out = _product(spec.result.length, sizes)
        if out > MAX_ELEMENTS:
            raise BadArgs(f"result {'*'.join(spec.result.length)} = {out} is too large")
    fields: dict[str, Any] = {}
    vector_fields, dim_fields = iter(_VECTOR_FIELDS), iter(_DIM_FIELDS)
    for p in spec.params:
        fields[next(vector_fields) if p.kind == "vector" else next(dim_fields)] = values[p.name]
    return Request(kernel, **fields)
