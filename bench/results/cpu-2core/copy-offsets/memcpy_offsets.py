"""A userspace copy of 80,000 bytes (a memoryview slice assignment, memcpy) from and into
buffers at these offsets from a page boundary: p50 of 3000, in µs."""

import time

import numpy as np

N = 80000
src = np.ones(N + 4096, np.uint8)
dst = np.zeros(N + 4096, np.uint8)
bs = (-src.ctypes.data) % 4096
bd = (-dst.ctypes.data) % 4096
for so in (0, 8):
    for do in (0, 4, 8, 16, 64):
        s = memoryview(src)[bs + so : bs + so + N]
        d = memoryview(dst)[bd + do : bd + do + N]
        ts = []
        for _ in range(3000):
            t = time.perf_counter_ns()
            d[:] = s
            ts.append(time.perf_counter_ns() - t)
        ts.sort()
        print(f"src+{so:3d} dst+{do:3d}: copy {ts[len(ts) // 2] / 1000:6.1f} us")
