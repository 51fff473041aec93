"""Programs run on a device (``program_runner``): one wait, batches, graphs, fusion.

The cpu backend runs every step at once; graphs and compiled kernels are the cuda backend's,
played here by doubles: a graph double that keeps what was queued during capture and runs it
again at each launch (as a replay does), and a compiler that answers at once.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import Any

import numpy as np
import pytest

from erlcuda import program_runner
from erlcuda.backends.base import BackendError
from erlcuda.backends.cpu import CpuDevice
from erlcuda.general import Registry
from erlcuda.kernels import Operand, Plan
from erlcuda.lanes import BufferStore
from erlcuda.program_runner import Runner
from erlcuda.protocol import Handle, Kept, Listed
from programdefs import chain, check, definition, f32, inp, saxpy_registry, step


class GraphDouble:
    """Capture keeps the queued work's function (the device runs nothing meanwhile: the
    test's device queues nothing while capturing), launch runs it."""

    def __init__(self) -> None:
        self.captured: list[Callable[[], None]] = []
        self.released: list[Any] = []
        self.launches = 0

    def capture(self, queue: Callable[[], None]) -> Any:
        self.captured.append(queue)
        return len(self.captured) - 1

    def launch(self, handle: Any) -> None:
        self.launches += 1
        self.captured[handle]()

    def release(self, handle: Any) -> None:
        self.released.append(handle)


class Device(CpuDevice):
    """The cpu device, counting its arrays; with graphs where asked."""

    def __init__(self, graphs: bool = False, fail_at: int = -1) -> None:
        super().__init__(0)
        self.graphs = GraphDouble() if graphs else None
        self.live = 0
        self.enqueued = 0
        self.fail_at = fail_at

    def alloc(self, dtype: Any, count: int, *, zero: bool) -> np.ndarray:
        self.live += 1
        return super().alloc(dtype, count, zero=zero)

    def upload(self, host: np.ndarray) -> np.ndarray:
        array = self.alloc(host.dtype, host.size, zero=False)
        array[:] = host
        return array

    def stage_in(self, hosts: Sequence[np.ndarray]) -> list[Any]:
        self.live += len(hosts)
        return super().stage_in(hosts)

    def free(self, array: np.ndarray) -> None:
        self.live -= 1
        super().free(array)

    def enqueue(self, plan: Plan, bound: Sequence[Any], out: Any = None, count: int = 1) -> None:
        self.enqueued += 1
        if self.enqueued == self.fail_at:
            raise BackendError("launch_failed", "the third step faults")
        super().enqueue(plan, bound, out, count)


def runner(registry: Registry | None = None, **kw: Any) -> tuple[Runner, BufferStore]:
    store = BufferStore()
    return Runner(0, registry or Registry(), store, **kw), store


def host(op: Operand) -> np.ndarray:
    return op.value  # type: ignore[no-any-return]


def expected_chain(a: np.ndarray, b: np.ndarray, links: int) -> tuple[float, np.ndarray]:
    last = a.copy()
    for _ in range(links):
        last = last + b
    return float(np.float32(last.astype(np.float64).sum())), last


def test_a_run_answers_its_outputs_and_frees_what_it_made() -> None:
    run, _ = runner()
    device = Device()
    a, b = f32([1, 2, 3]), f32([0.5, 0.5, 0.5])
    (result,) = run.run([check(chain(10), [a, b])], device, host)
    total, last = expected_chain(a, b, 10)
    assert isinstance(result, Listed)
    assert result.items[0] == total
    np.testing.assert_array_equal(result.items[1], last)
    assert device.live == 0 and device.held == 0


def test_a_batch_answers_each_run_as_if_alone() -> None:
    raw = chain(4)
    plans = [check(raw, [f32([i, i + 1]), f32([1, 2])], job_id=i) for i in range(5)]
    assert len({p.key for p in plans}) == 1
    batched = runner()[0].run(plans, Device(), host)
    alone = [runner()[0].run([p], Device(), host)[0] for p in plans]
    for got, want in zip(batched, alone, strict=True):
        assert got.items[0] == want.items[0]
        np.testing.assert_array_equal(got.items[1], want.items[1])


def test_a_batch_of_matmuls_and_dots_splits_per_run() -> None:
    raw = definition(2, [("matmul", [inp(0), inp(1), 2, 2, 2]), ("dot_product", [step(0),
                                                                              step(0)])],
                     [step(0), step(1)])
    rng = np.random.default_rng(3)
    plans = [check(raw, [rng.random(4, np.float32), rng.random(4, np.float32)])
             for _ in range(3)]
    for plan, result in zip(plans, runner()[0].run(plans, Device(), host), strict=True):
        a, b = (op.value.reshape(2, 2) for op in plan.operands)
        product = (a @ b).reshape(-1)
        np.testing.assert_allclose(result.items[0], product, rtol=1e-6)
        assert result.items[1] == pytest.approx(float(product @ product), rel=1e-6)


