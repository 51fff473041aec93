"""How long opening a device takes, and its in-place measurement alone."""
import sys, time
from pathlib import Path
sys.path.insert(0, "python")
from erlcuda.backends.cuda import CudaBackend
backend = CudaBackend(Path("kernels"))
for i in range(3):
    t0 = time.perf_counter()
    dev = backend.open(0)
    t1 = time.perf_counter()
    t2 = time.perf_counter(); limit = dev._measure_in_place(); t3 = time.perf_counter()
    print(f"open {1e3*(t1-t0):.1f} ms; in-place measurement alone {1e3*(t3-t2):.1f} ms -> {limit}; timings {[(t.elements, round(t.copies_s*1e6,1), round(t.in_place_s*1e6,1)) for t in dev.in_place_timings]}")
    dev.close()
backend.close()
