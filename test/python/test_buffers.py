"""Buffers, other element types and user code through a real worker's pipes, and a lane's
general path with a device that runs user kernels in numpy."""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
import pytest

from erlcuda.backends.base import Backend, BackendError, Device
from erlcuda.backends.cpu import CpuDevice
from erlcuda.etf import Atom
from erlcuda.general import Registry, UserKernel
from erlcuda.lanes import Job, Lane
from erlcuda.protocol import Launch, decode
from test_lanes import CapturingWriter
from workerpipe import (
    ETYPE,
    TEST_WORKER,
    Buffer,
    Number,
    Reply,
    W,
    WorkerPipe,
    Zeroed,
    batch_frame,
    launch_frame,
    typed,
)

LAYOUTS = {
    "two-devices": ("--cpu-devices", "2"),
    "one-device-inline": ("--cpu-devices", "1"),
    "one-device-thread": ("--cpu-devices", "1", "--device-thread"),
}


@pytest.fixture(params=list(LAYOUTS))
def worker(request: pytest.FixtureRequest, tmp_path: Any,
           monkeypatch: pytest.MonkeyPatch) -> Iterator[WorkerPipe]:
    monkeypatch.setenv("ERLCUDA_CACHE_DIR", str(tmp_path / "cache"))  # compiled user code
    pipe = WorkerPipe("--backend", "cpu", *LAYOUTS[request.param], module=TEST_WORKER)
    yield pipe
    assert pipe.close() == 0


def f32(values: Any) -> bytes:
    return np.asarray(values, dtype="<f4").tobytes()


def until(holds: Callable[[], bool], seconds: float = 30.0) -> bool:
    """Whether ``holds()`` came true within ``seconds``, asked every 10 ms: long enough
    for a loaded machine, and over as soon as it holds."""
    deadline = time.monotonic() + seconds
    while not holds():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def lane_info(pipe: WorkerPipe, device: int = 0) -> dict[str, Any]:
    tag, _, info = pipe.call("info")
    assert tag == "r"
    return dict(info["device_info"][device])


def bad_args(result: tuple[str, Any]) -> str:
    status, (reason, text) = result
    assert (status, reason) == ("error", "bad_args"), result
    return bytes(text).decode()


# -- buffers ---------------------------------------------------------------------------------


def test_upload_add_in_place_on_the_device_then_download(worker: WorkerPipe) -> None:
    a, b = np.arange(5, dtype=np.float32), np.full(5, 0.5, np.float32)
    worker.launch(1, "copy", [a], keep=[101])
    worker.launch(2, "copy", [b], keep=[102])
    worker.launch(3, "vector_add", [Buffer(101), Buffer(102)], keep=[103])
    worker.launch(4, "copy", [Buffer(103)])
    worker.launch(5, "dot_product", [Buffer(101), Buffer(103)])
    got = [worker.reply() for _ in range(5)]
    assert [r.job_id for r in got] == [1, 2, 3, 4, 5]
    assert [r.tag for r in got] == [W.tag_handle] * 3 + [W.tag_vector, W.tag_scalar]
    assert [r.result for r in got[:3]] == [("ok", ("buffer", i, "f32", 5))
                                           for i in (101, 102, 103)]
    assert got[3].payload == (a + b).tobytes()
    assert got[4].result == ("ok", float(np.dot(a.astype(np.float64), a + b)))
    info = lane_info(worker)
    assert (info["buffers"], info["buffer_bytes"], info["buffer_peak"], info["buffer_limit"]) \
        == (3, 60, 60, 0)
    assert worker.call("free", 0, [101, 103, 999]) == ("r", worker._next_call - 1, "ok")
    info = lane_info(worker)
    assert (info["buffers"], info["buffer_bytes"], info["buffer_peak"]) == (1, 20, 60)
    worker.launch(6, "copy", [Buffer(101)])
    worker.launch(7, "copy", [Buffer(102)])
    assert worker.result() == (6, ("error", ("buffer_lost", 101)))
    assert worker.result() == (7, ("ok", [0.5] * 5))


def test_a_buffer_copied_on_the_device_is_a_buffer_of_its_own(worker: WorkerPipe) -> None:
    worker.launch(1, "copy", [typed([1, 2, 3], "i64")], keep=[1])
    worker.launch(2, "copy", [Buffer(1)], keep=[2])
    assert worker.result() == (1, ("ok", ("buffer", 1, "i64", 3)))
    assert worker.result() == (2, ("ok", ("buffer", 2, "i64", 3)))
    worker.call("free", 0, [1])
    worker.launch(3, "copy", [Buffer(2)])
    reply = worker.reply()
    assert reply.tag == W.tag_typed and reply.result == ("ok", [1, 2, 3])
    assert lane_info(worker)["buffer_bytes"] == 24


@pytest.mark.parametrize("etype", ["f64", "i32", "u32", "i64", "u8"])
def test_every_element_type_goes_up_and_comes_back(worker: WorkerPipe, etype: str) -> None:
    dtype = np.dtype({"f64": "<f8", "i32": "<i4", "u32": "<u4", "i64": "<i8",
                      "u8": "u1"}[etype])
    info = np.finfo(dtype) if dtype.kind == "f" else np.iinfo(dtype)
    values = np.array([info.min, info.max, 0, 1, 3], dtype)
    worker.launch(1, "copy", [typed(values, etype)])  # a round trip, no buffer
    worker.launch(2, "copy", [typed(values, etype)], keep=[7])
    worker.launch(3, "copy", [Buffer(7)])
    worker.launch(4, "zeros", [Zeroed(3, ETYPE[etype])])
    worker.launch(5, "empty", [Zeroed(2, ETYPE[etype])], keep=[8])
    one, two, three, four, five = (worker.reply() for _ in range(5))
    assert one.tag == three.tag == four.tag == W.tag_typed
    assert one.payload == three.payload == bytes((ETYPE[etype],)) + values.tobytes()
    assert one.result == ("ok", values.tolist())
    assert two.result == ("ok", ("buffer", 7, etype, 5))
    assert four.result == ("ok", [0, 0, 0])
    assert five.result == ("ok", ("buffer", 8, etype, 2))
    assert lane_info(worker)["buffer_bytes"] == 7 * dtype.itemsize


