"""A program's definition read and typed against a run's inputs (``programs``)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from erlcuda import etf, general, programs, protocol
from erlcuda.etf import Atom
from erlcuda.kernels import Refused
from erlcuda.protocol import Handle, Scalar
from programdefs import chain, check, definition, f32, inp, saxpy_registry, step


def refusal(raw: bytes, args: list[Any], **kw: Any) -> Any:
    with pytest.raises(Refused) as info:
        check(raw, args, **kw)
    return info.value.failure.term


# -- the definition ----------------------------------------------------------------------------


@pytest.mark.parametrize("raw", [
    b"\x83junk",
    etf.encode_bytes((Atom("other"), 1, 1, [], [], [])),
    etf.encode_bytes((Atom("erlcuda_program"), 1, 1, "x", [], [])),
    definition(1, [], [step(0)]),
    definition(1, [("reduce", [inp(0)])], []),
    definition(1, [("reduce", [inp(1)])], [step(0)]),  # no input 1
    definition(1, [("reduce", [step(0)])], [step(0)]),  # itself: no cycle can be named
    definition(2, [("vector_add", [inp(0), step(1)]), ("reduce", [inp(1)])], [step(0)]),
    definition(1, [("reduce", [inp(0)])], [step(1)]),  # no step 1
    definition(1, [("reduce", [True])], [step(0)]),
    definition(300, [("reduce", [inp(0)])], [step(0)]),
])
def test_a_definition_that_is_not_one_is_bad_program(raw: bytes) -> None:
    # the definition is read before the inputs are counted
    term = refusal(raw, [f32([1])])
    assert term[0] == "bad_program"


def test_another_version_is_named() -> None:
    term = refusal(definition(1, [("reduce", [inp(0)])], [step(0)], version=2), [f32([1])])
    assert term[0] == "bad_program" and "version 2" in term[1]


def test_a_definition_is_read_once_for_its_bytes() -> None:
    raw = chain(3)
    assert programs.definition(raw) is programs.definition(bytearray(raw))
    defn = programs.definition(raw)
    assert (defn.inputs, len(defn.steps), defn.outputs) == (2, 4, ((3, 0), (2, 0)))
    assert defn.fuse and defn.graph
    off = programs.definition(chain(3, options=()))
    assert not off.fuse and not off.graph


# -- typed against the inputs ---------------------------------------------------------------------


def test_a_chain_types_every_value() -> None:
    plan = check(chain(3), [f32([1, 2]), f32([3, 4])])
    typed = plan.program.plan
    assert plan.action == "program" and plan.kernel == "prog"
    assert [s.elements for s in typed.slots[:5]] == [2] * 5
    assert typed.slots[5].scalar and typed.slots[5].type == "f32"
    assert typed.outputs == (5, 4)
    assert [s.plan.kernel for s in typed.steps] == ["vector_add"] * 3 + ["reduce"]
    assert plan.key is not None and plan.elements == 4


def test_one_shape_is_typed_once() -> None:
    raw = chain(2)
    first = check(raw, [f32([1, 2]), f32([3, 4])]).program.plan
    again = check(raw, [f32([5, 6]), f32([7, 8])]).program.plan
    other = check(raw, [f32([1, 2, 3]), f32([3, 4, 5])]).program.plan
    assert first is again and first is not other


def test_a_step_that_refuses_the_inputs_names_its_index() -> None:
    term = refusal(chain(3), [f32([1, 2]), f32([1, 2, 3])])
    assert term[:2] == ("step", 1) and term[2][0] == "bad_args"
    assert "length mismatch" in term[2][1]
    # types: the first step takes one element type
    term = refusal(chain(2), [f32([1, 2]), np.array([1, 2], np.float64)])
    assert term[:2] == ("step", 1)


def test_the_inputs_must_be_as_many_as_declared() -> None:
    term = refusal(chain(2), [f32([1, 2])])
    assert term == ("bad_args", "the program takes 2 inputs, got 1")


def test_an_unknown_kernel_is_its_steps() -> None:
    term = refusal(definition(1, [("reduce", [inp(0)]), ("nope", [inp(0)])], [step(0)]),
                   [f32([1])])
    assert term == ("step", 2, ("unknown_kernel", "nope"))


def test_buffer_makers_are_not_steps() -> None:
    assert refusal(definition(1, [("copy", [inp(0)])], [step(0)]), [f32([1])])[0] == (
        "bad_program")


def test_a_scalar_result_is_an_output_only() -> None:
    raw = definition(1, [("reduce", [inp(0)]), ("vector_add", [step(0), inp(0)])], [step(1)])
    term = refusal(raw, [f32([1])])
    assert term[0] == "bad_program" and "output only" in term[1]


def test_a_buffer_input_needs_the_lanes_buffers() -> None:
    raw = chain(2)
    held = {7: ("f32", 2)}.get
    plan = check(raw, [Handle(7), f32([1, 2])], held=held)
    assert plan.operands[0].source == "buffer" and plan.key is None  # runs alone
    assert refusal(raw, [Handle(8), f32([1, 2])], held=held) == ("buffer_lost", 8)


def test_kept_outputs_must_be_as_many_as_the_vectors() -> None:
    raw = chain(2)
    plan = check(raw, [f32([1]), f32([2])], keep=(11,))
    assert plan.keep == (11,) and plan.key is None and plan.kept_bytes == 4 + 4
    assert refusal(raw, [f32([1]), f32([2])], keep=(11, 12))[0] == "bad_args"


def test_numbers_as_inputs_bind_per_run() -> None:
    raw = definition(3, [("matmul", [inp(0), inp(0), inp(1), inp(1), inp(1)]),
                         ("saxpy", [step(0), inp(2), step(0)])], [step(1)])
    registry = saxpy_registry()
    plan = check(raw, [f32([1, 2, 3, 4]), 2, Scalar("f32", np.float32(3))], registry)
    typed = plan.program.plan
    matmul, saxpy = typed.steps
    assert [op.kind for op in matmul.ops[2:]] == ["slot"] * 3  # the dims: input 1
    assert saxpy.ops[1].kind == "slot" and saxpy.ops[1].cast == "f32"
    # another dim is another shape: typed again, and checked against it
    assert refusal(raw, [f32([1, 2, 3, 4]), 3, Scalar("f32", np.float32(3))],
                   registry=registry)[:2] == ("step", 1)


def test_constants_take_their_params_type() -> None:
    registry = saxpy_registry()
    raw = definition(1, [("saxpy", [inp(0), 2, inp(0)])], [step(0)])
    plan = check(raw, [f32([1, 2])], registry)
    value = plan.program.plan.steps[0].ops[1].value
    assert type(value) is np.float32 and value == 2
    too_big = definition(1, [("saxpy", [inp(0), 1e300, inp(0)])], [step(0)])
    assert refusal(too_big, [f32([1])], registry=registry)[:2] == ("step", 1)
    float_dim = definition(1, [("matmul", [inp(0), inp(0), 1.5, 1, 1])], [step(0)])
    assert refusal(float_dim, [f32([1])])[:2] == ("step", 1)


def test_a_written_param_takes_a_count_or_a_copy() -> None:
    registry = saxpy_registry()
    raw = definition(1, [("scale", [inp(0), 2.0]), ("scale", [3, 1.0])],
                     [step(0), step(1)])
    typed = check(raw, [f32([1, 2])], registry).program.plan
    first, second = typed.steps
    assert first.ops[0].kind == "copy" and first.ops[0].source == 0  # the input, copied
    assert second.ops[0].kind == "new" and second.ops[0].zero
    assert typed.slots[second.results[0]].elements == 3
    assert not typed.batchable  # a raw kernel may read any element


def test_only_elementwise_runs_batch() -> None:
    registry = saxpy_registry()
    pure = definition(2, [("saxpy", [inp(0), 2.0, inp(1)]), ("reduce", [step(0)])],
                      [step(1)])
    assert check(pure, [f32([1]), f32([2])], registry).key is not None
    registry.install("idx", [general.UserKernel(
        "idx", "idx", (("in", "f32"), ("out", "f32")), "elementwise", 1,
        general.ElementwiseBody((("x", "f32", "vector"),), (("z", "f32"),), "z = x * i", ()))])
    uses_i = definition(1, [("idx", [inp(0)])], [step(0)])
    assert check(uses_i, [f32([1])], registry).key is None


def test_a_changed_catalogue_types_again() -> None:
    registry = saxpy_registry()
    raw = definition(2, [("saxpy", [inp(0), 2.0, inp(1)])], [step(0)])
    first = check(raw, [f32([1]), f32([2])], registry).program.plan
    registry.remove("saxpy")
    assert refusal(raw, [f32([1]), f32([2])], registry=registry) == (
        "step", 1, ("unknown_kernel", "saxpy"))
    assert first.steps  # the old plan is not changed, only no longer found


def test_the_step_reason_travels() -> None:
    failure = protocol.step_failure(3, protocol.bad_args("x"))
    assert failure.term == ("step", 3, ("bad_args", "x"))
    tag, index, (reason, text) = etf.decode(etf.encode_bytes(failure.term))
    assert (tag, index, reason, bytes(text)) == ("step", 3, "bad_args", b"x")


def test_a_program_that_is_one_launch_says_so() -> None:
    add = definition(2, [("vector_add", [inp(1), inp(0)])], [step(0)])
    assert check(add, [f32([1]), f32([2])]).program.plan.launch == (inp(1), inp(0))
    product = definition(3, [("matmul", [inp(0), inp(1), inp(2), inp(2), 2])], [step(0)])
    assert check(product, [f32([1, 2]), f32([3, 4]), 1]).program.plan.launch == (
        inp(0), inp(1), inp(2), inp(2), 2)


@pytest.mark.parametrize(("raw", "args"), [
    (chain(2, total=False), [f32([1]), f32([2])]),  # two steps
    (definition(1, [("reduce", [inp(0)])], [step(0), step(0)]), [f32([1])]),  # answered twice
    (definition(2, [("vector_add", [inp(0), inp(1)])], [step(0)]),
     [np.array([1.0]), np.array([2.0])]),  # f64: not the launch path's
])
def test_anything_else_is_not_one_launch(raw: bytes, args: list[Any]) -> None:
    assert check(raw, args).program.plan.launch is None


def test_a_user_kernel_step_is_not_one_launch() -> None:
    raw = definition(1, [("saxpy", [inp(0), 2.0, inp(0)])], [step(0)])
    assert check(raw, [f32([1])], saxpy_registry()).program.plan.launch is None
