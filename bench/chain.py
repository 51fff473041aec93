"""Device buffers and user kernels from Erlang, beside CuPy on the same GPU, in one run.

    bench/chain [--backend auto|cpu|cuda] [--size N] [--reps N] [--out DIR]

One Erlang node (``bench/erlcuda_chain.erl``) times, on ``--size`` f32 elements:

- a chain of 10 vector_adds whose operands and results stay on the device (``{keep,
  true}``), with and without downloading the last result;
- the same chain with every operand and result through the port (shared memory above its
  threshold, as any launch);
- saxpy, ``z = a x + y``, on device buffers: written by ``erlcuda:elementwise/5`` and the
  same kernel loaded as CUDA C with ``erlcuda:load/4``.

Then, in this process once the node has stopped (one CUDA context at a time), CuPy does the
same: the chain of 10 ``x + b`` (synchronized once at its end), and saxpy as a
``cupy.ElementwiseKernel`` and as a ``cupy.RawKernel`` of the same source (synchronized after
each call). Every figure is a wall time per call from the caller's side; the report gives
p50, p90 and p99 and the bytes the kernels touch per second. Writes ``report.md`` and
``results.json`` to ``--out`` (default: a new folder under ``_build/bench/``).
"""

from __future__ import annotations

import argparse
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import stack_bench  # bench/ is not a package

ROOT = stack_bench.ROOT
BUILD = stack_bench.BUILD
CHAIN = 10
SAXPY_SOURCE = r"""
extern "C" __global__ void saxpy_raw(float a, const float *x, const float *y,
                                     float *z, long long n) {
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
       i += (long long)blockDim.x * gridDim.x)
    z[i] = a * x[i] + y[i];
}
"""
#: Bytes each case's kernels touch per call, per element: a vector_add reads two vectors
#: and writes one (12 bytes an element), saxpy the same.
BYTES_PER_ELEMENT = {"chain": CHAIN * 12, "saxpy": 12}

Json = dict[str, Any]


def run_node(backend: str, size: int, reps: int) -> tuple[Json, list[Json]]:
    term = {"backend": backend, "size": size, "reps": reps,
            "python": stack_bench.ErlString(sys.executable),
            "user_kernels": backend == "cuda"}
    return stack_bench.run_bench_module("erlcuda_chain", term)


def run_cupy(size: int, reps: int) -> list[Json]:
    import cupy as cp

    rng = np.arange(size, dtype=np.int64)
    a = cp.asarray((rng % 97).astype(np.float32))
    b = cp.asarray(((rng * 2) % 97).astype(np.float32))
    saxpy_ew = cp.ElementwiseKernel("float32 a, float32 x, float32 y", "float32 z",
                                    "z = a * x + y", "saxpy_elementwise")
    saxpy_raw = cp.RawKernel(SAXPY_SOURCE, "saxpy_raw")
    z = cp.zeros(size, dtype=cp.float32)
    block = 256
    grid = (size + block - 1) // block

    def chain() -> None:
        x = a
        for _ in range(CHAIN):
            x = x + b
        cp.cuda.runtime.deviceSynchronize()

    def ew() -> None:
        saxpy_ew(np.float32(2.0), a, b)
        cp.cuda.runtime.deviceSynchronize()

    def raw() -> None:
        saxpy_raw((grid,), (block,), (np.float32(2.0), a, b, z, np.int64(size)))
        cp.cuda.runtime.deviceSynchronize()

    out: list[Json] = []
    for name, fn in (("cupy_chain", chain), ("cupy_saxpy_elementwise", ew),
                     ("cupy_saxpy_raw", raw)):
        fn()
        samples = []
        for _ in range(reps):
            t0 = time.perf_counter_ns()
            fn()
            samples.append(time.perf_counter_ns() - t0)
        out.append({"event": "result", "case": name, "size": size, "samples_ns": samples})
    raw()
    expect = 2.0 * cp.asnumpy(a) + cp.asnumpy(b)
    if not np.array_equal(cp.asnumpy(z), expect):
        raise SystemExit("chain: CuPy's saxpy_raw disagrees with numpy")
    return out


