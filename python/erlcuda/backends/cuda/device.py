"""``CudaDevice``: one CUDA context, stream and set of staging buffers, owned by the thread
that opens it; its batched runs, general-path arrays, built-ins and user modules."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import pycuda.driver as cuda

from ...compile import arch_of
from ...hostmem import Addresses, Pinning, address
from ...kernels import F32, Plan, UniformPlans
from ..base import (
    STAGE_MAX,
    BackendError,
    BackendUnavailable,
    Device,
    Result,
    stage_layout,
)
from ..in_place import (
    IN_PLACE_MAX,
    IN_PLACE_SIZES,
    InPlaceTiming,
    choose_in_place_max,
    time_both,
)
from ..pipeline import (
    CALIBRATION_SIZES,
    NEVER,
    PINNED_MIN,
    PIPELINE_MIN,
    Chunks,
    Download,
    Pipeline,
    Timing,
    Upload,
)
from ..pool import DevicePool, default_limit, size_class
from ..quick import Quick, Quicks
from ..replays import REPLAY_MAX_ELEMENTS, Replays
from .context import (
    cuda_errors,
    is_oom,
    to_backend_error,
)
from .graphs import graphs_for
from .kernels import (
    BLOCK_1D,
    BUILTIN_ARITY,
    F64,
    FUNCTIONS,
    MATMUL_BK,
    MATMUL_F64_TILE,
    MATMUL_THREADS,
    MATMUL_TILE,
    MAX_GRID_X,
    MAX_GRID_Z,
    PACK_ALIGN,
    REDUCE_BLOCKS_PER_SM,
    REDUCE_ELEMENTS_PER_THREAD,
    SCALAR_FORMATS,
    SEGMENT_MAX,
    TRANSFER_CHUNK,
    VECTOR_ADD_BLOCKS_PER_SM,
    Kernel,
)
from .transfers import (
    CudaArray,
    CudaPinner,
    DeviceBuffer,
    Fill,
    HostBuffer,
    StagedArray,
    ceil_div,
    fill_blocks,
    pack,
    pack_chunk,
    round_up,
)


class _UserModule:
    """A loaded cubin, its functions by name, and the argument format each is prepared for."""

    __slots__ = ("formats", "functions", "module")

    def __init__(self, module: cuda.Module, functions: dict[str, cuda.Function]) -> None:
        self.module = module
        self.functions = functions
        self.formats: dict[str, str] = {}


def _vector(operand: object, kernel: str) -> CudaArray:
    if not isinstance(operand, CudaArray):
        raise BackendError("invalid_value", f"{kernel}: expected a device array, got "
                           f"{type(operand).__name__}")
    return operand


def _dim(operand: object, kernel: str) -> int:
    if not isinstance(operand, (int, np.integer)) or isinstance(operand, bool) or operand < 0:
        raise BackendError("invalid_value", f"{kernel}: expected a dim, got {operand!r:.40}")
    return int(operand)


def _same(kernel: str, arrays: Sequence[CudaArray], sizes: Sequence[int]) -> None:
    """Every array of one dtype, and of the size given for it."""
    for array, size in zip(arrays, sizes, strict=True):
        if array.dtype != arrays[0].dtype:
            raise BackendError("invalid_value", f"{kernel}: operands of types "
                               f"{arrays[0].dtype.name} and {array.dtype.name}")
        if array.size != size:
            raise BackendError("invalid_value", f"{kernel}: an operand of {array.size} "
                               f"elements where {size} are needed")




# -- the device ----------------------------------------------------------------------------


def _b(request: Plan) -> np.ndarray:
    assert request.b is not None, f"{request.kernel} needs two operands"
    return request.b


def _raise_fatal(exc: Exception) -> None:
    """Raise ``exc`` as its ``BackendError`` where it poisoned the context (a measurement
    at open that faulted): the device is lost, not merely unmeasured."""
    error = to_backend_error(exc)
    if error.fatal:
        raise error from exc


class CudaDevice(Device):
    """One GPU: a context current in the opening thread, a stream, kernels and staging.

    Every method must be called from the thread that created the device.
    """

    calibration: list[Timing] = []  # noqa: RUF012 - replaced per device, never mutated
    calibration_error: str | None = None
    #: The most operand elements a job runs in place with (``in_place.py``), and the
    #: figures that chose it; 0 where the device takes no host pointers.
    in_place_max = 0
    in_place_timings: list[InPlaceTiming] = []  # noqa: RUF012 - replaced per device
    in_place_error: str | None = None

    def __init__(self, index: int, cubins: Mapping[str, bytes]) -> None:
        """Make the context (pushed on this thread's stack) and load the kernels."""
        self.index = index
        self._closed = False
        with cuda_errors():
            self._dev = cuda.Device(index)
            self._ctx = self._make_context()
        try:
            with cuda_errors():
                self._setup(cubins)
        except BaseException:
            self._release_context()
            raise

    def _make_context(self) -> cuda.Context:
        """A context of the device's own, current on this thread (pushed on its stack).

        A subclass may return another one that it has pushed: ``close`` pops it and detaches
        it. (The benchmarks use the primary context there, to share it with CuPy.)
        """
        return self._dev.make_context()

    def _setup(self, cubins: Mapping[str, bytes]) -> None:
        attribute = cuda.device_attribute
        self._sm_count = int(self._dev.get_attribute(attribute.MULTIPROCESSOR_COUNT))
        # Whether kernels may read and write pinned host memory, allocated or registered, at
        # its host addresses (unified addressing): small jobs then skip their copies. A job
        # in slots runs on them in place on its lane's word that they are registered, which
        # holds: slots are registered and released only on this thread.
        self._host_pointers = bool(
            self._dev.get_attribute(attribute.UNIFIED_ADDRESSING)
            and self._dev.get_attribute(attribute.CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM))
        self._modules = {stem: cuda.module_from_buffer(cubin) for stem, cubin in cubins.items()}
        self._fn: dict[str, Kernel] = {}
        for name, (stem, signature) in FUNCTIONS.items():
            if stem not in self._modules:
                raise BackendUnavailable(f"kernel file {stem}.cu was not compiled")
            self._fn[name] = Kernel(self._modules[stem].get_function(name), signature)
        self._stream = cuda.Stream()
        # The general path's device arrays; the staging below is not pooled, but empties the
        # pool's cache before it fails for lack of memory.
        self._pool = DevicePool(self._raw_alloc, self._raw_free,
                                limit=default_limit(int(self._dev.total_memory())),
                                is_oom=is_oom)
        # 8 bytes a block: f64 partials too.
        self._partials = cuda.mem_alloc(self._sm_count * REDUCE_BLOCKS_PER_SM * 8)
        reclaim = self._pool.flush
        self._dev_in = DeviceBuffer("input staging", reclaim=reclaim)
        self._dev_out = DeviceBuffer("output staging", reclaim=reclaim)
        self._dev_offsets = DeviceBuffer("segment offsets", np.int64, reclaim=reclaim)
        # The equal segments whose offsets the device holds (count, size), if any.
        self._offsets_of: tuple[int, int] | None = None
        self._host_in = HostBuffer("input staging")
        self._host_out = HostBuffer("output staging")
        self._host_offsets = HostBuffer("segment offsets", np.int64)
        # The general path: a scalar result, pinned transfer chunks and their copies' events,
        # and the user modules by name.
        self._scalar = cuda.mem_alloc(8)
        self._scalar_host = cuda.pagelocked_empty(1, F64)
        self._host_chunks = (HostBuffer("transfer chunk", np.uint8),
                             HostBuffer("transfer chunk", np.uint8))
        self._chunk_copied = (cuda.Event(), cuda.Event())
        self._user: dict[str, _UserModule] = {}
        # Programs: the architecture fused kernels are compiled for, and graphs of the stream.
        major, minor = self._dev.compute_capability()
        self.arch = arch_of((int(major), int(minor)))
        self.graphs = graphs_for(self._stream)
        self._replays = Replays(self.graphs)
        self._quicks = Quicks(self._replays)
        # Large lone jobs: chunked copies on two streams, straight from and into the host
        # memory registered here (backends/pipeline.py), staged through pinned chunks otherwise.
        self.pinning = Pinning(CudaPinner())
        self._addresses = Addresses()  # of a lone job's slots, run in place again and again
        self._stream2 = cuda.Stream()
        self._pipeline_chunks = Chunks(lambda n: cuda.pagelocked_empty(n, np.uint8))
        self._pipeline = Pipeline(cuda, (self._stream, self._stream2), self._pipeline_chunks,
                                  self.pinning, pack_chunk)
        self.calibrate()
        self.in_place_max = self._measure_in_place()

    def calibrate(self, sizes: Sequence[int] = CALIBRATION_SIZES) -> list[Timing]:
        """Time the copies of a fresh mapping at each size (``pipeline.Timing``): staged,
        registered for the one copy, registered beforehand; the pipeline then registers a
        job's own operand files from the size where that beat staging (done once at open;
        again here with other sizes). No figures where the device has no room now."""
        try:
            scratch = cuda.mem_alloc(max(sizes))
        except cuda.Error:
            return []  # no room now: fresh mappings are staged
        try:
            self.calibration = self._pipeline.calibrate(int(scratch), sizes)
        except Exception as exc:  # no figures is no reason to lose the device: staged
            _raise_fatal(exc)
            self.calibration = []
            self._pipeline.register_min = NEVER
            self.calibration_error = f"{type(exc).__name__}: {exc}"
        finally:
            scratch.free()
        return self.calibration

    # -- Device API ------------------------------------------------------------------------

    def _run_batch(self, kernel: str, requests: Sequence[Plan]) -> list[Result]:
        if self._closed:
            raise BackendError("invalid_value", "device is closed")
        if not requests:
            return []
        if len(requests) == 1:
            quick = self._quicks.find((kernel, requests[0].a.size), self._staging())
            if quick is not None and not self._lone(requests):
                return [self._run_quick(quick, requests[0])]
        for r in requests:
            if r.key != requests[0].key or r.kernel != kernel:
                raise BackendError("invalid_value", "a batch mixes kernels or matmul shapes")
        with cuda_errors():
            if kernel == "vector_add":
                if self._lone(requests):
                    return [self._vector_add_lone(requests[0], None)]
                return self._vector_add(requests)
            if kernel in ("reduce", "dot_product"):
                dot = kernel == "dot_product"
                if self._lone(requests):
                    return [self._sum_lone(requests[0], dot=dot)]
                return self._reduce(requests, dot=dot)
            if kernel == "matmul":
                return self._matmul(requests)
        raise BackendError("not_supported", f"unknown kernel {kernel!r}")

    def _run_batch_into(self, kernel: str, requests: Sequence[Plan],
                        into: Sequence[np.ndarray | None],
                        registered: bool = False) -> list[Result]:
        target = into[0] if len(requests) == 1 else None
        if (kernel == "vector_add" and target is not None and not self._closed
                and target.size == requests[0].a.size):
            with cuda_errors():
                return [self._vector_add_lone(requests[0], target, registered)]
        return super()._run_batch_into(kernel, requests, into)

    def _run_quick(self, quick: Quick, r: Plan) -> Result:
        """A lone small job by its kernel and size's replay (``quick.py``)."""
        try:
            np.copyto(quick.ins[0], r.a)
            if len(quick.ins) > 1:
                np.copyto(quick.ins[1], _b(r))
            self._replays.launch(quick.handle)
            self._stream.synchronize()
        except (cuda.Error, MemoryError) as exc:
            raise to_backend_error(exc) from exc
        return float(quick.out[0]) if quick.scalar else quick.out

    def _lone(self, requests: Sequence[Plan]) -> bool:
        """Whether a batch is one job that the pipeline runs: large, or with an operand in
        registered host memory (only ever one of shared memory's sizes)."""
        if len(requests) != 1:
            return False
        r = requests[0]
        nbytes = r.a.nbytes + (0 if r.b is None else r.b.nbytes)
        if nbytes >= PIPELINE_MIN:
            return True
        if nbytes < PINNED_MIN or not self.pinning.count:
            return False
        return any(self.pinning.covers(x) for x in (r.a, r.b) if x is not None)

    def info(self) -> dict[str, Any]:
        with cuda_errors():
            free, _total = cuda.mem_get_info()
            major, minor = self._dev.compute_capability()
            return {
                "name": str(self._dev.name()),
                "total_memory": int(self._dev.total_memory()),
                "free_memory": int(free),
                "compute_capability": (int(major), int(minor)),
                # Device memory the pool keeps for reuse: neither free nor leaked.
                "pool_bytes": self._pool.cached_bytes,
                # Host memory registered now (operand slots, result buffers), and the size
                # from which a job's own operand file is registered for its copy.
                "pinned_bytes": self.pinning.bytes,
                "register_min": self._pipeline.register_min,
                # The most operand elements a small job runs in place with, as measured.
                "in_place_max": self.in_place_max,
            }

    def close(self) -> None:
        """Free the buffers and pop and release the context. Safe after a fatal error."""
        if self._closed:
            return
        self._closed = True
        self.pinning.close()  # before the context: registrations belong to it
        self._quicks.clear()
        self._replays.close()
        self._pipeline_chunks.close(lambda buffer: buffer.base.free())
        self._pool.close()  # cached blocks and those of arrays never freed
        for buffer in (self._dev_in, self._dev_out, self._dev_offsets):
            buffer.free()
        for host in (self._host_in, self._host_out, self._host_offsets, *self._host_chunks):
            host.free()
        for alloc in (self._partials, self._scalar, self._scalar_host.base):
            try:
                alloc.free()  # type: ignore[union-attr]
            except cuda.Error:
                pass
        # Dropped while the context is current so that their destructors run here.
        self._user.clear()
        self._fn.clear()
        self._modules.clear()
        del self._chunk_copied
        del self._pipeline
        del self._stream2
        del self._stream
        self._release_context()

    def _release_context(self) -> None:
        # Pop first: PyCUDA aborts at exit if a context is left on a thread's stack.
        try:
            self._ctx.pop()
        except cuda.Error:
            pass
        try:
            self._ctx.detach()
        except cuda.Error:
            pass

    # -- the general path: device arrays -----------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise BackendError("invalid_value", "device is closed")

    def alloc(self, dtype: np.dtype[Any], count: int, *, zero: bool) -> CudaArray:
        self._check_open()
        dtype = np.dtype(dtype)
        if dtype.kind not in "biuf":
            raise BackendError("invalid_value", f"no device arrays of {dtype}")
        if count < 0:
            raise BackendError("invalid_value", f"cannot allocate {count} elements")
        nbytes = count * dtype.itemsize
        if nbytes == 0:
            return CudaArray(None, dtype, count)
        try:
            if size_class(nbytes) >= 1 << 63:  # beyond size_t's conversion: no card has that
                raise MemoryError("no device has that much memory")
            block = self._pool.alloc(nbytes)  # cached, or new (after emptying the cache)
        except (cuda.MemoryError, MemoryError) as exc:
            raise BackendError(
                "out_of_memory", f"cannot allocate {nbytes} bytes of device memory: {exc}"
            ) from exc
        except cuda.Error as exc:
            raise to_backend_error(exc) from exc
        array = CudaArray(block, dtype, count)
        if zero:  # a reused block holds its last user's bytes: zeroed all the same
            try:
                with cuda_errors():
                    cuda.memset_d8_async(block.ptr, 0, nbytes, self._stream)
            except BackendError:
                self.free(array)
                raise
        return array

    def upload(self, host: np.ndarray) -> CudaArray:
        self._check_open()
        src = np.ascontiguousarray(host).reshape(-1)
        array = self.alloc(src.dtype, src.size, zero=False)
        if array.nbytes == 0:
            return array
        try:
            with cuda_errors():
                self._to_device(array.ptr, src.view(np.uint8))
        except BaseException:
            self.free(array)
            raise
        return array

    def download(self, array: Any) -> np.ndarray:
        self._check_open()
        array = _vector(array, "download")
        out = np.empty(array.size, array.dtype)
        if array.nbytes > 0:
            with cuda_errors():
                self._from_device(out.view(np.uint8), array.ptr)
        return out

    def free(self, array: Any) -> None:
        """Give ``array``'s block back to the pool (cached for reuse, or really freed)."""
        array = _vector(array, "free")
        if array._freed:
            return
        block = array._block
        if block is not None and not self._closed and not self._pool.is_live(block):
            raise BackendError("invalid_value", "a device array of another device")
        array._freed = True
        array._block = None
        if block is None or self._closed:
            return  # a closed device's pool freed its memory
        # No wait: whatever the stream still does with the block comes before the work of
        # its next user, on the same stream; a block really freed waits (``_raw_free``).
        self._pool.free(block)

    @property
    def pool(self) -> DevicePool:
        """The pool of this device's general-path arrays, with its counters; a pool of a
        closed device raises ``PoolClosed`` on use."""
        return self._pool

    def _raw_alloc(self, nbytes: int) -> cuda.DeviceAllocation:
        return cuda.mem_alloc(nbytes)

    def _raw_free(self, alloc: cuda.DeviceAllocation) -> None:
        try:
            # Work queued on the stream may still use the memory.
            self._stream.synchronize()
        except cuda.Error:
            pass  # a poisoned context: the call that poisoned it has reported it
        try:
            alloc.free()
        except cuda.Error:
            pass

    def _chunks(self, nbytes: int) -> tuple[int, tuple[np.ndarray, np.ndarray]]:
        """The chunk size of a transfer of ``nbytes`` and the two pinned buffers it uses in
        turn (one and the same where a single chunk will do)."""
        chunk = min(nbytes, TRANSFER_CHUNK)
        first = self._host_chunks[0].ensure(chunk)
        second = self._host_chunks[1].ensure(chunk) if nbytes > chunk else first
        return chunk, (first, second)

    def _to_device(self, ptr: int, data: np.ndarray) -> None:
        """Copy the bytes ``data`` to device address ``ptr``; returns when they are there.
        Registered host memory (an operand slot's) is copied from where it lies, at the
        bus's speed; any other goes through the pinned chunks."""
        if self.pinning.count and self.pinning.covers(data):
            cuda.memcpy_htod_async(ptr, data, self._stream)
            self._stream.synchronize()
            return
        nbytes = data.size
        chunk, buffers = self._chunks(nbytes)
        for index, start in enumerate(range(0, nbytes, chunk)):
            slot = index % 2
            if index >= 2:
                self._chunk_copied[slot].synchronize()  # its buffer's last copy is done
            size = min(chunk, nbytes - start)
            staged = buffers[slot][:size]
            pack(staged, data[start : start + size])
            cuda.memcpy_htod_async(ptr + start, staged, self._stream)
            self._chunk_copied[slot].record(self._stream)
        self._stream.synchronize()

    def _from_device(self, data: np.ndarray, ptr: int) -> None:
        """Copy ``data.size`` bytes from device address ``ptr`` into ``data`` (after the work
        queued before on the stream)."""
        nbytes = data.size
        chunk, buffers = self._chunks(nbytes)
        starts = range(0, nbytes, chunk)

        def fetch(index: int) -> None:
            slot = index % 2
            size = min(chunk, nbytes - starts[index])
            cuda.memcpy_dtoh_async(buffers[slot][:size], ptr + starts[index], self._stream)
            self._chunk_copied[slot].record(self._stream)

        fetch(0)
        for index, start in enumerate(starts):
            if index + 1 < len(starts):
                fetch(index + 1)  # into the other buffer, emptied in the previous step
            slot = index % 2
            self._chunk_copied[slot].synchronize()
            size = min(chunk, nbytes - start)
            pack(data[start : start + size], buffers[slot][:size])

    def _read_scalar(self, dtype: np.dtype[Any]) -> float:
        """The scalar result at ``self._scalar`` (one ``dtype`` element), after the stream."""
        host = self._scalar_host.view(dtype)[:1]
        cuda.memcpy_dtoh_async(host, int(self._scalar), self._stream)
        self._stream.synchronize()
        return float(host[0])

    # -- the general path: catalogue kernels on device arrays --------------------------------

    def _run_bound(self, kernel: str, operands: Sequence[Any], out: Any | None) -> float | None:
        self._check_open()
        with cuda_errors():
            self._builtin(kernel, operands, out)
            if kernel in ("reduce", "dot_product"):
                return self._read_scalar(_vector(operands[0], kernel).dtype)
            self._stream.synchronize()
        return None

    def _builtin(self, kernel: str, operands: Sequence[Any], out: Any | None,
                 count: int = 1) -> None:
        """Queue a catalogue kernel on device arrays: ``count`` runs of one shape laid end
        to end. A sum goes into ``out`` (one per run), or into the scalar slot where
        ``out`` is ``None``."""
        arity = BUILTIN_ARITY
        if kernel not in arity:
            raise BackendError("not_supported", f"no built-in kernel {kernel!r:.40}")
        if len(operands) != arity[kernel]:
            raise BackendError("invalid_value", f"{kernel} takes {arity[kernel]} operands, "
                               f"got {len(operands)}")
        a = _vector(operands[0], kernel)
        if kernel == "copy":
            c = _vector(out, kernel)
            _same(kernel, [a, c], [a.size, a.size])
            if a.nbytes > 0:
                cuda.memcpy_dtod_async(c.ptr, a.ptr, a.nbytes, self._stream)
            return
        if a.dtype not in (F32, F64):
            raise BackendError("invalid_value", f"{kernel} takes f32 or f64 vectors, not "
                               f"{a.dtype.name}")
        f64 = a.dtype == F64
        if kernel == "vector_add":
            b, c = _vector(operands[1], kernel), _vector(out, kernel)
            _same(kernel, [a, b, c], [a.size] * 3)
            self.launch_vector_add(a.ptr, b.ptr, c.ptr, a.size, f64=f64)
            return
        if kernel == "matmul":
            b = _vector(operands[1], kernel)
            m, n, k = (_dim(d, kernel) for d in operands[2:])
            c = _vector(out, kernel)
            _same(kernel, [a, b, c], [count * m * k, count * k * n, count * m * n])
            self.launch_matmul(a.ptr, b.ptr, c.ptr, m, n, k, count, f64=f64)
            return
        dot = kernel == "dot_product"
        y = _vector(operands[1], kernel) if dot else a
        _same(kernel, [a, y], [a.size, a.size])
        target = int(self._scalar) if out is None else _vector(out, kernel).ptr
        if count == 1:
            self.launch_reduce(a.ptr, y.ptr, a.size, target, dot=dot, f64=f64)
        else:
            self._sums_of_runs(a, y, count, target, dot=dot)

    def _sums_of_runs(self, a: CudaArray, y: CudaArray, count: int, target: int, *,
                      dot: bool) -> None:
        """Queue the sums of ``count`` equal segments of ``a`` (dot: of products with
        ``y``) into ``count`` elements at ``target``: one block per segment where they are
        small f32 ones, else one two-pass reduction each."""
        size = a.size // count
        item = a.dtype.itemsize
        if a.dtype == F32 and 0 < size <= SEGMENT_MAX:
            if self._offsets_of != (count, size):  # else the device holds these already
                self._stream.synchronize()  # the offsets' staging may still be read
                host = self._host_offsets.ensure(count + 1)[: count + 1]
                host[:] = np.arange(count + 1, dtype=np.int64) * size
                self._dev_offsets.ensure(count + 1)
                cuda.memcpy_htod_async(self._dev_offsets.ptr, host, self._stream)
                self._offsets_of = (count, size)
            self.launch_segments(a.ptr, y.ptr, self._dev_offsets.ptr, count, target, dot=dot)
            return
        for r in range(count):
            at = r * size * item
            self.launch_reduce(a.ptr + at, y.ptr + at, size, target + r * item, dot=dot,
                               f64=a.dtype == F64)

    # -- programs: queued work, waited for once -------------------------------------------

    def enqueue(self, plan: Plan, bound: Sequence[Any], out: Any | None = None,
                count: int = 1) -> None:
        self._check_open()
        with cuda_errors():
            if plan.user is None:
                self._builtin(plan.kernel, bound, out, count)
                return
            assert plan.geometry is not None
            grid, block, shared = plan.geometry
            self._launch_user(plan.user.module, plan.user.name, bound, grid, block, shared)

    def synchronize(self) -> None:
        self._check_open()
        with cuda_errors():
            self._stream.synchronize()

    def stage_in(self, hosts: Sequence[np.ndarray]) -> list[Any]:
        """Small inputs go through the input staging with one copy (views of it, as a
        batched run's operands are); large ones as ``upload`` sends them, in chunks."""
        self._check_open()
        srcs = [np.ascontiguousarray(h).reshape(-1) for h in hosts]
        at, total = stage_layout([s.nbytes for s in srcs])
        if total > STAGE_MAX:
            return [self.upload(src) for src in srcs]
        with cuda_errors():
            self._dev_in.ensure(total // 4 + 1)
            staged = self._host_in.ensure(total // 4 + 1).view(np.uint8)
            for src, start in zip(srcs, at, strict=True):
                pack(staged[start : start + src.nbytes], src.view(np.uint8))
            base = self._dev_in.ptr
            if total:
                cuda.memcpy_htod_async(base, staged[:total], self._stream)
        return [StagedArray(base + start, src.dtype, src.size)
                for src, start in zip(srcs, at, strict=True)]

    def stage_into(self, arrays: Sequence[Any], hosts: Sequence[np.ndarray]) -> None:
        self._check_open()
        targets = [_vector(a, "stage") for a in arrays]
        srcs = [np.ascontiguousarray(h).reshape(-1) for h in hosts]
        for target, src in zip(targets, srcs, strict=True):
            if src.dtype != target.dtype or src.size != target.size:
                raise BackendError("invalid_value", f"{src.size} {src.dtype} elements into "
                                   f"{target.size} {target.dtype}")
        at, total = stage_layout([s.nbytes for s in srcs])
        with cuda_errors():
            if total > STAGE_MAX:
                for target, src in zip(targets, srcs, strict=True):
                    if target.nbytes:
                        self._to_device(target.ptr, src.view(np.uint8))
                return
            staged = self._host_in.ensure(total // 4 + 1).view(np.uint8)
            for target, src, start in zip(targets, srcs, at, strict=True):
                if target.nbytes:
                    pack(staged[start : start + src.nbytes], src.view(np.uint8))
                    cuda.memcpy_htod_async(target.ptr, staged[start : start + src.nbytes],
                                           self._stream)

    def stage_out(self, arrays: Sequence[Any]) -> list[np.ndarray]:
        """Small outputs come back through the output staging, one copy each and one wait
        for all; large ones as ``download`` fetches them."""
        self._check_open()
        found = [_vector(a, "download") for a in arrays]
        at, total = stage_layout([a.nbytes for a in found])
        if total > STAGE_MAX:
            return [self.download(a) for a in found]
        with cuda_errors():
            staged = self._host_out.ensure(total // 4 + 1).view(np.uint8)
            for array, start in zip(found, at, strict=True):
                if array.nbytes:
                    cuda.memcpy_dtoh_async(staged[start : start + array.nbytes], array.ptr,
                                           self._stream)
            self._stream.synchronize()
        return [staged[start : start + a.nbytes].view(a.dtype).copy()
                for a, start in zip(found, at, strict=True)]

    def host_buffer(self, nbytes: int) -> np.ndarray:
        self._check_open()
        with cuda_errors():
            return cuda.pagelocked_empty(max(1, nbytes), np.uint8)

    def release_host(self, host: np.ndarray) -> None:
        try:
            host.base.free()  # type: ignore[union-attr]
        except (AttributeError, cuda.Error):
            pass

    def copy_in(self, array: Any, host: np.ndarray) -> None:
        self._check_open()
        array = _vector(array, "copy")
        if array.nbytes:
            with cuda_errors():
                cuda.memcpy_htod_async(array.ptr, host, self._stream)

    def copy_out(self, host: np.ndarray, array: Any) -> None:
        self._check_open()
        array = _vector(array, "copy")
        if array.nbytes:
            with cuda_errors():
                cuda.memcpy_dtoh_async(host, array.ptr, self._stream)

    def copy_into(self, array: Any, source: Any) -> None:
        self._check_open()
        array, source = _vector(array, "copy"), _vector(source, "copy")
        _same("copy", [source, array], [source.size, source.size])
        if array.nbytes:
            with cuda_errors():
                cuda.memcpy_dtod_async(array.ptr, source.ptr, array.nbytes, self._stream)

    def zero(self, array: Any) -> None:
        self._check_open()
        array = _vector(array, "zero")
        if array.nbytes:
            with cuda_errors():
                cuda.memset_d8_async(array.ptr, 0, array.nbytes, self._stream)

    # -- the general path: user modules ------------------------------------------------------

    def load_module(self, name: str, image: bytes, functions: Sequence[str]) -> None:
        self._check_open()
        try:
            module = cuda.module_from_buffer(image)
            found = {f: module.get_function(f) for f in functions}
        except cuda.Error as exc:
            error = to_backend_error(exc)
            if error.fatal or error.code == "out_of_memory":
                raise error from exc
            raise BackendError("invalid_value",
                               f"cannot load module {name}: {error.message}") from exc
        # The old module (if any) is unloaded here, in this thread, as its last references go.
        self._user[name] = _UserModule(module, found)

    def unload_module(self, name: str) -> None:
        self._user.pop(name, None)

    def launch_user(self, module: str, function: str, args: Sequence[Any],
                    grid: tuple[int, int, int], block: tuple[int, int, int],
                    shared: int) -> None:
        self._check_open()
        with cuda_errors():
            self._launch_user(module, function, args, grid, block, shared)
            self._stream.synchronize()

    def _launch_user(self, module: str, function: str, args: Sequence[Any],
                     grid: tuple[int, int, int], block: tuple[int, int, int],
                     shared: int) -> None:
        """Queue ``function`` of a loaded module on the stream."""
        loaded = self._user.get(module)
        if loaded is None:
            raise BackendError("invalid_value", f"module {module!r:.60} is not loaded")
        fn = loaded.functions.get(function)
        if fn is None:
            raise BackendError("invalid_value", f"module {module!r:.60} has no function "
                               f"{function!r:.60}")
        codes: list[str] = []
        values: list[int | float] = []
        for arg in args:
            if isinstance(arg, CudaArray):
                codes.append("P")
                values.append(arg.ptr)
            elif isinstance(arg, np.generic) and arg.dtype.str[1:] in SCALAR_FORMATS:
                codes.append(SCALAR_FORMATS[arg.dtype.str[1:]])
                values.append(arg.item())
            else:
                raise BackendError("invalid_value", f"{function}: cannot pass "
                                   f"{type(arg).__name__} to a kernel")
        fmt = "".join(codes)
        try:
            with cuda_errors():
                if loaded.formats.get(function) != fmt:
                    fn.prepare(fmt)
                    loaded.formats[function] = fmt
                if shared > 48 * 1024:  # more dynamic shared memory than a launch gets unasked
                    fn.set_attribute(cuda.function_attribute.MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                     shared)
                fn.prepared_async_call(tuple(int(g) for g in grid),
                                       tuple(int(b) for b in block), self._stream, *values,
                                       shared_size=int(shared))
        except (OverflowError, TypeError, ValueError) as exc:  # a geometry out of C's range
            raise BackendError("invalid_value", f"cannot launch {function}: {exc}") from exc

    # -- staging ---------------------------------------------------------------------------

    def _ensure_capacity(self, in_elements: int, out_elements: int, offsets: int = 0) -> None:
        """Grow the staging to ``in_elements`` f32 inputs, ``out_elements`` f32 outputs and
        ``offsets`` int64 segment offsets. Device memory first: a request too big for the
        card then fails fast, before any large pinned host allocation is tried."""
        self._dev_in.ensure(in_elements)
        self._dev_out.ensure(out_elements)
        if offsets:
            self._dev_offsets.ensure(offsets)
        self._host_in.ensure(in_elements)
        self._host_out.ensure(out_elements)
        if offsets:
            self._host_offsets.ensure(offsets)

    def _fetch(self, count: int) -> np.ndarray:
        """Copy ``count`` f32 results from the device's output staging, wait for the stream,
        and return them (a view of pinned memory)."""
        out = self._host_out.array[:count]
        cuda.memcpy_dtoh_async(out, self._dev_out.ptr, self._stream)
        self._stream.synchronize()
        return out

    # -- launches (also used by bench/gpu_kernels.py on device pointers) --------------------

    @property
    def stream(self) -> cuda.Stream:
        return self._stream

    @property
    def sm_count(self) -> int:
        return self._sm_count

    def launch_vector_add(self, a: int, b: int, c: int, n: int, *, f64: bool = False,
                          stream: cuda.Stream | None = None) -> None:
        """Enqueue c[i] = a[i] + b[i] for i < n on ``stream`` (the device's by default;
        device addresses of f32 elements, or f64 ones if ``f64``)."""
        if n <= 0:
            return
        per_thread = 2 if f64 else 4  # a double2 or a float4 per loop step
        blocks = min(
            ceil_div(ceil_div(n, per_thread), BLOCK_1D),
            self._sm_count * VECTOR_ADD_BLOCKS_PER_SM,
        )
        self._fn["vector_add_f64" if f64 else "vector_add"](
            (blocks, 1, 1), (BLOCK_1D, 1, 1), self._stream if stream is None else stream,
            a, b, c, n
        )

    def launch_reduce(self, x: int, y: int, n: int, out: int, *, dot: bool,
                      f64: bool = False) -> None:
        """Enqueue the two-pass reduction: ``*out`` = sum of x[i] (dot: x[i] * y[i]) for
        i < n, written as 0.0 when n == 0. ``y`` is ignored unless ``dot``. f32 elements
        summed in f32, or (``f64``) f64 ones in f64."""
        blocks = min(
            ceil_div(n, BLOCK_1D * REDUCE_ELEMENTS_PER_THREAD),
            self._sm_count * REDUCE_BLOCKS_PER_SM,
        )
        partials = int(self._partials)
        suffix = "_f64" if f64 else ""
        if blocks > 0:
            self._fn[("dot_partial" if dot else "reduce_partial") + suffix](
                (blocks, 1, 1), (BLOCK_1D, 1, 1), self._stream, x, y, n, partials
            )
        self._fn["reduce_final" + suffix](
            (1, 1, 1), (BLOCK_1D, 1, 1), self._stream, partials, blocks, out
        )

    def launch_segments(
        self, x: int, y: int, offsets: int, nseg: int, out: int, *, dot: bool
    ) -> None:
        """Enqueue out[s] = sum over segment s (offsets: nseg + 1 int64s on the device)."""
        if nseg <= 0:
            return
        if nseg > MAX_GRID_X:
            raise BackendError("invalid_value", f"{nseg} segments exceed the grid limit")
        self._fn["dot_segments" if dot else "reduce_segments"](
            (nseg, 1, 1), (BLOCK_1D, 1, 1), self._stream, x, y, offsets, nseg, out
        )

    def launch_matmul(self, a: int, b: int, c: int, m: int, n: int, k: int, batch: int = 1,
                      *, f64: bool = False) -> None:
        """Enqueue C = A B for ``batch`` stacked jobs (A: m x k, B: k x n, C: m x n each,
        contiguous; f32, or f64 if ``f64``). Nothing happens when m, n or batch is 0; k == 0
        writes zeros."""
        if m <= 0 or n <= 0 or batch <= 0:
            return
        tile = MATMUL_F64_TILE if f64 else MATMUL_TILE
        tiles = ceil_div(m, tile) * ceil_div(n, tile)
        if max(m, n, k) > MAX_GRID_X or tiles > MAX_GRID_X:
            raise BackendError("invalid_value", f"matmul {m}x{k} by {k}x{n} is too large")
        aligned = (
            not f64
            and m % MATMUL_TILE == 0
            and n % MATMUL_TILE == 0
            and k % MATMUL_BK == 0
            and k > 0
            and (a | b | c) % 16 == 0
        )
        if f64:
            fn = self._fn["matmul_f64"]
        else:
            fn = self._fn["matmul_aligned" if aligned else "matmul_checked"]
        item = 8 if f64 else 4
        for start in range(0, batch, MAX_GRID_Z):
            jobs = min(MAX_GRID_Z, batch - start)
            fn(
                (tiles, 1, jobs),
                (MATMUL_THREADS, 1, 1),
                self._stream,
                a + item * start * m * k,
                b + item * start * k * n,
                c + item * start * m * n,
                m,
                n,
                k,
            )

    # -- the kernels' batches --------------------------------------------------------------

    def execute_uniform(self, batch: UniformPlans) -> np.ndarray:
        if self._closed:
            raise BackendError("invalid_value", "device is closed")
        count, size = batch.a.shape
        with cuda_errors():
            if batch.kernel == "vector_add" and batch.b is not None:
                out, _ = self._add(count * size, fill_blocks(batch.a, batch.b))
                return out.reshape(count, size)
            if batch.kernel in ("reduce", "dot_product"):
                dot = batch.kernel == "dot_product"
                return self._sums([size] * count, fill_blocks(batch.a, batch.b), dot=dot)
            if batch.kernel == "matmul" and batch.b is not None:
                m, n, k = batch.m, batch.n, batch.k
                out = self._product(m, n, k, count, fill_blocks(batch.a, batch.b))
                return out.reshape(count, m * n)
        return super().execute_uniform(batch)

    # -- the kernels' batches --------------------------------------------------------------
    # Each packs its operands into the input staging (a fill function: the requests one by
    # one, or a uniform batch's blocks at once), then runs as one launch where it can.

    def _vector_add(self, requests: Sequence[Plan]) -> list[Result]:
        sizes = [int(r.a.size) for r in requests]
        starts = list(itertools.accumulate(sizes[:-1], initial=0))

        def fill(host_in: np.ndarray, b_at: int) -> None:
            for r, start, size in zip(requests, starts, sizes, strict=True):
                pack(host_in[start : start + size], r.a)
                pack(host_in[b_at + start : b_at + start + size], _b(r))

        out, replayed = self._add(sum(sizes), fill)
        if replayed is not None and len(requests) == 1:
            host_in, n = self._host_in.array, sizes[0]
            b_at = round_up(n, PACK_ALIGN)
            self._quicks.keep(("vector_add", n), self._staging(),
                              (host_in[:n], host_in[b_at : b_at + n]), out, replayed)
        return [out[start : start + size] for start, size in zip(starts, sizes, strict=True)]

    def _vector_add_lone(self, r: Plan, into: np.ndarray | None,
                         registered: bool = False) -> np.ndarray:
        """One vector_add run alone: its result in ``into`` (a result buffer) where given,
        else in the output staging; run straight on its memory where it is below the
        pipeline's size and all of it lies in registered memory (``registered``: known to,
        from ``execute``), else through the pipeline."""
        n = int(r.a.size)
        if n == 0:
            return np.empty(0, F32) if into is None else into
        b_at = round_up(n, PACK_ALIGN)
        d_in = self._dev_in.ensure(b_at + n)
        d_out = self._dev_out.ensure(n)
        if (into is not None and 8 * n < PIPELINE_MIN
                and (registered or self._registered(r.a, _b(r), into))):
            return self._vector_add_direct(r.a, _b(r), into, b_at)
        out = self._host_out.ensure(n)[:n] if into is None else into

        def compute(start: int, count: int, stream: cuda.Stream) -> None:
            self.launch_vector_add(d_in + 4 * start, d_in + 4 * (b_at + start),
                                   d_out + 4 * start, count, stream=stream)

        known = True if registered else None
        self._pipeline.run(n, [Upload(d_in, r.a, known), Upload(d_in + 4 * b_at, _b(r), known)],
                           compute, Download(d_out, out, True if into is None else known))
        return out

    def _registered(self, *hosts: np.ndarray) -> bool:
        """Whether every one of ``hosts`` lies whole in registered host memory (slots):
        contiguous, so that its bytes are those from its first on, as a kernel reads them
        in place and as ``covers`` counts them."""
        return bool(self.pinning.count) and all(
            h.flags.c_contiguous and self.pinning.covers(h) for h in hosts)

    def _vector_add_direct(self, a: np.ndarray, b: np.ndarray, into: np.ndarray,
                           b_at: int) -> np.ndarray:
        """A lone vector_add below the pipeline's size whose operands and result all lie in
        registered host memory (a job in slots, contiguous): run in place where the device
        takes host pointers (``_in_place``: every size below the pipeline's), else copied
        straight in and out on the stream; one wait. Not replayed as a graph: a graph's
        copies from registered memory measured slower than these calls
        (bench/lone_parts.py --slots)."""
        n = int(a.size)
        if self._in_place(n):
            at = self._addresses
            self.launch_vector_add(at(a), at(b), at(into), n)
        else:
            d_in, d_out = self._dev_in.ptr, self._dev_out.ptr
            cuda.memcpy_htod_async(d_in, a, self._stream)
            cuda.memcpy_htod_async(d_in + 4 * b_at, b, self._stream)
            self.launch_vector_add(d_in, d_in + 4 * b_at, d_out, n)
            cuda.memcpy_dtoh_async(into, d_out, self._stream)
        self._stream.synchronize()
        return into

    def _in_place(self, elements: int) -> bool:
        """Whether a job of ``elements`` f32 operands whose operands and result lie in
        pinned host memory runs there: its kernels read the operands over the bus and write
        the result back themselves, with no copy queued before or after them. Up to
        ``in_place_max``, measured as the device opened (0 without host pointers)."""
        return elements <= self.in_place_max

    def _measure_in_place(self) -> int:
        """``in_place.choose_in_place_max`` of vector_adds timed both ways at each of
        ``IN_PLACE_SIZES`` on pinned and device memory of their own, freed after: 0 (the
        copies) without host pointers, or where in place failed or computed other sums
        than the copies; ``IN_PLACE_MAX`` where there is no room to measure now (in place
        needs no device memory: as measured on the H200s). A fault that poisons the
        context is raised: the device cannot open."""
        if not self._host_pointers:
            return 0
        span = round_up(max(IN_PLACE_SIZES), PACK_ALIGN)
        try:
            host = cuda.pagelocked_empty(4 * span, F32)
        except (cuda.Error, MemoryError) as exc:
            self.in_place_error = f"no room to measure: {exc}"
            return IN_PLACE_MAX
        try:
            scratch = cuda.mem_alloc(3 * span * 4)
        except (cuda.Error, MemoryError) as exc:
            host.base.free()
            self.in_place_error = f"no room to measure: {exc}"
            return IN_PLACE_MAX
        try:
            self.in_place_timings = [self._time_in_place(host, int(scratch), span, n)
                                     for n in IN_PLACE_SIZES]
        except Exception as exc:  # no figures is no reason to lose the device: copies
            _raise_fatal(exc)
            self.in_place_timings = []
            self.in_place_error = f"{type(exc).__name__}: {exc}"
        finally:
            scratch.free()
            host.base.free()
        return choose_in_place_max(self.in_place_timings)

    def _time_in_place(self, host: np.ndarray, scratch: int, span: int,
                       n: int) -> InPlaceTiming:
        """A vector_add of ``n`` elements from ``host`` (operands packed as ``_add`` packs
        them; results at ``2 * span``, copied, and ``3 * span``, in place) timed both ways;
        in place as slow as never where its sums are not the copies'."""
        b_at = round_up(n, PACK_ALIGN)
        host[:n] = np.arange(n, dtype=F32) % 97
        host[b_at : b_at + n] = np.arange(n, dtype=F32) % 89
        copied, placed = host[2 * span : 2 * span + n], host[3 * span : 3 * span + n]
        h = address(host)
        stream = self._stream

        def copies() -> None:
            cuda.memcpy_htod_async(scratch, host[: b_at + n], stream)
            self.launch_vector_add(scratch, scratch + 4 * b_at, scratch + 8 * span, n)
            cuda.memcpy_dtoh_async(copied, scratch + 8 * span, stream)
            stream.synchronize()

        def in_place() -> None:
            self.launch_vector_add(h, h + 4 * b_at, h + 12 * span, n)
            stream.synchronize()

        copies_s, in_place_s = time_both(copies, in_place)
        copied[:], placed[:] = np.nan, np.nan  # each checked on a run of its own
        copies()
        in_place()
        right = np.array_equal(copied, placed) and np.array_equal(
            copied, host[:n] + host[b_at : b_at + n])
        return InPlaceTiming(n, copies_s, in_place_s if right else float("inf"))

    def _sum_lone(self, r: Plan, *, dot: bool) -> float:
        """One large reduce (dot: dot_product): its operands copied in through the
        pipeline, then the two-pass reduction."""
        n = int(r.a.size)
        if n == 0:
            return 0.0
        y_at = round_up(n, PACK_ALIGN)
        d_x = self._dev_in.ensure(y_at + n if dot else n)
        d_y = d_x + 4 * y_at if dot else d_x
        d_out = self._dev_out.ensure(1)
        self._host_out.ensure(1)
        uploads = [Upload(d_x, r.a)] + ([Upload(d_y, _b(r))] if dot else [])
        self._pipeline.run(n, uploads, None, None)
        self.launch_reduce(d_x, d_y, n, d_out, dot=dot)
        return float(self._fetch(1)[0])

    def _add(self, total: int, fill: Fill) -> tuple[np.ndarray, Any]:
        """The sums of the operands ``fill`` packs (a view of the output staging), and the
        graph that replayed the work where one did."""
        if total == 0:
            return np.empty(0, F32), None
        b_at = round_up(total, PACK_ALIGN)  # b's operands start here in the input staging
        self._ensure_capacity(b_at + total, total)
        host_in = self._host_in.array[: b_at + total]
        fill(host_in, b_at)
        d_in, d_out = self._dev_in.ptr, self._dev_out.ptr
        out = self._host_out.array[:total]
        in_place = self._in_place(total)

        def queue() -> None:
            if in_place:  # the staging is pinned: the kernel reads and writes it there
                h_in = self._host_in.ptr
                self.launch_vector_add(h_in, h_in + 4 * b_at, self._host_out.ptr, total)
                return
            cuda.memcpy_htod_async(d_in, host_in, self._stream)
            self.launch_vector_add(d_in, d_in + 4 * b_at, d_out, total)
            cuda.memcpy_dtoh_async(out, d_out, self._stream)

        return out, self._replayed(("add", total), total, queue)

    def _staging(self) -> tuple[int, int, int, int]:
        """Where the staging lies: what a replay of staged work holds."""
        return self._dev_in.ptr, self._dev_out.ptr, self._host_in.ptr, self._host_out.ptr

    def _replayed(self, key: tuple[Any, ...], elements: int, queue: Callable[[], None]) -> Any:
        """Queue a small batch's staged work (``replays``: replayed as a graph once its key
        came before) or a larger one's as it is, and wait for it; the graph that replayed
        it, where one did."""
        replayed = None
        if elements <= REPLAY_MAX_ELEMENTS:
            replayed = self._replays.run(key, self._staging(), queue)
        else:
            queue()
        self._stream.synchronize()
        return replayed

    def _reduce(self, requests: Sequence[Plan], *, dot: bool) -> list[Result]:
        sizes = [int(r.a.size) for r in requests]
        starts = list(itertools.accumulate(sizes[:-1], initial=0))

        def fill(host_in: np.ndarray, y_at: int) -> None:
            for r, start, size in zip(requests, starts, sizes, strict=True):
                pack(host_in[start : start + size], r.a)
                if dot:
                    pack(host_in[y_at + start : y_at + start + size], _b(r))

        return [float(v) for v in self._sums(sizes, fill, dot=dot)]

    def _keep_sum(self, n: int, dot: bool, out: np.ndarray, replayed: Any) -> None:
        """Keep a lone reduce (dot: dot_product) of ``n`` elements's replay (``quick.py``)."""
        host_in = self._host_in.array
        y_at = round_up(n, PACK_ALIGN)
        ins = (host_in[:n], host_in[y_at : y_at + n]) if dot else (host_in[:n],)
        self._quicks.keep(("dot_product" if dot else "reduce", n), self._staging(), ins, out,
                          replayed, scalar=True)

    def _sums(self, sizes: list[int], fill: Fill, *, dot: bool) -> np.ndarray:
        """Each segment's sum (dot: of products), as f32 values in an f64 array."""
        total = sum(sizes)
        count = len(sizes)
        if total == 0:
            return np.zeros(count)
        y_at = round_up(total, PACK_ALIGN)  # dot: y's operands start here
        in_elements = y_at + total if dot else total
        segmented = count > 1 and max(sizes) <= SEGMENT_MAX
        self._ensure_capacity(in_elements, count, count + 1 if segmented else 0)
        host_in = self._host_in.array
        fill(host_in, y_at)
        offsets = list(itertools.accumulate(sizes, initial=0))  # segment s: offsets[s:s+2]
        d_x = self._dev_in.ptr
        d_y = d_x + 4 * y_at if dot else d_x
        d_out = self._dev_out.ptr
        if count == 1:
            host = host_in[:in_elements]
            out = self._host_out.array[:1]
            in_place = self._in_place(in_elements)

            def queue() -> None:
                if in_place:  # the staging is pinned: the kernels read and write it there
                    h_x = self._host_in.ptr
                    h_y = h_x + 4 * y_at if dot else h_x
                    self.launch_reduce(h_x, h_y, total, self._host_out.ptr, dot=dot)
                    return
                cuda.memcpy_htod_async(d_x, host, self._stream)
                self.launch_reduce(d_x, d_y, total, d_out, dot=dot)
                cuda.memcpy_dtoh_async(out, d_out, self._stream)

            replayed = self._replayed(("sum", total, dot), total, queue)
            if replayed is not None:
                self._keep_sum(total, dot, out, replayed)
            return out.astype(np.float64)
        cuda.memcpy_htod_async(d_x, host_in[:in_elements], self._stream)
        if segmented:
            self._offsets_of = None
            host_offsets = self._host_offsets.array[: count + 1]
            host_offsets[:] = offsets
            d_offsets = self._dev_offsets.ptr
            cuda.memcpy_htod_async(d_offsets, host_offsets, self._stream)
            self.launch_segments(d_x, d_y, d_offsets, count, d_out, dot=dot)
        else:
            # One two-pass reduction per job, in stream order: they share the partials.
            for i, (start, size) in enumerate(zip(offsets[:-1], sizes, strict=True)):
                self.launch_reduce(d_x + 4 * start, d_y + 4 * start, size, d_out + 4 * i, dot=dot)
        return self._fetch(count).astype(np.float64)

    def _matmul(self, requests: Sequence[Plan]) -> list[Result]:
        r0 = requests[0]
        m, n, k = r0.m, r0.n, r0.k
        count = len(requests)
        a_size, b_size, c_size = m * k, k * n, m * n

        def fill(host_in: np.ndarray, b_at: int) -> None:
            for i, r in enumerate(requests):
                pack(host_in[i * a_size : (i + 1) * a_size], r.a)
                pack(host_in[b_at + i * b_size : b_at + (i + 1) * b_size], _b(r))

        out = self._product(m, n, k, count, fill)
        return [out[i * c_size : (i + 1) * c_size] for i in range(count)]

    def _product(self, m: int, n: int, k: int, count: int, fill: Fill) -> np.ndarray:
        if m == 0 or n == 0:
            return np.empty(0, F32)
        b_at = round_up(count * m * k, PACK_ALIGN)  # the stacked Bs start here
        in_elements = b_at + count * k * n
        self._ensure_capacity(in_elements, count * m * n)
        host_in = self._host_in.array
        fill(host_in, b_at)
        d_in = self._dev_in.ptr
        if in_elements > 0:  # k == 0: nothing to send, the kernel writes zeros
            cuda.memcpy_htod_async(d_in, host_in[:in_elements], self._stream)
        self.launch_matmul(d_in, d_in + 4 * b_at, self._dev_out.ptr, m, n, k, count)
        return self._fetch(count * m * n)
