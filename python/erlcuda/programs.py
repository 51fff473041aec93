"""Programs: many kernels on device data in one launch, checked once per shape.

A program launch (``protocol.Launch.program``) carries its definition as the ETF that
Erlang's ``erlcuda_program`` wrote once, when the program was made:
``{erlcuda_program, 1, NInputs, Steps, Outputs, Options}``, each step ``{Kernel, Args}``
(an argument ``{in, I}``, ``{step, J, K}`` (step J's result K, both from 0), an integer or
a float), each output ``{step, J, K}``, and the options a list of atoms (``fuse``,
``graph``). The launch's arguments are the program's inputs.

``definition`` reads that term (cached by its bytes: a program sends the same bytes with
every run). ``check`` types it against a run's inputs: each step is checked by the one
check of a launch (``general.check``, handed in as ``check_step``), on a launch whose
vector arguments are the program's values as handles (a value's number is its slot:
inputs first, then each step's results in order), so the rules of every kernel stay
written once. What it finds for one shape of inputs (``ProgramPlan``: each step's plan,
the slots, what fusion makes of it) is cached, and a run's ``Plan`` carries it with the
run's own operands.

A program never writes its inputs: an ``out`` param takes a count (a new zeroed vector),
an ``inout`` param a count or a value (a copy of it); a step's results are its written
vectors in param order (a built-in's result, an elementwise kernel's outputs). Values are
immutable, so a program has no cycle: a step names inputs and earlier steps only.

Errors: ``kernels.Refused`` carrying ``{bad_program, Text}`` for a definition the worker
cannot run, and ``{step, Index, Reason}`` for a step that refuses the run's inputs.
"""

from __future__ import annotations

import functools
import hashlib
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from . import contract, elements, etf, protocol
from .kernels import DTYPES, Operand, Plan, Refused
from .protocol import Handle, Launch, Scalar
from .shm import FileArg

#: Definitions kept (by their bytes) and shapes of them checked, at most.
MAX_DEFINITIONS = 256
MAX_PLANS = 256
#: The built-in kernels a step may name (the others make or copy buffers, which a program
#: does with its values).
STEP_BUILTINS = ("vector_add", "reduce", "dot_product", "matmul")
#: Built-ins whose launch over runs laid end to end is each run's launch, segment by
#: segment (the device splits a reduction's sums and a matmul's products per run).
_BATCHED_BUILTINS = frozenset(STEP_BUILTINS)
_TAG = "erlcuda_program"
_VERSION = 1
_USES_INDEX = re.compile(r"\b[in]\b")


def _bad(text: str) -> Refused:
    return Refused(protocol.bad_program(text))


# -- the definition ---------------------------------------------------------------------------

#: A step's argument: ``("in", I)``, ``("step", J, K)``, or a number.
Arg = tuple[str, int] | tuple[str, int, int] | int | float


@dataclass(frozen=True, slots=True)
class StepDef:
    kernel: str
    args: tuple[Arg, ...]


@dataclass(frozen=True, slots=True)
class Definition:
    inputs: int
    steps: tuple[StepDef, ...]
    outputs: tuple[tuple[int, int], ...]
    fuse: bool
    graph: bool
    digest: str  # names the program's generated kernels and cache entries


def definition(raw: bytes) -> Definition:
    """The definition in ``raw`` (cached); ``Refused`` (``bad_program``) for any other term."""
    return _definition(bytes(raw))


@functools.lru_cache(maxsize=MAX_DEFINITIONS)
def _definition(raw: bytes) -> Definition:
    try:
        term = etf.decode(raw)
    except etf.CodecError as exc:
        raise _bad(f"an undecodable definition: {exc}") from None
    match term:
        case (etf.Atom() as tag, int() as version, int() as ninputs, list() as steps,
              list() as outputs, list() as options) if tag == _TAG:
            pass
        case _:
            raise _bad("not a program's definition")
    if version != _VERSION:
        raise _bad(f"a definition of version {version}; this worker reads {_VERSION}")
    if not 0 <= ninputs <= 255:
        raise _bad(f"{ninputs} inputs: a launch carries 255 at most")
    parsed = tuple(_step(j, s, ninputs) for j, s in enumerate(steps))
    if not parsed or not outputs:
        raise _bad("a program needs a step and an output")
    outs = tuple(_output(o, len(parsed)) for o in outputs)
    flags = {str(o) for o in options if isinstance(o, etf.Atom)}
    return Definition(ninputs, parsed, outs, "fuse" in flags, "graph" in flags,
                      hashlib.sha256(raw).hexdigest())


