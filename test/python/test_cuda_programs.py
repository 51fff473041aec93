"""Programs on a GPU: one wait for every step, batches, CUDA graphs, fused kernels, and a
faulting step (needs a GPU, PyCUDA and nvcc; graphs need cuda-bindings).

The values are small integers, so every sum and product is exact in f32, fused or not."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pytest

from erlcuda import usercode
from erlcuda.general import Registry
from erlcuda.kernels import Operand
from erlcuda.lanes import BufferStore
from erlcuda.program_runner import Runner
from erlcuda.protocol import Handle, Listed
from programdefs import chain, check, definition, inp, saxpy_registry, step

if TYPE_CHECKING:
    from erlcuda.backends.cuda import CudaDevice

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def device() -> Iterator[CudaDevice]:
    from erlcuda.backends.cuda import CudaBackend

    backend = CudaBackend()
    dev = backend.open(0)
    yield dev
    dev.close()
    backend.close()


@pytest.fixture(scope="module")
def registry(device: CudaDevice, tmp_path_factory: pytest.TempPathFactory) -> Registry:
    """saxpy (elementwise) loaded into the device as the worker loads it."""
    found = saxpy_registry()
    body = found.get("saxpy").body  # type: ignore[union-attr]
    source = usercode.elementwise_source("saxpy", list(body.inputs), list(body.outputs),
                                         body.operation)
    image = usercode.compile_module(source, [], device.arch or "sm_90",
                                    cache=tmp_path_factory.mktemp("cubins"))
    device.load_module("saxpy", image, ["saxpy"])
    return found


@pytest.fixture
def runner(registry: Registry, device: CudaDevice) -> Iterator[Runner]:
    compiler = ThreadPoolExecutor(1)
    found = Runner(0, registry, BufferStore(), compiler)
    yield found
    found.close(device)
    compiler.shutdown()


def host(op: Operand) -> np.ndarray:
    return op.value  # type: ignore[no-any-return]


def ints(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(-50, 50, n).astype(np.float32)


def chain_of(a: np.ndarray, b: np.ndarray, links: int) -> tuple[float, np.ndarray]:
    last = a + links * b
    return float(last.astype(np.float64).sum()), last


@pytest.mark.parametrize("n", [1, 1000, 1 << 20])
def test_a_chain_runs_with_one_wait(runner: Runner, device: CudaDevice, n: int) -> None:
    a, b = ints(n, 1), ints(n, 2)
    (result,) = runner.run([check(chain(10, options=()), [a, b])], device, host)
    total, last = chain_of(a, b, 10)
    assert result.items[0] == total
    np.testing.assert_array_equal(result.items[1], last)


def test_a_batch_splits_sums_products_and_elementwise_runs(runner: Runner, device: CudaDevice,
                                                           registry: Registry) -> None:
    raw = definition(2, [("saxpy", [inp(0), 3.0, inp(1)]),
                         ("matmul", [step(0), inp(1), 8, 8, 8]),
                         ("reduce", [step(1)]), ("dot_product", [step(0), inp(1)])],
                     [step(1), step(2), step(3)], options=())
    plans = [check(raw, [ints(64, i), ints(64, i + 100)], registry, job_id=i) for i in range(40)]
    assert len({p.key for p in plans}) == 1
    for plan, result in zip(plans, runner.run(plans, device, host), strict=True):
        x, y = (op.value for op in plan.operands)
        z = 3 * x + y
        product = (z.reshape(8, 8) @ y.reshape(8, 8)).reshape(-1)
        np.testing.assert_array_equal(result.items[0], product)
        assert result.items[1] == float(product.astype(np.float64).sum())
        assert result.items[2] == float((z.astype(np.float64) * y).sum())


def test_a_repeated_run_is_replayed_as_a_graph(runner: Runner, device: CudaDevice) -> None:
    pytest.importorskip("cuda.bindings")
    assert device.graphs is not None
    store = runner.store
    b = device.upload(ints(1000, 9))
    store.put(1, b, "f32")
    raw = chain(10, options=("graph",))
    for i in range(5):
        a = ints(1000, i)
        (result,) = runner.run([check(raw, [a, Handle(1)], held=store.held)], device, host)
        total, last = chain_of(a, device.download(b), 10)
        assert result.items[0] == total
        np.testing.assert_array_equal(result.items[1], last)
    assert runner.stats["captures"] == 1 and runner.stats["graph_runs"] == 4


def test_an_elementwise_run_is_fused_once_compiled(runner: Runner, device: CudaDevice,
                                                   registry: Registry) -> None:
    raw = definition(2, [("vector_add", [inp(0), inp(1)]), ("saxpy", [step(0), 2.0, inp(1)]),
                         ("saxpy", [step(1), -1.0, step(0)]), ("reduce", [step(2)])],
                     [step(3), step(2)], options=("fuse",))
    a, b = ints(5000, 3), ints(5000, 4)
    plan = check(raw, [a, b], registry)
    s0 = a + b
    want = -(2 * s0 + b) + s0
    deadline = time.monotonic() + 300  # nvcc, cold
    while runner.stats["fused_runs"] == 0:
        (result,) = runner.run([plan], device, host)
        assert result.items[0] == float(want.astype(np.float64).sum())
        np.testing.assert_array_equal(result.items[1], want)
        assert time.monotonic() < deadline, "the fused kernel never came"
        time.sleep(0.05)
    (result,) = runner.run([plan], device, host)
    np.testing.assert_array_equal(result.items[1], want)
    assert isinstance(result, Listed)


FAULT_SCRIPT = """
import sys
import numpy as np
sys.path[:0] = [sys.argv[2], sys.argv[3]]
from erlcuda import usercode
from erlcuda.backends.base import BackendError
from erlcuda.backends.cuda import CudaBackend
from erlcuda.general import Registry, UserKernel
from erlcuda.lanes import BufferStore
from erlcuda.program_runner import Runner
from programdefs import check, definition, inp, step
SOURCE = 'extern "C" __global__ void wild(float* x) { x[(1LL << 40) + threadIdx.x] = 1.0f; }'
backend = CudaBackend()
dev = backend.open(0)
registry = Registry()
registry.install("wild", [UserKernel("wild", "wild", (("inout", "f32"),))])
dev.load_module("wild", usercode.compile_module(SOURCE, [], dev.arch, cache=sys.argv[1]),
                ["wild"])
runner = Runner(0, registry, BufferStore())
raw = definition(1, [("vector_add", [inp(0), inp(0)]), ("wild", [step(0)])], [step(1)], ())
try:
    runner.run([check(raw, [np.ones(256, np.float32)], registry)], dev, lambda op: op.value)
    print("NO ERROR")
except BackendError as exc:
    print("CODE", exc.code, exc.fatal, flush=True)
dev.close()
backend.close()
print("CLOSED", flush=True)
"""


def test_a_faulting_step_is_a_fatal_backend_error(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(FAULT_SCRIPT), str(tmp_path),
         str(ROOT / "python"), str(ROOT / "test" / "python")],
        capture_output=True, text=True, timeout=300, check=False,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(
            filter(None, [str(ROOT / "python"), os.environ.get("PYTHONPATH")]))})
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log
    assert "CODE illegal_address True" in proc.stdout, log
    assert "CLOSED" in proc.stdout, log
