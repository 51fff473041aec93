"""The worker end to end through real pipes: replies, errors, batching, order, shutdown."""

from __future__ import annotations

import os
import select
import struct
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import erlcuda
from erlcuda import contract, etf
from erlcuda.etf import Atom
from workerpipe import (
    BENCH_WORKER,
    TEST_WORKER,
    Reply,
    Vector,
    W,
    WorkerPipe,
    batch_frame,
    launch_frame,
)


@pytest.fixture
def worker() -> Iterator[WorkerPipe]:
    pipe = WorkerPipe("--backend", "cpu", "--cpu-devices", "2", module=TEST_WORKER)
    yield pipe
    assert pipe.close() == 0


#: The three ways a worker lays out its threads: two devices (a reading thread handing jobs
#: to a thread per device), one device run by the reading thread itself (the default), and
#: one device on a thread of its own (``--device-thread``).
LAYOUTS = {
    "two-devices": ("--cpu-devices", "2"),
    "one-device-inline": ("--cpu-devices", "1"),
    "one-device-thread": ("--cpu-devices", "1", "--device-thread"),
}


@pytest.fixture(params=list(LAYOUTS))
def any_layout(request: pytest.FixtureRequest) -> Iterator[WorkerPipe]:
    """A worker of each layout; its tests use device 0 only."""
    pipe = WorkerPipe("--backend", "cpu", *LAYOUTS[request.param],
                      module=TEST_WORKER)
    yield pipe
    assert pipe.close() == 0


@pytest.fixture
def bench_worker() -> Iterator[WorkerPipe]:
    pipe = WorkerPipe("--backend", "cpu", "--cpu-devices", "2", module=BENCH_WORKER)
    yield pipe
    assert pipe.close() == 0


@pytest.fixture
def plain_worker() -> Iterator[WorkerPipe]:
    pipe = WorkerPipe("--backend", "cpu")
    yield pipe
    assert pipe.close() == 0


def f32(values: list[float]) -> bytes:
    return np.asarray(values, dtype="<f4").tobytes()


def test_hello_describes_the_backend(worker: WorkerPipe) -> None:
    tag, _, info = worker.call("hello")
    assert tag == "r"
    assert info["backend"] == "cpu"
    assert info["devices"] == 2
    assert info["status"] == "ok"
    assert worker.proc.pid == info["os_pid"]
    assert [d["jobs"] for d in info["device_info"]] == [0, 0]
    assert bytes(info["version"]).decode() == erlcuda.__version__
    assert info["protocol"] == contract.PROTOCOL
    assert [bytes(h) for h in info["hooks"]] == [b"fault", b"print", b"stall",
                                                  b"frozen"]


def test_the_bench_worker_names_its_calls(bench_worker: WorkerPipe) -> None:
    tag, _, info = bench_worker.call("info")
    assert tag == "r" and [bytes(h) for h in info["hooks"]] == [b"echo", b"pure",
                                                                 b"transfers"]


def test_the_bench_worker_times_no_copies_on_the_cpu(bench_worker: WorkerPipe) -> None:
    # transfers: the GPU's copies of a fresh mapping; the CPU backend makes none
    tag, _, answer = bench_worker.call("transfers", 0, [1 << 20])
    assert (tag, answer) == ("r", [[], 0])


def test_hello_with_the_same_version_runs_jobs(plain_worker: WorkerPipe) -> None:
    version = erlcuda.__version__.encode()
    tag, _, info = plain_worker.call("hello", version, contract.PROTOCOL)
    assert (tag, info["status"], info["hooks"]) == ("r", "ok", [])
    plain_worker.launch(1, "reduce", [f32([1, 2])])
    assert plain_worker.result() == (1, ("ok", 3.0))


