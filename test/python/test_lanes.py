"""Device lanes with a backend that reuses one staging buffer, as the CUDA backend does."""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest

from erlcuda import kernels
from erlcuda.backends.base import Backend, BackendError, Device, Result
from erlcuda.backends.cpu import CpuDevice
from erlcuda.framing import MAX_FRAME, FrameReader, FrameWriter
from erlcuda.lanes import Job, Lane
from programdefs import check, definition, f32, inp, step
from workerpipe import Reply, W, parse_results


class StagingDevice(Device):
    """Answers with views into one buffer that every run overwrites."""

    def __init__(self) -> None:
        self.cpu = CpuDevice(0)
        self.staging = np.empty(1 << 16, dtype=np.float32)
        self.runs: list[tuple[str, int]] = []

    def _run_batch(self, kernel: str, requests: Sequence[kernels.Plan]) -> list[Result]:
        self.runs.append((kernel, len(requests)))
        if kernel == "dot_product" and requests[0].a.size == 13:
            raise BackendError("illegal_address", "boom", fatal=True)
        if kernel == "vector_add" and requests[0].a.size == 7:
            return [np.array([object()] * 7)]  # nothing the codec can encode
        out: list[Result] = []
        offset = 0
        for value in self.cpu.execute(requests):
            if isinstance(value, np.ndarray):
                view = self.staging[offset : offset + value.size]
                view[:] = value
                offset += value.size
                out.append(view)
            else:
                out.append(value)
        return out

    def info(self) -> dict[str, Any]:
        return {"name": "staging", "total_memory": 1 << 20}


class StagingBackend(Backend):
    name = "cpu"

    def __init__(self) -> None:
        self.device = StagingDevice()

    def device_count(self) -> int:
        return 1

    def open(self, index: int) -> Device:
        return self.device


class CapturingWriter:
    max_frame = MAX_FRAME

    def __init__(self) -> None:
        self.frames: list[list[Reply]] = []

    def write_many(self, frames: Sequence[Sequence[bytes | memoryview]]) -> None:
        self.frames.extend(parse_results(b"".join(bytes(c) for c in f)) for f in frames)

    def write_sized(self, chunks: Sequence[bytes | memoryview], size: int) -> None:
        body = b"".join(bytes(c) for c in chunks)
        assert len(body) == size
        self.frames.append(parse_results(body))

    @property
    def replies(self) -> list[Reply]:
        return [r for frame in self.frames for r in frame]

    def results(self) -> dict[int, Any]:
        return {r.job_id: r.result for r in self.replies}


def make_lane() -> tuple[Lane, CapturingWriter, list[str]]:
    writer = CapturingWriter()
    fatal: list[str] = []
    lane = Lane(0, StagingBackend(), writer, max_batch=256, max_elements=1 << 20,  # type: ignore[arg-type]
                on_fatal=fatal.append)
    return lane, writer, fatal


def test_mixed_batch_keeps_each_result_and_the_order() -> None:
    lane, writer, fatal = make_lane()
    rng = np.random.default_rng(3)
    expected = {}
    for job_id in range(40):
        a, b = rng.standard_normal((2, 8), dtype=np.float32)
        if job_id % 2:
            request = kernels.parse("vector_add", [a, b])
            expected[job_id] = a + b
        else:
            request = kernels.parse("matmul", [a, b, 2, 2, 4])
            expected[job_id] = (a.reshape(2, 4) @ b.reshape(4, 2)).ravel()
        lane.submit(Job(job_id, request))
    lane.start()
    lane.stop()
    lane.join(5)
    assert not fatal
    assert len(writer.frames) == 1  # one batch, one results frame
    assert [r.job_id for r in writer.replies] == list(range(40))
    for reply in writer.replies:
        assert reply.result[0] == "ok" and reply.tag == W.tag_vector
        np.testing.assert_allclose(np.frombuffer(reply.payload, "<f4"), expected[reply.job_id],
                                   rtol=1e-5)
    assert lane.stats.launches == 2 and lane.stats.max_batch == 20