def test_f64_builtins_keep_their_precision(worker: WorkerPipe) -> None:
    # f32 would round each to 1; in f64 every partial sum is exact, in any order
    fine = [1 + 2**-40] * 4
    worker.launch(1, "reduce", [typed(fine, "f64")])
    worker.launch(2, "vector_add", [typed([1e-300, 0.1], "f64"), typed([1e-300, 0.2], "f64")])
    worker.launch(3, "dot_product", [typed([1e200, 3], "f64"), typed([1e-200, 4], "f64")])
    worker.launch(4, "matmul", [typed([1, 2, 3, 4], "f64"), typed([0.5, 0.25], "f64"), 2, 1, 2])
    worker.launch(5, "reduce", [typed([], "f64")])
    worker.launch(6, "copy", [typed(fine, "f64")], keep=[1])
    worker.launch(7, "reduce", [Buffer(1)])
    got = {r.job_id: r for r in (worker.reply() for _ in range(7))}
    assert got[1].result == ("ok", 4 + 2**-38) and got[1].tag == W.tag_scalar
    assert got[2].tag == W.tag_typed and got[2].result == ("ok", [2e-300, 0.1 + 0.2])
    assert got[3].result == ("ok", 13.0)
    assert got[4].result == ("ok", [1.0, 2.5])
    assert got[5].result == ("ok", 0.0)
    assert got[7].result == ("ok", 4 + 2**-38)


@pytest.mark.parametrize(("kernel", "args", "keep", "match"), [
    ("vector_add", [typed([1], "i32"), typed([1], "i32")], None, "takes f32 or f64, not i32"),
    ("vector_add", [typed([1], "f64"), f32([1])], None, "B is f32 but A is f64"),
    ("vector_add", [f32([1]), f32([1])], [1, 2], "makes 1 vector result but 2"),
    ("reduce", [typed([1, 2], "f64"), typed([1, 2], "f64")], None, "takes 1 argument,"),
    ("copy", [3], None, "A: expected a vector"),
    ("zeros", [Zeroed(2**31)], None, "over the 2147483647 limit"),
])
def test_a_general_launch_that_breaks_a_rule_is_bad_args(
        worker: WorkerPipe, kernel: str, args: list[Any], keep: list[int] | None,
        match: str) -> None:
    worker.launch(1, kernel, args, keep=keep)
    assert match in bad_args(worker.result()[1])
    worker.launch(2, "reduce", [f32([1, 2])])
    assert worker.result() == (2, ("ok", 3.0))


def test_a_malformed_general_frame_is_bad_args_for_its_job(worker: WorkerPipe) -> None:
    frames = [launch_frame(1, "copy", [f32([1])], keep=[5])[:-3],
              launch_frame(2, "copy", [Number(1.0, raw=bytes(4) + b"\x01" + bytes(3))]),
              launch_frame(3, "copy", [f32([1])], keep=[5, 5])]
    for frame in frames:
        worker.send_raw(frame)
    for job_id in (1, 2, 3):
        got_id, result = worker.result()
        assert got_id == job_id and bad_args(result)
    assert lane_info(worker)["buffers"] == 0


def test_a_kept_id_in_use_is_refused_and_the_buffer_stays(worker: WorkerPipe) -> None:
    worker.launch(1, "copy", [f32([1, 2])], keep=[4])
    worker.launch(2, "copy", [f32([3])], keep=[4])
    worker.launch(3, "copy", [Buffer(4)])
    assert worker.result()[1][0] == "ok"
    assert "buffer id 4 is in use" in bad_args(worker.result()[1])
    assert worker.result() == (3, ("ok", [1.0, 2.0]))


def free(pipe: WorkerPipe, *ids: int) -> None:
    """Free ``ids`` on device 0 as Erlang does: a call of Id 0, never answered."""
    pipe.send((Atom("C"), 0, Atom("erlcuda"), Atom("free"), [0, list(ids)]))


def test_a_chain_of_kernels_on_buffers_one_job_at_a_time(worker: WorkerPipe) -> None:
    # Each frame comes alone, as from one caller that waits for every reply: one device run
    # by the reading thread takes the lone path, and learns the chain's frame (lone.py).
    a, b = np.arange(5, dtype=np.float32), np.full(5, 2, np.float32)
    worker.launch(1, "copy", [a], keep=[1])
    assert worker.result() == (1, ("ok", ("buffer", 1, "f32", 5)))
    worker.launch(2, "copy", [b], keep=[2])
    assert worker.result() == (2, ("ok", ("buffer", 2, "f32", 5)))
    x = 1
    for step in range(10):
        worker.launch(10 + step, "vector_add", [Buffer(x), Buffer(2)], keep=[100 + step])
        assert worker.result() == (10 + step, ("ok", ("buffer", 100 + step, "f32", 5)))
        if x != 1:
            free(worker, x)
        x = 100 + step
    worker.launch(30, "copy", [Buffer(x)])
    assert worker.result() == (30, ("ok", (a + 10 * b).tolist()))
    # The frame of a step with other buffers: their lengths and types decide, as ever.
    worker.launch(31, "copy", [f32(range(6))], keep=[3])
    worker.launch(32, "copy", [typed([1, 2, 3, 4, 5], "f64")], keep=[4])
    assert [worker.result()[0] for _ in range(2)] == [31, 32]
    worker.launch(33, "vector_add", [Buffer(3), Buffer(2)], keep=[200])
    assert "length mismatch" in bad_args(worker.result()[1])
    worker.launch(34, "vector_add", [Buffer(4), Buffer(4)], keep=[201])
    assert worker.result() == (34, ("ok", ("buffer", 201, "f64", 5)))
    worker.launch(35, "vector_add", [Buffer(108), Buffer(2)], keep=[202])  # freed
    assert worker.result() == (35, ("error", ("buffer_lost", 108)))
    worker.launch(36, "vector_add", [Buffer(x), Buffer(2)], keep=[x])  # an id in use
    assert f"buffer id {x} is in use" in bad_args(worker.result()[1])
    worker.launch(37, "reduce", [Buffer(201)])
    assert worker.result() == (37, ("ok", 30.0))
    free(worker, 1, 2, 3, 4, 201, x)
    # with a device thread, the frees run on it in their turn
    assert until(lambda: lane_info(worker)["buffers"] == 0)


