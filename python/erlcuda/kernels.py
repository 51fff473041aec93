"""The kernel catalogue: argument checking and batch keys, shared by every backend.

The catalogue itself is ``contract.KERNELS`` (from ``contract.json``): each kernel's params,
in order, are vectors of an element type or dims (non-negative integers), a vector's length
may be tied to a product of other params, and a vector result's length is such a product.
``parse`` checks a job against that declaration alone, so a kernel added there is checked
here without code of its own.

Arguments arrive from Erlang already validated, as numpy views of the launch frame's bytes
(``protocol.decode``), but the worker is also driven from the command line and from tests,
and a port peer is never trusted: everything is checked again here and a bad job raises
``BadArgs``. The checks are worked out once per kernel (``_Plan``), so a job costs a few
comparisons.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from . import contract, elements

F32 = np.dtype("<f4")

#: Largest element count of one operand or result (2**31 - 1 keeps every index in an int32
#: loop counter on the device safe and bounds one request at 8 GiB).
MAX_ELEMENTS = contract.MAX_ELEMENTS

#: The kernels of the batched f32 path (a ``general`` one, such as a buffer operation, runs
#: on the general path alone).
KERNELS: tuple[str, ...] = tuple(k for k, spec in contract.KERNELS.items() if not spec.general)

#: numpy dtypes of the contract's element types.
DTYPES: dict[str, np.dtype[Any]] = elements.DTYPES

# Request carries up to two vectors (a, b) and three dims (m, n, k), filled in param order.
_VECTOR_FIELDS = ("a", "b")
_DIM_FIELDS = ("m", "n", "k")


class BadArgs(ValueError):
    """A job's arguments do not fit its kernel. ``str(exc)`` is the reason sent to Erlang."""


@dataclass(slots=True)
class Request:
    """One validated job. ``a``/``b`` are its vectors and m, n, k its dims, in param order.

    ``elements`` (its input elements) and ``result_elements`` (1 for a scalar) are worked out
    once, by ``parse`` or at construction; treat a request as immutable.
    """

    kernel: str
    a: np.ndarray
    b: np.ndarray | None = None
    m: int = 0
    n: int = 0
    k: int = 0
    elements: int = -1
    result_elements: int = -1

    def __post_init__(self) -> None:
        if self.elements < 0:
            self.elements = int(self.a.size) + (0 if self.b is None else int(self.b.size))
        if self.result_elements < 0:
            result = contract.KERNELS[self.kernel].result
            self.result_elements = (_product(result.length, _sizes(self))
                                    if result.kind == "vector" else 1)

    @property
    def key(self) -> tuple[Any, ...]:
        """Jobs with equal keys may run together as one batched launch: same kernel and dims."""
        return (self.kernel, self.m, self.n, self.k)

    @property
    def device_bytes(self) -> int:
        """Device memory the job needs: its inputs and its output."""
        return 4 * (self.elements + self.result_elements)


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
        if spec.general:
            continue
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
    # The batched kernels take f32 alone; another type would need its own conversion here.
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


@dataclass(frozen=True, slots=True)
class _Plan:
    """A kernel's declaration worked out once for ``parse``; params by their index."""

    spec: contract.KernelSpec
    vectors: tuple[tuple[int, str, np.dtype[Any]], ...]
    dims: tuple[tuple[int, str], ...]
    rules: tuple[tuple[int, tuple[int, ...]], ...]  # a param, the params of its length
    result: tuple[int, ...] | None  # the params of a vector result's length; None: a scalar
    fields: tuple[int | None, ...]  # the param of each of Request's a, b, m, n, k


_PLANS: dict[str, _Plan] = {}


