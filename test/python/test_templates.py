"""The template cache (``templates.py``): a frame matches only where decoding and checking
it would give the learned request with its own data, and fills in exactly that."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from erlcuda import general, kernels, protocol
from erlcuda import templates as cache
from erlcuda.protocol import Launch
from workerpipe import (
    ETYPE,
    Buffer,
    FileVector,
    Number,
    Vector,
    W,
    Zeroed,
    batch_frame,
    launch_frame,
)

rng = np.random.default_rng(7)


def f32(n: int) -> np.ndarray:
    return rng.standard_normal(n).astype(np.float32)


def checked(frame: bytearray) -> tuple[Launch, kernels.Plan]:
    launch = protocol.decode(frame)
    assert isinstance(launch, Launch) and launch.error is None
    return launch, kernels.parse(launch.kernel, launch.args)


def learned(frame: bytearray) -> cache.Templates:
    templates = cache.Templates()
    templates.learn(frame, *checked(frame))
    return templates


def same_request(got: kernels.Plan, want: kernels.Plan) -> None:
    assert (got.kernel, got.m, got.n, got.k, got.elements, got.out_elements) == (
        want.kernel, want.m, want.n, want.k, want.elements, want.out_elements)
    for mine, theirs in ((got.a, want.a), (got.b, want.b)):
        if theirs is None:
            assert mine is None
        else:
            assert mine is not None and mine.dtype == theirs.dtype
            assert mine.tobytes() == theirs.tobytes()


SHAPES: list[tuple[str, Any]] = [
    ("reduce", lambda: [f32(1)]),
    ("reduce", lambda: [f32(0)]),
    ("vector_add", lambda: [f32(5), f32(5)]),
    ("dot_product", lambda: [f32(300), f32(300)]),
    ("matmul", lambda: [f32(6), f32(12), 2, 4, 3]),
]


@pytest.mark.parametrize(("kernel", "args"), SHAPES, ids=[k for k, _ in SHAPES])
def test_a_frame_of_new_data_and_job_id_is_filled_as_parse_would(kernel: str,
                                                                 args: Any) -> None:
    templates = learned(bytearray(launch_frame(1, kernel, args())))
    for job_id in (2, 2**64 - 1):
        frame = bytearray(launch_frame(job_id, kernel, args()))
        template = templates.find(frame)
        assert template is not None
        same_request(template.fill(frame), checked(frame)[1])


@given(st.data())
def test_a_frame_that_differs_outside_job_id_and_data_never_matches(data: st.DataObject) -> None:
    kernel, args = data.draw(st.sampled_from(SHAPES))
    first = bytearray(launch_frame(1, kernel, args()))
    templates = learned(first)
    launch = protocol.decode(first)
    assert isinstance(launch, Launch)
    layout = protocol.vector_spans(launch)
    assert layout is not None
    data_bytes = {i for start, end in layout[0] for i in range(start, end)}
    header = [i for i in range(len(first)) if i not in data_bytes and not 1 <= i < 9]
    at = data.draw(st.sampled_from(header))
    other = bytearray(launch_frame(5, kernel, args()))
    # (flag_floats alone, which says how the result goes, is the same template's)
    other[at] ^= data.draw(st.integers(1, 255).filter(
        lambda x: at != protocol.LAUNCH_FLAGS or x != W.flag_floats))
    assert templates.find(other) is None


@pytest.mark.parametrize("first_floats", [False, True])
def test_launches_that_differ_in_flag_floats_alone_are_one_template(first_floats: bool) -> None:
    # A caller of lists beside one of binaries: their frames differ in that flag alone, and
    # must not take turns at being decoded and checked again.
    templates = learned(bytearray(launch_frame(1, "vector_add", [f32(4), f32(4)],
                                               floats=first_floats)))
    for floats in (True, False):
        frame = bytearray(launch_frame(2, "vector_add", [f32(4), f32(4)], floats=floats))
        template = templates.find(frame)
        assert template is not None
        same_request(template.fill(frame), checked(frame)[1])
    flags = W.flag_floats | W.flag_trace
    assert templates.find(bytearray(launch_frame(3, "vector_add", [f32(4), f32(4)],
                                                 flags=flags))) is None


def test_what_decoding_says_differently_is_never_a_match() -> None:
    templates = learned(bytearray(launch_frame(1, "vector_add", [f32(4), f32(4)])))
    for frame in (launch_frame(1, "vector_add", [f32(4), f32(4)], device=1),
                  launch_frame(1, "vector_add", [f32(4), f32(4)], trace=True),
                  launch_frame(1, "dot_product", [f32(4), f32(4)]),
                  launch_frame(1, "vector_add", [f32(3), f32(5)]),  # same length, bad args
                  launch_frame(1, "vector_add", [Vector(f32(4).tobytes(), 1), f32(4)])):
        assert templates.find(bytearray(frame)) is None


def test_no_template_for_shared_memory_or_for_converted_operands() -> None:
    frame = bytearray(launch_frame(1, "reduce", [FileVector("i1-0", 4000)]))
    launch = protocol.decode(frame)
    assert isinstance(launch, Launch)
    templates = cache.Templates()
    templates.learn(frame, launch, kernels.parse("reduce", [f32(1000)]))
    assert templates.find(frame) is None
    # A request whose vectors are not views of the frame's bytes (a copy) teaches nothing.
    frame = bytearray(launch_frame(1, "reduce", [f32(8)]))
    launch, request = checked(frame)
    templates.learn(frame, launch, kernels.parse("reduce", [request.a.copy()]))
    assert templates.find(frame) is None


def test_templates_are_kept_up_to_a_bound_and_can_be_cleared() -> None:
    templates = cache.Templates()
    frames = [bytearray(launch_frame(1, "reduce", [f32(n)]))
              for n in range(cache.MAX_TEMPLATES + 1)]
    for frame in frames:
        templates.learn(frame, *checked(frame))
    assert templates.find(frames[0]) is None  # the oldest went
    assert all(templates.find(f) is not None for f in frames[1:])
    templates.clear()
    assert templates.find(frames[-1]) is None


def test_a_traced_or_malformed_launch_teaches_no_template() -> None:
    templates = cache.Templates()
    for frame in (bytearray(launch_frame(1, "reduce", [f32(4)], trace=True)),
                  bytearray(launch_frame(1, "reduce", [f32(4)], result_file=("s1", 1 << 20)))):
        launch = protocol.decode(frame)
        assert isinstance(launch, Launch)
        templates.learn(frame, launch, kernels.parse("reduce", launch.args))
        assert templates.find(frame) is None


# -- general launches: buffers, dims, scalars and counts ---------------------------------------


class Held(dict[int, tuple[str, int]]):
    """A lane's buffers as ``general.check`` sees them: id -> (element type, length)."""

    def __call__(self, buffer_id: int) -> tuple[str, int] | None:
        return self.get(buffer_id)


