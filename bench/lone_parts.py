"""Where a lone small job's time goes inside the worker, beside the lean floor's Python.

    python bench/lone_parts.py [--backend cpu|cuda] [--elements N] [--n N] [--profile]

No Erlang: one process builds the worker (``erlcuda.worker.Worker``, its device on this
thread as in ``serve``) and hands it the launch frame Erlang writes for a lone job, again
and again (``Worker._take``: the lone path, reply encoded and written to ``/dev/null``);
beside it, the lean floor's own work for the same job (``bench/lean_floor.py``: the request
sliced, its GPU work, the raw reply written), and the backend's call alone. Medians and
percentiles in µs, per kind: the part of a lone job's round trip that is the worker's
Python against what the floor's Python does. ``--profile`` adds cProfile's view of the
worker's lone path (its own overhead inflates every call; read it for the split).
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "python"), str(ROOT / "bench"), str(ROOT / "test" / "python")]

import lean_floor  # noqa: E402
from erlcuda.framing import FrameReader, FrameWriter  # noqa: E402
from erlcuda.worker import Options, Worker  # noqa: E402
from workerpipe import launch_frame  # noqa: E402


def timed(fn: Callable[[], object], n: int) -> list[float]:
    clock = time.perf_counter_ns
    out = []
    for _ in range(n):
        t0 = clock()
        fn()
        out.append((clock() - t0) / 1000)
    return out


def summary(name: str, samples: list[float]) -> str:
    p50, p90, p99 = np.percentile(samples, [50, 90, 99])
    return f"{name:<44} p50 {p50:8.1f}  p90 {p90:8.1f}  p99 {p99:8.1f} µs"


def alone(worker: Worker, kind: str, body: bytearray, n: int) -> list[str]:
    """The lone path, the template's fill and the backend call, each timed on its own."""
    device = worker._device
    assert device is not None
    for _ in range(200):  # templates learned, caches warm
        worker._take(body)
    template = worker._templates.find(body)
    assert template is not None
    plan = template.fill(body)
    return [summary(f"{kind}: worker lone path (_take)", timed(lambda: worker._take(body), n)),
            summary(f"{kind}: template fill", timed(lambda: template.fill(body), n)),
            summary(f"{kind}: backend execute([plan])", timed(lambda: device.execute([plan]),
                                                               n))]


def split(worker: Worker, frames: dict[str, bytes], n: int) -> list[str]:
    """The lone path's parts timed in turn in one loop, beside the whole of it: the
    template's fill, the backend call, the reply's encoding and write, ``_take``."""
    lane, device = worker.lanes[0], worker._device
    clock = time.perf_counter_ns
    lines = []
    for kind, frame in frames.items():
        body = bytearray(frame)
        parts: dict[str, list[float]] = {"fill": [], "execute": [], "reply": [], "_take": []}
        for _ in range(n):
            t0 = clock()
            plan = worker._templates.find(body).fill(body)
            t1 = clock()
            values = device.execute([plan])
            t2 = clock()
            lane._reply([(1, values[0], None)])
            t3 = clock()
            worker._take(body)
            t4 = clock()
            for key, d in zip(parts, (t1 - t0, t2 - t1, t3 - t2, t4 - t3), strict=True):
                parts[key].append(d / 1000)
        lines += [summary(f"{kind}: in turn: {key}", v) for key, v in parts.items()]
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--backend", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--elements", type=int, default=1000)
    parser.add_argument("--n", type=int, default=3000)
    parser.add_argument("--profile", action="store_true")
    args = parser.parse_args()
    n = args.elements
    a = np.arange(n, dtype=np.float32)
    b = np.arange(n, dtype=np.float32) * 2
    sink = os.open(os.devnull, os.O_WRONLY)
    dead_r, dead_w = os.pipe()  # nothing is ever read from the worker's reader
    worker = Worker(FrameReader(dead_r), FrameWriter(sink),
                    Options(backend=args.backend, spin_us=0))
    worker._device = worker.lanes[0].open_here()
    frames = {"vector_add": launch_frame(1, "vector_add", [a.tobytes(), b.tobytes()]),
              "reduce": launch_frame(2, "reduce", [a.tobytes()])}
    run, _ = (lean_floor.cuda_runner if args.backend == "cuda" else lean_floor.cpu_runner)(n)
    # The floor's context is made current over the worker's: each side's is pushed in turn.
    floor_context = getattr(run, "context", None)
    if floor_context is not None:
        floor_context.pop()
    os.dup2(sink, lean_floor.OUT_FD)
    requests = {"vector_add": bytes([0]) + n.to_bytes(4, "little") + a.tobytes() + b.tobytes(),
                "reduce": bytes([1]) + n.to_bytes(4, "little") + a.tobytes()}

    def floor(kind: str) -> Callable[[], object]:
        request = bytearray(requests[kind])

        def one() -> None:
            fa = np.frombuffer(request, np.float32, n, 5)
            fb = np.frombuffer(request, np.float32, n, 5 + 4 * n) if kind == "vector_add" \
                else None
            lean_floor.reply(run(0 if kind == "vector_add" else 1, fa, fb))
        return one

    lines = []
    for kind, frame in frames.items():
        lines += alone(worker, kind, bytearray(frame), args.n)
    if floor_context is not None:
        floor_context.push()
    for kind in frames:
        timed(floor(kind), 200)
        lines.append(summary(f"{kind}: lean floor (slice, run, reply)", timed(floor(kind),
                                                                             args.n)))
    if floor_context is not None:
        floor_context.pop()
    lines += split(worker, frames, args.n)
    print(f"backend {args.backend}, {n} elements, {args.n} samples each")
    print("\n".join(lines))
    if args.profile:
        body = bytearray(frames["vector_add"])
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(args.n):
            worker._take(body)
        prof.disable()
        pstats.Stats(prof).sort_stats("tottime").print_stats(25)
    worker.lanes[0].close_here(worker._device)  # its context off the stack before exit
    os.close(dead_w)
    return 0


if __name__ == "__main__":
    sys.exit(main())