def _plan(spec: contract.KernelSpec) -> _Plan:
    index = {p.name: i for i, p in enumerate(spec.params)}
    vector_fields, dim_fields = iter(_VECTOR_FIELDS), iter(_DIM_FIELDS)
    field_of = {next(vector_fields) if p.kind == "vector" else next(dim_fields): i
                for i, p in enumerate(spec.params)}
    return _Plan(
        spec,
        tuple((i, p.name, DTYPES[p.type or ""]) for i, p in enumerate(spec.params)
              if p.kind == "vector"),
        tuple((i, p.name) for i, p in enumerate(spec.params) if p.kind == "dim"),
        tuple((i, tuple(index[n] for n in p.length)) for i, p in enumerate(spec.params)
              if p.length),
        tuple(index[n] for n in spec.result.length) if spec.result.kind == "vector" else None,
        tuple(field_of.get(f) for f in (*_VECTOR_FIELDS, *_DIM_FIELDS)),
    )


def parse(kernel: str, args: Sequence[Any]) -> Request:
    """Check ``args`` against ``kernel``'s declaration; raise ``BadArgs`` with a readable reason.

    A vector is a 1-D numpy array of its element type (taken as it is), an f32 binary
    (viewed) or a list of numbers (copied); a dim a non-negative integer.
    """
    spec = contract.KERNELS.get(kernel)
    if spec is None:
        raise BadArgs(f"unknown kernel {kernel!r:.40}")
    if spec.general:
        raise BadArgs(f"{kernel} is not a kernel of the batched f32 path")
    plan = _PLANS.get(kernel)
    if plan is None or plan.spec is not spec:
        plan = _PLANS[kernel] = _plan(spec)
    if not isinstance(args, (list, tuple)):
        raise BadArgs("args must be a list")
    if len(args) != len(spec.params):
        raise BadArgs(f"{kernel} takes {spec.arity} arguments, got {len(args)}")
    # Every param first, then the lengths, which may name params that come later.
    values = list(args)
    sizes = [0] * len(values)
    limit = MAX_ELEMENTS
    elements = 0
    for i, name, dtype in plan.vectors:
        value = values[i]
        if type(value) is not np.ndarray or value.dtype is not dtype or value.ndim != 1:
            value = values[i] = _vector(value, name, dtype)
        size = value.size
        if size > limit:
            raise BadArgs(f"{name}: {size} elements, over the {limit} limit")
        sizes[i] = size
        elements += size
    for i, name in plan.dims:
        value = values[i]
        if type(value) is not int or value < 0 or value > limit:
            value = values[i] = _dim(value, name)
        sizes[i] = value
    for i, length in plan.rules:
        want = 1
        for j in length:
            want *= sizes[j]
        if sizes[i] != want:
            named = {p.name: sizes[j] for j, p in enumerate(spec.params)}
            vectors = {name for _, name, _ in plan.vectors}
            raise _length_error(spec.params[i].name, sizes[i], spec.params[i].length, named,
                                vectors)
    out = 1
    if plan.result is not None:
        for j in plan.result:
            out *= sizes[j]
        if out > limit:
            raise BadArgs(f"result {'*'.join(spec.result.length)} = {out} is too large")
    a, b, m, n, k = (None if j is None else values[j] for j in plan.fields)
    return Request(kernel, a, b, m or 0, n or 0, k or 0, elements, out)  # type: ignore[arg-type]


@dataclass(slots=True)
class UniformRequest:
    """Jobs of one kernel whose operands all have the same sizes (``templates.Table``): ``a``
    and ``b`` are ``count x size`` blocks, row ``i`` job ``i``'s; the rest as in
    ``Request``, per job. ``scalar``: the result is a scalar, else a vector."""

    kernel: str
    a: np.ndarray
    b: np.ndarray | None
    m: int
    n: int
    k: int
    count: int
    elements: int
    result_elements: int
    scalar: bool

    def row(self, i: int) -> Request:
        """Job ``i`` as a ``Request``."""
        return Request(self.kernel, self.a[i], None if self.b is None else self.b[i],
                       self.m, self.n, self.k, self.elements, self.result_elements)

    def rows(self, start: int, end: int) -> UniformRequest:
        """Jobs ``start`` to ``end`` (excluded) as a batch of their own."""
        return replace(self, a=self.a[start:end],
                       b=None if self.b is None else self.b[start:end], count=end - start)

    @property
    def device_bytes(self) -> int:
        return 4 * self.count * (self.elements + self.result_elements)