def test_a_call_of_id_0_is_run_and_never_answered(worker: WorkerPipe) -> None:
    worker.launch(1, "zeros", [Zeroed(4)], keep=[7])
    assert worker.result() == (1, ("ok", ("buffer", 7, "f32", 4)))
    worker.send((Atom("C"), 0, Atom("erlcuda"), Atom("free"), [0, [-1]]))
    worker.send((Atom("C"), 0, Atom("erlcuda"), Atom("no_such_call"), []))
    free(worker, 7)
    # the answer comes first (``call`` checks)
    assert until(lambda: lane_info(worker)["buffers"] == 0)
    logged = " ".join(text for _, text in worker.logs)
    assert "free takes" in logged and "unknown call no_such_call" in logged


def test_buffers_belong_to_their_device() -> None:
    pipe = WorkerPipe("--backend", "cpu", "--cpu-devices", "2")
    try:
        pipe.launch(1, "copy", [f32([1])], keep=[9], device=1)
        assert pipe.result() == (1, ("ok", ("buffer", 9, "f32", 1)))
        pipe.launch(2, "copy", [Buffer(9)], device=0)
        pipe.launch(3, "copy", [Buffer(9)], device=1)
        # (the replies of two devices come in either order: each device keeps its own)
        assert dict(pipe.result() for _ in range(2)) == {2: ("error", ("buffer_lost", 9)),
                                                          3: ("ok", [1.0])}
        assert pipe.call("free", 0, [9])[2] == "ok"  # not device 0's: ignored
        assert [d["buffers"] for d in pipe.call("info")[2]["device_info"]] == [0, 1]
        assert pipe.call("free", 5, [9])[2] == "ok"  # no such device: nothing held there
        tag, _, text = pipe.call("free", 0, [-1])
        assert tag == "e" and b"free takes" in bytes(text)
    finally:
        assert pipe.close() == 0


def test_the_buffer_limit_is_out_of_memory_and_the_worker_serves_on() -> None:
    pipe = WorkerPipe("--backend", "cpu", "--buffer-limit", "100")
    try:
        pipe.launch(1, "copy", [f32(range(20))], keep=[1])  # 80 bytes
        pipe.launch(2, "zeros", [Zeroed(6)], keep=[2])  # 24 more: over
        pipe.launch(3, "vector_add", [Buffer(1), Buffer(1)])  # no buffer kept: fine
        pipe.launch(4, "zeros", [Zeroed(5)], keep=[3])  # 20 more: exactly the limit
        assert pipe.result() == (1, ("ok", ("buffer", 1, "f32", 20)))
        status, (reason, code, text) = pipe.result()[1]
        assert (status, reason, code) == ("error", "cuda", "out_of_memory")
        assert b"buffer limit" in bytes(text)
        assert pipe.result() == (3, ("ok", [2.0 * i for i in range(20)]))
        assert pipe.result() == (4, ("ok", ("buffer", 3, "f32", 5)))
        info = lane_info(pipe)
        assert (info["buffers"], info["buffer_bytes"], info["buffer_peak"],
                info["buffer_limit"]) == (2, 100, 100, 100)
        pipe.call("free", 0, [1, 3])
        pipe.launch(5, "zeros", [Zeroed(6)], keep=[2])
        assert pipe.result() == (5, ("ok", ("buffer", 2, "f32", 6)))
        info = lane_info(pipe)
        assert (info["buffers"], info["buffer_bytes"], info["buffer_peak"]) == (1, 24, 100)
        assert info["errors"] == 1
    finally:
        assert pipe.close() == 0


def test_general_and_batched_jobs_on_one_device_answer_in_launch_order(
        worker: WorkerPipe) -> None:
    # The lane sleeps while everything queues up, then runs it: batched jobs around general
    # ones, the latter one at a time, every reply in the order launched.
    worker.send((Atom("C"), 99, Atom("erlcuda"), Atom("stall"), [0, 300]))
    want: dict[int, Any] = {}
    frames = []
    for job_id in range(1, 61):
        value = float(job_id)
        match job_id % 4:
            case 0:
                frames.append(launch_frame(job_id, "reduce", [f32([value, 1])]))
                want[job_id] = ("ok", value + 1)
            case 1:
                frames.append(launch_frame(job_id, "copy", [f32([value])], keep=[job_id]))
                want[job_id] = ("ok", ("buffer", job_id, "f32", 1))
            case 2:
                frames.append(launch_frame(job_id, "vector_add",
                                           [Buffer(job_id - 1), f32([1])]))
                want[job_id] = ("ok", [value])
            case _:
                frames.append(launch_frame(job_id, "reduce", [typed([value, 0.5], "f64")]))
                want[job_id] = ("ok", value + 0.5)
    for start in range(0, 60, 10):  # batch frames and lone frames, mixed
        worker.send_raw(batch_frame(frames[start : start + 5]))
        for frame in frames[start + 5 : start + 10]:
            worker.send_raw(frame)
    order, answered = [], False
    while len(order) < 60 or not answered:
        got = worker.receive()
        if isinstance(got, Reply):
            assert got.result == want[got.job_id], got
            order.append(got.job_id)
        else:
            answered = got[:2] == ("r", 99)
    assert order == list(range(1, 61))
    info = lane_info(worker)
    assert info["jobs"] == 60 and info["buffers"] == 15 and info["errors"] == 0