def general_plan(frame: bytearray, held: Held,
                 registry: general.Registry | None = None) -> tuple[Launch, general.Plan]:
    launch = protocol.decode(frame)
    assert isinstance(launch, Launch) and launch.error is None
    return launch, general.check(launch, registry or general.Registry(), held)


def general_learned(frame: bytearray, held: Held,
                    registry: general.Registry | None = None) -> cache.Templates:
    templates = cache.Templates()
    launch, plan = general_plan(frame, held, registry)
    templates.learn_general(frame, launch, plan, held)
    return templates


def plan_fields(plan: general.Plan) -> tuple[Any, ...]:
    return (plan.kernel, plan.action,
            [(op.source, op.value, op.type, op.elements, op.result) for op in plan.operands],
            plan.keep, plan.out_type, plan.out_elements, plan.scalar, plan.user, plan.geometry,
            plan.results, plan.device_bytes, plan.kept_bytes)


def scale(etype: str) -> general.UserKernel:
    return general.UserKernel("scale", "m", (("inout", etype), ("scalar", etype),
                                             ("out", "f32"), ("out", "i32")))


USER = general.Registry()
USER.install("m", [scale("f64")])

# (kernel, its arguments given the buffer ids (a, b), kept ids)
GENERAL: list[tuple[str, Any, int]] = [
    ("vector_add", lambda a, b: [Buffer(a), Buffer(b)], 1),
    ("vector_add", lambda a, b: [Buffer(a), Buffer(a)], 1),
    ("vector_add", lambda a, b: [Buffer(a), Buffer(b)], 0),
    ("reduce", lambda a, b: [Buffer(b)], 0),
    ("dot_product", lambda a, b: [Buffer(a), Buffer(b)], 0),
    ("copy", lambda a, b: [Buffer(a)], 1),
    ("copy", lambda a, b: [Buffer(a)], 0),
    ("zeros", lambda a, b: [Zeroed(7, ETYPE["i32"])], 1),
    ("matmul", lambda a, b: [Buffer(a), Buffer(b), 2, 3, 3], 1),
    ("scale", lambda a, b: [Buffer(a), Number(2.5, ETYPE["f64"]), 5, 6], 2),
]
SIGS = {"matmul": (("f32", 6), ("f32", 9)), "scale": (("f64", 4), ("f64", 4))}


