"""Host and device staging buffers, the general path's device arrays (``CudaArray``), and
the packing of a batch's operands into pinned staging (in parallel for large ones)."""

from __future__ import annotations

import ctypes
import ctypes.util
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import pycuda.driver as cuda

from ...hostmem import PinError, address
from ...kernels import F32
from ..base import BackendError
from ..pool import Block
from .kernels import (
    MIN_STAGING,
)

# -- staging buffers -----------------------------------------------------------------------


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def round_up(a: int, b: int) -> int:
    return ceil_div(a, b) * b


def _grown(needed: int, current: int) -> int:
    return max(needed, 2 * current, MIN_STAGING)


class DeviceBuffer:
    """Device memory for ``dtype`` elements that grows, never shrinks, and is reused.

    ``reclaim`` (if given) frees memory held elsewhere (the device's pool) and returns the
    bytes it freed: it is called once before a growth fails for lack of memory."""

    def __init__(self, what: str, dtype: np.dtype[Any] | type = F32,
                 reclaim: Callable[[], int] | None = None) -> None:
        self.what = what
        self.itemsize = np.dtype(dtype).itemsize
        self.capacity = 0  # elements
        self.ptr = 0  # the buffer's address (0 while none is allocated)
        self._alloc: cuda.DeviceAllocation | None = None
        self._reclaim = reclaim

    def ensure(self, count: int) -> int:
        """The buffer's address, after growing it to hold ``count`` elements if need be.

        On failure the old buffer is kept and ``BackendError('out_of_memory')`` is raised.
        """
        if self._alloc is not None and count <= self.capacity:
            return self.ptr
        want = _grown(count, self.capacity)
        try:
            alloc = cuda.mem_alloc(want * self.itemsize)
        except cuda.MemoryError:
            want = max(count, 1)
            alloc = self._alloc_exactly(want)
        self.free()
        self._alloc = alloc
        self.capacity = want
        self.ptr = int(alloc)
        return self.ptr

    def _alloc_exactly(self, count: int) -> cuda.DeviceAllocation:
        """``count`` elements of device memory, after reclaiming the pool's if need be."""
        try:
            return cuda.mem_alloc(count * self.itemsize)
        except cuda.MemoryError as exc:
            error = exc
        if self._reclaim is not None and self._reclaim() > 0:
            try:
                return cuda.mem_alloc(count * self.itemsize)
            except cuda.MemoryError as exc:
                error = exc
        raise BackendError(
            "out_of_memory",
            f"cannot allocate {count * self.itemsize} bytes of device memory "
            f"for {self.what}: {error}",
        ) from error

    def free(self) -> None:
        if self._alloc is not None:
            try:
                self._alloc.free()
            except cuda.Error:
                pass  # a poisoned context; the driver frees it with the context
            self._alloc = None
            self.capacity = 0
            self.ptr = 0


class HostBuffer:
    """Pinned (page-locked) host memory, grown and reused like ``DeviceBuffer``."""

    def __init__(self, what: str, dtype: np.dtype[Any] | type = F32) -> None:
        self.what = what
        self.dtype = np.dtype(dtype)
        self.array: np.ndarray = np.empty(0, self.dtype)
        self.ptr = 0  # the array's address (0 while none is pinned)
        self._pinned = False

    def ensure(self, count: int) -> np.ndarray:
        """The whole pinned array (at least ``count`` elements); slice it."""
        if self._pinned and count <= self.array.size:
            return self.array
        want = _grown(count, self.array.size if self._pinned else 0)
        try:
            array = cuda.pagelocked_empty(want, self.dtype)
        except (cuda.MemoryError, MemoryError, ValueError):
            try:
                array = cuda.pagelocked_empty(max(count, 1), self.dtype)
            except (cuda.MemoryError, MemoryError, ValueError) as exc:
                raise BackendError(
                    "out_of_memory",
                    f"cannot allocate {count * self.dtype.itemsize} bytes of pinned host "
                    f"memory for {self.what}: {exc}",
                ) from exc
        self.free()
        self.array = array
        self.ptr = int(array.ctypes.data)
        self._pinned = True
        return array

    def free(self) -> None:
        # Freed explicitly, in the owning thread: PyCUDA cannot free pinned memory from
        # another thread, which is where the garbage collector might drop the last view.
        if self._pinned:
            try:
                self.array.base.free()  # type: ignore[union-attr]
            except cuda.Error:
                pass
            self.array = np.empty(0, self.dtype)
            self.ptr = 0
            self._pinned = False


# -- device arrays and user modules ---------------------------------------------------------


class CudaArray:
    """A device array of the general path: ``size`` elements of ``dtype`` (``nbytes`` bytes)
    in a block of the pool of the device that made it (the block may be larger: its size
    class). An empty one holds no block (the driver makes no zero-byte blocks) and passes a
    null pointer to kernels."""

    __slots__ = ("_block", "_freed", "dtype", "nbytes", "size")

    def __init__(self, block: Block | None, dtype: np.dtype[Any], size: int) -> None:
        self._block = block
        self._freed = False
        self.dtype = dtype
        self.size = size
        self.nbytes = size * dtype.itemsize

    @property
    def ptr(self) -> int:
        """The device address (0 for an empty array)."""
        if self._freed:
            raise BackendError("invalid_value", "a device array was used after it was freed")
        return 0 if self._block is None else self._block.ptr

    def __repr__(self) -> str:
        state = " freed" if self._freed else ""
        return f"<CudaArray {self.dtype.name}[{self.size}]{state}>"