def test_a_traced_general_job_carries_its_stamps(worker: WorkerPipe) -> None:
    worker.launch(1, "copy", [typed([1, 2], "u8")], trace=True)
    reply = worker.reply()
    assert reply.result == ("ok", [1, 2]) and reply.tag == W.tag_typed
    assert set(reply.stamps or {}) == {b"decode", b"queue", b"group", b"backend", b"encode"}


# -- user code -------------------------------------------------------------------------------

SOURCE = b'extern "C" __global__ void scale(float *x, float s, long long n) {\n' \
         b'    long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;\n' \
         b'    if (i < n) x[i] *= s;\n}\n'
KERNELS = [(b"scale", [(Atom("inout"), Atom("f32")), (Atom("scalar"), Atom("f32")),
                       (Atom("scalar"), Atom("i64"))])]
HAS_GXX = shutil.which("g++") is not None


def answer(pipe: WorkerPipe, function: str, *args: Any) -> Any:
    tag, _, value = pipe.call(function, *args)
    assert tag == "r", value
    return value


def reason_of(value: Any) -> tuple[str, str]:
    """A refused call's reason and text (a load refused once it compiled also says what the
    compile took: ``compiled``)."""
    status, (reason, text), *_ = value
    assert status == "error"
    return str(reason), bytes(text).decode()


def compiled(value: Any) -> dict[str, Any]:
    """What a load's answer says of its compile: ``{ok, Report}``, ``{error, R, Report}``."""
    report = value[-1]
    assert isinstance(report, dict), value
    return {bytes(k).decode(): v for k, v in report.items()}


@pytest.mark.skipif(not HAS_GXX, reason="g++ is not installed")
def test_a_kernel_the_cpu_backend_cannot_run_is_unavailable(worker: WorkerPipe) -> None:
    barrier = SOURCE.replace(b"    if (i", b"    __syncthreads();\n    if (i")
    reason, text = reason_of(answer(worker, "load", b"m", barrier, [], KERNELS))
    assert reason == "backend_unavailable"
    assert text.startswith("kernel scale uses __syncthreads (barriers, kernel.cu:3)"), text
    assert "cuda backend" in text
    reason, text = reason_of(answer(worker, "elementwise", b"axpy",
                                    [(b"a", Atom("f32"), Atom("scalar")),
                                     (b"x", Atom("f32"), Atom("vector"))],
                                    [(b"z", Atom("f32"))], b"z = atomicAdd(&z, a * x)", []))
    assert reason == "backend_unavailable" and "kernel axpy uses atomicAdd (atomics" in text
    # nothing was registered: its launches are unknown kernels, and info lists no module
    worker.launch(1, "scale", [f32([1]), Number(2.0), Number(1, ETYPE["i64"])])
    assert worker.result() == (1, ("error", ("unknown_kernel", memoryview(b"scale"))))
    assert answer(worker, "info")["modules"] == []
    assert answer(worker, "unload", b"m") == "ok"


