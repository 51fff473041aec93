"""Templates of lone launch frames: a frame matches only where decoding and checking it
would give the learned request with its own data, and fills in exactly that."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from erlcuda import kernels, lone, protocol
from erlcuda.protocol import Launch
from workerpipe import FileVector, Vector, launch_frame

rng = np.random.default_rng(7)


def f32(n: int) -> np.ndarray:
    return rng.standard_normal(n).astype(np.float32)


def checked(frame: bytearray) -> tuple[Launch, kernels.Request]:
    launch = protocol.decode(frame)
    assert isinstance(launch, Launch) and launch.error is None
    return launch, kernels.parse(launch.kernel, launch.args)


def learned(frame: bytearray) -> lone.Templates:
    templates = lone.Templates()
    templates.learn(frame, *checked(frame))
    return templates


def same_request(got: kernels.Request, want: kernels.Request) -> None:
    assert (got.kernel, got.m, got.n, got.k, got.elements, got.result_elements) == (
        want.kernel, want.m, want.n, want.k, want.elements, want.result_elements)
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
    other[at] ^= data.draw(st.integers(1, 255))
    assert templates.find(other) is None


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
    templates = lone.Templates()
    templates.learn(frame, launch, kernels.parse("reduce", [f32(1000)]))
    assert templates.find(frame) is None
    # A request whose vectors are not views of the frame's bytes (a copy) teaches nothing.
    frame = bytearray(launch_frame(1, "reduce", [f32(8)]))
    launch, request = checked(frame)
    templates.learn(frame, launch, kernels.parse("reduce", [request.a.copy()]))
    assert templates.find(frame) is None


def test_templates_are_kept_up_to_a_bound_and_can_be_cleared() -> None:
    templates = lone.Templates()
    frames = [bytearray(launch_frame(1, "reduce", [f32(n)]))
              for n in range(lone.MAX_TEMPLATES + 1)]
    for frame in frames:
        templates.learn(frame, *checked(frame))
    assert templates.find(frames[0]) is None  # the oldest went
    assert all(templates.find(f) is not None for f in frames[1:])
    templates.clear()
    assert templates.find(frames[-1]) is None


def test_a_traced_or_malformed_launch_teaches_no_template() -> None:
    templates = lone.Templates()
    for frame in (bytearray(launch_frame(1, "reduce", [f32(4)], trace=True)),
                  bytearray(launch_frame(1, "reduce", [f32(4)], result_file=True))):
        launch = protocol.decode(frame)
        assert isinstance(launch, Launch)
        templates.learn(frame, launch, kernels.parse("reduce", launch.args))
        assert templates.find(frame) is None
