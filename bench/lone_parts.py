"""Where a lone small job's time goes inside the worker, beside the lean floor's Python.

    python bench/lone_parts.py [--backend cpu|cuda] [--elements N] [--n N] [--profile]
                               [--slots]

No Erlang: one process builds the worker (``erlcuda.worker.Worker``, its device on this
thread as in ``serve``) and hands it the launch frame Erlang writes for a lone job, again
and again (``Worker._take``: the lone path, reply encoded and written to ``/dev/null``);
beside it, the lean floor's own work for the same job (``bench/lean_floor.py``: the request
sliced, its GPU work, the raw reply written), and the backend's call alone. Medians and
percentiles in µs, per kind: the part of a lone job's round trip that is the worker's
Python against what the floor's Python does. ``--profile`` adds cProfile's view of the
worker's lone path (its own overhead inflates every call; read it for the split).
``--slots`` times instead the lone path of a vector_add whose operands and result are in
slots of a shared-memory folder (the frame Erlang writes when the job goes through shared
memory), split into its mapping and its run, beside the same job from the frame and the
same job with the lane's reading of the last one forgotten (``Lane._again``).
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "python"), str(ROOT / "bench"), str(ROOT / "test" / "python")]

import lean_floor  # noqa: E402
from erlcuda.framing import FrameReader, FrameWriter  # noqa: E402
from erlcuda.lanes import Job  # noqa: E402
from erlcuda.shm import SharedFolder  # noqa: E402
from erlcuda.worker import Options, Worker  # noqa: E402
from workerpipe import FileVector, launch_frame, result_slot  # noqa: E402


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


def slot_frames(folder: Path, a: np.ndarray, b: np.ndarray) -> dict[str, bytes]:
    """A vector_add's frame with its operands in slots ``s1``, ``s2`` and its result in
    slot ``s3`` (written as Erlang writes them), and the same job's frame with its data."""
    part = max(1 << 20, -(-a.nbytes // (1 << 20)) << 20)
    for name, data in (("s1", a), ("s2", b)):
        with open(folder / f"{name}.0", "wb") as f:
            f.write(data.tobytes())
            f.truncate(part)
    slots = launch_frame(1, "vector_add", [FileVector("s1", a.nbytes, part_bytes=part),
                                           FileVector("s2", b.nbytes, part_bytes=part)],
                         result_file=result_slot(folder, "s3", part))
    return {"slots": slots, "frame": launch_frame(2, "vector_add", [a.tobytes(),
                                                                     b.tobytes()])}


def read_again(worker: Worker, body: bytearray) -> None:
    """A slot job's lone path with the lane's reading of the last one forgotten: its
    operands mapped, its plan made and its result's target found again."""
    worker.lanes[0]._again = None
    worker._take(body)


def slot_split(worker: Worker, body: bytearray, n: int) -> list[str]:
    """A slot job's lone path in parts, in turn: the slot template's fill (the frame
    read), the operands mapped (``Lane.prepare_slots``, on a job of its own), the lane's
    short path (``Lane.run_lone_slots``: mapped, run, answered)."""
    lane, device = worker.lanes[0], worker._device
    template = worker._templates.find_slots(body)
    assert template is not None, "the slot template is learned by the first jobs"
    clock = time.perf_counter_ns
    parts: dict[str, list[float]] = {"fill": [], "prepare_slots": [], "run_lone_slots": []}
    for _ in range(n):
        t0 = clock()
        named = template.fill(body)
        assert named is not None
        files, result = named
        t1 = clock()
        lane.prepare_slots(Job(1, result_file=result), files, template.plan)
        t2 = clock()
        lane.run_lone_slots(Job(1, result_file=result), files, template.plan, device)
        t3 = clock()
        for key, d in zip(parts, (t1 - t0, t2 - t1, t3 - t2), strict=True):
            parts[key].append(d / 1000)
    lines = [summary(f"slots: in turn: {key}", v) for key, v in parts.items()]
    named = template.fill(body)
    assert named is not None
    job = Job(1, result_file=named[1])
    lane.prepare_slots(job, named[0], template.plan)
    plan = job.plan
    assert plan is not None and device is not None
    into = lane.slots.result(job.result_file, plan.out_elements * 4).view(np.float32)
    lines.append(summary("slots: backend execute(into=result slot)",
                         timed(lambda: device.execute([plan], into=[into]), n)))
    lines.append(summary("slots: backend execute(into, registered: the lane's word)",
                         timed(lambda: device.execute([plan], into=[into], registered=True), n)))
    if worker.backend_name == "cuda":
        lines.append(summary("slots: direct copies and kernel on the slots' pages",
                             timed(direct(device, plan, into), n)))
    return lines


def direct(device: object, plan: object, into: np.ndarray) -> Callable[[], None]:
    """The floor's GPU work on the slots' registered pages, through erlcuda's device: both
    operands copied in, the kernel, the result copied out, one stream, one wait."""
    import pycuda.driver as cuda  # the cuda backend is running: PyCUDA is there

    a, b = plan.a, plan.b  # type: ignore[attr-defined]
    n = int(a.size)
    d_in = device._dev_in.ensure(2 * n)  # type: ignore[attr-defined]
    d_out = device._dev_out.ensure(n)  # type: ignore[attr-defined]
    stream = device._stream  # type: ignore[attr-defined]

    def one() -> None:
        cuda.memcpy_htod_async(d_in, a, stream)
        cuda.memcpy_htod_async(d_in + 4 * n, b, stream)
        device.launch_vector_add(d_in, d_in + 4 * n, d_out, n)  # type: ignore[attr-defined]
        cuda.memcpy_dtoh_async(into, d_out, stream)
        stream.synchronize()
    return one


def slots_main(args: argparse.Namespace, a: np.ndarray, b: np.ndarray) -> list[str]:
    """``--slots``: the lone path of a job in slots, beside the same job from its frame."""
    base = Path(tempfile.mkdtemp(prefix="erlcuda-", dir="/dev/shm"))
    sink = os.open(os.devnull, os.O_WRONLY)
    dead_r, dead_w = os.pipe()
    try:
        worker = Worker(FrameReader(dead_r), FrameWriter(sink),
                        Options(backend=args.backend, spin_us=0), shm=SharedFolder(str(base)))
        worker._device = worker.lanes[0].open_here()
        frames = {k: bytearray(v) for k, v in slot_frames(base, a, b).items()}
        lines = []
        for kind, body in frames.items():
            for _ in range(200):
                worker._take(body)
            lines.append(summary(f"{kind}: worker lone path (_take)",
                                 timed(lambda body=body: worker._take(body), args.n)))
        lines.append(summary("slots: the same, the slots read again each time (no _again)",
                             timed(lambda: read_again(worker, frames["slots"]), args.n)))
        got = np.fromfile(base / "s3.0", np.float32, a.size)
        assert np.array_equal(got, a + b), "the result slot holds the sum"
        lines += slot_split(worker, frames["slots"], args.n)
        if args.profile:
            prof = cProfile.Profile()
            prof.enable()
            for _ in range(args.n):
                worker._take(frames["slots"])
            prof.disable()
            pstats.Stats(prof).sort_stats("tottime").print_stats(25)
        worker.lanes[0].close_here(worker._device)
        return lines
    finally:
        os.close(dead_w)
        shutil.rmtree(base, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--backend", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--elements", type=int, default=1000)
    parser.add_argument("--n", type=int, default=3000)
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--slots", action="store_true")
    args = parser.parse_args()
    n = args.elements
    a = np.arange(n, dtype=np.float32)
    b = np.arange(n, dtype=np.float32) * 2
    if args.slots:
        lines = slots_main(args, a, b)
        print(f"backend {args.backend}, {n} elements, {args.n} samples each")
        print("\n".join(lines))
        return 0
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