@pytest.mark.parametrize(("version", "protocol"), [(b"0.1.0", None), (None, 1)])
def test_hello_from_another_version_refuses_every_job(
        plain_worker: WorkerPipe, version: bytes | None, protocol: int | None) -> None:
    theirs = version or erlcuda.__version__.encode()
    tag, _, info = plain_worker.call("hello", theirs, protocol or contract.PROTOCOL)
    assert tag == "r"
    status, text = info["status"]
    text = bytes(text).decode()
    assert status == "version_mismatch"
    assert theirs.decode() in text and erlcuda.__version__ in text
    assert f"protocol {protocol or contract.PROTOCOL}" in text
    assert bytes(info["version"]).decode() == erlcuda.__version__
    for job_id, device in ((1, 0), (2, 5)):  # not run, whatever the job
        plain_worker.launch(job_id, "reduce", [f32([1])], device=device)
        assert plain_worker.result() == (job_id, ("error", ("backend_unavailable",
                                                            memoryview(text.encode()))))
    assert plain_worker.call("info")[2]["status"][0] == "version_mismatch"


def test_hello_with_other_arguments_is_refused(plain_worker: WorkerPipe) -> None:
    tag, _, reason = plain_worker.call("hello", "0.2.0")
    assert tag == "e" and b"hello takes" in bytes(reason)
    plain_worker.launch(1, "reduce", [f32([1])])
    assert plain_worker.result() == (1, ("ok", 1.0))


@pytest.mark.parametrize("function", ["fault", "print", "stall", "frozen", "echo", "pure"])
def test_test_and_bench_calls_are_unknown_to_the_shipped_worker(plain_worker: WorkerPipe,
                                                                function: str) -> None:
    tag, _, reason = plain_worker.call(function, 0, 0)
    assert tag == "e"
    assert bytes(reason).decode() == f"unknown call {function}"


def test_the_serving_worker_freezes_its_start_up_heap(any_layout: WorkerPipe) -> None:
    # Start-up's objects out of the collector's walks: each walk of them held up every
    # device's jobs at once (``portenv.settle_heap``).
    tag, _, frozen = any_layout.call("frozen")
    assert tag == "r" and frozen > 1000


def _served_info(devices: int, once_open: Callable[[Any], None],
                 slow_open: bool = False) -> tuple[int, Any]:
    """An in-process worker of ``devices`` cpu devices given one info call and the end of
    its input, its ``serve`` given ``once_open`` (called with the worker); with
    ``slow_open``, its last lane's device opens only once the control thread could have run
    (released from another thread): what ``serve`` returned, and the info reply."""
    from erlcuda.framing import FrameReader, FrameWriter
    from erlcuda.worker import Options, Worker

    requests_r, requests_w = os.pipe()
    replies_r, replies_w = os.pipe()
    try:
        worker = Worker(FrameReader(requests_r), FrameWriter(replies_w),
                        Options(backend="cpu", cpu_devices=devices))
        if slow_open:
            lane, released = worker.lanes[-1], threading.Event()
            opened = lane._open
            lane._open = lambda: (released.wait(), opened())[1]  # type: ignore[method-assign]
            threading.Timer(0.2, released.set).start()
        FrameWriter(requests_w).write(
            etf.encode((Atom("C"), 1, Atom("erlcuda"), Atom("info"), [])))
        os.close(requests_w)
        code = worker.serve(lambda: once_open(worker))
        # The control thread answers calls and is not joined: its answer may come after
        # serve returned. A guard against a hang where no answer comes: not a timing.
        answered, _, _ = select.select([replies_r], [], [], 30)
        return code, etf.decode(FrameReader(replies_r).read()) if answered else None
    finally:
        for fd in (requests_r, replies_r, replies_w):
            try:
                os.close(fd)
            except OSError:
                pass


@pytest.mark.parametrize("devices", [1, 2])
def test_serve_calls_once_open_when_every_device_is_open_before_any_answer(
        devices: int) -> None:
    # One device: the reading thread owns it; more: each lane's thread opens its own.
    seen: list[list[bool]] = []
    code, reply = _served_info(
        devices, lambda worker: seen.append([lane.ready.is_set() for lane in worker.lanes]),
        slow_open=devices > 1)
    assert code == 0
    assert reply is not None and reply[:2] == ("r", 1) and reply[2]["devices"] == devices
    assert seen == [[True] * devices]


