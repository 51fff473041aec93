"""The one check of a launch (``check``), and the user kernels: their registry and declarations.

``check`` turns any decoded launch into a ``kernels.Plan``. A plain launch of a batched f32
kernel becomes a ``batched`` plan (``kernels.parse``), which lanes group by key. Any other
launch is general: its frame says so (``protocol.Launch.general``: kept results, a
geometry, a buffer, scalar or empty argument, a vector of another type than f32) or its
kernel is outside the batched catalogue: ``copy``, ``zeros`` and ``empty`` (``general`` in
the contract) and the user kernels loaded at run time (``Registry``). Such a launch is
checked on its device's thread (where the buffers it names are known), and its plan says
what to run alone: which operands to upload, which to allocate, which buffers to use, what
to call and which vectors are the job's results; the lane runs it (``lanes.Lane``).

The rules, as the contract says them: a built-in kernel runs in one element type per launch
(that of its vector operands, else its first type, and one of its ``types``), with the
length rules of its params; a user kernel takes each pointer in its declared type and each
scalar in its declared type. ``NKeep`` must be the number of vector results the launch makes.
Whatever breaks a rule is refused with ``Refused``, carrying the job's ``{error, Reason}``.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from . import contract, elements, kernels, programs, protocol
from .kernels import DTYPES, MAX_ELEMENTS, Operand, Plan, Refused
from .protocol import Empty, Handle, Launch, Scalar
from .shm import FileArg

#: The access of a user kernel's param: a pointer read, written or both, or a scalar.
ACCESS = ("in", "out", "inout", "scalar")
#: Threads per block of a launch without a geometry (elements: one thread each).
BLOCK = 256
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


def _bad(text: str) -> Refused:
    return Refused(protocol.bad_args(text))


# -- user kernels ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class UserKernel:
    """A loaded kernel: ``name`` is its extern "C" function's name and the name launches
    use. ``params`` are the function's params in order, ``(access, type)``. An elementwise
    kernel (``kind``) is launched with its first ``inputs`` params: the worker makes its
    outputs (the params after them) and passes the length ``n`` last."""

    name: str
    module: str
    params: tuple[tuple[str, str], ...]
    kind: str = "raw"
    inputs: int = 0  # elementwise: how many params the launch passes
    body: ElementwiseBody | None = None  # elementwise: what its source was written from

    @property
    def elementwise(self) -> bool:
        return self.kind == "elementwise"

    @property
    def launch_params(self) -> tuple[tuple[str, str], ...]:
        """The function's params as a launch passes them: an elementwise kernel's end with
        the length ``n``, an i64 scalar."""
        return self.params + ((("scalar", "i64"),) if self.elementwise else ())


@dataclass(frozen=True, slots=True)
class ElementwiseBody:
    """What an elementwise kernel's source is written from (``usercode.elementwise_source``):
    its inputs ``(Var, Type, vector | scalar)``, outputs ``(Var, Type)``, the operation and
    the nvcc flags it was loaded with. A program fuses such kernels (``fusion``)."""

    inputs: tuple[tuple[str, str, str], ...]
    outputs: tuple[tuple[str, str], ...]
    operation: str
    flags: tuple[str, ...]


class Registry:
    """The user kernels by name and the modules they came from. Changed by one thread (the
    one answering control calls), read by every lane: a change swaps in new dicts, so a
    reader sees one state or the next, never half of one."""

    def __init__(self) -> None:
        self.kernels: dict[str, UserKernel] = {}
        self.modules: dict[str, tuple[str, ...]] = {}
        self.version = 0  # changes with every install and remove: what was checked is stale

    def get(self, name: str) -> UserKernel | None:
        return self.kernels.get(name)

    def owner(self, name: str, module: str) -> str | None:
        """Who holds ``name`` where ``module`` may not take it: the catalogue or another
        module; ``None`` where it is free (or ``module``'s own)."""
        if name in contract.KERNELS:
            return "a built-in kernel"
        held = self.kernels.get(name)
        if held is not None and held.module != module:
            return f"module {held.module}"
        return None

    def install(self, module: str, kernels: Sequence[UserKernel]) -> None:
        """``module`` with ``kernels``, in place of what it held before."""
        table = {k: v for k, v in self.kernels.items() if v.module != module}
        table.update((k.name, k) for k in kernels)
        modules = dict(self.modules)
        modules[module] = tuple(k.name for k in kernels)
        self.kernels, self.modules = table, modules
        self.version += 1

    def remove(self, module: str) -> bool:
        """Forget ``module``; ``False`` where it was not loaded."""
        if module not in self.modules:
            return False
        self.kernels = {k: v for k, v in self.kernels.items() if v.module != module}
        self.modules = {m: names for m, names in self.modules.items() if m != module}
        self.version += 1
        return True


def text(value: Any, what: str) -> str:
    """A binary (or an atom's name) as text; ``Refused`` for anything else."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        try:
            return bytes(value).decode("utf-8")
        except UnicodeDecodeError:
            raise _bad(f"{what} is not UTF-8") from None
    if isinstance(value, str):
        return str(value)
    raise _bad(f"{what}: expected a binary, got {value!r:.60}")


def _identifier(value: Any, what: str) -> str:
    name = text(value, what)
    if not _NAME.match(name) or len(name.encode()) > elements.KERNEL_NAME_BYTES:
        raise _bad(f"{what} {name!r:.60} is not a C identifier (of at most "
                   f"{elements.KERNEL_NAME_BYTES} bytes)")
    return name


def _type(value: Any, what: str) -> str:
    if isinstance(value, str) and str(value) in contract.ELEMENT_TYPES:
        return str(value)
    raise _bad(f"{what}: {value!r:.40} is not one of {', '.join(contract.ELEMENT_TYPES)}")


def options(value: Any) -> list[str]:
    """nvcc's flags: a list of binaries."""
    if not isinstance(value, list):
        raise _bad("options: expected a list of binaries")
    return [text(v, "an option") for v in value]


def user_kernels(module: str, value: Any) -> list[UserKernel]:
    """The kernels of a ``load`` call: ``[{Name, [{Access, Type}]}]``."""
    if not isinstance(value, list) or not value:
        raise _bad("kernels: expected a non-empty list of {Name, Params}")
    found: list[UserKernel] = []
    for entry in value:
        if not (isinstance(entry, tuple) and len(entry) == 2 and isinstance(entry[1], list)):
            raise _bad(f"kernels: {entry!r:.80} is not {{Name, Params}}")
        name = _identifier(entry[0], "a kernel name")
        if len(entry[1]) > 255:
            raise _bad(f"{name}: {len(entry[1])} params, over the 255 a launch can pass")
        params = []
        for param in entry[1]:
            if not (isinstance(param, tuple) and len(param) == 2
                    and isinstance(param[0], str) and str(param[0]) in ACCESS):
                raise _bad(f"{name}: {param!r:.60} is not {{in | out | inout | scalar, Type}}")
            params.append((str(param[0]), _type(param[1], f"{name}'s param type")))
        if any(k.name == name for k in found):
            raise _bad(f"kernel {name} is declared twice")
        found.append(UserKernel(name, module, tuple(params)))
    return found


def elementwise_kernel(name_term: Any, inputs_term: Any, outputs_term: Any) -> (
        tuple[UserKernel, list[tuple[str, str, str]], list[tuple[str, str]]]):
    """An ``elementwise`` call's kernel, and its inputs ``(Var, Type, vector | scalar)`` and
    outputs ``(Var, Type)`` as ``usercode.elementwise_source`` takes them."""
    name = _identifier(name_term, "the kernel name")
    if not isinstance(inputs_term, list) or not isinstance(outputs_term, list):
        raise _bad("inputs and outputs: expected lists")
    inputs: list[tuple[str, str, str]] = []
    for entry in inputs_term:
        if not (isinstance(entry, tuple) and len(entry) == 3 and isinstance(entry[2], str)
                and str(entry[2]) in ("vector", "scalar")):
            raise _bad(f"inputs: {entry!r:.60} is not {{Var, Type, vector | scalar}}")
        inputs.append((_identifier(entry[0], "a variable"), _type(entry[1], "an input type"),
                       str(entry[2])))
    outputs: list[tuple[str, str]] = []
    for entry in outputs_term:
        if not (isinstance(entry, tuple) and len(entry) == 2):
            raise _bad(f"outputs: {entry!r:.60} is not {{Var, Type}}")
        outputs.append((_identifier(entry[0], "a variable"), _type(entry[1], "an output type")))
    if not any(kind == "vector" for _, _, kind in inputs):
        raise _bad(f"{name}: an elementwise kernel needs a vector input (its length is n)")
    if not outputs:
        raise _bad(f"{name}: an elementwise kernel needs an output")
    if len(inputs) > 255:
        raise _bad(f"{name}: {len(inputs)} inputs, over the 255 a launch can pass")
    names = [var for var, *_ in inputs] + [var for var, _ in outputs]
    for var in names:
        if var in ("i", "n", name):
            raise _bad(f"{name}: the variable name {var} is taken (the index i, the length n "
                       "and the kernel's name)")
        if names.count(var) > 1:
            raise _bad(f"{name}: the variable {var} is named twice")
    params = tuple(("in" if kind == "vector" else "scalar", t) for _, t, kind in inputs) + \
        tuple(("out", t) for _, t in outputs)
    return UserKernel(name, name, params, "elementwise", len(inputs)), inputs, outputs


# -- a launch, checked -----------------------------------------------------------------------


#: What a lane says of a buffer it holds: its element type and length; ``None`` where it
#: holds no buffer of that id.
Held = Callable[[int], tuple[str, int] | None]


def route(launch: Launch, registry: Registry | None = None) -> str:
    """Where a decoded launch is checked, decided here alone: ``"batched"`` (a batched f32
    kernel on vectors and dims, or a program that names no buffer and keeps nothing: its
    check needs no buffers, so the reading thread makes its plan), ``"general"`` (buffers,
    other element types, ``copy``/``zeros``/``empty``, user kernels: checked on its
    device's thread, which knows the buffers) or ``"unknown"`` (a kernel neither the
    catalogue nor ``registry`` has; without a registry, any kernel that is not batched is
    ``"general"``)."""
    if launch.program is not None:
        # buffers are known on the device's thread alone; kept outputs are made there
        held = launch.keep is not None or any(type(a) is Handle for a in launch.args)
        return "general" if held else "batched"
    return _route(launch, registry)


def _route(launch: Launch, registry: Registry | None) -> str:
    if not launch.general and launch.kernel in kernels.KERNELS:
        return "batched"
    if registry is None or launch.kernel in contract.KERNELS or (
            launch.kernel in registry.kernels):
        return "general"
    return "unknown"


def check(launch: Launch, registry: Registry, held: Held | None = None) -> Plan:
    """The one check: ``launch``'s plan, whatever its kernel (batched, built-in of any
    element type, user kernel); ``Refused`` where it breaks a rule, or names a buffer that
    ``held`` (the lane's buffers; a batched launch names none) does not know
    (``{buffer_lost, Id}``)."""
    if launch.program is not None:
        return programs.check(launch, functools.partial(_check_step, registry), registry.get,
                              registry.version, held)
    path = route(launch, registry)
    if path == "batched":
        try:
            return kernels.parse(launch.kernel, launch.args)
        except kernels.BadArgs as exc:
            raise _bad(str(exc)) from None
    if path == "unknown":  # an unload may have raced the routing
        raise Refused(protocol.unknown_kernel(launch.kernel))
    if held is None:
        raise ValueError(f"{launch.kernel}: a general launch is checked against held buffers")
    user = registry.get(launch.kernel)
    if user is not None:
        return _check_user(launch, user, held)
    return _check_builtin(launch, contract.KERNELS[launch.kernel], held)


def _check_step(registry: Registry, launch: Launch, held: Held) -> Plan:
    """A program step's plan: the check of a launch whose vectors name the program's values."""
    return check(launch, registry, held)


def _vector(arg: Any, what: str, held: Held) -> Operand:
    """A vector argument as an operand; ``Refused`` for one that is not a vector."""
    cls = type(arg)
    if cls is np.ndarray:
        return Operand("data", arg, elements.TYPE_OF[arg.dtype], int(arg.size))
    if cls is FileArg:
        return Operand("file", arg, elements.TYPE_OF[arg.dtype],
                       arg.nbytes // arg.dtype.itemsize)
    if cls is Handle:
        found = held(arg.buffer_id)
        if found is None:
            raise Refused(protocol.buffer_lost(arg.buffer_id))
        return Operand("buffer", arg.buffer_id, found[0], found[1])
    if cls is Empty:
        return Operand("zeros", None, arg.type, arg.elements)
    raise _bad(f"{what}: expected a vector")


def _limit(op: Operand, what: str) -> Operand:
    if op.elements > MAX_ELEMENTS:
        raise _bad(f"{what}: {op.elements} elements, over the {MAX_ELEMENTS} limit")
    return op


def _dim(arg: Any, what: str) -> int:
    if type(arg) is not int:
        raise _bad(f"{what}: expected a non-negative integer")
    if arg > MAX_ELEMENTS:
        raise _bad(f"{what}: {arg} out of range")
    return arg


def _keep(launch: Launch, made: int) -> None:
    if launch.keep is not None and len(launch.keep) != made:
        raise _bad(f"{launch.kernel} makes {made} vector result{'s' * (made != 1)} "
                   f"but {len(launch.keep)} buffer ids came to keep them")


def _check_builtin(launch: Launch, spec: contract.KernelSpec, held: Held) -> Plan:
    kernel, args = launch.kernel, launch.args
    if launch.geometry is not None:
        raise _bad(f"{kernel}: a geometry is for user kernels")
    if len(args) != len(spec.params):
        raise _bad(f"{kernel} takes {kernels.counted(spec.arity, 'argument')}, got {len(args)}")
    operands: list[Operand] = []
    sizes: dict[str, int] = {}
    chosen: tuple[str, str] | None = None  # the launch's element type, and who set it
    for param, arg in zip(spec.params, args, strict=True):
        if param.kind == "vector":
            op = _limit(_vector(arg, param.name, held), param.name)
        elif spec.general and type(arg) is Empty:
            # zeros and empty: their N, given with the element type to make
            op = _limit(Operand("value", arg.elements, arg.type, arg.elements), param.name)
        elif type(arg) is not int:
            raise _bad(f"{param.name}: expected a non-negative integer")
        else:
            op = Operand("value", _dim(arg, param.name), None, arg)
        if op.type is not None:
            if chosen is None:
                chosen = (op.type, param.name)
            elif op.type != chosen[0]:
                raise _bad(f"{param.name} is {op.type} but {chosen[1]} is {chosen[0]}: "
                           f"a {kernel} launch takes one element type")
        sizes[param.name] = op.elements
        operands.append(op)
    etype = chosen[0] if chosen is not None else spec.types[0]
    if etype not in spec.types:
        raise _bad(f"{kernel} takes {' or '.join(spec.types)}, not {etype}")
    try:
        out = kernels.check_lengths(spec, sizes)
    except kernels.BadArgs as exc:
        raise _bad(str(exc)) from None
    if spec.result.kind != "vector":
        _keep(launch, 0)
        return Plan(kernel, "builtin", operands, launch.keep, scalar=True)
    _keep(launch, 1)
    if kernel == "copy":
        action = "copy"
    elif kernel in ("zeros", "empty"):
        action = "fill"
        operands = []
    else:
        action = "builtin"
    return Plan(kernel, action, operands, launch.keep, etype, out)


def _scalar(arg: Any, etype: str, what: str) -> Operand:
    cls = type(arg)
    if cls is Scalar:
        if arg.type != etype:
            raise _bad(f"{what}: a {arg.type} scalar for a {etype} param")
        return Operand("value", arg.value)
    if cls is int:  # a dim: Erlang's integer, sent as it is
        dtype = DTYPES[etype]
        if not elements.in_range(etype, arg):
            raise _bad(f"{what}: {arg} out of range for {etype}")
        return Operand("value", dtype.type(arg))
    raise _bad(f"{what}: expected a {etype} scalar")


def _check_user(launch: Launch, user: UserKernel, held: Held) -> Plan:
    name, args = user.name, launch.args
    passed = user.params[: user.inputs] if user.elementwise else user.params
    if len(args) != len(passed):
        raise _bad(f"{name} takes {kernels.counted(len(passed), 'argument')}, got {len(args)}")
    operands: list[Operand] = []
    results: list[int] = []
    for i, ((access, etype), arg) in enumerate(zip(passed, args, strict=True), 1):
        what = f"{name} argument {i}"
        if access == "scalar":
            operands.append(_scalar(arg, etype, what))
            continue
        if type(arg) is int and access != "in":  # N: a new zeroed vector of N elements
            op = Operand("zeros", None, etype, _dim(arg, what))
        else:
            op = _limit(_vector(arg, what, held), what)
        if op.type != etype:
            raise _bad(f"{what}: a {op.type} vector for a {etype} param")
        if op.source == "zeros" and access == "in":
            raise _bad(f"{what}: a count makes a vector for an out or inout param, "
                       "not an in one")
        # A buffer is used in place; data and counts are the job's to answer.
        op.result = access != "in" and op.source != "buffer"
        if op.result:
            results.append(len(operands))
        operands.append(op)
    lengths = [op.elements for op in operands if op.vector]
    if user.elementwise:
        n = lengths[0]
        for op in operands:
            if op.vector and op.elements != n:
                raise _bad(f"length mismatch: {name}'s vector inputs have {n} and "
                           f"{op.elements} elements")
        for _, etype in user.params[user.inputs :]:
            results.append(len(operands))
            operands.append(Operand("zeros", None, etype, n, result=True))
        operands.append(Operand("value", np.int64(n)))
    _keep(launch, len(results))
    geometry = launch.geometry
    if geometry is not None:
        if min(geometry[0]) < 1 or min(geometry[1]) < 1:
            raise _bad(f"{name}: grid and block sizes must be positive, got "
                       f"{geometry[0]} and {geometry[1]}")
    else:
        elements = max(lengths, default=0)
        # nothing to run over: no launch (a grid of 0 blocks is no valid launch)
        geometry = (((elements + BLOCK - 1) // BLOCK, 1, 1), (BLOCK, 1, 1), 0) if elements \
            else None
    return Plan(name, "user", operands, launch.keep, user=user, geometry=geometry,
                results=results)