def _step(j: int, term: Any, ninputs: int) -> StepDef:
    match term:
        case (bytes() | memoryview() as name, list() as args):
            pass
        case _:
            raise _bad(f"step {j + 1}: not {{Kernel, Args}}")
    try:
        kernel = bytes(name).decode("utf-8")
    except UnicodeDecodeError:
        raise _bad(f"step {j + 1}: the kernel name is not UTF-8") from None
    if len(args) > 255:
        raise _bad(f"step {j + 1}: {len(args)} arguments, over 255")
    return StepDef(kernel, tuple(_arg(j, a, ninputs) for a in args))


def _arg(j: int, term: Any, ninputs: int) -> Arg:
    match term:
        case (etf.Atom() as tag, int() as i) if tag == "in" and 0 <= i < ninputs:
            return ("in", i)
        case (etf.Atom() as tag, int() as s, int() as k) if tag == "step" and 0 <= s < j and (
                0 <= k < 256):
            return ("step", s, k)
        case bool():
            pass
        case int() | float():
            return term  # type: ignore[no-any-return]
    raise _bad(f"step {j + 1}: an argument {term!r:.60} names no input or earlier step")


def _output(term: Any, nsteps: int) -> tuple[int, int]:
    match term:
        case (etf.Atom() as tag, int() as s, int() as k) if tag == "step" and (
                0 <= s < nsteps and 0 <= k < 256):
            return (s, k)
    raise _bad(f"an output {term!r:.60} names no step")


# -- a definition typed against a run's inputs ------------------------------------------------


@dataclass(frozen=True, slots=True)
class Slot:
    """A value of the program: a vector of ``type`` and ``elements``, a scalar result of
    ``type`` (``scalar``), or an input that is a number (``number``: an int or a typed
    scalar, passed as it is)."""

    type: str | None
    elements: int = 0
    scalar: bool = False
    number: bool = False

    @property
    def vector(self) -> bool:
        return not self.scalar and not self.number

    @property
    def nbytes(self) -> int:
        if self.number or self.type is None:
            return 0
        return (1 if self.scalar else self.elements) * DTYPES[self.type].itemsize


@dataclass(frozen=True, slots=True)
class Op:
    """How a step's operand is bound when it runs: ``slot`` (a value's array, read, or a
    number input, as the run gives it or ``cast`` to an element type), ``value`` (passed as
    it is), ``new`` (a new array for result slot ``slot``, zeroed if ``zero``) or ``copy``
    (a new array for result slot ``slot`` holding value ``source``)."""

    kind: str
    slot: int = -1
    value: Any = None
    zero: bool = False
    source: int = -1
    cast: str | None = None


@dataclass(frozen=True, slots=True)
class StepPlan:
    """A step, checked: its kernel's plan (``general.check``'s), how each operand is bound,
    and the slots it writes (a built-in's result comes through ``out``)."""

    index: int  # from 0, in the definition
    plan: Plan
    ops: tuple[Op, ...]
    out: int | None  # a built-in's result slot
    results: tuple[int, ...]
    batchable: bool
    elementwise: bool  # reads and writes element i alone, over vectors of one length


@dataclass(slots=True)
class ProgramPlan:
    """A definition checked for one shape of inputs (cached): its slots (inputs first), its
    steps, the output slots, and the fused kernels of its elementwise runs, once compiled."""

    definition: Definition
    slots: tuple[Slot, ...]
    steps: tuple[StepPlan, ...]
    outputs: tuple[int, ...]
    batchable: bool
    #: The outputs a run downloads, each once: all of them, or the scalars where vectors
    #: are kept.
    fetch: tuple[int, ...] = ()
    fetch_kept: tuple[int, ...] = ()
    ident: tuple[Any, ...] = ()  # names this plan in the runners' caches
    #: Where the program is one built-in step over its own inputs (f32 vectors and ints)
    #: answering that step's result alone: the step's arguments, each an input's index or
    #: a constant. A run of it is that launch, and runs as one (``program_runner``).
    launch: tuple[tuple[str, int] | int, ...] | None = None
    fusion: list[Any] | None = None  # ``fusion.Group``s, found by the first runner to ask
    device_bytes: int = 0  # every slot's bytes: what a run takes on the device at most