def test_a_programs_outputs_outlive_the_next_group_in_the_staging() -> None:
    lane, writer, fatal = make_lane()
    add = definition(2, [("vector_add", [inp(0), inp(1)])], [step(0)])
    a, b = f32([1, 2, 3]), f32([10, 20, 30])
    for job_id in range(4):  # a program that is one launch: its output is a staging view
        lane.submit(Job(job_id, check(add, [a * job_id, b])))
    lane.submit(Job(9, kernels.parse("vector_add", [f32([7, 7, 7]), f32([0, 0, 0])])))
    lane.start()
    lane.stop()
    lane.join(5)
    assert not fatal and lane.stats.launches == 2
    results = writer.results()
    for job_id in range(4):
        assert results[job_id] == ("ok", [(a * job_id + b).tolist()])
    assert results[9] == ("ok", [7.0, 7.0, 7.0])


def test_a_fatal_error_answers_the_batch_then_reports() -> None:
    lane, writer, fatal = make_lane()
    ones = np.ones(13, np.float32)
    lane.submit(Job(1, kernels.parse("dot_product", [ones, ones])))
    lane.submit(Job(2, kernels.parse("reduce", [ones])))
    lane.start()
    lane.stop()
    lane.join(5)
    replies = writer.results()
    assert replies[1][0] == "error" and replies[1][1][:2] == ("cuda", "illegal_address")
    assert replies[2] == ("ok", 13.0)
    assert fatal and "illegal_address" in fatal[0]


def test_a_job_larger_than_the_device_memory_is_too_large() -> None:
    lane, writer, _ = make_lane()
    big = np.ones(200_000, np.float32)  # 2.4 MB with its output, over the 1 MiB device
    lane.submit(Job(1, kernels.parse("vector_add", [big, big])))
    lane.submit(Job(2, kernels.parse("reduce", [big[:10]])))
    lane.start()
    lane.stop()
    lane.join(5)
    replies = writer.results()
    assert replies == {1: ("error", "too_large"), 2: ("ok", 10.0)}


def test_a_result_the_codec_refuses_still_gets_one_reply() -> None:
    lane, writer, _ = make_lane()
    seven = np.ones(7, np.float32)  # StagingDevice answers this one with object dtype
    lane.submit(Job(1, kernels.parse("vector_add", [seven, seven])))
    lane.submit(Job(2, kernels.parse("reduce", [seven[:3]])))
    lane.start()
    lane.stop()
    lane.join(5)
    replies = writer.results()
    assert replies[1][0] == "error" and replies[1][1][0] == "internal"
    assert replies[2] == ("ok", 3.0)
    assert lane.stats.errors == 1


def run_lane_on_a_pipe(max_frame: int, jobs: list[Job]) -> tuple[Lane, list[list[Reply]]]:
    """Run ``jobs`` as one batch through a lane writing to a real pipe; the frames read."""
    r, w = os.pipe()
    frames: list[list[Reply]] = []
    try:
        writer = FrameWriter(w, max_frame=max_frame)
        fatal: list[str] = []
        lane = Lane(0, StagingBackend(), writer, max_batch=256, max_elements=1 << 20,
                    on_fatal=fatal.append)
        for job in jobs:
            lane.submit(job)

        def read() -> None:
            reader = FrameReader(r)
            while sum(map(len, frames)) < len(jobs):
                frame = reader.read()
                assert frame is not None
                assert len(frame) <= max_frame
                frames.append(parse_results(frame))

        reading = threading.Thread(target=read, daemon=True)
        reading.start()
        lane.start()
        lane.stop()
        lane.join(5)
        reading.join(5)
        assert not fatal
    finally:
        os.close(r)
        os.close(w)
    return lane, frames