def general_frame(job_id: int, case: tuple[str, Any, int], a: int, b: int,
                  keep: list[int]) -> bytearray:
    kernel, args, nkeep = case
    return bytearray(launch_frame(job_id, kernel, args(a, b),
                                  keep=keep[:nkeep] if nkeep else None))


@pytest.mark.parametrize("case", GENERAL, ids=[f"{k}-{n}" for k, _, n in GENERAL])
def test_a_general_frame_of_other_buffer_ids_is_filled_as_the_check_would(case: Any) -> None:
    sig_a, sig_b = SIGS.get(case[0], (("f32", 5), ("f32", 5)))
    held = Held({1: sig_a, 2: sig_b, 30: sig_a, 2**64 - 1: sig_b})
    templates = general_learned(general_frame(1, case, 1, 2, [10, 11]), held, USER)
    for job_id, a, b, keep in ((2, 30, 2**64 - 1, [12, 13]), (2**64 - 1, 1, 2, [10, 11])):
        frame = general_frame(job_id, case, a, b, keep)
        template = templates.find_general(frame)
        assert template is not None
        plan = template.fill(frame, held)
        assert plan is not None
        assert plan_fields(plan) == plan_fields(general_plan(frame, held, USER)[1])


def test_a_general_frame_whose_buffers_differ_is_checked_as_ever() -> None:
    held = Held({1: ("f32", 5), 2: ("f32", 5), 3: ("f32", 6), 4: ("f64", 5)})
    case = GENERAL[0]
    templates = general_learned(general_frame(1, case, 1, 2, [10]), held)
    for a, b in ((3, 2), (1, 3), (4, 4), (1, 99), (99, 2)):  # a length, a type, not held
        frame = general_frame(2, case, a, b, [11])
        template = templates.find_general(frame)
        assert template is not None and template.fill(frame, held) is None
    # The check's verdicts, for the worker to answer.
    with pytest.raises(general.Refused, match="length mismatch"):
        general_plan(general_frame(2, case, 3, 2, [11]), held)
    with pytest.raises(general.Refused) as lost:
        general_plan(general_frame(2, case, 1, 99, [11]), held)
    assert lost.value.failure == protocol.buffer_lost(99)


def test_kept_ids_twice_in_one_frame_are_left_to_the_decoder() -> None:
    held = Held({1: ("f64", 4)})
    case = GENERAL[-1]
    templates = general_learned(general_frame(1, case, 1, 1, [10, 11]), held, USER)
    frame = general_frame(2, case, 1, 1, [12, 12])
    template = templates.find_general(frame)
    assert template is not None and template.fill(frame, held) is None
    assert protocol.decode(frame).error == "a buffer id is kept twice"  # type: ignore[union-attr]


@given(st.data())
def test_a_general_frame_that_differs_outside_job_id_and_buffer_ids_never_matches(
        data: st.DataObject) -> None:
    case = data.draw(st.sampled_from(GENERAL))
    sig_a, sig_b = SIGS.get(case[0], (("f32", 5), ("f32", 5)))
    held = Held({1: sig_a, 2: sig_b})
    first = general_frame(1, case, 1, 2, [10, 11])
    templates = general_learned(first, held, USER)
    launch = protocol.decode(first)
    assert isinstance(launch, Launch)
    layout = protocol.buffer_id_spans(launch)
    assert layout is not None
    handles, keep_at, _ = layout
    ids = {i for at in handles for i in range(at, at + 8)}
    if keep_at >= 0:
        ids |= set(range(keep_at, keep_at + 8 * case[2]))
    header = [i for i in range(len(first)) if i not in ids and not 1 <= i < 9]
    at = data.draw(st.sampled_from(header))
    other = general_frame(5, case, 1, 2, [10, 11])
    other[at] ^= data.draw(st.integers(1, 255))
    assert templates.find_general(other) is None