@dataclass(slots=True)
class ProgramRun:
    """What a program launch's ``Plan`` carries: the checked plan and the run's batch key
    (``None``: the run goes alone)."""

    plan: ProgramPlan
    key: tuple[Any, ...] | None


#: The one check of a step, ``general.check`` bound to the registry: the plan of a launch
#: whose vectors name slots, given what each slot holds.
StepCheck = Callable[[Launch, Callable[[int], tuple[str, int] | None]], Plan]
UserOf = Callable[[str], Any]


def check(launch: Launch, step_check: StepCheck, user_of: UserOf, version: int,
          held: Callable[[int], tuple[str, int] | None] | None) -> Plan:
    """The plan of a program launch: its inputs as operands and the typed program.
    ``held`` knows the lane's buffers (``None`` on the reading thread, where a launch that
    names one does not come); ``version`` is the registry's, whose kernels the steps use."""
    assert launch.program is not None
    defn = definition(launch.program)
    if len(launch.args) != defn.inputs:
        raise Refused(protocol.bad_args(f"the program takes {defn.inputs} inputs, got "
                                        f"{len(launch.args)}"))
    operands = [_input(i, a, held) for i, a in enumerate(launch.args)]
    signature = tuple(_signature(op) for op in operands)
    typed = _typed(launch.program, signature, version, step_check, user_of)
    kept = sum(1 for _ in typed.outputs if typed.slots[_].vector)
    if launch.keep is not None and len(launch.keep) != kept:
        raise Refused(protocol.bad_args(f"the program makes {kept} vector outputs but "
                                        f"{len(launch.keep)} buffer ids came to keep them"))
    key = None
    if typed.batchable and launch.keep is None and all(
            op.source in ("data", "value") for op in operands):
        key = ("program", launch.program, signature,
               tuple(_number(op.value) for op in operands if op.source == "value"))
    elements_in = sum(op.elements for op in operands if op.vector)
    return Plan(launch.kernel, "program", operands, launch.keep, elements=elements_in,
                program=ProgramRun(typed, key))


def _number(value: Any) -> Any:
    return (type(value).__name__, value.item() if isinstance(value, np.generic) else value)