@pytest.mark.parametrize("devices", [1, 2])
def test_a_failing_once_open_is_logged_and_calls_are_still_answered(
        devices: int, caplog: pytest.LogCaptureFixture) -> None:
    def fails(_worker: Any) -> None:
        raise RuntimeError("no heap to settle")

    code, reply = _served_info(devices, fails)
    assert code == 0 and reply is not None and reply[:2] == ("r", 1)
    assert "no heap to settle" in caplog.text


def test_an_extension_cannot_replace_a_call_of_the_worker() -> None:
    from erlcuda.framing import FrameReader, FrameWriter
    from erlcuda.worker import Options, Worker

    read_fd, write_fd = os.pipe()
    try:
        with pytest.raises(ValueError, match="the call info is the worker's own"):
            Worker(FrameReader(read_fd), FrameWriter(write_fd), Options(backend="cpu"),
                   extensions={"info": lambda worker, args: None})
    finally:
        os.close(read_fd)
        os.close(write_fd)


def test_echo_answers_what_it_got(bench_worker: WorkerPipe) -> None:
    payload = [Atom("anything"), b"x" * 1000, (1, 2.5)]
    tag, _, got = bench_worker.call("echo", payload)
    assert tag == "r" and got[0] == "anything" and bytes(got[1]) == b"x" * 1000
    assert got[2] == (1, 2.5)


def test_each_kernel_replies_to_its_caller(worker: WorkerPipe) -> None:
    worker.launch(1, "vector_add", [f32([1, 2]), f32([3, 4])])
    worker.launch(2, "reduce", [f32([1, 2, 3.5])])
    worker.launch(3, "dot_product", [f32([1, 2]), f32([3, 4])], device=1)
    worker.launch(4, "matmul", [f32([1, 2, 3, 4]), f32([5, 6, 7, 8]), 2, 2, 2])
    worker.launch(5, "vector_add", [f32([]), f32([])])
    replies = {r.job_id: r for r in (worker.reply() for _ in range(5))}
    results = {job_id: r.result for job_id, r in replies.items()}
    assert results[1] == ("ok", [4.0, 6.0])
    assert results[2] == ("ok", 6.5)
    assert results[3] == ("ok", 11.0)
    assert results[4] == ("ok", [19.0, 22.0, 43.0, 50.0])
    assert results[5] == ("ok", [])
    # Vectors travel as raw little-endian f32, scalars as a little-endian f64.
    assert (replies[1].tag, replies[1].payload) == (W.tag_vector, f32([4, 6]))
    assert (replies[2].tag, replies[2].payload) == (W.tag_scalar, struct.pack("<d", 6.5))
    assert all(r.stamps is None for r in replies.values())


def test_non_finite_values_travel_as_they_are(any_layout: WorkerPipe) -> None:
    # Erlang, not the worker, refuses what its floats cannot hold ({non_finite, _}).
    any_layout.launch(1, "vector_add", [f32([np.inf, np.nan, 1]), f32([1, 1, 1])])
    any_layout.launch(2, "reduce", [f32([3e38, 3e38])])
    vector, scalar = any_layout.reply(), any_layout.reply()
    assert vector.tag == W.tag_vector
    got = np.frombuffer(vector.payload, "<f4")
    assert got[0] == np.inf and np.isnan(got[1]) and got[2] == 2.0
    assert scalar.tag == W.tag_scalar and struct.unpack("<d", scalar.payload)[0] == np.inf


