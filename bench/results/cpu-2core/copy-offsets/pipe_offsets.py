import os, time, numpy as np, fcntl, sys
N = int(sys.argv[1]) if len(sys.argv) > 1 else 80000
r, w = os.pipe(); fcntl.fcntl(r, 1031, 1 << 20)
src = np.zeros(N + 4096, np.uint8)
dst = np.zeros(N + 4096, np.uint8)
def t(soff, doff, reps=2000):
    s = memoryview(src)[soff:soff + N]; d = memoryview(dst)[doff:doff + N]
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter_ns(); os.write(w, s); t1 = time.perf_counter_ns()
        got = os.readv(r, [d]); t2 = time.perf_counter_ns()
        assert got == N
        ts.append((t1 - t0, t2 - t1))
    ws = sorted(a for a, _ in ts); rs = sorted(b for _, b in ts)
    return ws[len(ws)//2] / 1000, rs[len(rs)//2] / 1000
base_s = (-src.ctypes.data) % 4096; base_d = (-dst.ctypes.data) % 4096
for rnd in range(2):
    for so in (0, 8):
        for do in (0, 4, 8, 16, 32, 48, 64):
            wt, rt = t(base_s + so, base_d + do)
            print(f"src+{so:3d} dst+{do:3d}: write {wt:6.1f} us  read {rt:6.1f} us")
