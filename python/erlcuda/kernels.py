"""The kernel catalogue: argument checking and batch keys, shared by every backend.

The catalogue itself is ``contract.KERNELS`` (from ``contract.json``): each kernel's params,
in order, are vectors of an element type or dims (non-negative integers), a vector's length
may be tied to a product of other params, and a vector result's length is such a product.
``parse`` checks a job against that declaration alone, so a kernel added there is checked
here without code of its own.

Arguments arrive from Erlang already validated, as numpy views of the launch frame's bytes
(``protocol.decode``), but the worker is also driven from the command line and from tests,
and a port peer is never trusted: everything is checked again here and a bad job raises
``BadArgs``. The checks are worked out once per kernel (``_Rules``), so a job costs a few
comparisons. ``Plan``, what any checked launch becomes, is defined here, next to the rules
of the batched kernels, whose plans the hot paths make.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from . import contract, elements

if TYPE_CHECKING:  # they import this module
    from .general import UserKernel
    from .programs import ProgramRun
    from .protocol import Failure, Geometry

F32 = np.dtype("<f4")

#: Largest element count of one operand or result (2**31 - 1 keeps every index in an int32
#: loop counter on the device safe and bounds one request at 8 GiB).
MAX_ELEMENTS = contract.MAX_ELEMENTS

#: The kernels of the batched f32 path (a ``general`` one, such as a buffer operation, runs
#: on the general path alone).
KERNELS: tuple[str, ...] = tuple(k for k, spec in contract.KERNELS.items() if not spec.general)

#: numpy dtypes of the contract's element types.
DTYPES: dict[str, np.dtype[Any]] = elements.DTYPES

# A batched plan carries up to two vectors (a, b) and three dims (m, n, k), in param order.
_VECTOR_FIELDS = ("a", "b")
_DIM_FIELDS = ("m", "n", "k")


class Refused(Exception):
    """A launch (a program's too, or a user kernel's declaration) that breaks a rule:
    ``failure`` is the ``{error, Reason}`` to answer (``bad_args``, ``buffer_lost``,
    ``bad_program``, ``step``...)."""

    def __init__(self, failure: Failure) -> None:
        super().__init__(str(failure.detail[-1]) if failure.detail else failure.reason)
        self.failure = failure


class BadArgs(ValueError):
    """A job's arguments do not fit its kernel. ``str(exc)`` is the reason sent to Erlang."""


@dataclass(slots=True)
class Operand:
    """One argument of a plan that runs on its own (not ``batched``), and where it comes
    from: ``data`` (a host array to upload: ``value``), ``file`` (a ``FileArg`` to map,
    then upload), ``buffer`` (the held buffer ``value``, used in place), ``zeros``
    (``elements`` zeroed elements to allocate) or ``value`` (a dim or a numpy scalar,
    passed as it is)."""

    source: str
    value: Any
    type: str | None = None  # a vector's element type
    elements: int = 0
    result: bool = False  # its contents after the call are one of the job's results

    @property
    def vector(self) -> bool:
        return self.source != "value"


@dataclass(slots=True)
class Plan:
    """A launch, checked (``general.check``, the one check): what its lane runs.

    ``action``: ``batched`` (a batched f32 kernel on host vectors and dims: ``a``, ``b``
    and ``m``, ``n``, ``k`` in param order, ``elements`` its input elements; plans of one
    ``key`` run as one backend call), ``builtin`` (a catalogue kernel on ``operands``, into
    a new ``out`` array of ``out_type`` where the result is a vector), ``copy`` (the operand
    is the result: a buffer copied on the device where it is kept, an upload where data is
    kept), ``fill`` (zeros or empty: a new array) or ``user`` (``user`` launched with the
    operands, in a grid of ``geometry``; no launch where it is ``None``). ``out_elements``
    is the result's length (1 for a batched scalar). The job's vector results are the
    ``out`` array or the operands marked ``result``, in order: kept under ``keep`` where it
    is set, else downloaded; a user kernel's are answered as a list. ``program`` runs a
    program (``programs``) on its inputs, the ``operands``; its outputs are answered as a
    list. Treat a plan as immutable."""

    kernel: str
    action: str
    operands: Sequence[Operand] = ()
    keep: tuple[int, ...] | None = None
    out_type: str | None = None
    out_elements: int = 0
    scalar: bool = False  # the result is a scalar
    user: UserKernel | None = None
    geometry: Geometry | None = None
    results: Sequence[int] = ()  # the operands that are results
    a: np.ndarray | None = None
    b: np.ndarray | None = None
    m: int = 0
    n: int = 0
    k: int = 0
    elements: int = 0
    program: ProgramRun | None = None  # ``program``: the checked program and its batch key

    @property
    def key(self) -> tuple[Any, ...] | None:
        """Plans with equal keys run together as one batched launch (same kernel and dims,
        or the same program on inputs of the same shapes); ``None``: the plan runs alone."""
        if self.action == "batched":
            return (self.kernel, self.m, self.n, self.k)
        if self.program is not None:
            return self.program.key
        return None

    @property
    def makes_out(self) -> bool:
        """Whether the lane allocates a new array for the result (``out_type``)."""
        if self.action == "builtin":
            return not self.scalar
        if self.action == "copy":
            return self.keep is not None and self.operands[0].source == "buffer"
        return self.action == "fill" and self.keep is not None

    @property
    def device_bytes(self) -> int:
        """Device memory the job takes: the arrays it uploads and allocates."""
        if self.action == "batched":
            return 4 * (self.elements + self.out_elements)
        if self.program is not None:
            return self.program.plan.device_bytes
        total = sum(op.elements * DTYPES[op.type].itemsize for op in self.operands
                    if op.source in ("data", "file", "zeros") and op.type is not None)
        if self.makes_out and self.out_type is not None:
            total += self.out_elements * DTYPES[self.out_type].itemsize
        return total

    @property
    def kept_bytes(self) -> int:
        """Bytes of the vectors the job keeps as new buffers."""
        if not self.keep:
            return 0
        if self.program is not None:
            typed = self.program.plan
            return sum(typed.slots[s].nbytes for s in typed.outputs)
        if self.action != "user":
            return self.out_elements * DTYPES[self.out_type or "f32"].itemsize
        return sum(self.operands[i].elements * DTYPES[self.operands[i].type or "f32"].itemsize
                   for i in self.results)