def test_a_traced_job_carries_the_workers_stamps(worker: WorkerPipe) -> None:
    worker.launch(1, "reduce", [f32([1, 2])], trace=True)
    worker.launch(2, "reduce", [f32([1])], device=9, trace=True)  # answered at once
    worker.launch(3, "reduce", [f32([4])])
    replies = {r.job_id: r for r in (worker.reply() for _ in range(3))}
    assert replies[1].result == ("ok", 3.0) and replies[1].tag == W.tag_scalar
    # nanoseconds per stage, each on the worker's own clock
    stamps = replies[1].stamps or {}
    assert set(stamps) == {b"decode", b"queue", b"group", b"backend", b"encode"}
    assert all(isinstance(ns, int) and ns >= 0 for ns in stamps.values())
    assert replies[2].result == ("error", ("bad_device", 9))
    assert set(replies[2].stamps or {}) == {b"decode"}
    assert replies[3].stamps is None and replies[3].result == ("ok", 4.0)


@pytest.mark.parametrize(
    ("kernel", "args", "device", "reason"),
    [
        ("vector_add", [f32([1]), f32([1, 2])], 0, "bad_args"),
        ("reduce", [b"\x00\x00\x00"], 0, "bad_args"),
        ("matmul", [f32([1]), f32([1]), 1, 1, 2], 0, "bad_args"),
        ("matmul", [f32([1]), f32([1]), 1, 1, 2**64 - 1], 0, "bad_args"),
        ("reduce", [f32([1]), f32([1])], 0, "bad_args"),
        ("reduce", [1], 0, "bad_args"),
        ("fft", [f32([1])], 0, "unknown_kernel"),
        ("reduce", [f32([1])], 2, "bad_device"),
        ("reduce", [f32([1])], 65535, "bad_device"),
    ],
)
def test_bad_jobs_get_an_error_and_the_next_job_works(
        worker: WorkerPipe, kernel: str, args: list, device: int, reason: str) -> None:
    worker.launch(1, kernel, args, device=device)
    job_id, (status, (got, detail)) = worker.result()
    assert (job_id, status, got) == (1, "error", reason)
    if reason == "bad_args":
        assert isinstance(detail, memoryview) and len(detail) > 0
    if reason == "bad_device":
        assert detail == device
    worker.launch(2, "reduce", [f32([2, 3])])
    assert worker.result() == (2, ("ok", 5.0))


def test_an_unknown_kernel_is_named_as_erlang_can_read_it(worker: WorkerPipe) -> None:
    # A name the contract has as an atom travels as that atom; any other as a binary.
    worker.launch(1, "fft", [f32([1])])
    worker.launch(2, "ok", [f32([1])])
    worker.launch(3, "ядро", [f32([1])])
    results = dict(worker.result() for _ in range(3))
    assert results[1] == ("error", ("unknown_kernel", memoryview(b"fft")))
    assert results[2] == ("error", ("unknown_kernel", Atom("ok")))
    assert isinstance(results[2][1][1], Atom)
    assert results[3] == ("error", ("unknown_kernel", memoryview("ядро".encode())))


def _head(job_id: int, device: int = 0, flags: int = 0, kernel: bytes = b"reduce") -> bytes:
    return struct.pack(">BQHBB", W.launch, job_id, device, flags, len(kernel)) + kernel


GOOD = launch_frame(5, "reduce", [f32([1, 2])])
MALFORMED = {
    "header only": _head(5),
    "kernel name cut": _head(5)[:-2],
    "short header": _head(5)[:12],
    "just a job id": _head(5)[:9],
    "no args byte": _head(5, kernel=b""),
    "trailing byte": GOOD + b"\0",
    "missing arg": _head(5) + b"\x02" + GOOD[len(_head(5)) + 1 :],
    "cut vector header": GOOD[: len(_head(5)) + 6],
    "cut vector": GOOD[:-1],
    "bytes past the frame": _head(5) + b"\x01" + struct.pack(">BBQ", W.arg_vector, 0, 2**64 - 1),
    "element type": launch_frame(5, "reduce",
                                 [Vector(f32([1]), etype=len(contract.ELEMENT_TYPES))]),
    "unknown kind": _head(5) + b"\x01" + struct.pack(">BQ", 0x77, 4),
    "cut dim": launch_frame(5, "matmul", [f32([1]), f32([1]), 1, 1, 1])[:-3],
    "not utf-8": _head(5, kernel=b"\xff\xfe") + b"\x00",
    "bad device too": _head(5, device=77) + b"\x01",
}