def test_without_a_compiler_user_code_on_the_cpu_is_unavailable(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    for var in ("CUDA_HOME", "CUDA_PATH"):
        monkeypatch.delenv(var, raising=False)
    pipe = WorkerPipe("--backend", "cpu")
    try:
        reason, text = reason_of(answer(pipe, "load", b"m", SOURCE, [], KERNELS))
        assert reason == "backend_unavailable" and "need a C++ compiler (g++)" in text, text
        reason, text = reason_of(answer(pipe, "elementwise", b"ew",
                                        [(b"x", Atom("f32"), Atom("vector"))],
                                        [(b"z", Atom("f32"))], b"z = x", []))
        assert reason == "backend_unavailable" and "g++" in text
        assert answer(pipe, "info")["modules"] == []
    finally:
        assert pipe.close() == 0


@pytest.mark.skipif(not HAS_GXX, reason="g++ is not installed")
def test_a_load_says_what_its_compile_took_and_whether_the_cache_held_it(
        worker: WorkerPipe) -> None:
    first = answer(worker, "load", b"m", SOURCE, [], KERNELS)
    second = answer(worker, "load", b"m", SOURCE, [], KERNELS)
    assert first[0] == second[0] == "ok"
    assert compiled(first)["cache_hit"] is False  # a fresh cache folder
    assert compiled(second)["cache_hit"] is True
    assert all(type(compiled(a)["duration_ns"]) is int and compiled(a)["duration_ns"] >= 0
               for a in (first, second))
    bad = answer(worker, "load", b"m", SOURCE.replace(b"*= s;", b"*= nothing;"), [], KERNELS)
    assert reason_of(bad)[0] == "compile" and compiled(bad)["cache_hit"] is False
    # refused before any compile: no report
    assert len(answer(worker, "load", b"m", SOURCE, [b"-o", b"x"], KERNELS)) == 2


@pytest.mark.skipif(not HAS_GXX, reason="g++ is not installed")
def test_source_that_does_not_compile_is_a_compile_error(worker: WorkerPipe) -> None:
    bad = SOURCE.replace(b"*= s;", b"*= undefined_name;")
    reason, log = reason_of(answer(worker, "load", b"m", bad, [], KERNELS))
    assert reason == "compile"
    assert "undefined_name" in log and "error" in log and "kernel.cu:3" in log
    reason, log = reason_of(answer(worker, "elementwise", b"ew",
                                   [(b"x", Atom("f32"), Atom("vector"))],
                                   [(b"z", Atom("f32"))], b"z = x +* ;", []))
    assert reason == "compile" and "operation" in log
    assert answer(worker, "info")["modules"] == []


@pytest.mark.parametrize(("args", "match"), [
    ([b"m", SOURCE, [], []], "non-empty list"),
    ([b"m", SOURCE, [], [(b"reduce", [])]], "belongs to a built-in kernel"),
    ([b"m", SOURCE, [], [(b"k", [(Atom("both"), Atom("f32"))])]], "is not {in"),
    ([b"m", SOURCE, [], [(b"k", [(Atom("in"), Atom("f16"))])]], "not one of"),
    ([b"m", SOURCE, [1], KERNELS], "an option"),
    ([b"m", SOURCE, []], "load takes"),
    ([b"m", b"\xff", [], KERNELS], "not UTF-8"),
])
def test_a_load_that_breaks_a_rule_is_bad_args(worker: WorkerPipe, args: list[Any],
                                               match: str) -> None:
    reason, text = reason_of(answer(worker, "load", *args))
    assert reason == "bad_args" and match in text, text


def test_a_load_with_a_flag_off_the_allow_list_is_bad_option(worker: WorkerPipe) -> None:
    # checked before nvcc is looked for, so alike with and without it
    status, reason = answer(worker, "load", b"m", SOURCE, [b"-o", b"x"], KERNELS)
    assert (status, reason) == (Atom("error"), (Atom("bad_option"), (Atom("options"), b"-o")))


def test_an_elementwise_declaration_that_breaks_a_rule_is_bad_args(worker: WorkerPipe) -> None:
    reason, text = reason_of(answer(worker, "elementwise", b"ew",
                                    [(b"x", Atom("f32"), Atom("vector"))],
                                    [(b"x", Atom("f32"))], b"x = x", []))
    assert reason == "bad_args" and "named twice" in text
    reason, text = reason_of(answer(worker, "elementwise", b"ew",
                                    [(b"x", Atom("f32"), Atom("vector"))],
                                    [(b"z", Atom("f32"))], b"", []))
    assert reason == "bad_args" and "empty" in text


# -- a lane running user kernels -------------------------------------------------------------


class UserDevice(CpuDevice):
    """The CPU device with user kernels written in numpy, and a record of every array it
    made and freed (to see that temporaries never leak)."""

    def __init__(self) -> None:
        super().__init__(0)
        self.functions: dict[str, Callable[..., None]] = {}
        self.loaded: dict[str, bytes] = {}
        self.launches: list[tuple[str, tuple[int, int, int], tuple[int, int, int], int]] = []
        self.live: dict[int, np.ndarray] = {}

    def alloc(self, dtype: np.dtype[Any], count: int, *, zero: bool) -> np.ndarray:
        array = super().alloc(dtype, count, zero=zero)
        self.live[id(array)] = array
        return array

    def free(self, array: np.ndarray) -> None:
        assert self.live.pop(id(array), None) is not None, "freed twice, or not ours"

    def load_module(self, name: str, image: bytes, functions: Sequence[str]) -> None:
        self.loaded[name] = image

    def launch_user(self, module: str, function: str, args: Sequence[Any],
                    grid: tuple[int, int, int], block: tuple[int, int, int],
                    shared: int) -> None:
        self.launches.append((function, grid, block, shared))
        self.functions[function](*args)


class UserBackend(Backend):
    name = "cpu"

    def __init__(self, device: Device) -> None:
        self.device = device

    def device_count(self) -> int:
        return 1

    def open(self, index: int) -> Device:
        return self.device


def saxpy(a: np.float32, x: np.ndarray, y: np.ndarray, flags: np.ndarray,
          n: np.int64) -> None:
    y[:] = a * x + y
    flags[:] = (y > 0).astype(np.int32)[: flags.size] if flags.size <= y.size else 0


def fault(x: np.ndarray, *_: Any) -> None:
    raise BackendError("illegal_address", "an illegal address", fatal=False)


SAXPY = UserKernel("saxpy", "m", (("scalar", "f32"), ("in", "f32"), ("inout", "f32"),
                                  ("out", "i32"), ("scalar", "i64")))
AXPY = UserKernel("axpy", "axpy", (("scalar", "f64"), ("in", "f64"), ("in", "f64"),
                                   ("out", "f64"), ("out", "u8")), "elementwise", 3)


@pytest.fixture
def user_lane() -> tuple[Lane, UserDevice, CapturingWriter, list[str]]:
    device = UserDevice()
    device.functions.update(saxpy=saxpy, faulty=fault,
                            axpy=lambda a, x, y, z, w, n: (z.__setitem__(slice(None), a * x + y),
                                                          w.__setitem__(slice(None),
                                                                        x > y)))
    registry = Registry()
    registry.install("m", [SAXPY, UserKernel("faulty", "m", (("inout", "f32"),))])
    registry.install("axpy", [AXPY])
    writer = CapturingWriter()
    fatal: list[str] = []
    lane = Lane(0, UserBackend(device), writer, max_batch=256, max_elements=1 << 20,  # type: ignore[arg-type]
                on_fatal=fatal.append, registry=registry, buffer_limit=1 << 20)
    return lane, device, writer, fatal


def run(lane: Lane, frames: list[bytes]) -> None:
    device = lane.open_here()
    jobs = []
    for frame in frames:
        launch = decode(frame)
        assert isinstance(launch, Launch) and launch.error is None, launch
        jobs.append(Job(launch.job_id, general=launch))
    lane.run_jobs(jobs, device)


def test_a_raw_kernel_answers_its_written_vectors_in_param_order(user_lane: Any) -> None:
    lane, device, writer, fatal = user_lane
    x, y = np.array([1, -2, 3], np.float32), np.array([1, 1, -10], np.float32)
    run(lane, [
        launch_frame(1, "copy", [x], keep=[50]),
        launch_frame(2, "saxpy", [Number(2.0), Buffer(50), y, 3, Number(3, ETYPE["i64"])]),
        launch_frame(3, "saxpy", [Number(1.0), x, Buffer(50), 2, Number(3, ETYPE["i64"])],
                     keep=[60], geometry=((2, 1, 1), (64, 1, 1), 128)),
        launch_frame(4, "copy", [Buffer(50)]),
        launch_frame(5, "copy", [Buffer(60)]),
    ])
    results = writer.results()
    assert results[2] == ("ok", [[3.0, -3.0, -4.0], [1, 0, 0]])
    assert results[3] == ("ok", [("buffer", 60, "i32", 2)])  # the in-place buffer is no result
    assert results[4] == ("ok", [2.0, -4.0, 6.0])
    assert results[5] == ("ok", [1, 0])
    assert [launch[1:] for launch in device.launches] == [
        ((1, 1, 1), (256, 1, 1), 0), ((2, 1, 1), (64, 1, 1), 128)]
    assert not fatal and lane.store.ids() == [50, 60]
    assert set(device.live) == {id(lane.store.get(50)), id(lane.store.get(60))}


def test_an_elementwise_kernel_makes_its_outputs(user_lane: Any) -> None:
    lane, device, writer, _ = user_lane
    x, y = np.array([1.0, 5.0]), np.array([2.0, 1.0])
    run(lane, [
        launch_frame(1, "axpy", [Number(3.0, ETYPE["f64"]), typed(x, "f64"), typed(y, "f64")]),
        launch_frame(2, "axpy", [Number(3.0, ETYPE["f64"]), typed(x, "f64"), typed(y, "f64")],
                     keep=[1, 2]),
        launch_frame(3, "axpy", [Number(3.0, ETYPE["f64"]), typed(x, "f64"),
                                 typed([1.0], "f64")]),
        launch_frame(4, "axpy", [Number(3.0, ETYPE["f64"]), typed([], "f64"),
                                 typed([], "f64")]),
    ])
    results = writer.results()
    assert results[1] == ("ok", [[5.0, 16.0], [0, 1]])
    assert results[2] == ("ok", [("buffer", 1, "f64", 2), ("buffer", 2, "u8", 2)])
    assert "length mismatch" in bytes(results[3][1][1]).decode()
    assert results[4] == ("ok", [[], []])  # nothing to run over: no launch
    assert len(device.launches) == 2
    assert set(device.live) == {id(lane.store.get(1)), id(lane.store.get(2))}


def test_a_failed_launch_frees_its_temporaries_and_keeps_nothing(user_lane: Any) -> None:
    lane, device, writer, fatal = user_lane
    run(lane, [launch_frame(1, "faulty", [f32([1, 2])], keep=[3]),
               launch_frame(2, "copy", [f32([1])], keep=[4]),
               launch_frame(3, "faulty", [Buffer(4)])])
    results = writer.results()
    assert results[1] == ("error", ("cuda", "illegal_address",
                                    memoryview(b"an illegal address")))
    assert results[3][1][:2] == ("cuda", "illegal_address")
    assert lane.store.ids() == [4] and set(device.live) == {id(lane.store.get(4))}
    assert not fatal and lane.stats.errors == 2


def test_a_lost_device_ends_the_worker_after_the_reply(user_lane: Any) -> None:
    lane, device, writer, fatal = user_lane

    def lost(*_: Any) -> None:
        raise BackendError("illegal_address", "context lost", fatal=True)

    device.functions["faulty"] = lost
    run(lane, [launch_frame(1, "faulty", [f32([1])])])
    assert writer.results()[1][1][:2] == ("cuda", "illegal_address")
    assert fatal and "context lost" in fatal[0]
    assert not device.live


# -- shared memory ---------------------------------------------------------------------------


def test_typed_operands_in_shared_memory_and_an_f32_result_in_a_file(tmp_path: Any) -> None:
    from workerpipe import FileVector, read_slot, result_slot

    folder = tmp_path / "erlcuda-general"
    folder.mkdir()
    pipe = WorkerPipe("--backend", "cpu", "--shm-dir", str(folder))
    try:
        a = np.arange(100_000, dtype="<f8")
        (folder / "i1.0").write_bytes(a.tobytes())
        pipe.launch(1, "copy", [FileVector("i1", a.nbytes, etype=ETYPE["f64"])], keep=[5])
        assert pipe.result() == (1, ("ok", ("buffer", 5, "f64", a.size)))
        pipe.launch(2, "reduce", [Buffer(5)])
        assert pipe.result() == (2, ("ok", float(a.sum())))
        # a typed result goes through the pipe, even where a file is asked for
        pipe.launch(3, "copy", [Buffer(5)], result_file=result_slot(folder, "s3"))
        reply = pipe.reply()
        assert reply.tag == W.tag_typed and reply.payload[1:] == a.tobytes()
        b = np.arange(50_000, dtype="<f4")
        (folder / "i4.0").write_bytes(b.tobytes())
        pipe.launch(4, "copy", [FileVector("i4", b.nbytes)], keep=[6])
        pipe.launch(5, "vector_add", [Buffer(6), Buffer(6)], result_file=result_slot(folder, "s5"))
        assert pipe.result() == (4, ("ok", ("buffer", 6, "f32", b.size)))
        assert pipe.result() == (5, ("file", (b.nbytes, 1 << 20)))
        # as Erlang reads it: the result's bytes from the start of its slot
        np.testing.assert_array_equal(read_slot(folder, "s5", b.nbytes), b + b)
        pipe.launch(6, "copy", [FileVector("missing", 8, etype=ETYPE["f64"])])
        assert "missing" in bad_args(pipe.result()[1])
    finally:
        assert pipe.close() == 0
    plain = WorkerPipe("--backend", "cpu")
    try:
        plain.launch(1, "copy", [FileVector("i1", 8, etype=ETYPE["f64"])])
        assert plain.result() == (1, ("error", ("worker_down", "shm_unavailable")))
    finally:
        assert plain.close() == 0


# -- the cuda backend ------------------------------------------------------------------------


@pytest.fixture
def gpu_worker(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[WorkerPipe]:
    monkeypatch.setenv("ERLCUDA_CACHE_DIR", str(tmp_path / "cache"))
    pipe = WorkerPipe("--backend", "cuda", "--buffer-limit", str(1 << 20))
    yield pipe
    assert pipe.close() == 0


@pytest.mark.gpu
def test_buffers_and_element_types_on_the_gpu(gpu_worker: WorkerPipe) -> None:
    pipe = gpu_worker
    rng = np.random.default_rng(8)
    a, b = rng.standard_normal((2, 1000))
    pipe.launch(1, "copy", [typed(a, "f64")], keep=[1])
    pipe.launch(2, "copy", [typed(b, "f64")], keep=[2])
    pipe.launch(3, "vector_add", [Buffer(1), Buffer(2)], keep=[3])
    pipe.launch(4, "copy", [Buffer(3)])
    pipe.launch(5, "dot_product", [Buffer(1), Buffer(2)])
    pipe.launch(6, "reduce", [typed([1 + 2**-40] * 1000, "f64")])  # exact in f64 alone
    pipe.launch(7, "matmul", [Buffer(1), typed(b[:10], "f64"), 100, 1, 10])
    pipe.launch(8, "vector_add", [f32(a), f32(b)])  # the batched path, among them
    got = {r.job_id: r for r in (pipe.reply() for _ in range(8))}
    assert [got[i].result for i in (1, 2, 3)] == [("ok", ("buffer", i, "f64", 1000))
                                                  for i in (1, 2, 3)]
    assert got[4].tag == W.tag_typed and got[4].payload[1:] == (a + b).tobytes()
    assert got[5].result[1] == pytest.approx(float(np.dot(a, b)), rel=1e-12)
    assert got[6].result == ("ok", 1000 * (1 + 2**-40))
    np.testing.assert_allclose(got[7].result[1], a.reshape(100, 10) @ b[:10], rtol=1e-12)
    np.testing.assert_allclose(got[8].result[1], a.astype(np.float32) + b.astype(np.float32),
                               rtol=1e-6)
    for etype in ("i32", "u32", "i64", "u8"):
        dtype = np.dtype({"i32": "<i4", "u32": "<u4", "i64": "<i8", "u8": "u1"}[etype])
        values = np.array([np.iinfo(dtype).min, np.iinfo(dtype).max, 7], dtype)
        pipe.launch(10, "copy", [typed(values, etype)], keep=[10])
        pipe.launch(11, "copy", [Buffer(10)], keep=[11])
        pipe.launch(12, "copy", [Buffer(11)])
        pipe.launch(13, "zeros", [Zeroed(2, ETYPE[etype])])
        assert pipe.result()[1] == ("ok", ("buffer", 10, etype, 3))
        assert pipe.result()[1] == ("ok", ("buffer", 11, etype, 3))
        assert pipe.result()[1] == ("ok", values.tolist())
        assert pipe.result()[1] == ("ok", [0, 0])
        pipe.call("free", 0, [10, 11])
    pipe.launch(20, "zeros", [Zeroed(1 << 18)], keep=[20])  # 1 MiB: over with the 48 KB held
    status, (reason, code, _) = pipe.result()[1]
    assert (status, reason, code) == ("error", "cuda", "out_of_memory")
    pipe.launch(21, "copy", [Buffer(99)])
    assert pipe.result() == (21, ("error", ("buffer_lost", 99)))
    info = lane_info(pipe)
    assert (info["buffers"], info["buffer_bytes"], info["buffer_limit"]) == (3, 24000, 1 << 20)
    assert info["buffer_peak"] >= 24000
    pipe.call("free", 0, [1, 2, 3])
    assert lane_info(pipe)["buffer_bytes"] == 0


USER_SOURCE = b'''
extern "C" __global__ void scale(float *x, float s, long long n) {
    long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (i < n) x[i] *= s;
}
extern "C" __global__ void iota(int *out, long long n) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x)
        out[i] = (int)i;
}
'''
USER_KERNELS = [(b"scale", [(Atom("inout"), Atom("f32")), (Atom("scalar"), Atom("f32")),
                           (Atom("scalar"), Atom("i64"))]),
               (b"iota", [(Atom("out"), Atom("i32")), (Atom("scalar"), Atom("i64"))])]


@pytest.fixture(params=[pytest.param("cpu", marks=pytest.mark.skipif(
                            not HAS_GXX, reason="g++ is not installed")),
                        pytest.param("cuda", marks=pytest.mark.gpu)])
def any_worker(request: pytest.FixtureRequest, tmp_path: Any,
               monkeypatch: pytest.MonkeyPatch) -> Iterator[WorkerPipe]:
    """A worker of each backend (two devices on the cpu one, which load every module)."""
    monkeypatch.setenv("ERLCUDA_CACHE_DIR", str(tmp_path / "cache"))
    layout = ("--cpu-devices", "2") if request.param == "cpu" else ()
    pipe = WorkerPipe("--backend", request.param, "--buffer-limit", str(1 << 20), *layout)
    yield pipe
    assert pipe.close() == 0


def test_user_kernels_through_the_worker(any_worker: WorkerPipe) -> None:
    pipe = any_worker
    assert answer(pipe, "load", b"m", USER_SOURCE, [], USER_KERNELS)[0] == "ok"
    assert [bytes(m) for m in answer(pipe, "info")["modules"]] == [b"m"]
    x = np.arange(1000, dtype=np.float32)
    pipe.launch(1, "copy", [x], keep=[1])
    pipe.launch(2, "scale", [Buffer(1), Number(2.0), Number(1000, ETYPE["i64"])])
    pipe.launch(3, "copy", [Buffer(1)])
    pipe.launch(4, "scale", [x, Number(0.5), Number(1000, ETYPE["i64"])])
    pipe.launch(5, "iota", [300, Number(300, ETYPE["i64"])],
                geometry=((2, 1, 1), (32, 1, 1), 0))  # a grid-stride loop: any grid
    pipe.launch(6, "iota", [Zeroed(4, ETYPE["i32"]), Number(4, ETYPE["i64"])], keep=[6])
    pipe.launch(7, "copy", [Buffer(6)])
    results = dict(pipe.result() for _ in range(7))
    assert results[2] == ("ok", [])  # a buffer is written in place
    assert results[3] == ("ok", (2 * x).tolist())
    assert results[4] == ("ok", [(0.5 * x).tolist()])
    assert results[5] == ("ok", [list(range(300))])
    assert results[6] == ("ok", [("buffer", 6, "i32", 4)])
    assert results[7] == ("ok", [0, 1, 2, 3])
    # an elementwise kernel of mixed types, its outputs made by the worker
    ew = answer(pipe, "elementwise", b"axpy",
                [(b"a", Atom("f64"), Atom("scalar")), (b"x", Atom("f64"), Atom("vector")),
                 (b"y", Atom("i32"), Atom("vector"))],
                [(b"z", Atom("f64")), (b"w", Atom("u8"))], b"z = a * x + y; w = x > y", [])
    assert ew[0] == "ok" and compiled(ew)["cache_hit"] in (False, True)
    xs, ys = np.linspace(-3, 3, 777), np.arange(-388, 389, dtype=np.int32)
    pipe.launch(8, "axpy", [Number(2.0, ETYPE["f64"]), typed(xs, "f64"), typed(ys, "i32")])
    pipe.launch(9, "axpy", [Number(2.0, ETYPE["f64"]), typed(xs, "f64"), typed(ys, "i32")],
                keep=[9, 10])
    z, w = pipe.result()[1][1]
    np.testing.assert_allclose(z, 2 * xs + ys, rtol=1e-15)
    assert w == (xs > ys).astype(int).tolist()
    assert pipe.result()[1] == ("ok", [("buffer", 9, "f64", 777), ("buffer", 10, "u8", 777)])
    # a reload replaces the module
    reason, log = reason_of(answer(pipe, "load", b"m", b"nonsense", [], USER_KERNELS))
    assert reason == "compile" and "error" in log
    status, reason, _ = answer(pipe, "load", b"m", USER_SOURCE, [],
                               [(b"missing", [(Atom("in"), Atom("f32"))])])
    assert (status, reason[:2]) == ("error", ("cuda", "invalid_value"))  # no such function
    assert answer(pipe, "load", b"m", USER_SOURCE, [], USER_KERNELS)[0] == "ok"
    assert answer(pipe, "unload", b"m") == "ok"
    pipe.launch(11, "iota", [3, Number(3, ETYPE["i64"])])
    assert pipe.result() == (11, ("error", ("unknown_kernel", memoryview(b"iota"))))
    assert [bytes(m) for m in answer(pipe, "info")["modules"]] == [b"axpy"]


@pytest.mark.parametrize("layout", [("--cpu-devices", "2"), ("--device-thread",), ()])
def test_a_launch_right_after_a_free_finds_the_memory_given_back(layout: tuple[str, ...]) -> None:
    # With device threads, a free used to go through the control thread, so a launch written
    # after it could run first and find the limit still taken. (One device run by the
    # reading thread, the last layout, runs a free that comes alone at once.)
    pipe = WorkerPipe("--backend", "cpu", "--buffer-limit", "400", *layout)
    try:
        for rep in range(20):
            keep = 100 + rep
            pipe.launch(rep, "zeros", [Zeroed(100)], keep=[keep])  # the whole limit
            assert pipe.result() == (rep, ("ok", ("buffer", keep, "f32", 100)))
            pipe.send((Atom("C"), 0, Atom("erlcuda"), Atom("free"), [0, [keep]]))
            pipe.launch(1000 + rep, "zeros", [Zeroed(100)], keep=[5000 + rep])
            pipe.send((Atom("C"), 0, Atom("erlcuda"), Atom("free"), [0, [5000 + rep]]))
            # Erlang's frees (call Id 0) get no answer: the launch's reply comes alone
            assert pipe.result() == (1000 + rep, ("ok", ("buffer", 5000 + rep, "f32", 100)))
        # nothing came before the info's answer (``call`` checks); the last free is done
        assert until(lambda: lane_info(pipe)["buffers"] == 0)
    finally:
        assert pipe.close() == 0
