"""What a graph saves a lone small job on the GPU: the lean floor's sequence against replays.

    python bench/lone_graph.py [--elements N] [--n N]

One 1000-element vector_add on pinned staging, timed four ways, 5,000 jobs each, twice:
the floor's sequence (two pinned copies, the upload, erlcuda's kernel through PyCUDA's
``prepared_async_call``, the download, the wait), the same with the kernel launched by one
``cuLaunchKernel``, and the upload, kernel and download captured once as a CUDA graph and
replayed (waited for through PyCUDA and through the driver). Needs PyCUDA and
``cuda-bindings``.
"""

from __future__ import annotations

import argparse
import struct
import sys
import time
from pathlib import Path

import numpy as np
import pycuda.driver as cuda
from cuda.bindings import driver as cu

sys.path[:0] = [str(Path(__file__).resolve().parents[1] / "python")]

from erlcuda.backends.cuda.kernels import compile_kernels  # noqa: E402
from erlcuda.backends.sources import find_kernel_dir  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--elements", type=int, default=1000)
    parser.add_argument("--n", type=int, default=5000)
    args = parser.parse_args()
    cuda.init()
    dev = cuda.Device(0)
    ctx = dev.make_context()
    try:
        run(dev, args.elements, args.n)
    finally:
        ctx.pop()
    return 0


def run(dev: cuda.Device, n: int, reps: int) -> None:
    cubins = compile_kernels(find_kernel_dir(), dev.compute_capability())
    add = cuda.module_from_buffer(cubins["vector_add"]).get_function("vector_add")
    add.prepare("PPPq")
    a = np.arange(n, dtype=np.float32)
    b = a * 2
    b_at = -(-n // 64) * 64
    host_in = cuda.pagelocked_empty(2 * b_at, np.float32)
    host_out = cuda.pagelocked_empty(n, np.float32)
    d_in, d_out = cuda.mem_alloc(8 * b_at), cuda.mem_alloc(4 * n)
    stream = cuda.Stream()
    handle = cu.CUstream(stream.handle)
    grid, block = (((n + 3) // 4 + 255) // 256, 1, 1), (256, 1, 1)
    packed = struct.Struct("PPPq")
    ptrs = (int(d_in), int(d_in) + 4 * b_at, int(d_out), n)

    def fill() -> None:
        np.copyto(host_in[:n], a)
        np.copyto(host_in[b_at : b_at + n], b)

    def queue(direct: bool) -> None:
        cuda.memcpy_htod_async(d_in, host_in, stream)
        if direct:
            add._launch_kernel(grid, block, packed.pack(*ptrs), 0, stream)
        else:
            add.prepared_async_call(grid, block, stream, *ptrs)
        cuda.memcpy_dtoh_async(host_out, d_out, stream)

    cu.cuStreamBeginCapture(handle, cu.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
    queue(True)
    _, graph = cu.cuStreamEndCapture(handle)
    _, executable = cu.cuGraphInstantiate(graph, 0)
    ways = {
        "floor (prepared_async_call)": lambda: (fill(), queue(False), stream.synchronize()),
        "one cuLaunchKernel": lambda: (fill(), queue(True), stream.synchronize()),
        "graph, PyCUDA's wait": lambda: (fill(), cu.cuGraphLaunch(executable, handle),
                                         stream.synchronize()),
        "graph, the driver's wait": lambda: (fill(), cu.cuGraphLaunch(executable, handle),
                                             cu.cuStreamSynchronize(handle)),
    }
    for way in ways.values():
        way()
        assert np.array_equal(host_out, a + b)
    clock = time.perf_counter_ns
    for _ in range(2):
        for name, way in ways.items():
            for _ in range(500):
                way()
            samples = []
            for _ in range(reps):
                t0 = clock()
                way()
                samples.append((clock() - t0) / 1000)
            p50, p90 = np.percentile(samples, [50, 90])
            print(f"{name:<28} p50 {p50:6.1f}  p90 {p90:6.1f} µs")
    cu.cuGraphExecDestroy(executable)
    cu.cuGraphDestroy(graph)


if __name__ == "__main__":
    sys.exit(main())