@pytest.mark.parametrize("frame", MALFORMED.values(), ids=MALFORMED.keys())
def test_a_malformed_launch_is_bad_args_for_its_job(worker: WorkerPipe, frame: bytes) -> None:
    worker.send_raw(frame)
    job_id, (status, (reason, detail)) = worker.result()
    assert (job_id, status, reason) == (5, "error", "bad_args")
    assert len(bytes(detail)) > 0
    worker.launch(6, "reduce", [f32([2, 3])])
    assert worker.result() == (6, ("ok", 5.0))
    assert any("malformed launch" in text for _, text in worker.logs)


def test_a_malformed_traced_launch_keeps_its_trace(worker: WorkerPipe) -> None:
    worker.send_raw(_head(8, flags=W.flag_trace | 0x80) + b"\x01")
    reply = worker.reply()
    assert reply.job_id == 8 and reply.result[1][0] == "bad_args" and reply.stamps


@pytest.mark.parametrize("frame", [bytes((W.launch,)), _head(5)[:8], b"", b"Z" * 20])
def test_a_frame_without_a_job_id_is_dropped_and_logged(worker: WorkerPipe,
                                                        frame: bytes) -> None:
    worker.send_raw(frame)
    worker.launch(7, "reduce", [f32([1])])
    assert worker.result() == (7, ("ok", 1.0))
    assert any("dropped" in text for _, text in worker.logs)


def test_a_batch_frame_runs_each_launch_in_order(any_layout: WorkerPipe) -> None:
    any_layout.send_raw(batch_frame([launch_frame(1, "reduce", [f32([1, 2])]),
                                 launch_frame(2, "vector_add", [f32([1]), f32([2])]),
                                 _head(3) + b"\x01",  # malformed: bad_args for job 3
                                 b"Z" * 4,  # no launch: dropped and logged
                                 launch_frame(4, "reduce", [f32([5])], device=9)]))
    got = [any_layout.result() for _ in range(4)]
    # device 0's jobs in the order launched; a bad device is answered at once
    assert [job_id for job_id, _ in got if job_id != 4] == [1, 2, 3]
    results = dict(got)
    assert results[1] == ("ok", 3.0)
    assert np.array_equal(results[2][1], np.frombuffer(f32([3]), "<f4"))
    assert results[3][1][0] == "bad_args"
    assert results[4] == ("error", ("bad_device", 9))
    assert any("launch 4 of 5 dropped" in text for _, text in any_layout.logs)


@pytest.mark.parametrize("cut", [1, 7, 12])
def test_a_batch_frame_cut_short_keeps_the_launches_before_the_cut(any_layout: WorkerPipe,
                                                                   cut: int) -> None:
    whole = batch_frame([launch_frame(1, "reduce", [f32([1])]),
                         launch_frame(2, "reduce", [f32([2])])])
    any_layout.send_raw(whole[:-cut])
    assert any_layout.result() == (1, ("ok", 1.0))
    any_layout.launch(3, "reduce", [f32([3])])
    assert any_layout.result() == (3, ("ok", 3.0))
    assert any("batch frame" in text for _, text in any_layout.logs)


def test_a_launch_as_a_term_is_no_longer_understood(any_layout: WorkerPipe) -> None:
    # Protocol 2's launch: the worker logs it and drops it, and answers the next job.
    any_layout.send((Atom("M"), (Atom("launch"), 1, Atom("caller"), 0, Atom("reduce"),
                             [f32([1])], {})))
    any_layout.launch(2, "reduce", [f32([1])])
    assert any_layout.result() == (2, ("ok", 1.0))
    assert any("not an erlcuda message" in text for _, text in any_layout.logs)


