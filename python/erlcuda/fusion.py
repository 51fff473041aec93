"""Fusion: a run of a program's elementwise steps becomes one generated kernel.

Consecutive steps that each read and write element ``i`` alone, over vectors of one length
(the built-in ``vector_add``, an elementwise kernel whose operation names neither ``i`` nor
``n``, loaded without nvcc flags), make a group. Its kernel reads each vector the group
takes from outside once, computes every step for element ``i`` in registers, and writes
only the values used after the group or answered as outputs: each element read once and
written once, where the unfused steps read and write every value once per step.

An elementwise kernel's operation is inlined as its own kernel runs it: in a block where its
inputs and outputs are locals of their names. nvcc may then contract a multiply of one step
and an add of the next into one fused multiply-add, as it does within one operation, so a
fused program's floats may differ from the unfused one's in the last bit.

``groups`` finds the groups of a checked program (``programs.ProgramPlan``); each ``Group``
holds its source, compiled through the one compile cache (``compile.py``) by the runner,
and the step that runs it in place of the group's steps.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from . import elements
from .general import BLOCK, UserKernel
from .kernels import Operand, Plan
from .programs import Op, ProgramPlan, StepPlan

#: Words after which an inlined operation would leave its block early.
_JUMPS = re.compile(r"\b(?:return|goto|break|continue)\b")
_PREFIX = "erlcuda_"


@dataclass(frozen=True, slots=True)
class Group:
    """Steps ``start`` to ``end`` (excluded) fused: ``step`` runs the kernel ``name`` of
    module ``module``, written as ``source``."""

    start: int
    end: int
    module: str
    name: str
    source: str
    step: StepPlan


def groups(plan: ProgramPlan, user_of: Callable[[str], UserKernel | None]) -> list[Group]:
    """The fusable runs of ``plan``'s steps, as groups of two steps or more."""
    needed = _needed_after(plan)
    found: list[Group] = []
    run: list[StepPlan] = []
    length = -1
    for step in (*plan.steps, None):
        n = _fusable_length(plan, step, user_of) if step is not None else -1
        if n >= 0 and (not run or n == length):
            run.append(step)  # type: ignore[arg-type]
            length = n
            continue
        if len(run) >= 2:
            found.append(_Writer(plan, run, length, needed, user_of).group())
        run = [step] if n >= 0 and step is not None else []
        length = n
    return found


def _fusable_length(plan: ProgramPlan, step: StepPlan,
                    user_of: Callable[[str], UserKernel | None]) -> int:
    """The length of ``step``'s vectors where it can join a group, else -1."""
    if not step.elementwise:
        return -1
    if step.plan.user is not None:
        user = user_of(step.plan.user.name)
        body = user.body if user is not None else None
        if body is None or body.flags or _JUMPS.search(body.operation) or any(
                var.startswith(_PREFIX) for var, *_ in (*body.inputs, *body.outputs)):
            return -1
    lengths = {plan.slots[op.slot].elements for op in step.ops
               if op.kind in ("slot", "new") and plan.slots[op.slot].vector}
    return lengths.pop() if len(lengths) == 1 else -1


def _needed_after(plan: ProgramPlan) -> dict[int, int]:
    """For each slot, the last step that reads it (``len(steps)`` for an output)."""
    last: dict[int, int] = {}
    for step in plan.steps:
        for op in step.ops:
            if op.kind == "slot":
                last[op.slot] = step.index
            elif op.kind == "copy":
                last[op.source] = step.index
    for slot in plan.outputs:
        last[slot] = len(plan.steps)
    return last