def batch_plan(kernel: str, a: np.ndarray, b: np.ndarray | None = None, m: int = 0,
               n: int = 0, k: int = 0, elements: int = -1, out_elements: int = -1) -> Plan:
    """The ``batched`` plan of ``kernel`` on these operands, trusted as they are (``parse``
    checks them); ``elements`` and ``out_elements`` worked out where not given."""
    if elements < 0:
        elements = int(a.size) + (0 if b is None else int(b.size))
    result = contract.KERNELS[kernel].result
    scalar = result.kind != "vector"
    if out_elements < 0:
        out_elements = 1 if scalar else _product(
            result.length, _sizes(kernel, (a, b), (m, n, k)))
    return Plan(kernel, "batched", (), None, "f32", out_elements, scalar, None, None, (),
                a, b, m, n, k, elements)


def _sizes(kernel: str, vectors: Sequence[np.ndarray | None],
           dims: Sequence[int]) -> dict[str, int]:
    """Each param's size by name: a vector's length, a dim's value."""
    spec = contract.KERNELS[kernel]
    vector_values, dim_values = iter(vectors), iter(dims)
    sizes = {}
    for p in spec.params:
        if p.kind == "vector":
            sizes[p.name] = int(next(vector_values).size)  # type: ignore[union-attr]
        else:
            sizes[p.name] = int(next(dim_values))
    return sizes


def counted(n: int, word: str) -> str:
    """``n`` and ``word``, plural but for one: "1 argument", "2 arguments"."""
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def _product(names: Sequence[str], sizes: dict[str, int]) -> int:
    return math.prod(sizes[name] for name in names)


def _check_catalogue() -> None:
    """Fail at import, not at the first job, when the contract outgrows a batched ``Plan``."""
    for spec in contract.KERNELS.values():
        if spec.general:
            continue
        kinds = [p.kind for p in spec.params]
        if kinds.count("vector") > len(_VECTOR_FIELDS) or kinds.count("dim") > len(_DIM_FIELDS):
            raise RuntimeError(f"contract: {spec.name} has more params than a batched Plan holds")
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
    """A 1-D little-endian f32 view of a binary, or a copy of a list of numbers; an array as
    it is where it is contiguous f32, else a contiguous f32 copy (the backends read and
    copy a vector's bytes from its first on)."""
    if isinstance(value, np.ndarray):
        if value.ndim != 1:
            raise BadArgs(f"{what}: expected a 1-D vector")
        return np.ascontiguousarray(value, dtype=F32)
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


def check_lengths(spec: contract.KernelSpec, sizes: dict[str, int]) -> int:
    """The length rules of ``spec``'s params on their sizes by name (a vector's length, a
    dim's value), and its vector result's length (1 for a scalar one): the one statement of
    them, which ``parse``'s loop repeats on its precomputed indexes. ``BadArgs`` where one
    is broken, or the result is too large."""
    vectors = {p.name for p in spec.params if p.kind == "vector"}
    for p in spec.params:
        if p.length and sizes[p.name] != _product(p.length, sizes):
            raise _length_error(p.name, sizes[p.name], p.length, sizes, vectors)
    if spec.result.kind != "vector":
        return 1
    out = _product(spec.result.length, sizes)
    if out > MAX_ELEMENTS:
        raise BadArgs(f"result {'*'.join(spec.result.length)} = {out} is too large")
    return out


