"""Batch frames of one template's launches (``templates.Templates.table``): read as tables,
run as one batch, answered with one table of records (``protocol.encode_table``), exactly as
the general path answers them."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from erlcuda import protocol
from erlcuda.backends import select
from erlcuda.etf import Atom
from erlcuda.kernels import parse
from erlcuda.protocol import encode_table
from erlcuda.templates import MIN_ROWS, Table, Templates
from workerpipe import (
    TEST_WORKER,
    FileVector,
    Reply,
    W,
    WorkerPipe,
    batch_frame,
    launch_frame,
    parse_results,
)

RNG = np.random.default_rng(7)


def table_of(frame: bytes) -> Table | None:
    """``frame`` read as a table by a cache that has seen nothing else."""
    return Templates().table(frame)


def vec(n: int) -> np.ndarray:
    return RNG.standard_normal(n).astype(np.float32)


def jobs_of(kernel: str, count: int, n: int = 100) -> list[list[Any]]:
    if kernel == "matmul":
        return [[vec(6), vec(12), 2, 4, 3] for _ in range(count)]
    if kernel == "reduce":
        return [[vec(n)] for _ in range(count)]
    return [[vec(n), vec(n)] for _ in range(count)]


def frame_of(kernel: str, jobs: list[list[Any]], first_id: int = 1, **flags: Any) -> bytes:
    return batch_frame([launch_frame(first_id + i, kernel, args, **flags)
                        for i, args in enumerate(jobs)])


@pytest.mark.parametrize("kernel", ["vector_add", "reduce", "dot_product", "matmul"])
def test_a_uniform_frame_reads_as_a_table(kernel: str) -> None:
    jobs = jobs_of(kernel, 20)
    found = table_of(frame_of(kernel, jobs, first_id=100))
    assert found is not None
    batch = found.batch
    assert batch.kernel == kernel and found.device == 0 and batch.count == 20
    assert found.job_ids.tolist() == list(range(100, 120))
    blocks = [b for b in (batch.a, batch.b) if b is not None]
    for i, args in enumerate(jobs):
        vectors = [a for a in args if isinstance(a, np.ndarray)]
        for got, want in zip(blocks, vectors, strict=True):
            np.testing.assert_array_equal(got[i], want)
        dims = [a for a in args if not isinstance(a, np.ndarray)]
        assert dims == [batch.m, batch.n, batch.k][:len(dims)]


def _differing(kernel: str, change: str) -> bytes:
    jobs = jobs_of(kernel, 12)
    launches = [launch_frame(1 + i, kernel, args) for i, args in enumerate(jobs)]
    if change == "kernel":
        launches[5] = launch_frame(6, "dot_product", jobs[5])
    elif change == "size":
        launches[5] = launch_frame(6, kernel, [vec(101), vec(99)])
    elif change == "device":
        launches[5] = launch_frame(6, kernel, jobs[5], device=1)
    elif change == "trace":
        launches = [launch_frame(1 + i, kernel, args, trace=True)
                    for i, args in enumerate(jobs)]
    elif change == "result_file":
        launches = [launch_frame(1 + i, kernel, args, result_file=("s1", 1 << 20))
                    for i, args in enumerate(jobs)]
    elif change == "file":
        launches = [launch_frame(1 + i, kernel, [FileVector(f"i{i}", 400), args[1]])
                    for i, args in enumerate(jobs)]
    elif change == "short":
        launches = launches[: MIN_ROWS - 1]
    elif change == "malformed":
        launches = [f[:-3] for f in launches]
    return batch_frame(launches)


@pytest.mark.parametrize("change", ["kernel", "size", "device", "trace", "result_file",
                                    "file", "short", "malformed"])
def test_anything_but_jobids_and_data_differing_takes_the_general_path(change: str) -> None:
    assert table_of(_differing("vector_add", change)) is None


def test_matmul_rows_of_other_dims_take_the_general_path() -> None:
    launches = [launch_frame(i, "matmul", [vec(6), vec(12), 2, 4, 3]) for i in range(10)]
    launches[3] = launch_frame(3, "matmul", [vec(6), vec(12), 3, 4, 2])
    assert table_of(batch_frame(launches)) is None


def test_a_batch_frame_with_bytes_after_its_launches_takes_the_general_path() -> None:
    assert table_of(frame_of("reduce", jobs_of("reduce", 10)) + b"\0") is None
    assert table_of(launch_frame(1, "reduce", [vec(3)])) is None


@pytest.mark.parametrize("floats", [False, True])
@pytest.mark.parametrize("values", [np.arange(12, dtype=np.float32).reshape(4, 3),
                                    np.array([[1.5, -np.inf], [np.nan, 3e38], [0, -0.0],
                                              [1e-45, 7]], np.float32),
                                    np.array([1.5, -np.inf, np.nan, 3e38])])
def test_the_table_of_records_is_byte_for_byte_the_general_encoding(
        values: np.ndarray, floats: bool) -> None:
    # (floats: the launches had flag_floats, each vector goes as the ETF of its floats)
    ids = np.array([5, 2**64 - 1, 7, 0], np.uint64)
    table = encode_table(ids, values, 1 << 20, floats)
    rows = [(protocol.as_floats(v) if floats else v) if values.ndim == 2 else float(v)
            for v in values]
    general = protocol.encode_results([(int(i), r, None) for i, r in zip(ids, rows,
                                                                          strict=True)])
    assert [b"".join(bytes(c) for c in f) for f in table] == [
        b"".join(bytes(c) for c in f) for f in general.frames]


def test_a_table_says_which_launches_have_flag_floats() -> None:
    # Launches that differ in flag_floats alone (callers of lists and of binaries) are one
    # table; any other flag apart is not.
    jobs = jobs_of("vector_add", 10)
    for floats in ([True] * 10, [False] * 10, [i != 4 for i in range(10)]):
        launches = [launch_frame(1 + i, "vector_add", args, floats=f)
                    for i, (args, f) in enumerate(zip(jobs, floats, strict=True))]
        found = table_of(batch_frame(launches))
        assert found is not None and found.floats.tolist() == floats  # type: ignore[union-attr]
    launches[4] = launch_frame(5, "vector_add", jobs[4], trace=True)
    assert table_of(batch_frame(launches)) is None


def test_a_table_over_the_frame_limit_is_split_into_frames() -> None:
    values = np.ones((10, 25), np.float32)
    frames = encode_table(np.arange(10, dtype=np.uint64), values, 5 + 3 * (13 + 100))
    assert len(frames) == 4
    replies = [r for f in frames for r in parse_results(b"".join(bytes(c) for c in f))]
    assert [r.job_id for r in replies] == list(range(10))
    assert encode_table(np.arange(2, dtype=np.uint64), values[:2], 50) == []


@pytest.mark.parametrize("kernel", ["vector_add", "reduce", "dot_product", "matmul"])
def test_the_cpu_backend_runs_a_uniform_batch_as_it_runs_each_job(kernel: str) -> None:
    backend, _ = select("cpu")
    device = backend.open(0)
    jobs = jobs_of(kernel, 16, n=1000)
    found = table_of(frame_of(kernel, jobs))
    assert found is not None
    batch = found.batch
    got = device.execute_uniform(batch)
    want = [device.execute([parse(kernel, args)])[0] for args in jobs]
    if batch.scalar:
        np.testing.assert_allclose(got, want, rtol=1e-6)
    else:
        np.testing.assert_allclose(got, np.stack(want), rtol=1e-6)


# -- through a worker ------------------------------------------------------------------------

LAYOUTS = [("--cpu-devices", "1"), ("--cpu-devices", "2"),
           ("--cpu-devices", "1", "--device-thread")]


@pytest.fixture(params=LAYOUTS, ids=["inline", "two-devices", "device-thread"])
def worker(request: pytest.FixtureRequest) -> Iterator[WorkerPipe]:
    pipe = WorkerPipe("--backend", "cpu", *request.param)
    yield pipe
    assert pipe.close() == 0


def _replies(worker: WorkerPipe, count: int) -> list[Reply]:
    return [worker.reply() for _ in range(count)]


@pytest.mark.parametrize("kernel", ["vector_add", "reduce", "dot_product", "matmul"])
def test_a_uniform_frame_is_answered_as_its_jobs_one_by_one(worker: WorkerPipe,
                                                              kernel: str) -> None:
    jobs = jobs_of(kernel, 40)
    worker.send_raw(frame_of(kernel, jobs, first_id=1))
    table = _replies(worker, 40)
    frames_for_table = worker.results_frames
    for i, args in enumerate(jobs):
        worker.launch(1000 + i, kernel, args)
    single = _replies(worker, 40)
    assert [r.job_id for r in table] == list(range(1, 41))
    assert [(r.tag, r.payload) for r in table] == [(r.tag, r.payload) for r in single]
    assert frames_for_table == 1
    _, _, info = worker.call("info")
    assert info["device_info"][0]["table_jobs"] == 40
    assert info["device_info"][0]["jobs"] == 80


@pytest.mark.parametrize("kernel", ["reduce", "dot_product"])
def test_ill_conditioned_sums_are_the_same_bits_either_way(worker: WorkerPipe,
                                                           kernel: str) -> None:
    # Huge values beside small ones: any other order of additions gives other sums.
    rows = []
    for _ in range(12):
        v = RNG.standard_normal(64).astype(np.float32)
        v[RNG.integers(0, 64, 4)] = np.float32(2.0**60) * RNG.choice([-1, 1], 4)
        rows.append(v)
    jobs = [[v] if kernel == "reduce" else [v, v[::-1].copy()] for v in rows]
    worker.send_raw(frame_of(kernel, jobs, first_id=1))
    table = _replies(worker, 12)
    worker.send_raw(batch_frame([launch_frame(100 + i, kernel, args, trace=True)
                                 for i, args in enumerate(jobs)]))  # traced: general path
    general = _replies(worker, 12)
    for i, args in enumerate(jobs):
        worker.launch(200 + i, kernel, args)  # one by one
    lone = _replies(worker, 12)
    assert [r.payload for r in table] == [r.payload for r in general] == [
        r.payload for r in lone]


def test_jobs_before_and_after_a_uniform_frame_keep_their_order(worker: WorkerPipe) -> None:
    worker.launch(1, "reduce", [vec(5)])
    worker.send_raw(frame_of("reduce", jobs_of("reduce", 20), first_id=2))
    worker.launch(22, "reduce", [vec(5)])
    assert [r.job_id for r in _replies(worker, 22)] == list(range(1, 23))


def test_a_uniform_frame_of_bad_jobs_gets_bad_args_for_each(worker: WorkerPipe) -> None:
    jobs = [[vec(10), vec(11)] for _ in range(12)]  # a length mismatch in every row
    worker.send_raw(frame_of("vector_add", jobs))
    replies = _replies(worker, 12)
    assert [r.job_id for r in replies] == list(range(1, 13))
    assert all(r.tag == W.tag_error and r.result[1][0] == "bad_args" for r in replies)
    worker.launch(99, "reduce", [np.ones(3, np.float32)])
    assert worker.result() == (99, ("ok", 3.0))
    _, _, info = worker.call("info")
    assert info["device_info"][0]["table_jobs"] == 0


def test_batching_off_answers_a_uniform_frame_job_by_job() -> None:
    pipe = WorkerPipe("--backend", "cpu", "--max-batch", "1")
    try:
        pipe.send_raw(frame_of("reduce", jobs_of("reduce", 10)))
        assert [r.job_id for r in _replies(pipe, 10)] == list(range(1, 11))
        assert pipe.results_frames == 10
        _, _, info = pipe.call("info")
        assert info["device_info"][0]["table_jobs"] == 0
    finally:
        assert pipe.close() == 0


@pytest.mark.parametrize("kernel", ["reduce", "dot_product"])
def test_the_cpu_backend_sums_a_lone_job_as_a_batch_does(kernel: str) -> None:
    device = select("cpu")[0].open(0)
    rows = []
    for _ in range(8):
        v = RNG.standard_normal(300).astype(np.float32)
        v[RNG.integers(0, 300, 6)] = np.float32(2.0**60) * RNG.choice([-1, 1], 6)
        rows.append(v)
    requests = [parse(kernel, [v] if kernel == "reduce" else [v, v[::-1].copy()])
                for v in rows]
    batched = device.execute(requests)
    assert [device.execute([r])[0] for r in requests] == batched


def test_a_table_waiting_behind_a_busy_device_keeps_its_own_data() -> None:
    # Frames over 1 MiB are read into reused buffers: a table queued behind a stalled device
    # must hold its frame's buffer, or the frames read meanwhile overwrite its operands (a
    # failure seen under load: callers got other callers' sums).
    pipe = WorkerPipe("--backend", "cpu", "--cpu-devices", "2", module=TEST_WORKER)
    n, rows = 16384, 20  # 64 KiB operands: a 1.3 MB frame

    def frame(first_id: int, device: int, value: float, count: int = rows) -> bytes:
        v = np.full(n, value, np.float32)
        return batch_frame([launch_frame(first_id + i, "reduce", [v], device=device)
                            for i in range(count)])

    try:
        pipe.send((Atom("C"), 99, Atom("erlcuda"), Atom("stall"), [0, 800]))
        pipe.send_raw(frame(100, 0, 1.0))
        sizes = {k: rows - 2 * (k - 2) for k in range(2, 9)}
        for k, count in sizes.items():
            pipe.send_raw(frame(100 * k, 1, float(k), count))
        want = {100 + i: 16384.0 for i in range(rows)}
        want |= {100 * k + i: 16384.0 * k for k, count in sizes.items() for i in range(count)}
        got: dict[int, Any] = {}
        while len(got) < len(want):
            message = pipe.receive()
            if isinstance(message, Reply):
                got[message.job_id] = message.result
        assert got == {job: ("ok", value) for job, value in want.items()}
    finally:
        assert pipe.close() == 0


def test_a_table_over_max_batch_runs_in_slices() -> None:
    pipe = WorkerPipe("--backend", "cpu", "--max-batch", "16")
    try:
        jobs = jobs_of("reduce", 40)
        pipe.send_raw(frame_of("reduce", jobs))
        replies = _replies(pipe, 40)
        assert [r.job_id for r in replies] == list(range(1, 41))
        for r, (v,) in zip(replies, jobs, strict=True):
            assert r.result[1] == pytest.approx(float(v.astype(np.float64).sum()), rel=1e-6)
        _, _, info = pipe.call("info")
        device = info["device_info"][0]
        assert (device["table_jobs"], device["launches"], device["max_batch"]) == (40, 3, 16)
    finally:
        assert pipe.close() == 0
