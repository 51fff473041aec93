"""The CPU backend: numpy, one call per batch. Runs everywhere; the reference for the GPU.

``cpu_devices`` virtual devices share the host's cores; they exist so that routing and
per-device queues behave as they do with several GPUs. Their device arrays (buffers, the
general path's operands) are numpy arrays in host memory. User kernels are CUDA C built
for the host (``usercode.compile_host``), each device with its own copy of a module
(``hostlib``), run over those arrays.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..kernels import F32, Plan, UniformPlans
from .base import Backend, BackendError, Device, Result
from .hostlib import HostModule


def _offsets(requests: Sequence[Plan]) -> np.ndarray:
    sizes = np.fromiter((r.a.size for r in requests), dtype=np.int64, count=len(requests))
    return np.concatenate(([0], np.cumsum(sizes)))


def _split(flat: np.ndarray, offsets: np.ndarray) -> list[Result]:
    return [flat[offsets[i] : offsets[i + 1]] for i in range(len(offsets) - 1)]


def _segment_sums(values: np.ndarray, offsets: np.ndarray) -> list[Result]:
    # f64 accumulation: the CPU backend doubles as the accuracy reference for the GPU. Every
    # sum (a lone job's, a batch's, a table's) is made here, so they agree to the bit.
    sums = np.zeros(len(offsets) - 1)
    # reduceat misreads empty segments (it yields values[i]) and refuses a start at the end,
    # so only the non-empty ones go in; each then runs up to the next non-empty start.
    full = offsets[1:] > offsets[:-1]
    if full.any():
        sums[full] = np.add.reduceat(values, offsets[:-1][full])
    return [float(np.float32(s)) for s in sums]


def _ram() -> int:
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError):
        return 1 << 62


class CpuDevice(Device):
    def __init__(self, index: int, capacity: int | None = None) -> None:
        self.index = index
        self.held = 0  # bytes of the device arrays made and not freed
        self.capacity = _ram() * 3 // 4 if capacity is None else capacity
        self._user: dict[str, HostModule] = {}  # loaded modules by name

    def _run_batch(self, kernel: str, requests: Sequence[Plan]) -> list[Result]:
        if kernel == "matmul":
            r0 = requests[0]
            a = np.stack([r.a for r in requests]).reshape(len(requests), r0.m, r0.k)
            b = np.stack([r.b for r in requests]).reshape(len(requests), r0.k, r0.n)
            out = np.matmul(a, b, dtype=F32)
            return list(out.reshape(len(requests), r0.m * r0.n))
        if len(requests) == 1:  # the lone job: no concatenation, no offsets
            r = requests[0]
            if kernel == "vector_add":
                return [np.add(r.a, r.b, dtype=F32)]
            if kernel in ("reduce", "dot_product"):
                values = r.a.astype(np.float64)
                if kernel == "dot_product":
                    values *= r.b
                # reduceat, as _segment_sums does: a lone job's sum has a batch's bits
                total = np.add.reduceat(values, [0])[0] if values.size else 0.0
                return [float(np.float32(total))]
        offsets = _offsets(requests)
        a = np.concatenate([r.a for r in requests]) if len(requests) > 1 else requests[0].a
        if kernel == "reduce":
            return _segment_sums(a.astype(np.float64), offsets)
        b = np.concatenate([r.b for r in requests]) if len(requests) > 1 else requests[0].b
        assert b is not None
        if kernel == "vector_add":
            return _split(np.add(a, b, dtype=F32), offsets)
        if kernel == "dot_product":
            return _segment_sums(a.astype(np.float64) * b.astype(np.float64), offsets)
        raise ValueError(f"unknown kernel {kernel}")

    def _run_batch_into(self, kernel: str, requests: Sequence[Plan],
                        into: Sequence[np.ndarray | None],
                        registered: bool = False) -> list[Result]:
        # A lone vector_add is added straight into its result file's pages.
        target = into[0] if len(requests) == 1 else None
        r = requests[0]
        if kernel == "vector_add" and target is not None and target.size == r.a.size:
            np.add(r.a, r.b, out=target, dtype=F32)
            return [target]
        return super()._run_batch_into(kernel, requests, into)

    def execute_uniform(self, batch: UniformPlans) -> np.ndarray:
        a, b, kernel = batch.a, batch.b, batch.kernel
        if kernel == "vector_add" and b is not None:
            return np.add(a, b, dtype=F32)
        if kernel in ("reduce", "dot_product"):
            # The sums of _run_batch's segments, in the same order: a job's result does not depend
            # on the path it took.
            count, size = a.shape
            values = a.astype(np.float64)
            if kernel == "dot_product" and b is not None:
                values *= b
            offsets = np.arange(count + 1, dtype=np.int64) * size
            return np.array(_segment_sums(values.reshape(-1), offsets))
        if kernel == "matmul" and b is not None:
            m, n, k = batch.m, batch.n, batch.k
            out = np.matmul(a.reshape(batch.count, m, k), b.reshape(batch.count, k, n),
                            dtype=F32)
            return out.reshape(batch.count, m * n)
        return super().execute_uniform(batch)

    # -- device arrays: numpy arrays ---------------------------------------------------------
    def alloc(self, dtype: np.dtype[Any], count: int, *, zero: bool) -> np.ndarray:
        # The host commits pages lazily, so numpy's own MemoryError comes too late (the
        # worker killed when the pages are touched): arrays are counted against the RAM.
        nbytes = count * np.dtype(dtype).itemsize
        if self.held + nbytes > self.capacity:
            raise BackendError("out_of_memory",
                               f"{count} elements of {dtype} do not fit: {self.held} bytes "
                               f"held, {self.capacity} at most (3/4 of the machine's memory)")
        try:
            array = np.zeros(count, dtype) if zero else np.empty(count, dtype)
        except MemoryError as exc:
            raise BackendError("out_of_memory",
                               f"{count} elements of {dtype} do not fit in memory") from exc
        self.held += nbytes
        return array

    def upload(self, host: np.ndarray) -> np.ndarray:
        array = self.alloc(host.dtype, host.size, zero=False)
        array[:] = host
        return array

    def download(self, array: np.ndarray) -> np.ndarray:
        return array.copy()

    def free(self, array: np.ndarray) -> None:
        self.held -= int(array.nbytes)  # the memory goes with the last reference

    def _run_bound(self, kernel: str, operands: Sequence[Any], out: Any | None) -> float | None:
        if kernel == "copy":
            out[:] = operands[0]
        elif kernel == "vector_add":
            np.add(operands[0], operands[1], out=out)
        elif kernel == "matmul":
            a, b, m, n, k = operands
            np.matmul(a.reshape(m, k), b.reshape(k, n), out=out.reshape(m, n))
        elif kernel in ("reduce", "dot_product"):
            # f64 accumulation, as _run_batch's: an f32 launch's sum is rounded to f32 as there
            a = operands[0]
            values = a.astype(np.float64)
            if kernel == "dot_product":
                values *= operands[1]
            total = np.add.reduceat(values, [0])[0] if values.size else 0.0
            return float(np.float32(total)) if a.dtype == F32 else float(total)
        else:
            raise BackendError("not_supported", f"the cpu backend has no built-in {kernel}")
        return None

    # -- programs: every step runs at once, in order -------------------------------------
    def enqueue(self, plan: Plan, bound: Sequence[Any], out: Any | None = None,
                count: int = 1) -> None:
        if plan.user is not None:
            assert plan.geometry is not None
            grid, block, shared = plan.geometry
            self.launch_user(plan.user.module, plan.user.name, bound, grid, block, shared)
        elif plan.kernel in ("reduce", "dot_product"):
            out[:] = _sums(bound[0], bound[1] if plan.kernel == "dot_product" else None,
                           count)
        elif plan.kernel == "matmul":
            a, b, m, n, k = bound
            np.matmul(a.reshape(count, m, k), b.reshape(count, k, n),
                      out=out.reshape(count, m, n))
        else:
            self._run_bound(plan.kernel, bound, out)

    def stage_in(self, hosts: Sequence[np.ndarray]) -> list[Any]:
        # The steps never write their inputs: the host arrays serve as they are (counted
        # while the run holds them, as ``free`` will uncount them).
        self.held += sum(int(host.nbytes) for host in hosts)
        return list(hosts)

    def stage_into(self, arrays: Sequence[Any], hosts: Sequence[np.ndarray]) -> None:
        for array, host in zip(arrays, hosts, strict=True):
            array[:] = host

    def copy_in(self, array: Any, host: np.ndarray) -> None:
        array[:] = host

    def copy_out(self, host: np.ndarray, array: Any) -> None:
        host[:] = array

    def stage_out(self, arrays: Sequence[Any]) -> list[np.ndarray]:
        return [array.copy() for array in arrays]  # a graph's arrays are written again

    def copy_into(self, array: Any, source: Any) -> None:
        array[:] = source

    def zero(self, array: Any) -> None:
        array[:] = 0

    # -- user kernels: host libraries -------------------------------------------------------
    def load_module(self, name: str, image: bytes, functions: Sequence[str]) -> None:
        module = HostModule(name, image, functions)  # a failure leaves the old one loaded
        old = self._user.pop(name, None)
        self._user[name] = module
        if old is not None:
            old.close()

    def unload_module(self, name: str) -> None:
        module = self._user.pop(name, None)
        if module is not None:
            module.close()

    def launch_user(self, module: str, function: str, args: Sequence[Any],
                    grid: tuple[int, int, int], block: tuple[int, int, int],
                    shared: int) -> None:
        loaded = self._user.get(module)
        if loaded is None:
            raise BackendError("invalid_value", f"module {module!r:.60} is not loaded")
        loaded.launch(function, args, grid, block, shared)

    def info(self) -> dict[str, Any]:
        return {"name": f"cpu:{self.index}"}

    def close(self) -> None:
        for name in list(self._user):
            self.unload_module(name)


def _sums(a: np.ndarray, b: np.ndarray | None, count: int) -> np.ndarray:
    """The sums (``b``: of products) of ``count`` equal segments, accumulated in f64 as
    ``_run_bound`` does; the caller rounds them to the vectors' type."""
    values = a.astype(np.float64)
    if b is not None:
        values *= b
    size = values.size // count if count else 0
    if size == 0:
        return np.zeros(count)
    return np.add.reduceat(values, np.arange(count, dtype=np.int64) * size)


class CpuBackend(Backend):
    name = "cpu"
    user_code = "host"

    def __init__(self, devices: int = 1) -> None:
        if devices < 1:
            raise ValueError("cpu_devices must be at least 1")
        self._devices = devices

    def device_count(self) -> int:
        return self._devices

    def open(self, index: int) -> Device:
        return CpuDevice(index)
