"""The CUDA backend: erlcuda's own kernels (``kernels/*.cu``), compiled by nvcc, run through PyCUDA.

Its modules: ``kernels`` (launch constants, the functions of each kernel file, compiling
them), ``context`` (what a CUDA error means for the context), ``transfers`` (staging
buffers, device arrays, packing), ``device`` (``CudaDevice``), and here ``CudaBackend``; the
caching allocator of device arrays is ``backends.pool``.

This package imports PyCUDA at the top: it is imported only when the cuda backend is chosen,
so the package works without PyCUDA (``backends.select`` turns the ImportError into
``BackendUnavailable``).

``CudaBackend`` compiles every kernel file once per compute capability, through the one
nvcc cache (``compile.py``, keyed on the source, its headers, the options and nvcc's
version), and each device loads the cubins into its own context. ``CudaDevice`` owns one CUDA
context, made current in the thread that opens it, one stream, and staging buffers that
grow with the largest batch seen and are reused: every batch is copied into pinned host
memory, sent with one host-to-device copy, computed with as few launches as the kernel
allows, and fetched with one device-to-host copy. Arrays returned are views into the pinned
output staging, valid until the next call (the contract of ``base.Device``).

The general path (``alloc``/``upload``/``download``/``free``/``_run_bound`` and user modules)
works on ``CudaArray`` device arrays of any element type, on the same stream; each of its
calls returns once its work on the device is done, so a fault is reported by the call that
caused it. Host transfers go through two pinned chunks in turn (one is packed while the other
is copied), so large ones run near pinned speed without pinning the caller's memory.

Device arrays come from a caching allocator (``pool.DevicePool``, one per device): a freed
array's block is kept by size class and handed to the next allocation of its class, so a
chain of steps that each make a result and free the previous one does not pay
``cuMemAlloc``/``cuMemFree`` per step. The cache holds at most ``pool.default_limit`` bytes
(1 GiB, or 1/16 of the device's memory if that is less), shows in ``info()`` as
``pool_bytes``, is freed whole before an allocation (or a staging buffer's growth) fails for
lack of memory, and goes with ``close``. Every block is used on the device's one stream, so
a cached block is reused in stream order without waiting.
"""

from __future__ import annotations

from pathlib import Path

import pycuda.driver as cuda

from ..base import Backend, BackendError, BackendUnavailable
from ..sources import find_kernel_dir, kernel_sources
from .context import to_backend_error
from .device import CudaDevice
from .kernels import FUNCTIONS, NVCC_OPTIONS, compile_kernels
from .transfers import CudaArray

__all__ = ["FUNCTIONS", "NVCC_OPTIONS", "CudaArray", "CudaBackend", "CudaDevice",
           "compile_kernels", "find_kernel_dir", "kernel_sources", "to_backend_error"]


class CudaBackend(Backend):
    """Every CUDA device PyCUDA sees, with the kernels compiled for each one's architecture.

    Raises ``BackendUnavailable`` when the driver does not start, there is no device, the
    kernel sources are missing or nvcc fails (the message carries nvcc's output).
    """

    name = "cuda"
    #: What ``open`` makes: a subclass may name a subclass of ``CudaDevice``.
    device_type: type[CudaDevice] = CudaDevice

    def __init__(self, kernel_dir: Path | None = None) -> None:
        try:
            cuda.init()
            count = int(cuda.Device.count())
            capabilities = {
                i: tuple(int(v) for v in cuda.Device(i).compute_capability()) for i in range(count)
            }
        except cuda.Error as exc:
            raise BackendUnavailable(f"CUDA driver: {exc}") from exc
        if count == 0:
            raise BackendUnavailable("no CUDA device")
        self.kernel_dir = kernel_dir if kernel_dir is not None else find_kernel_dir()
        self._count = count
        self._capabilities: dict[int, tuple[int, int]] = {
            i: (cap[0], cap[1]) for i, cap in capabilities.items()
        }
        self._cubins = {
            cap: compile_kernels(self.kernel_dir, cap)
            for cap in sorted(set(self._capabilities.values()))
        }

    def device_count(self) -> int:
        return self._count

    def open(self, index: int) -> CudaDevice:
        if not 0 <= index < self._count:
            raise BackendError("invalid_value", f"no CUDA device {index}")
        cubins = self._cubins[self._capabilities[index]]
        return self.device_type(index, cubins)
