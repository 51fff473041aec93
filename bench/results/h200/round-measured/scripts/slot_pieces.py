"""Per-piece times of a lone slot job in the worker (H200 diagnostics, not shipped)."""
import os, sys, time, shutil, tempfile
from pathlib import Path
import numpy as np
ROOT = Path.cwd()
sys.path[:0] = [str(ROOT / "python"), str(ROOT / "bench"), str(ROOT / "test" / "python")]
import lone_parts
from erlcuda.framing import FrameReader, FrameWriter
from erlcuda.shm import SharedFolder
from erlcuda.worker import Options, Worker
from erlcuda import lanes as lanes_mod

backend = sys.argv[1] if len(sys.argv) > 1 else "cpu"
n = int(sys.argv[2]) if len(sys.argv) > 2 else 1000
a = np.arange(n, dtype=np.float32); b = a * 2
base = Path(tempfile.mkdtemp(prefix="erlcuda-", dir="/dev/shm"))
sink = os.open(os.devnull, os.O_WRONLY); dead_r, dead_w = os.pipe()
worker = Worker(FrameReader(dead_r), FrameWriter(sink), Options(backend=backend, spin_us=0),
                shm=SharedFolder(str(base)))
worker._device = worker.lanes[0].open_here()
lane = worker.lanes[0]
frames = {k: bytearray(v) for k, v in lone_parts.slot_frames(base, a, b).items()}
body = frames["slots"]
acc = {}
clock = time.perf_counter_ns
def wrap(obj, name, label):
    f = getattr(obj, name)
    def w(*args, **kw):
        t0 = clock(); r = f(*args, **kw); acc.setdefault(label, []).append(clock() - t0); return r
    setattr(obj, name, w)
for _ in range(300):
    worker._take(body)
wrap(lane, "_again_for", "again_for")
wrap(lane, "_run_one", "run_one (backend)")
wrap(lane, "_sent", "sent")
wrap(lane, "_answer_one", "answer_one (encode+write)")
wrap(worker._templates, "find_slots", "find_slots")
wrap(lane, "run_lone_slots", "run_lone_slots")
wrap(worker._device, "execute", "device.execute")
tot = []
for _ in range(5000):
    t0 = clock(); worker._take(body); tot.append(clock() - t0)
print(f"backend {backend}, {n} elements")
print(f"{'_take total':<28} p50 {np.percentile(tot,50)/1e3:7.1f} µs")
for k, v in acc.items():
    print(f"{k:<28} p50 {np.percentile(v,50)/1e3:7.1f} µs")
lane.close_here(worker._device)
shutil.rmtree(base, ignore_errors=True)