def test_a_reply_over_the_frame_limit_is_too_large_and_the_batch_is_delivered() -> None:
    # One oversized reply made write_many refuse the whole batch: every job lost its reply.
    small, big = np.ones(10, np.float32), np.ones(600, np.float32)  # 600 floats: 2.4 KB
    lane, frames = run_lane_on_a_pipe(2000, [
        Job(job_id, kernels.parse("vector_add", [vector, vector]))
        for job_id, vector in enumerate([small, big, small, big[:100]])])
    assert lane.stats.launches == 1  # one batch
    assert len(frames) == 1  # whose records all fit one frame
    results = {r.job_id: r.result for r in frames[0]}
    assert results[1] == ("error", "too_large")
    assert results[0] == ("ok", [2.0] * 10) and results[2] == ("ok", [2.0] * 10)
    assert results[3] == ("ok", [2.0] * 100)
    assert lane.stats.errors == 1


def test_a_batch_over_the_frame_limit_is_split_over_frames() -> None:
    # Each record fits a frame, no two of them do: four frames, in the jobs' order.
    vector = np.ones(300, np.float32)  # a record of 13 + 1200 bytes
    lane, frames = run_lane_on_a_pipe(2000, [
        Job(job_id, kernels.parse("vector_add", [vector, vector])) for job_id in range(4)])
    assert lane.stats.launches == 1
    assert [[r.job_id for r in f] for f in frames] == [[0], [1], [2], [3]]
    assert all(r.result == ("ok", [2.0] * 300) for f in frames for r in f)
    assert lane.stats.errors == 0


def test_a_lone_job_is_answered_whatever_its_run_does() -> None:
    lane, writer, fatal = make_lane()
    device = lane.open_here()
    ones = np.ones(13, np.float32)
    lone = [(1, kernels.parse("reduce", [ones])),
            (2, kernels.parse("vector_add", [ones[:7], ones[:7]])),  # not encodable
            (3, kernels.parse("vector_add", [ones[:3], ones[:3]])),
            (4, kernels.parse("dot_product", [ones, ones]))]  # a fatal error
    for job_id, request in lone:
        assert lane.run_lone(job_id, request, device)
    assert [len(frame) for frame in writer.frames] == [1, 1, 1, 1]
    replies = writer.results()
    assert replies[1] == ("ok", 13.0)
    assert replies[2][0] == "error" and replies[2][1][0] == "internal"
    assert replies[3] == ("ok", [2.0, 2.0, 2.0])
    assert replies[4][0] == "error" and replies[4][1][:2] == ("cuda", "illegal_address")
    assert len(fatal) == 1 and "illegal_address" in fatal[0]
    assert (lane.stats.jobs, lane.stats.errors, lane.stats.launches) == (4, 2, 3)


def test_a_lone_job_the_general_path_must_answer_is_left_untouched() -> None:
    lane, writer, _ = make_lane()
    big = kernels.parse("reduce", [np.ones(300_000, np.float32)])  # over the 1 MiB device
    assert not lane.run_lone(1, big, lane.open_here())
    assert not lane.run_lone(2, kernels.parse("reduce", [np.ones(1, np.float32)]), None)
    assert writer.frames == [] and lane.stats.jobs == 0


def test_a_lone_job_whose_backend_breaks_its_contract_is_internal() -> None:
    lane, writer, fatal = make_lane()
    device = lane.open_here()
    request = kernels.parse("reduce", [np.ones(3, np.float32)])
    for job_id, values in ((1, []), (2, [1.0, 2.0])):
        device.execute = lambda plans, v=values: v  # type: ignore[method-assign]
        assert lane.run_lone(job_id, request, device)
    replies = writer.results()
    assert [replies[1][1][0], replies[2][1][0]] == ["internal", "internal"]
    assert not fatal and lane.stats.errors == 2


def test_a_lane_is_ready_even_when_opening_its_device_raises() -> None:
    # the control thread waits for every lane's ready before it answers calls
    lane, _, _ = make_lane()

    def interrupted() -> None:
        raise KeyboardInterrupt

    lane._open = interrupted  # type: ignore[method-assign]
    with pytest.raises(KeyboardInterrupt):
        lane.open_here()
    assert lane.ready.is_set()