class _Writer:
    """The source and the step of one group."""

    def __init__(self, plan: ProgramPlan, run: Sequence[StepPlan], n: int,
                 needed: dict[int, int], user_of: Callable[[str], UserKernel | None]) -> None:
        self.plan, self.run, self.n = plan, run, n
        self.needed, self.user_of = needed, user_of
        self.made: set[int] = set()  # slots computed inside the group
        self.params: list[str] = []
        self.kinds: list[tuple[str, str]] = []  # the kernel's params, as a user kernel's
        self.ops: list[Op] = []
        self.loads: list[str] = []
        self.body: list[str] = []
        self.stores: list[str] = []
        self.loaded: set[int] = set()

    def group(self) -> Group:
        for step in self.run:
            if step.plan.user is None:
                self._vector_add(step)
            else:
                self._elementwise(step)
        end = self.run[-1].index + 1
        for slot in sorted(self.made):
            if self.needed.get(slot, -1) >= end:
                self._param(f"{self._c(slot)}* __restrict__", ("out", self._type(slot)),
                            Op("new", slot=slot), store=slot)
        source = self._source()
        digest = hashlib.sha256(source.encode()).hexdigest()[:16]
        name = f"erlcuda_fused_{digest}"
        source = source.replace("KERNEL_NAME", name)
        user = UserKernel(name, f"erlcuda:fused:{digest}", tuple(self.kinds))
        count = max(1, -(-self.n // BLOCK))
        ops = (*self.ops, Op("value", value=np.int64(self.n)))
        plan = Plan(name, "user", [Operand("value", None)] * len(ops), user=user,
                    geometry=((count, 1, 1), (BLOCK, 1, 1), 0))
        results = tuple(op.slot for op in self.ops if op.kind == "new")
        step = StepPlan(self.run[0].index, plan, ops, None, results, True, True)
        return Group(self.run[0].index, end, user.module, name, source, step)

    def _type(self, slot: int) -> str:
        return self.plan.slots[slot].type or "f32"

    def _c(self, slot: int) -> str:
        return elements.C_TYPES[self._type(slot)]

    def _param(self, decl: str, kind: tuple[str, str], op: Op, store: int = -1) -> str:
        name = f"{_PREFIX}p{len(self.params)}"
        self.params.append(f"{decl} {name}")
        self.kinds.append(kind)
        self.ops.append(op)
        if store >= 0:
            self.stores.append(f"        {name}[i] = {_PREFIX}v{store};")
        return name

    def _read(self, op: Op) -> str:
        """The expression of an operand: a local for a vector, a param for a number."""
        if op.kind == "slot" and self.plan.slots[op.slot].vector:
            slot = op.slot
            if slot not in self.made and slot not in self.loaded:
                ptr = self._param(f"const {self._c(slot)}* __restrict__",
                                  ("in", self._type(slot)), op)
                self.loads.append(f"        const {self._c(slot)} {_PREFIX}v{slot} = {ptr}[i];")
                self.loaded.add(slot)
            return f"{_PREFIX}v{slot}"
        value = op.value if op.kind == "value" else None
        etype = self._number_type(op, value)
        return self._param(f"const {elements.C_TYPES[etype]}", ("scalar", etype), op)

    def _number_type(self, op: Op, value: Any) -> str:
        if op.kind == "slot":
            return op.cast or self.plan.slots[op.slot].type or "i64"
        return elements.TYPE_OF[np.asarray(value).dtype]

    def _vector_add(self, step: StepPlan) -> None:
        a, b = (self._read(op) for op in step.ops[:2])
        out = step.results[0]
        self.made.add(out)
        self.body.append(f"        const {self._c(out)} {_PREFIX}v{out} = {a} + {b};")

    def _elementwise(self, step: StepPlan) -> None:
        user = self.user_of(step.plan.user.name)  # type: ignore[union-attr]
        assert user is not None and user.body is not None
        body = user.body
        binds = [f"const {elements.C_TYPES[t]} {var} = {self._read(op)};"
                 for (var, t, _), op in zip(body.inputs, step.ops, strict=False)]
        outs = step.results
        for slot in outs:
            self.made.add(slot)
        self.body.append("        " + " ".join(
            f"{self._c(s)} {_PREFIX}v{s};" for s in outs))
        locals_ = " ".join(f"{elements.C_TYPES[t]} {var} = 0;" for var, t in body.outputs)
        takes = " ".join(f"{_PREFIX}v{s} = {var};" for s, (var, _) in
                         zip(outs, body.outputs, strict=True))
        self.body += ["        {", "            " + " ".join(binds) + " " + locals_,
                      "            {", body.operation, "            ;", "            }",
                      "            " + takes, "        }"]

    def _source(self) -> str:
        params = ",\n    ".join([*self.params, "const long long n"])
        return "\n".join([
            "// erlcuda fused kernel (generated from a program's elementwise steps)",
            'extern "C" __global__ void KERNEL_NAME(',
            f"    {params}) {{",
            "    for (long long i = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;",
            "         i < n; i += static_cast<long long>(gridDim.x) * blockDim.x) {",
            *self.loads, *self.body, *self.stores,
            "    }",
            "}",
            ""])


