"""The lean floor: the least a port peer can do for one small job on a GPU.

Started as an Erlang port with ``{packet, 4}``, ``binary`` and ``nouse_stdio`` (requests on
fd 3, replies on fd 4)::

    python bench/lean_floor.py --backend cpu|cuda --max-elements N

One thread. Everything is allocated once, at start, for ``--max-elements`` elements: the
request buffer, pinned host memory for two operands and a result, device memory for the
same. A request ``<<Kernel:8, Count:32/little, A:Count/f32, B:Count/f32>>`` (kernel 0:
vector_add, B given; 1: reduce, no B) is read into the request buffer, its operands copied
into the pinned memory, copied to the device, computed and copied back on one stream, and
answered with the raw result (``Count`` f32s, or one f64 for reduce). The kernels are
erlcuda's own (compiled through its nvcc cache), so the GPU work is the same as a job's.
On the cpu backend numpy does the same into preallocated arrays, so that the floor runs
where there is no GPU (CI). The first reply is a hello: ``floor=lean backend=... device=...``.

With ``--shm PATH`` it is also the floor of shared memory: the file PATH (made at start, for
``--max-elements``: A at byte 0, B at ``4 * max``, the result at ``8 * max``) is mapped once
and registered with the driver (pinned, ``cuMemHostRegister``), and a request
``<<2:8, Count:32/little>>`` adds the ``Count`` elements of A and B found there, copied to the
device straight from the file's pages and the result straight back into them, answered with
one byte once it is there. The Erlang side writes the operands with one ``file:pwrite`` and
reads the result with one ``file:pread`` (``bench/erlcuda_bus.erl``): the least any design
that moves the data through memory shared with the BEAM does.

Unlike ``bench/floor.py`` (the same backend call as the worker's), this is no erlcuda code
path at all: what a user could write by hand for this one job. It never writes to stdout.
"""

from __future__ import annotations

import argparse
import mmap
import os
import struct
import sys
from collections.abc import Callable
from typing import Any

import numpy as np

IN_FD, OUT_FD = 3, 4
_length = struct.Struct(">I")
_head = struct.Struct("<BI")


def read_exactly(view: memoryview) -> bool:
    got = 0
    while got < view.nbytes:
        k = os.readv(IN_FD, [view[got:]])
        if not k:
            return False
        got += k
    return True


def reply(*parts: Any) -> None:
    views = [memoryview(p).cast("B") for p in parts]
    size = sum(v.nbytes for v in views)
    views.insert(0, memoryview(_length.pack(size)))
    while views:
        n = os.writev(OUT_FD, views)
        while views and n >= views[0].nbytes:
            n -= views[0].nbytes
            views.pop(0)
        if views and n:
            views[0] = views[0][n:]


#: ``run(kernel, a, b, out)``: ``out`` given, ``a``, ``b`` and ``out`` are registered
#: memory (the shared file's), copied from and into as they are.
Runner = Callable[[int, np.ndarray, np.ndarray | None, np.ndarray | None], np.ndarray]


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def cpu_runner(max_elements: int) -> tuple[Runner, str]:
    out = np.empty(max_elements, np.float32)
    total = np.empty(1, np.float64)

    def run(kernel: int, a: np.ndarray, b: np.ndarray | None,
            into: np.ndarray | None = None) -> np.ndarray:
        if kernel == 0:
            assert b is not None
            return np.add(a, b, out=out[: a.size] if into is None else into)
        total[0] = np.float32(np.add.reduce(a, dtype=np.float64))
        return total

    return run, "cpu"