def test_kept_outputs_become_buffers_once_every_step_ran() -> None:
    run, store = runner()
    device = Device()
    (result,) = run.run([check(chain(2), [f32([1]), f32([2])], keep=(21,))], device, host)
    assert result.items[1] == Kept(21, "f32", 1)
    np.testing.assert_array_equal(store.get(21), f32([5]))
    assert device.live == 1  # the kept buffer alone


def test_a_failing_step_keeps_nothing_and_frees_everything() -> None:
    run, store = runner()
    device = Device(fail_at=3)
    with pytest.raises(BackendError):
        run.run([check(chain(5), [f32([1]), f32([2])], keep=(21,))], device, host)
    assert len(store) == 0 and device.live == 0 and device.held == 0


def test_buffers_are_read_in_place_and_never_written() -> None:
    registry = saxpy_registry()
    run, store = runner(registry)
    device = Device()
    buffer = device.upload(f32([1, 2]))
    store.put(5, buffer, "f32")
    raw = definition(1, [("scale", [inp(0), 10.0])], [step(0)])
    plan = check(raw, [Handle(5)], registry, held=store.held)
    # the raw kernel needs a runner of user code: the cpu backend refuses it, and the
    # buffer is as it was
    with pytest.raises(BackendError):
        run.run([plan], device, host)
    np.testing.assert_array_equal(store.get(5), f32([1, 2]))


def test_a_program_that_is_one_launch_runs_as_that_launch() -> None:
    run, _ = runner()
    device = Device(graphs=True)
    add = definition(2, [("vector_add", [inp(1), inp(0)])], [step(0)])
    total = definition(1, [("reduce", [inp(0)])], [step(0)])
    product = definition(2, [("matmul", [inp(0), inp(1), 2, 2, 2])], [step(0)])
    a, b = f32([1, 2, 3, 4]), f32([10, 20, 30, 40])
    for _ in range(3):  # never captured as a graph, however often it runs
        (added,) = run.run([check(add, [a, b])], device, host)
        np.testing.assert_array_equal(added.items[0], a + b)
    (summed,) = run.run([check(total, [a])], device, host)
    assert summed.items == (10.0,)
    batch = run.run([check(product, [a * i, b]) for i in range(3)], device, host)
    for i, got in enumerate(batch):
        want = ((a * i).reshape(2, 2) @ b.reshape(2, 2)).reshape(-1)
        np.testing.assert_allclose(got.items[0], want)
    assert device.enqueued == 0 and device.graphs.captured == []
    assert device.live == 0 and run.stats["runs"] == 7


def test_a_one_step_program_on_a_buffer_runs_as_a_program() -> None:
    run, store = runner()
    device = Device()
    store.put(5, device.upload(f32([1, 2])), "f32")
    add = definition(2, [("vector_add", [inp(0), inp(1)])], [step(0)])
    (added,) = run.run([check(add, [f32([10, 20]), Handle(5)], held=store.held)], device, host)
    np.testing.assert_array_equal(added.items[0], f32([11, 22]))
    np.testing.assert_array_equal(store.get(5), f32([1, 2]))
    (kept,) = run.run([check(add, [f32([10, 20]), f32([1, 1])], keep=(6,))], device, host)
    assert kept.items[0] == Kept(6, "f32", 2)
    np.testing.assert_array_equal(store.get(6), f32([11, 21]))


# -- graphs -----------------------------------------------------------------------------------


def test_a_repeated_run_is_captured_once_then_replayed() -> None:
    run, _ = runner()
    device = Device(graphs=True)
    raw = chain(3)
    b = f32([1, 1])
    results = [run.run([check(raw, [f32([i, i]), b])], device, host)[0] for i in range(4)]
    assert run.stats["captures"] == 1 and run.stats["graph_runs"] == 3
    assert device.graphs.launches == 3
    for i, result in enumerate(results):
        total, last = expected_chain(f32([i, i]), b, 3)
        assert result.items[0] == total
        np.testing.assert_array_equal(result.items[1], last)
    # the graph's arrays stay until it goes
    assert device.live > 0
    run.close(device)
    assert device.live == 0 and device.graphs.released == [0]


def test_a_run_of_large_data_is_never_captured() -> None:
    # chain(3) on two vectors of 2 answers its sum and its last vector: 16 bytes in, 12 out
    run, _ = runner(graph_data_max=27)
    device = Device(graphs=True)
    raw, b = chain(3), f32([1, 1])
    for i in range(4):
        (result,) = run.run([check(raw, [f32([i, i]), b])], device, host)
        np.testing.assert_array_equal(result.items[1], f32([i, i]) + 3 * b)
    assert run.stats["captures"] == 0 and device.graphs.launches == 0
    assert device.live == 0
    small, _ = runner(graph_data_max=28)
    for i in range(2):
        small.run([check(raw, [f32([i, i]), b])], device, host)
    assert small.stats["captures"] == 1


