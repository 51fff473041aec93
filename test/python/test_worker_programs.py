"""Program launches through the worker's frames: lone ones by their template, batch frames
of one program read as a table, buffers and kept outputs, refusals (worker processes)."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

from erlcuda import protocol, templates
from programdefs import chain, definition, f32, inp, launch, step
from workerpipe import Buffer, Number, WorkerPipe, batch_frame, launch_frame


@pytest.fixture
def worker() -> Iterator[WorkerPipe]:
    pipe = WorkerPipe("--backend", "cpu")
    yield pipe
    assert pipe.close() == 0


def want_chain(a: np.ndarray, b: np.ndarray, links: int) -> list[object]:
    last = a + links * b
    return [float(np.float32(last.astype(np.float64).sum())), last.tolist()]


def test_lone_runs_answer_each_its_own(worker: WorkerPipe) -> None:
    raw = chain(5)
    for job in range(1, 6):
        a, b = f32(np.arange(job, job + 8)), f32(np.full(8, job))
        worker.launch(job, "chain", [a, b], program=raw)
        assert worker.result() == (job, ("ok", want_chain(a, b, 5)))
    # another shape, then the first again
    worker.launch(9, "chain", [f32([1]), f32([2])], program=raw)
    assert worker.result() == (9, ("ok", want_chain(f32([1]), f32([2]), 5)))
    a, b = f32(np.arange(8)), f32(np.ones(8))
    worker.launch(10, "chain", [a, b], program=raw)
    assert worker.result() == (10, ("ok", want_chain(a, b, 5)))


def test_a_batch_frame_of_one_program_is_run_as_one(worker: WorkerPipe) -> None:
    raw = chain(3)
    inputs = [(f32(np.arange(16) * i), f32(np.ones(16) * i)) for i in range(30)]
    worker.send_raw(batch_frame([launch_frame(100 + i, "chain", [a, b], program=raw)
                                 for i, (a, b) in enumerate(inputs)]))
    got = [worker.result() for _ in inputs]
    assert got == [(100 + i, ("ok", want_chain(a, b, 3))) for i, (a, b) in enumerate(inputs)]
    info = worker.call("info", 1, [])[2]
    device = info["device_info"][0]
    assert device["table_jobs"] == 30 and device["max_batch"] >= 30


def test_a_batch_frame_with_another_shape_in_it_is_answered_launch_by_launch(
        worker: WorkerPipe) -> None:
    raw = chain(2)
    frames = [launch_frame(i, "chain", [f32(np.ones(8)), f32(np.ones(8))], program=raw)
              for i in range(12)]
    frames[5] = launch_frame(5, "chain", [f32(np.ones(4)), f32(np.ones(8))], program=raw)
    worker.send_raw(batch_frame(frames))
    got = dict(worker.result() for _ in frames)
    assert got[5][0] == "error" and got[5][1][:2] == ("step", 1)
    assert all(got[i] == ("ok", [24.0, [3.0] * 8]) for i in range(12) if i != 5)


def test_buffers_numbers_and_kept_outputs(worker: WorkerPipe) -> None:
    worker.launch(1, "copy", [f32([1, 2, 3, 4])], keep=[7])
    assert worker.result()[1][0] == "ok"
    raw = definition(2, [("matmul", [inp(0), inp(0), inp(1), inp(1), inp(1)]),
                         ("vector_add", [step(0), inp(0)])], [step(1), step(0)])
    worker.launch(2, "mm", [Buffer(7), 2], keep=[8, 9], program=raw)
    assert worker.result() == (2, ("ok", [("buffer", 8, "f32", 4), ("buffer", 9, "f32", 4)]))
    worker.launch(3, "copy", [Buffer(8)])
    assert worker.result() == (3, ("ok", [8.0, 12.0, 18.0, 26.0]))
    # the same frame with other buffer ids: a template of the buffers' shapes
    worker.launch(4, "mm", [Buffer(9), 2], program=raw)
    squared = [199.0, 290.0, 435.0, 634.0]  # [[7, 10], [15, 22]] squared
    assert worker.result() == (4, ("ok", [[x + y for x, y in zip(squared, [7, 10, 15, 22],
                                                                  strict=True)], squared]))
    worker.launch(5, "mm", [Buffer(99), 2], program=raw)
    assert worker.result() == (5, ("error", ("buffer_lost", 99)))


def test_refusals_and_a_malformed_definition(worker: WorkerPipe) -> None:
    worker.launch(1, "p", [f32([1])], program=b"\x83junk")
    job, (status, reason) = worker.result()
    assert (job, status, reason[0]) == (1, "error", "bad_program")
    worker.launch(2, "p", [f32([1])], program=chain(2))
    job, (status, (reason, text)) = worker.result()
    assert (job, status, reason, bytes(text)) == (
        2, "error", "bad_args", b"the program takes 2 inputs, got 1")
    raw = definition(2, [("vector_add", [inp(0), inp(1)])], [step(0)])
    worker.launch(3, "p", [f32([1]), Number(2.0)], program=raw)
    job, (status, reason) = worker.result()
    assert (job, status, reason[:2]) == (3, "error", ("step", 1))


# -- the templates, in this process -------------------------------------------------------


def test_a_program_frame_on_data_is_read_by_its_template() -> None:
    raw = chain(2)
    cache = templates.Templates()
    first = launch_frame(1, "chain", [f32([1, 2]), f32([3, 4])], program=raw)
    message = protocol.decode(first)
    from erlcuda import general

    plan = general.check(message, general.Registry())
    cache.learn_program(first, message, plan)
    second = bytearray(launch_frame(2, "chain", [f32([5, 6]), f32([7, 8])], program=raw))
    found = cache.find_program(second)
    assert found is not None
    filled = found.fill(second)
    assert filled.program is plan.program and filled.key == plan.key
    assert [op.value.tolist() for op in filled.operands] == [[5, 6], [7, 8]]
    other = launch_frame(3, "chain", [f32([5, 6, 7]), f32([7, 8, 9])], program=raw)
    assert cache.find_program(other) is None
    assert cache.find_program(launch_frame(4, "chain", [f32([5, 6]), f32([7, 8])],
                                           program=chain(3))) is None
    # buffers and kept outputs are no template of data
    buffered = launch(raw, [f32([1, 2]), f32([3, 4])], keep=(5,))
    assert protocol.program_data_spans(buffered) is None


def test_a_lone_program_that_is_one_launch_is_read_as_that_launch(worker: WorkerPipe) -> None:
    add = definition(2, [("vector_add", [inp(1), inp(0)])], [step(0)])
    total = definition(1, [("reduce", [inp(0)])], [step(0)])
    a, b = f32(np.arange(16)), f32(np.full(16, 0.5))
    for job in range(1, 6):
        worker.launch(job, "add", [a * job, b], program=add)
        assert worker.result() == (job, ("ok", [(a * job + b).tolist()]))
        worker.launch(100 + job, "total", [a * job], program=total)
        assert worker.result() == (100 + job, ("ok", [float(a.sum() * job)]))
    device = worker.call("info", 1, [])[2]["device_info"][0]
    # the first of each was checked and run by the program runner; the others, by their
    # template, as the launch
    assert device["programs"]["runs"] == 2 and device["jobs"] == 10