def cuda_runner(max_elements: int) -> tuple[Runner, str]:
    import pycuda.driver as cuda

    from erlcuda.backends.cuda.kernels import compile_kernels
    from erlcuda.backends.sources import find_kernel_dir

    cuda.init()
    dev = cuda.Device(0)
    ctx = dev.make_context()
    cubins = compile_kernels(find_kernel_dir(), dev.compute_capability())
    add = cuda.module_from_buffer(cubins["vector_add"]).get_function("vector_add")
    add.prepare("PPPq")
    reduce_module = cuda.module_from_buffer(cubins["reduce"])
    partial = reduce_module.get_function("reduce_partial")
    partial.prepare("PPqP")
    final = reduce_module.get_function("reduce_final")
    final.prepare("PiP")
    host_a, host_b, host_c = (cuda.pagelocked_empty(max_elements, np.float32) for _ in "abc")
    host_sum = cuda.pagelocked_empty(1, np.float32)
    dev_a, dev_b, dev_c = (cuda.mem_alloc(4 * max_elements) for _ in "abc")
    sms = dev.get_attribute(cuda.device_attribute.MULTIPROCESSOR_COUNT)
    partials = cuda.mem_alloc(8 * 8 * sms)
    stream = cuda.Stream()
    total = np.empty(1, np.float64)

    # The grids erlcuda's device uses (backends/cuda/device.py: launch_vector_add, a float4
    # a thread; launch_reduce, eight elements a thread at least).
    def add_blocks(n: int) -> int:
        return min(ceil_div(ceil_div(n, 4), 256), 2048 * sms)

    def sum_blocks(n: int) -> int:
        return min(ceil_div(n, 256 * 8), 8 * sms)

    def run(kernel: int, a: np.ndarray, b: np.ndarray | None,
            into: np.ndarray | None = None) -> np.ndarray:
        n = a.size
        if into is None:  # the request buffer's operands, through the pinned copies
            np.copyto(host_a[:n], a)
            a = host_a[:n]
        cuda.memcpy_htod_async(dev_a, a, stream)
        if kernel == 0:
            assert b is not None
            if into is None:
                np.copyto(host_b[:n], b)
                b = host_b[:n]
            cuda.memcpy_htod_async(dev_b, b, stream)
            add.prepared_async_call((add_blocks(n), 1, 1), (256, 1, 1), stream, dev_a, dev_b,
                                    dev_c, n)
            result = host_c[:n] if into is None else into
            cuda.memcpy_dtoh_async(result, dev_c, stream)
            stream.synchronize()
            return result
        blocks = sum_blocks(n)
        partial.prepared_async_call((blocks, 1, 1), (256, 1, 1), stream, dev_a, dev_a, n,
                                    partials)
        final.prepared_async_call((1, 1, 1), (256, 1, 1), stream, partials, blocks, dev_c)
        cuda.memcpy_dtoh_async(host_sum, dev_c, stream)
        stream.synchronize()
        total[0] = host_sum[0]
        return total

    run.context = ctx  # type: ignore[attr-defined]  # current on this thread from here on
    return run, str(dev.name())


def shared_file(path: str, max_elements: int, backend: str) -> np.ndarray:
    """The mapping of the floor's shared file (made here), registered on the cuda backend."""
    size = 12 * max_elements
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.ftruncate(fd, size)
        mapped = np.frombuffer(mmap.mmap(fd, size), np.uint8)
    finally:
        os.close(fd)
    if backend == "cuda":
        from erlcuda.backends.cuda.transfers import CudaPinner

        CudaPinner().pin(mapped)  # for the process's life: the context goes with it
    return mapped


def serve(backend: str, max_elements: int, shm: str | None = None) -> int:
    run, device = (cuda_runner if backend == "cuda" else cpu_runner)(max_elements)
    shared = shared_file(shm, max_elements, backend) if shm else None
    reply(f"floor=lean\nbackend={backend}\ndevice={device}\nshm={shm or ''}".encode())
    request = bytearray(_head.size + 8 * max_elements)
    header = memoryview(bytearray(4))
    body = memoryview(request)
    while read_exactly(header):
        size = _length.unpack(header)[0]
        if not read_exactly(body[:size]):
            return 1
        kernel, n = _head.unpack_from(request)
        if kernel == 2 and shared is not None:
            a, b, into = (shared[at * 4 * max_elements:][: 4 * n].view(np.float32)
                          for at in range(3))
            run(0, a, b, into)
            reply(b"k")
            continue
        a = np.frombuffer(request, np.float32, n, _head.size)
        b = np.frombuffer(request, np.float32, n, _head.size + 4 * n) if kernel == 0 else None
        reply(run(kernel, a, b))
    return 0


def main(argv: list[str] | None = None) -> int:
    os.dup2(2, 1)  # nothing may reach stdout, which the node shares with its JSON lines
    sys.stdout = sys.stderr
    parser = argparse.ArgumentParser(prog="lean_floor.py", description=__doc__.split("\n")[0])
    parser.add_argument("--backend", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--max-elements", type=int, default=1 << 16)
    parser.add_argument("--shm", help="the shared file to make and serve kernel 2 from")
    args = parser.parse_args(argv)
    return serve(args.backend, args.max_elements, args.shm)


if __name__ == "__main__":
    sys.exit(main())
