"""A program's elementwise runs as generated kernels (``fusion``)."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

from erlcuda import compile as nvcc
from erlcuda import fusion, general
from erlcuda.general import ElementwiseBody, UserKernel
from erlcuda.protocol import Scalar
from programdefs import chain, check, definition, f32, inp, saxpy_registry, step


def groups(raw: bytes, n: int = 4, registry: general.Registry | None = None,
           inputs: int = 2) -> list[fusion.Group]:
    registry = registry or saxpy_registry()
    typed = check(raw, [f32([1] * n)] * inputs, registry).program.plan
    return fusion.groups(typed, registry.get)


def test_a_chain_is_one_group_and_its_sum_stays_apart() -> None:
    (group,) = groups(chain(10))
    assert (group.start, group.end) == (0, 10)
    ops = group.step.ops
    # reads a and b once, writes the last vector alone (the sum and an output need it)
    assert [op.kind for op in ops] == ["slot", "slot", "new", "value"]
    assert group.source.count("[i];") == 2 and group.source.count("[i] =") == 1
    assert group.step.results == (11,)
    assert group.name in group.source and group.module.endswith(group.name[-16:])


def test_values_used_after_the_group_are_written() -> None:
    raw = definition(2, [("vector_add", [inp(0), inp(1)]), ("vector_add", [step(0), inp(1)]),
                         ("reduce", [step(0)])], [step(2), step(1)])
    (group,) = groups(raw)
    assert group.step.results == (2, 3)  # step 0's result feeds the reduce


def test_an_elementwise_kernel_is_inlined_with_its_names() -> None:
    raw = definition(3, [("vector_add", [inp(0), inp(1)]), ("saxpy", [step(0), inp(2),
                                                                      inp(1)])], [step(1)])
    registry = saxpy_registry()
    typed = check(raw, [f32([1, 2]), f32([1, 2]), Scalar("f32", np.float32(2))],
                  registry).program.plan
    (group,) = fusion.groups(typed, registry.get)
    assert "z = a * x + y" in group.source
    assert [k for k, _ in group.step.plan.user.params] == ["in", "in", "scalar", "out"]
    assert group.step.ops[2].kind == "slot" and group.step.ops[2].cast == "f32"


@pytest.mark.parametrize("body", [
    ElementwiseBody((("x", "f32", "vector"),), (("z", "f32"),), "z = x; return", ()),
    ElementwiseBody((("x", "f32", "vector"),), (("z", "f32"),), "z = x * 2", ("-O3",)),
])
def test_kernels_that_cannot_be_inlined_end_a_group(body: ElementwiseBody) -> None:
    registry = saxpy_registry()
    registry.install("odd", [UserKernel("odd", "odd", (("in", "f32"), ("out", "f32")),
                                        "elementwise", 1, body)])
    raw = definition(2, [("vector_add", [inp(0), inp(1)]), ("odd", [step(0)]),
                         ("vector_add", [step(1), inp(1)])], [step(2)])
    assert groups(raw, registry=registry) == []


def test_vectors_of_other_lengths_are_other_groups() -> None:
    raw = definition(2, [("vector_add", [inp(0), inp(0)]), ("vector_add", [step(0), inp(0)]),
                         ("vector_add", [inp(1), inp(1)]), ("vector_add", [step(2), inp(1)])],
                     [step(1), step(3)])
    typed = check(raw, [f32([1, 2]), f32([1, 2, 3])], saxpy_registry()).program.plan
    found = fusion.groups(typed, saxpy_registry().get)
    assert [(g.start, g.end) for g in found] == [(0, 2), (2, 4)]


def test_one_step_is_no_group() -> None:
    assert groups(definition(2, [("vector_add", [inp(0), inp(1)])], [step(0)])) == []


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="no nvcc")
def test_the_generated_source_compiles(tmp_path: object) -> None:
    raw = definition(3, [("vector_add", [inp(0), inp(1)]), ("saxpy", [step(0), 2.5, inp(1)]),
                         ("saxpy", [step(1), 0.5, step(0)]), ("reduce", [step(2)])], [step(3)])
    (group,) = groups(raw, inputs=3)
    assert nvcc.cubin(group.source, [], "sm_90", cache=str(tmp_path))