def test_no_general_template_for_data_shared_memory_or_a_trace() -> None:
    held = Held({1: ("f32", 4)})
    for frame in (bytearray(launch_frame(1, "vector_add", [Buffer(1), f32(4)], keep=[9])),
                  bytearray(launch_frame(1, "copy", [Vector(f32(4).tobytes())], keep=[9])),
                  bytearray(launch_frame(1, "reduce", [FileVector("i1-0", 16, 1)])),
                  bytearray(launch_frame(1, "reduce", [Buffer(1)], trace=True)),
                  bytearray(launch_frame(1, "copy", [Buffer(1)], result_file=("s1", 1 << 20)))):
        templates = general_learned(frame, held)
        assert templates.find_general(frame) is None


def test_general_templates_are_kept_up_to_a_bound_and_cleared_with_the_others() -> None:
    held = Held({1: ("f32", 4)})
    templates = cache.Templates()
    frames = [bytearray(launch_frame(1, "k" * (n + 1), [Buffer(1)]))
              for n in range(cache.MAX_TEMPLATES + 1)]
    registry = general.Registry()
    registry.install("m", [general.UserKernel("k" * (n + 1), "m", (("inout", "f32"),))
                           for n in range(cache.MAX_TEMPLATES + 1)])
    for frame in frames:
        templates.learn_general(frame, *general_plan(frame, held, registry), held)
    assert templates.find_general(frames[0]) is None  # the oldest went
    assert all(templates.find_general(f) is not None for f in frames[1:])
    templates.clear()
    assert templates.find_general(frames[-1]) is None


def test_a_batch_frame_teaches_the_template_of_its_launches_alone() -> None:
    # A table is its first launch's template applied to every row: a lone frame of that
    # shape then hits the same template, and a batch of a lone frame's shape hits it too.
    jobs = [[f32(50), f32(50)] for _ in range(cache.MIN_ROWS)]
    launches = [launch_frame(1 + i, "vector_add", args) for i, args in enumerate(jobs)]
    templates = cache.Templates()
    found = templates.table(batch_frame(launches))
    assert found is not None and found.batch.count == cache.MIN_ROWS
    alone = bytearray(launch_frame(99, "vector_add", [f32(50), f32(50)]))
    template = templates.find(alone)
    assert template is not None and template.device == 0
    same_request(template.fill(alone), checked(alone)[1])
    other = cache.Templates()
    other.learn(alone, *checked(alone))
    assert other.table(batch_frame(launches)) is not None


def test_a_launch_for_another_device_is_its_own_template() -> None:
    frame = bytearray(launch_frame(1, "reduce", [f32(10)], device=3))
    templates = learned(frame)
    template = templates.find(frame)
    assert template is not None and template.device == 3
    assert templates.find(bytearray(launch_frame(2, "reduce", [f32(10)]))) is None


def test_a_slot_template_fills_the_same_slot_names_with_the_same_objects() -> None:
    """A lone caller's jobs name the same slots one after another: ``fill`` hands back the
    very operands and result slot it made for the last frame, which its lane then knows
    by identity; other names get objects of their own; a name that is not UTF-8, none."""
    from erlcuda.shm import FileArg, ResultSlot

    f32_ = np.dtype(np.float32)
    template = cache.SlotTemplate(
        (), 0, ((0, 2), (2, 4)), (FileArg("", f32_, 400, 1 << 20),
                                  FileArg("", f32_, 400, 1 << 20)),
        (4, 6, 1 << 20), "vector_add", (0, 0, 0, 100, 100), False)
    first = template.fill(bytearray(b"s1s2s3"))
    assert first == ((FileArg("s1", f32_, 400, 1 << 20), FileArg("s2", f32_, 400, 1 << 20)),
                     ResultSlot("s3", 1 << 20))
    again = template.fill(bytearray(b"s1s2s3"))
    assert again is not None and again[0] is first[0] and again[1] is first[1]
    other = template.fill(bytearray(b"s1s4s3"))
    assert other is not None and other[0] is not first[0]
    assert [f.name for f in other[0]] == ["s1", "s4"] and other[1] == ResultSlot("s3", 1 << 20)
    assert template.fill(bytearray(b"s1\xffs3s")) is None
    back = template.fill(bytearray(b"s1s4s3"))
    assert back is not None and back[0] is other[0]