class StagedArray(CudaArray):
    """A device array inside the device's input staging (``CudaDevice.stage_in``), valid
    until the staging is written again: it holds no block, so ``free`` leaves it be."""

    __slots__ = ("_at",)

    def __init__(self, at: int, dtype: np.dtype[Any], size: int) -> None:
        super().__init__(None, dtype, size)
        self._at = at

    @property
    def ptr(self) -> int:
        if self._freed:
            raise BackendError("invalid_value", "a device array was used after it was freed")
        return self._at if self.size else 0


#: Operands at least this large are copied into the staging by several threads at once: an
#: operand in shared memory faults its pages in as it is read, and one thread doing all of
#: it was most of a large job's time in the worker.
PARALLEL_PACK_MIN = 16 << 20
_PACK_THREADS = min(8, os.cpu_count() or 1)
_packers: ThreadPoolExecutor | None = None


#: A chunk of a pipelined copy (``backends/pipeline.py``) at least this large is packed in parallel.
PARALLEL_CHUNK_MIN = 2 << 20


def pack(dst: np.ndarray, src: np.ndarray, parallel_min: int = PARALLEL_PACK_MIN) -> None:
    """``np.copyto(dst, src)``, in parallel slices for a large one (numpy lets go of the GIL
    while it copies)."""
    global _packers
    if src.nbytes < parallel_min or src.ndim != 1:
        np.copyto(dst, src)
        return
    if _packers is None:
        _packers = ThreadPoolExecutor(_PACK_THREADS, thread_name_prefix="erlcuda-pack")
    step = -(-src.size // _PACK_THREADS)
    jobs = [_packers.submit(np.copyto, dst[i : i + step], src[i : i + step])
            for i in range(0, src.size, step)]
    for job in jobs:
        job.result()


def pack_chunk(dst: np.ndarray, src: np.ndarray) -> None:
    """``pack`` for one chunk of a pipelined copy: in parallel from ``PARALLEL_CHUNK_MIN``."""
    pack(dst, src, PARALLEL_CHUNK_MIN)


class CudaPinner:
    """Registers host memory with the driver (``cuMemHostRegister``), read-only where the
    memory is mapped read-only (``hostmem.Pinner``), in the calling thread's context.

    The driver is called through ctypes: PyCUDA's ``register_host_memory`` wraps a new
    numpy array around the memory, which numpy 2 refuses for a view (its base is set once),
    and the memory registered here is always a view of a mapping."""

    #: CU_MEMHOSTREGISTER_READ_ONLY: PyCUDA names only PORTABLE and DEVICEMAP.
    READ_ONLY = 0x08

    def __init__(self) -> None:
        self._register, self._unregister = _host_register_calls()

    def pin(self, view: np.ndarray) -> Callable[[], None]:
        if self._register is None or self._unregister is None:
            raise PinError("the CUDA driver library could not be loaded for host registration")
        flags = 0 if view.flags.writeable else self.READ_ONLY
        start = address(view)
        status = self._register(start, int(view.nbytes), flags)
        if status != 0:
            raise PinError(f"cuMemHostRegister of {view.nbytes} bytes failed: CUDA error "
                           f"{status}")
        unregister = self._unregister

        def unpin() -> None:
            unregister(start)  # a failure leaves nothing to undo: the context went first

        return unpin


def _host_register_calls() -> tuple[Any, Any]:
    """``cuMemHostRegister_v2`` and ``cuMemHostUnregister`` of the driver library, or
    ``(None, None)`` where it cannot be loaded."""
    name = ctypes.util.find_library("cuda") or "libcuda.so.1"
    try:
        lib = ctypes.CDLL(name)
        register, unregister = lib.cuMemHostRegister_v2, lib.cuMemHostUnregister
    except (OSError, AttributeError):
        return None, None
    register.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_uint]
    register.restype = ctypes.c_int
    unregister.argtypes = [ctypes.c_void_p]
    unregister.restype = ctypes.c_int
    return register, unregister


#: Packs a batch's operands into the input staging: ``fill(host_in, second_at)``, the
#: second operands (if any) starting at element ``second_at``.
Fill = Callable[[np.ndarray, int], None]


def fill_blocks(a: np.ndarray, b: np.ndarray | None) -> Fill:
    """The fill of a uniform batch: each block copied at once, rows one after another."""

    def fill(host_in: np.ndarray, second_at: int) -> None:
        count, size = a.shape
        np.copyto(host_in[: count * size].reshape(count, size), a)
        if b is not None:
            rows, width = b.shape
            np.copyto(host_in[second_at : second_at + rows * width].reshape(rows, width), b)

    return fill


# -- the backend ---------------------------------------------------------------------------
