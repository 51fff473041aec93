"""The worker and batch frames (what erlcuda_writer sends), hostile ones included.

Every launch whose JobId can be read gets exactly one reply, one device's replies keep the
order of the launches whether they came alone or in batch frames, and a hostile batch
header costs nothing and stops nothing.
"""

from __future__ import annotations

import struct
import time
import tracemalloc
from collections.abc import Iterator

import numpy as np
import pytest

from erlcuda import protocol
from erlcuda.etf import Atom
from workerpipe import TEST_WORKER, Reply, W, WorkerPipe, batch_frame, launch_frame


@pytest.fixture
def worker() -> Iterator[WorkerPipe]:
    pipe = WorkerPipe("--backend", "cpu", "--cpu-devices", "2", module=TEST_WORKER)
    yield pipe
    assert pipe.close() == 0


def f32(values: list[float] | np.ndarray) -> bytes:
    return np.asarray(values, dtype="<f4").tobytes()


def replies(worker: WorkerPipe, n: int) -> list[Reply]:
    got: list[Reply] = []
    while len(got) < n:
        item = worker.receive()
        if isinstance(item, Reply):
            got.append(item)
    return got


def test_order_and_one_reply_across_direct_and_batch_frames(worker: WorkerPipe) -> None:
    """Both lanes stalled while direct frames and batch frames (some over 1 MiB, read into
    the reader's pooled buffers whose views the queued jobs still hold) interleave: each
    job is answered once, with its own values, and each device in launch order."""
    for device in (0, 1):
        worker.send((Atom("C"), 90 + device, Atom("erlcuda"), Atom("stall"), [device, 400]))
    time.sleep(0.05)
    expected: dict[int, float] = {}
    order: dict[int, list[int]] = {0: [], 1: []}
    job = 0

    def next_launch(size: int) -> bytes:
        nonlocal job
        job += 1
        device = job % 2
        value = float(job % 7 + 1)
        expected[job] = value * size
        order[device].append(job)
        return launch_frame(job, "reduce", [f32(np.full(size, value))], device=device)

    for round_ in range(6):
        worker.send_raw(next_launch(3))
        # a batch of 1.5 MiB: pooled on the reader's side; then a small one
        big = round_ % 2 == 0
        worker.send_raw(batch_frame([next_launch(65536 * 3 if big else 5) for _ in range(2)]))
        worker.send_raw(batch_frame([next_launch(1)]))
    got = replies(worker, job)
    assert sorted(r.job_id for r in got) == list(range(1, job + 1))  # once each
    for r in got:
        assert r.result == ("ok", expected[r.job_id]), r.job_id
    for device in (0, 1):
        assert [r.job_id for r in got if r.job_id % 2 == device] == order[device]


@pytest.mark.parametrize("frame", [
    struct.pack(">BI", W.batch, 0xFFFFFFFF),                        # count, nothing after
    struct.pack(">BII", W.batch, 0xFFFFFFFF, 0xFFFFFFFF) + b"J",    # a launch of 4 GiB - 1
    struct.pack(">BI", W.batch, 0) + b"trailing",                    # count 0, then bytes
    struct.pack(">BII", W.batch, 1, 0),                              # an empty launch
    batch_frame([batch_frame([b"\x00" * 9])]),                       # a batch in a batch
    batch_frame([b"\x83\x6a"]),                                      # a term that is no call
])
def test_a_hostile_batch_header_costs_nothing(worker: WorkerPipe, frame: bytes) -> None:
    tracemalloc.start()
    try:
        messages, problems = protocol.decode_all(frame)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert problems  # each of these frames is logged
    assert peak < 1 << 20  # nothing the header claims is allocated
    assert not [m for m in messages if isinstance(m, protocol.Launch)]
    worker.send_raw(frame)
    worker.launch(5, "reduce", [f32([2.5])])
    assert worker.result() == (5, ("ok", 2.5))
    _, _, info = worker.call("info")
    assert info["devices"] == 2


def test_every_readable_job_id_in_a_batch_is_answered_once(worker: WorkerPipe) -> None:
    head = struct.pack(">BQ", W.launch, 12)  # a launch cut after its JobId
    frames = [launch_frame(11, "reduce", [f32([1])]),
              head,
              launch_frame(13, "no_such_kernel", [f32([1])]),
              launch_frame(14, "reduce", [f32([1])], device=77),
              launch_frame(15, "vector_add", [f32([1]), f32([1, 2])]),
              launch_frame(16, "reduce", [f32([4])], device=1, trace=True)]
    worker.send_raw(batch_frame(frames))
    got = {r.job_id: r for r in replies(worker, 6)}
    assert sorted(got) == [11, 12, 13, 14, 15, 16]
    assert got[11].result == ("ok", 1.0)
    assert got[12].result[1][0] == "bad_args"
    assert got[13].result[1][0] == "unknown_kernel"
    assert got[14].result == ("error", ("bad_device", 77))
    assert got[15].result[1][0] == "bad_args"
    assert got[16].result == ("ok", 4.0) and got[16].stamps is not None
    worker.launch(17, "reduce", [f32([1])])
    assert worker.result() == (17, ("ok", 1.0))