def test_an_undecodable_frame_is_dropped_and_logged(any_layout: WorkerPipe) -> None:
    any_layout.writer.write([b"\x83\xff\x00"])
    any_layout.launch(7, "reduce", [f32([1])])
    assert any_layout.result() == (7, ("ok", 1.0))
    assert any("undecodable" in text for _, text in any_layout.logs)


def test_queued_jobs_batch_and_keep_their_order(any_layout: WorkerPipe, tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    # Device 0's lane sleeps while the jobs queue up (from when the stall has begun: it
    # makes its marker); the call's answer comes among them.
    marker = tmp_path / "stalled"
    any_layout.send((Atom("C"), 99, Atom("erlcuda"), Atom("stall"),
                     [0, 300, str(marker).encode()]))
    deadline = time.monotonic() + 30
    while not marker.exists() and time.monotonic() < deadline:
        time.sleep(0.001)
    assert marker.exists()
    jobs = {}
    kernels = ["vector_add", "reduce", "dot_product", "matmul"]
    for job_id in range(1, 201):
        kernel = kernels[job_id % 4]
        if kernel == "matmul":
            a, b = rng.standard_normal(6, dtype=np.float32), rng.standard_normal(6, np.float32)
            any_layout.launch(job_id, kernel, [a.tobytes(), b.tobytes(), 2, 2, 3])
            ref = (a.reshape(2, 3).astype(np.float64) @ b.reshape(3, 2)).ravel()
        else:
            a, b = rng.standard_normal((2, job_id), dtype=np.float32)
            args = [a.tobytes()] if kernel == "reduce" else [a.tobytes(), b.tobytes()]
            any_layout.launch(job_id, kernel, args)
            ref = {"vector_add": a + b, "reduce": a.astype(np.float64).sum(),
                   "dot_product": np.dot(a.astype(np.float64), b)}[kernel]
        jobs[job_id] = ref
    order = []
    call_answer = None
    while len(order) < len(jobs):
        got = any_layout.receive()
        if not isinstance(got, Reply):
            call_answer = got
            continue
        status, value = got.result
        assert status == "ok"
        np.testing.assert_allclose(np.asarray(value, dtype=np.float64), jobs[got.job_id],
                                   rtol=1e-5, atol=1e-5)
        order.append(got.job_id)
    assert order == sorted(jobs)  # one caller, one device: replies in launch order
    assert call_answer is not None or any_layout.receive()[0] == "r"
    assert call_answer is None or call_answer[0] == "r"
    assert any_layout.results_frames < 200  # a batch's records share one results frame
    _, _, info = any_layout.call("info")
    lane = info["device_info"][0]
    assert lane["jobs"] == 200
    assert lane["launches"] < 200  # batches formed while the lane was stalled
    assert lane["max_batch"] > 1


def test_batching_off_runs_one_job_per_launch() -> None:
    pipe = WorkerPipe("--backend", "cpu", "--max-batch", "1", module=TEST_WORKER)
    try:
        pipe.send((Atom("C"), 99, Atom("erlcuda"), Atom("stall"), [0, 200]))
        for job_id in range(20):
            pipe.launch(job_id, "reduce", [f32([job_id])])
        replies, answered = [], False
        while len(replies) < 20 or not answered:
            got = pipe.receive()
            if isinstance(got, Reply):
                replies.append(got.job_id)
            else:
                answered = got[:2] == ("r", 99)
        assert replies == list(range(20))
        assert pipe.results_frames == 20  # one job a batch, one frame a batch
        _, _, info = pipe.call("info")
        assert info["batching"] is False
        assert info["device_info"][0]["launches"] == 20
        assert info["device_info"][0]["max_batch"] == 1
    finally:
        assert pipe.close() == 0


def test_pure_times_the_backend_call(bench_worker: WorkerPipe) -> None:
    tag, _, times = bench_worker.call("pure", 1, Atom("vector_add"),
                                      [f32([1] * 100), f32([2] * 100)], 5)
    assert tag == "r"
    assert len(times) == 5 and all(isinstance(t, int) and t > 0 for t in times)


def test_unknown_call_is_an_erlport_error(worker: WorkerPipe) -> None:
    tag, _, reason = worker.call("no_such_call")
    assert tag == "e"
    assert b"unknown call" in bytes(reason)


def test_native_output_becomes_log_frames(worker: WorkerPipe) -> None:
    # Bytes written straight to fds 1 and 2, as native libraries do, must not reach the
    # protocol stream: they arrive as log frames (stdout as info, stderr as warning).
    assert worker.call("print", "hello from fd 1", "hello from fd 2")[0] == "r"
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        if {("info", "erlcuda.output: hello from fd 1"),
                ("warning", "erlcuda.output: hello from fd 2")} <= set(worker.logs):
            return
        worker.call("info")
        time.sleep(0.05)
    raise AssertionError(f"log lines missing: {worker.logs}")


def test_a_lone_job_is_answered_as_a_batched_one() -> None:
    # A frame that arrives alone takes the lone path (no batch, one-record frame); the same
    # launches in one batch frame take the general path. The records must be the same.
    jobs = [("vector_add", [f32([1, 2]), f32([3, 4])]),
            ("vector_add", [f32(range(100)), f32(range(100))]),  # sent from its own memory
            ("reduce", [f32([1, 2, 3.5])]),
            ("reduce", [f32([])]),
            ("dot_product", [f32([1, 2]), f32([3, 4])]),
            ("matmul", [f32([1, 2, 3, 4]), f32([5, 6, 7, 8]), 2, 2, 2]),
            ("vector_add", [f32([1]), f32([1, 2])]),  # bad_args, from the general path
            ("reduce", [f32([3e38, 3e38])]),
            ("nothing", [f32([1])])]
    pipe = WorkerPipe("--backend", "cpu", "--cpu-devices", "1", record=True)
    try:
        lone = []
        for job_id, (kernel, args) in enumerate(jobs, 1):
            pipe.send_raw(launch_frame(job_id, kernel, args))
            lone.append(pipe.reply())  # one at a time: each frame is alone in the pipe
        assert pipe.results_frames == len(jobs)
        pipe.send_raw(batch_frame([launch_frame(job_id, kernel, args)
                                   for job_id, (kernel, args) in enumerate(jobs, 1)]))
        batched = [pipe.reply() for _ in jobs]
        assert pipe.results_frames == len(jobs) + 1
        _, _, info = pipe.call("info")
    finally:
        assert pipe.close() == 0
    assert [(r.job_id, r.tag, r.payload) for r in lone] == [
        (r.job_id, r.tag, r.payload) for r in batched]
    assert lone[0].result == ("ok", [4.0, 6.0]) and lone[5].result[1][:2] == [19.0, 22.0]
    assert lone[6].result[1][0] == "bad_args" and lone[8].result[1][0] == "unknown_kernel"
    lane = info["device_info"][0]
    assert lane["jobs"] == 2 * len(jobs) and lane["errors"] == 4


def test_launches_with_flag_floats_are_answered_with_the_etf_of_their_floats() -> None:
    # Erlang asks for floats for a caller of {format, list}: a vector result is the ETF of
    # the list of its values, alone, by the template, in a table and on the general path
    # alike; a scalar, and a launch without the flag, are answered as ever.
    a, b = f32(list(range(20))), f32([0.5] * 20)
    want = [x + 0.5 for x in range(20)]
    pipe = WorkerPipe("--backend", "cpu", "--cpu-devices", "1")
    try:
        pipe.send_raw(launch_frame(1, "vector_add", [a, b], floats=True))
        alone = [pipe.reply()]
        pipe.send_raw(launch_frame(2, "vector_add", [a, b], floats=True))  # its template
        alone.append(pipe.reply())
        pipe.send_raw(batch_frame([launch_frame(j, "vector_add", [a, b], floats=True)
                                   for j in range(3, 13)]))
        table = [pipe.reply() for _ in range(10)]
        pipe.send_raw(batch_frame([launch_frame(13, "vector_add", [a, b], floats=True),
                                   launch_frame(14, "reduce", [a], floats=True),
                                   launch_frame(15, "vector_add", [a, b])]))
        mixed = [pipe.reply() for _ in range(3)]
        # one table of both kinds of callers, each answered in its own kind
        pipe.send_raw(batch_frame([launch_frame(j, "vector_add", [a, b], floats=j % 2 == 0)
                                   for j in range(16, 26)]))
        both = [pipe.reply() for _ in range(10)]
        alternating = []
        for j in range(26, 30):  # alone, by one template
            pipe.send_raw(launch_frame(j, "vector_add", [a, b], floats=j % 2 == 0))
            alternating.append(pipe.reply())
        _, _, info = pipe.call("info")
    finally:
        assert pipe.close() == 0
    assert info["device_info"][0]["table_jobs"] == 20
    for reply in [*both, *alternating]:
        assert reply.tag == (W.tag_floats if reply.job_id % 2 == 0 else W.tag_vector)
        assert reply.result == ("ok", want)
    assert [r.job_id for r in [*both, *alternating]] == list(range(16, 30))
    for reply in [*alone, *table, mixed[0]]:
        assert reply.tag == W.tag_floats and reply.result == ("ok", want)
        assert reply.payload == etf.encode_bytes(want)
    assert [r.job_id for r in [*alone, *table, *mixed]] == list(range(1, 16))
    assert mixed[1].tag == W.tag_scalar and mixed[1].result == ("ok", sum(range(20)))
    assert mixed[2].tag == W.tag_vector and mixed[2].result == ("ok", want)


def test_repeated_lone_jobs_each_get_their_own_result() -> None:
    # The second and later frames of one shape are read through the first one's template:
    # each must still be computed from its own data and answered to its own JobId.
    rng = np.random.default_rng(11)
    pipe = WorkerPipe("--backend", "cpu", "--cpu-devices", "1")
    try:
        for job_id in range(1, 30):
            a, b = rng.standard_normal((2, 7)).astype(np.float32)
            kernel = ("vector_add", "reduce", "dot_product")[job_id % 3]
            args = [a.tobytes()] if kernel == "reduce" else [a.tobytes(), b.tobytes()]
            pipe.send_raw(launch_frame(job_id, kernel, args))
            reply = pipe.reply()
            assert reply.job_id == job_id
            if kernel == "vector_add":
                assert reply.payload == (a + b).tobytes()
            else:
                want = float(np.float32(np.sum(a.astype(np.float64)
                                               * (b if kernel == "dot_product" else 1))))
                assert reply.result == ("ok", pytest.approx(want, rel=1e-6))
    finally:
        assert pipe.close() == 0


def test_frames_queued_in_a_full_pipe_still_batch() -> None:
    # 4096-byte frames written faster than the worker runs them: every 64 KiB read ends on
    # a frame boundary with more in the pipe, which must join the batch (batches were cut at
    # 16 frames, one read's worth).
    pipe = WorkerPipe("--backend", "cpu", "--cpu-devices", "1")
    ones = np.ones(506, np.float32).tobytes()
    frames = [[launch_frame(j, "vector_add", [ones, ones])] for j in range(1, 2001)]
    assert len(frames[0][0]) + 4 == 4096
    try:
        writer = threading.Thread(target=pipe.writer.write_many, args=(frames,))
        writer.start()
        time.sleep(0.5)  # the pipe fills; the worker's replies wait in its own pipe
        got = 0
        while got < len(frames):
            got += isinstance(pipe.receive(), Reply)
        writer.join()
        _, _, info = pipe.call("info")
    finally:
        assert pipe.close() == 0
    lane = info["device_info"][0]
    assert lane["jobs"] == 2000 and lane["max_batch"] > 16