def _length_error(name: str, size: int, length: tuple[str, ...], sizes: dict[str, int],
                  vectors: set[str]) -> BadArgs:
    if len(length) == 1 and length[0] in vectors:
        return BadArgs(f"length mismatch: {length[0]} has {counted(sizes[length[0]], 'element')}, "
                       f"{name} has {size}")
    return BadArgs(f"{name} has {counted(size, 'element')}, "
                   f"{'*'.join(length)} = {_product(length, sizes)}")


@dataclass(frozen=True, slots=True)
class _Rules:
    """A kernel's declaration worked out once for ``parse``; params by their index."""

    spec: contract.KernelSpec
    vectors: tuple[tuple[int, str, np.dtype[Any]], ...]
    dims: tuple[tuple[int, str], ...]
    rules: tuple[tuple[int, tuple[int, ...]], ...]  # a param, the params of its length
    result: tuple[int, ...] | None  # the params of a vector result's length; None: a scalar
    fields: tuple[int | None, ...]  # the param of each of Plan's a, b, m, n, k


_RULES: dict[str, _Rules] = {}


def _rules(spec: contract.KernelSpec) -> _Rules:
    index = {p.name: i for i, p in enumerate(spec.params)}
    vector_fields, dim_fields = iter(_VECTOR_FIELDS), iter(_DIM_FIELDS)
    field_of = {next(vector_fields) if p.kind == "vector" else next(dim_fields): i
                for i, p in enumerate(spec.params)}
    return _Rules(
        spec,
        tuple((i, p.name, DTYPES[p.type or ""]) for i, p in enumerate(spec.params)
              if p.kind == "vector"),
        tuple((i, p.name) for i, p in enumerate(spec.params) if p.kind == "dim"),
        tuple((i, tuple(index[n] for n in p.length)) for i, p in enumerate(spec.params)
              if p.length),
        tuple(index[n] for n in spec.result.length) if spec.result.kind == "vector" else None,
        tuple(field_of.get(f) for f in (*_VECTOR_FIELDS, *_DIM_FIELDS)),
    )


def parse(kernel: str, args: Sequence[Any]) -> Plan:
    """Check ``args`` against ``kernel``'s declaration; raise ``BadArgs`` with a readable reason.

    A vector is a 1-D numpy array of its element type (taken as it is where contiguous,
    else copied), an f32 binary (viewed) or a list of numbers (copied); a dim a
    non-negative integer.
    """
    spec = contract.KERNELS.get(kernel)
    if spec is None:
        raise BadArgs(f"unknown kernel {kernel!r:.40}")
    if spec.general:
        raise BadArgs(f"{kernel} is not a kernel of the batched f32 path")
    plan = _RULES.get(kernel)
    if plan is None or plan.spec is not spec:
        plan = _RULES[kernel] = _rules(spec)
    if not isinstance(args, (list, tuple)):
        raise BadArgs("args must be a list")
    if len(args) != len(spec.params):
        raise BadArgs(f"{kernel} takes {counted(spec.arity, 'argument')}, got {len(args)}")
    # Every param first, then the lengths, which may name params that come later.
    values = list(args)
    sizes = [0] * len(values)
    limit = MAX_ELEMENTS
    elements = 0
    for i, name, dtype in plan.vectors:
        value = values[i]
        if (type(value) is not np.ndarray or value.dtype is not dtype or value.ndim != 1
                or not value.flags.c_contiguous):
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
        if sizes[i] != want:  # the reason, from the rules' one statement
            check_lengths(spec, {p.name: sizes[j] for j, p in enumerate(spec.params)})
    out = 1
    if plan.result is not None:
        for j in plan.result:
            out *= sizes[j]
        if out > limit:
            check_lengths(spec, {p.name: sizes[j] for j, p in enumerate(spec.params)})
    a, b, m, n, k = (None if j is None else values[j] for j in plan.fields)
    # (positional: the fields of ``Plan`` in order)
    return Plan(kernel, "batched", (), None, "f32", out, plan.result is None, None, None, (),
                a, b, m or 0, n or 0, k or 0, elements)  # type: ignore[arg-type]


@dataclass(slots=True)
class UniformPlans:
    """Batched plans of one key whose operands all have the same sizes, as a table
    (``templates.Table``): ``a`` and ``b`` are ``count x size`` blocks, row ``i`` plan
    ``i``'s; the rest as in ``Plan``, per plan. ``scalar``: the result is a scalar."""

    kernel: str
    a: np.ndarray
    b: np.ndarray | None
    m: int
    n: int
    k: int
    count: int
    elements: int
    out_elements: int
    scalar: bool

    def row(self, i: int) -> Plan:
        """Plan ``i`` on its own."""
        return batch_plan(self.kernel, self.a[i], None if self.b is None else self.b[i],
                          self.m, self.n, self.k, self.elements, self.out_elements)

    def rows(self, start: int, end: int) -> UniformPlans:
        """Jobs ``start`` to ``end`` (excluded) as a batch of their own."""
        return replace(self, a=self.a[start:end],
                       b=None if self.b is None else self.b[start:end], count=end - start)

    @property
    def device_bytes(self) -> int:
        return 4 * self.count * (self.elements + self.out_elements)