CASES = [
    # case, what, its CuPy counterpart, bytes per element
    ("chain_buffers", "chain of 10 vector_adds on device buffers", "cupy_chain", "chain"),
    ("chain_download", "the same, and the last result downloaded", "cupy_chain", "chain"),
    ("chain_port", "the same 10 vector_adds, data through the port each time", "cupy_chain",
     "chain"),
    ("saxpy_elementwise", "saxpy, erlcuda:elementwise/5, on buffers",
     "cupy_saxpy_elementwise", "saxpy"),
    ("saxpy_raw", "saxpy, CUDA C loaded with erlcuda:load/4, on buffers", "cupy_saxpy_raw",
     "saxpy"),
]


def summarize(results: list[Json]) -> dict[str, Json]:
    out: dict[str, Json] = {}
    for r in results:
        if r.get("event") != "result":
            continue
        ns = np.asarray(r["samples_ns"], dtype=np.float64)
        out[r["case"]] = {"n": int(ns.size), "size": r["size"],
                          **{f"p{q}_ms": float(np.percentile(ns, q)) / 1e6
                             for q in (50, 90, 99)}}
    return out


def report(info: Json, summary: dict[str, Json], memory: list[Json], args: argparse.Namespace,
           wall: float, cupy_note: str) -> str:
    size = args.size
    lines = [
        f"# erlcuda: device buffers and user kernels ({info.get('backend')} backend)", "",
        f"- Date: {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC; wall time {wall:.0f} s; "
        f"`bench/chain --backend {args.backend} --size {size} --reps {args.reps}`",
        f"- erlcuda {stack_bench.git_version()}; {stack_bench.cpu_model()}",
        f"- CuPy: {cupy_note}", "",
        f"Per call, wall time from the caller ({size:,} f32 elements; every call waits for "
        "its result). GB/s = bytes the kernels read and write (12 an element for each "
        "vector_add or saxpy) ÷ p50. Ratio = erlcuda p50 ÷ CuPy p50 in this run.", "",
        "| case | n | p50 ms | p90 ms | p99 ms | GB/s | CuPy p50 ms | ÷ CuPy |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for case, what, ref, kind in CASES:
        s = summary.get(case)
        if s is None:
            continue
        gbs = BYTES_PER_ELEMENT[kind] * size / (s["p50_ms"] / 1e3) / 1e9
        r = summary.get(ref)
        lines.append(f"| {what} | {s['n']} | {s['p50_ms']:.2f} | {s['p90_ms']:.2f} | "
                     f"{s['p99_ms']:.2f} | {gbs:.1f} | "
                     + (f"{r['p50_ms']:.2f} | {s['p50_ms'] / r['p50_ms']:.2f}x |" if r
                        else "- | - |"))
    lines += ["", "Device memory after the run (every buffer freed): "
              + "; ".join(f"device {i}: {m.get('buffers')} buffers, {m.get('buffer_bytes')} "
                          f"bytes (peak {m.get('buffer_peak')})"
                          for i, m in enumerate(memory)), ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=("auto", "cpu", "cuda"), default="auto")
    parser.add_argument("--size", type=int, default=16_000_000)
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    t0 = time.monotonic()
    info, results = run_node(args.backend, args.size, args.reps)
    cupy_note = "not run (the cpu backend)"
    if info.get("backend") == "cuda":
        try:
            results += run_cupy(args.size, args.reps)
            import cupy as cp
            cupy_note = f"{cp.__version__}, in this process after the Erlang node stopped"
        except ImportError:
            cupy_note = "not installed"
    summary = summarize(results)
    memory = next((r["devices"] for r in results if r.get("event") == "memory"), [])
    text = report(info, summary, memory, args, time.monotonic() - t0, cupy_note)
    stack_bench.write_tool_outputs("chain", args.out, {"info": info, "summary": summary,
                                                  "memory": memory, "results": results}, text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