def test_another_buffer_is_another_graph() -> None:
    run, store = runner()
    device = Device(graphs=True)
    raw = chain(2)
    for buffer_id, values in ((1, [1, 2]), (2, [3, 4])):
        store.put(buffer_id, device.upload(f32(values)), "f32")
    for buffer_id in (1, 1, 2, 2, 1):
        (result,) = run.run([check(raw, [Handle(buffer_id), f32([1, 1])], held=store.held)],
                            device, host)
        np.testing.assert_array_equal(result.items[1], store.get(buffer_id) + 2)
    assert run.stats["captures"] == 2


def test_kept_outputs_of_a_graph_are_copies() -> None:
    run, store = runner()
    device = Device(graphs=True)
    raw = chain(2)
    for buffer_id in (31, 32, 33):
        run.run([check(raw, [f32([1]), f32([buffer_id])], keep=(buffer_id,))], device, host)
    assert [store.get(i)[0] for i in (31, 32, 33)] == [63, 65, 67]


def test_graphs_are_bounded_and_released(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(program_runner, "MAX_GRAPHS", 2)
    run, _ = runner()
    device = Device(graphs=True)
    raw = chain(2)
    for size in (1, 2, 3):
        for _ in range(2):
            run.run([check(raw, [f32([1] * size), f32([1] * size)])], device, host)
    assert run.stats["captures"] == 3 and len(device.graphs.released) == 1


def test_a_changed_catalogue_drops_the_graphs() -> None:
    registry = Registry()
    run, _ = runner(registry)
    device = Device(graphs=True)
    raw = chain(2)
    for _ in range(2):
        run.run([check(raw, [f32([1]), f32([1])], registry)], device, host)
    assert run.stats["captures"] == 1
    registry.install("m", [])
    run.run([check(raw, [f32([1]), f32([1])], registry)], device, host)
    assert device.graphs.released == [0]


def test_a_program_made_without_graphs_is_never_captured() -> None:
    run, _ = runner()
    device = Device(graphs=True)
    for _ in range(3):
        run.run([check(chain(2, options=("fuse",)), [f32([1]), f32([1])])], device, host)
    assert run.stats["captures"] == 0 and run.stats["graph_runs"] == 0


# -- fusion -----------------------------------------------------------------------------------


class Compiler:
    """Answers each compile at once (or fails it)."""

    def __init__(self, fail: bool = False) -> None:
        self.sources: list[str] = []
        self.fail = fail

    def submit(self, fn: Any, source: str, options: list[str], arch: str) -> Future[bytes]:
        self.sources.append(source)
        done: Future[bytes] = Future()
        if self.fail:
            done.set_exception(RuntimeError("nvcc refused it"))
        else:
            done.set_result(b"cubin:" + source.encode())
        return done


class Loading(Device):
    arch = "sm_90"

    def __init__(self) -> None:
        super().__init__()
        self.loaded: dict[str, bytes] = {}

    def load_module(self, name: str, image: bytes, functions: Sequence[str]) -> None:
        self.loaded[name] = image


def test_an_elementwise_run_is_fused_once_compiled() -> None:
    registry = saxpy_registry()
    compiler = Compiler()
    run, _ = runner(registry, compiler=compiler)
    device = Loading()
    raw = definition(2, [("vector_add", [inp(0), inp(1)]), ("saxpy", [step(0), 2.0, inp(1)]),
                         ("reduce", [step(1)])], [step(2)])
    typed = check(raw, [f32([1]), f32([2])], registry).program.plan
    first = run._schedule(typed, device)
    assert [s.plan.kernel for s in first] == ["vector_add", "saxpy", "reduce"]
    assert len(compiler.sources) == 1  # asked for, not waited for
    second = run._schedule(typed, device)
    assert len(second) == 2 and second[0].plan.kernel.startswith("erlcuda_fused_")
    assert list(device.loaded) == [second[0].plan.user.module]
    run._schedule(typed, device)
    assert len(compiler.sources) == 1  # compiled and loaded once


def test_a_failed_fusion_leaves_the_steps_as_they_are() -> None:
    registry = saxpy_registry()
    run, _ = runner(registry, compiler=Compiler(fail=True))
    device = Loading()
    raw = definition(2, [("vector_add", [inp(0), inp(1)]), ("vector_add", [step(0), inp(1)])],
                     [step(1)])
    typed = check(raw, [f32([1]), f32([2])], registry).program.plan
    for _ in range(3):
        assert len(run._schedule(typed, device)) == 2
    assert not device.loaded


def test_no_fusion_where_the_device_compiles_nothing_or_the_program_says_so() -> None:
    registry = saxpy_registry()
    compiler = Compiler()
    run, _ = runner(registry, compiler=compiler)
    raw = chain(3, total=False)
    typed = check(raw, [f32([1]), f32([2])], registry).program.plan
    assert len(run._schedule(typed, Device())) == 3  # the cpu backend: no arch
    off = check(chain(3, total=False, options=("graph",)), [f32([1]), f32([2])],
                registry).program.plan
    assert len(run._schedule(off, Loading())) == 3
    assert not compiler.sources