def _input(i: int, arg: Any, held: Callable[[int], tuple[str, int] | None] | None) -> Operand:
    cls = type(arg)
    if cls is np.ndarray:
        return Operand("data", arg, elements.TYPE_OF[arg.dtype], int(arg.size))
    if cls is FileArg:
        return Operand("file", arg, elements.TYPE_OF[arg.dtype], arg.nbytes // arg.dtype.itemsize)
    if cls is Handle:
        found = held(arg.buffer_id) if held is not None else None
        if found is None:
            raise Refused(protocol.buffer_lost(arg.buffer_id))
        return Operand("buffer", arg.buffer_id, found[0], found[1])
    if cls is int:
        return Operand("value", arg)
    if cls is Scalar:
        return Operand("value", arg.value, arg.type)
    raise Refused(protocol.bad_args(f"input {i + 1}: a vector, a buffer or a number"))


def _signature(op: Operand) -> tuple[Any, ...]:
    if op.source == "value":
        if op.type is None:  # an int: dims and counts are shapes
            return ("int", op.value)
        return ("scalar", op.type)
    return ("vector", op.type, op.elements)


_PLANS: dict[tuple[Any, ...], ProgramPlan] = {}


def _typed(raw: bytes, signature: tuple[Any, ...], version: int, step_check: StepCheck,
           user_of: UserOf) -> ProgramPlan:
    key = (raw, signature, version)
    found = _PLANS.get(key)
    if found is None:
        found = _Typing(definition(raw), signature, step_check, user_of).plan()
        found.ident = (found.definition.digest, signature, version)
        if len(_PLANS) >= MAX_PLANS:
            _PLANS.pop(next(iter(_PLANS)))
        _PLANS[key] = found
    return found


def forget() -> None:
    """Drop every typed plan (the kernels they use changed)."""
    _PLANS.clear()


class _Typing:
    """The typing of one definition for one signature of inputs (``_typed``)."""

    def __init__(self, defn: Definition, signature: tuple[Any, ...], step_check: StepCheck,
                 user_of: UserOf) -> None:
        self.defn = defn
        self.step_check = step_check
        self.user_of = user_of
        self.slots: list[Slot] = [_input_slot(s) for s in signature]
        self.inputs = signature
        self.results: list[tuple[int, ...]] = []  # each step's result slots

    def plan(self) -> ProgramPlan:
        steps = tuple(self._step(j, s) for j, s in enumerate(self.defn.steps))
        outputs = tuple(self._result(s, k, f"output {n + 1}")
                        for n, (s, k) in enumerate(self.defn.outputs))
        fetch = tuple(dict.fromkeys(outputs))
        return ProgramPlan(self.defn, tuple(self.slots), steps, outputs,
                           all(s.batchable for s in steps), fetch,
                           tuple(o for o in fetch if self.slots[o].scalar),
                           launch=self._as_launch(steps, outputs),
                           device_bytes=sum(s.nbytes for s in self.slots))

    def _as_launch(self, steps: tuple[StepPlan, ...], outputs: tuple[int, ...]) -> (
            tuple[tuple[str, int] | int, ...] | None):
        """``ProgramPlan.launch``: the one step's arguments where the program is that
        launch, else ``None``."""
        if len(steps) != 1 or steps[0].out is None or outputs != (steps[0].out,):
            return None
        args = self.defn.steps[0].args
        for arg in args:
            if isinstance(arg, float) or (isinstance(arg, tuple) and arg[0] != "in"):
                return None
            held = self.slots[arg[1]] if isinstance(arg, tuple) else None
            if held is not None and held.type not in (None, "f32"):
                return None
        return args  # type: ignore[return-value]

    def _result(self, step: int, k: int, what: str) -> int:
        made = self.results[step]
        if k >= len(made):
            raise _bad(f"{what} names result {k + 1} of step {step + 1}, which makes "
                       f"{len(made)}")
        return made[k]

    def _slot_of(self, j: int, ref: Arg) -> int:
        if ref[0] == "in":  # type: ignore[index]
            return ref[1]  # type: ignore[index, return-value]
        return self._result(ref[1], ref[2], f"step {j + 1}")  # type: ignore[index, misc]

    def _step(self, j: int, step: StepDef) -> StepPlan:
        user = self.user_of(step.kernel)
        if user is None and step.kernel not in STEP_BUILTINS:
            if step.kernel in contract.KERNELS:
                raise _bad(f"step {j + 1}: {step.kernel} is not a program step (a program "
                           "makes and copies its values itself)")
            raise Refused(protocol.step_failure(j + 1, protocol.unknown_kernel(step.kernel)))
        args: list[Any] = []
        numbers: dict[int, int] = {}  # the operands that are number inputs: their slots
        for p, a in enumerate(step.args):
            arg, number = self._launch_arg(j, a, user, p)
            args.append(arg)
            if number is not None:
                numbers[p] = number
        launch = Launch(0, 0, step.kernel, args, general=True)
        try:
            plan = self.step_check(launch, self._held)
        except Refused as exc:
            raise Refused(protocol.step_failure(j + 1, exc.failure)) from None
        if user is None:
            return self._bind_builtin(j, plan, numbers)
        return self._bind_user(j, plan, user, numbers)

    def _launch_arg(self, j: int, arg: Arg, user: Any, position: int) -> tuple[Any, int | None]:
        """A step's argument as the one check takes it (a value's slot as a handle, a
        number input as an example of its kind, a constant in its param's type), and the
        slot of a number input, which each run binds to its own number."""
        if isinstance(arg, tuple):
            slot = self._slot_of(j, arg)
            held = self.slots[slot]
            if held.scalar:
                raise _bad(f"step {j + 1}: a scalar result is an output only, not an argument")
            if held.number:
                kind = self.inputs[slot]
                if kind[0] == "int":
                    return kind[1], slot
                return Scalar(kind[1], DTYPES[kind[1]].type(0)), slot
            return Handle(slot), None
        return self._constant_arg(j, arg, user, position), None

    def _constant_arg(self, j: int, arg: Arg, user: Any, position: int) -> Any:
        param = _user_param(user, position)
        if param is not None and param[0] == "scalar":
            return _constant(j, arg, param[1])
        if isinstance(arg, float):
            raise Refused(protocol.step_failure(j + 1, protocol.bad_args(
                f"argument {position + 1}: a float where an integer is taken")))
        return arg

    def _held(self, slot: int) -> tuple[str, int] | None:
        if not 0 <= slot < len(self.slots) or not self.slots[slot].vector:
            return None
        found = self.slots[slot]
        return (found.type or "f32", found.elements)

    def _new(self, slot: Slot) -> int:
        self.slots.append(slot)
        return len(self.slots) - 1

    def _bind_builtin(self, j: int, plan: Plan, numbers: dict[int, int]) -> StepPlan:
        ops = tuple(Op("slot", slot=op.value) if op.source == "buffer"
                    else Op("slot", slot=numbers[i]) if i in numbers
                    else Op("value", value=op.value) for i, op in enumerate(plan.operands))
        etype = next(self.slots[op.value].type for op in plan.operands
                     if op.source == "buffer")
        if plan.scalar:
            out = self._new(Slot(etype, 1, scalar=True))
        else:
            out = self._new(Slot(plan.out_type or "f32", plan.out_elements))
        self.results.append((out,))
        elementwise = plan.kernel == "vector_add"
        return StepPlan(j, plan, ops, out, (out,), plan.kernel in _BATCHED_BUILTINS,
                        elementwise)

    def _bind_user(self, j: int, plan: Plan, user: Any, numbers: dict[int, int]) -> StepPlan:
        ops: list[Op] = []
        results: list[int] = []
        params = list(user.params)
        for i, op in enumerate(plan.operands):
            access = params[i][0] if i < len(params) else "scalar"
            if i in numbers and op.source == "value":
                ops.append(Op("slot", slot=numbers[i], cast=params[i][1]))
            elif op.source == "value":
                ops.append(Op("value", value=op.value))
            elif op.source == "zeros":
                slot = self._new(Slot(op.type, op.elements))
                results.append(slot)
                # an elementwise kernel writes every element of its outputs
                ops.append(Op("new", slot=slot, zero=not user.elementwise))
            elif access == "in":
                ops.append(Op("slot", slot=op.value))
            elif access == "out":
                raise Refused(protocol.step_failure(j + 1, protocol.bad_args(
                    f"argument {i + 1} is an out param: a count, in a program (its values "
                    "are never written)")))
            else:
                slot = self._new(Slot(op.type, op.elements))
                results.append(slot)
                ops.append(Op("copy", slot=slot, source=op.value))
        if not results:
            raise _bad(f"step {j + 1}: {user.name} writes no vector, so it has no result")
        self.results.append(tuple(results))
        body = getattr(user, "body", None)
        pure = user.elementwise and body is not None and not _USES_INDEX.search(
            body.operation)
        return StepPlan(j, plan, tuple(ops), None, tuple(results), pure, pure)


def _input_slot(signature: tuple[Any, ...]) -> Slot:
    if signature[0] == "vector":
        return Slot(signature[1], signature[2])
    if signature[0] == "int":
        return Slot(None, number=True)
    return Slot(signature[1], number=True)


def _user_param(user: Any, position: int) -> tuple[str, str] | None:
    if user is None or position >= len(user.params):
        return None
    return user.params[position]  # type: ignore[no-any-return]


def _constant(j: int, value: int | float, etype: str) -> Scalar:
    element = elements.ELEMENTS[etype]
    if element.kind == "int":
        if not isinstance(value, int) or not elements.in_range(etype, value):
            raise Refused(protocol.step_failure(j + 1, protocol.bad_args(
                f"{value!r:.40} is no {etype}")))
    with np.errstate(over="ignore"):
        typed = element.dtype.type(value)
    if element.kind == "float" and not np.isfinite(typed):
        raise Refused(protocol.step_failure(j + 1, protocol.bad_args(
            f"{value!r:.40} is out of range for {etype}")))
    return Scalar(etype, typed)
