"""Kernel-only timings of erlcuda's CUDA kernels beside CuPy on the same GPU, in one run.

    PYTHONPATH=python python3 bench/gpu_kernels.py [--quick] [--out DIR] [--device N]

Measures, with CUDA events around the launches alone (no transfers, no Python staging):
matmul 4096^3 (TFLOP/s, against CuPy's a @ b, i.e. cuBLAS SGEMM), reduce and dot_product
over 256M f32 (GB/s of bytes read, against cupy.sum and cupy.dot) and vector_add over 256M
(GB/s counting a, b and c, against cupy.add with a preallocated out). Each figure is the
median of the timed launches after warm-up launches, on random data. Every one of our
results is checked against a float64 reference computed on the GPU.

Our kernels are launched through ``CudaDevice.launch_*``, the same functions, compiled
cubins and launch configurations the worker uses, on a ``CudaDevice`` made on the GPU's
primary context (``PrimaryContextDevice`` below). Writes ``<out>/kernels.md`` (the tables)
and ``<out>/kernels.json`` (every timing); ``<out>`` is a new folder
``_build/bench/kernels-<UTC date>-<time>`` unless ``--out`` names one (the committed figures
are in ``bench/results/h200/``).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import cupy as cp
import numpy as np
import pycuda
import pycuda.driver as cuda

from erlcuda.backends.cuda import CudaBackend, CudaDevice

ROOT = Path(__file__).resolve().parents[1]
BIG = 256 * 2**20  # elements of the bandwidth benchmarks
MATMUL = 4096
VARIANTS = (1024, 2048, 4000, 4096, 4097, 8192)
TARGETS = {"matmul": 0.75, "reduce": 0.90, "dot_product": 0.90, "vector_add": 0.90}


class PrimaryContextDevice(CudaDevice):
    """A ``CudaDevice`` on the device's primary context, the one the CUDA runtime (CuPy)
    uses, instead of a context of its own.

    Our kernels then read CuPy's arrays directly, and CuPy's runtime calls, which make the
    primary context current, never switch PyCUDA's context from under us. The worker itself
    always makes a context of its own. ``close`` (``_release_context``) pops the context
    and releases this hold on it.
    """

    def _make_context(self) -> cuda.Context:
        ctx = self._dev.retain_primary_context()
        ctx.push()
        return ctx


class PrimaryContextBackend(CudaBackend):
    """The kernels compiled as for the worker, opened on primary contexts."""

    device_type = PrimaryContextDevice


def time_ours(dev: CudaDevice, launch: Callable[[], None], warmup: int, repeat: int) -> list[float]:
    """Milliseconds of each of ``repeat`` launches, events on the device's own stream."""
    start, end = cuda.Event(), cuda.Event()
    for _ in range(warmup):
        launch()
    dev.stream.synchronize()
    times = []
    for _ in range(repeat):
        start.record(dev.stream)
        launch()
        end.record(dev.stream)
        end.synchronize()
        times.append(end.time_since(start))
    return times


def time_cupy(launch: Callable[[], Any], warmup: int, repeat: int) -> list[float]:
    """Milliseconds of each of ``repeat`` CuPy calls, events on CuPy's current stream."""
    stream = cp.cuda.get_current_stream()
    start, end = cp.cuda.Event(), cp.cuda.Event()
    for _ in range(warmup):
        launch()
    stream.synchronize()
    times = []
    for _ in range(repeat):
        start.record(stream)
        launch()
        end.record(stream)
        end.synchronize()
        times.append(cp.cuda.get_elapsed_time(start, end))
    return times


def ptr(array: cp.ndarray) -> int:
    return int(array.data.ptr)


def rel_error(got: cp.ndarray, ref: cp.ndarray) -> float:
    """||got - ref|| / ||ref||, in float64."""
    diff = got.astype(cp.float64) - ref
    return float(cp.linalg.norm(diff) / cp.linalg.norm(ref))


class Bench:
    def __init__(self, dev: CudaDevice, warmup: int, repeat: int) -> None:
        self.dev = dev
        self.warmup = warmup
        self.repeat = repeat
        self.rows: list[dict[str, Any]] = []
        self.variants: list[dict[str, Any]] = []
        self.gen = cp.random.default_rng(12345)

    def random(self, n: int) -> cp.ndarray:
        return self.gen.standard_normal(n, dtype=cp.float32)

    def record(
        self,
        kernel: str,
        size: str,
        unit: str,
        work: float,
        ours: list[float],
        theirs: list[float],
        error: float,
        bound: float,
        error_cupy: float,
    ) -> None:
        ours_rate = work / (statistics.median(ours) * 1e-3)
        cupy_rate = work / (statistics.median(theirs) * 1e-3)
        ratio = ours_rate / cupy_rate
        row = {
            "kernel": kernel,
            "size": size,
            "unit": unit,
            "ours": ours_rate / 1e12 if unit == "TFLOP/s" else ours_rate / 1e9,
            "cupy": cupy_rate / 1e12 if unit == "TFLOP/s" else cupy_rate / 1e9,
            "ratio": ratio,
            "target": TARGETS[kernel],
            "met": ratio >= TARGETS[kernel],
            "error": error,
            "error_bound": bound,
            "error_ok": error < bound,
            "error_cupy": error_cupy,
            "ours_ms": ours,
            "cupy_ms": theirs,
        }
        self.rows.append(row)
        print(
            f"{kernel:12s} {size:16s} ours {row['ours']:9.1f} {unit:8s} cupy "
            f"{row['cupy']:9.1f}  {100 * ratio:5.1f}%  err {error:.2e} (cupy {error_cupy:.2e},"
            f" bound {bound:.0e})",
            flush=True,
        )

    def vector_add(self) -> None:
        a, b = self.random(BIG), self.random(BIG)
        c, c_cupy = cp.empty_like(a), cp.empty_like(a)
        ours = time_ours(
            self.dev,
            lambda: self.dev.launch_vector_add(ptr(a), ptr(b), ptr(c), BIG),
            self.warmup,
            self.repeat,
        )
        theirs = time_cupy(lambda: cp.add(a, b, out=c_cupy), self.warmup, self.repeat)
        ref = a.astype(cp.float64) + b.astype(cp.float64)
        self.record(
            "vector_add",
            "256M f32",
            "GB/s",
            3 * 4 * BIG,
            ours,
            theirs,
            rel_error(c, ref),
            1e-5,
            rel_error(c_cupy, ref),
        )

    def reduction(self, kernel: str) -> None:
        dot = kernel == "dot_product"
        x = self.random(BIG)
        y = self.random(BIG) if dot else x
        out = cp.zeros(1, cp.float32)
        ours = time_ours(
            self.dev,
            lambda: self.dev.launch_reduce(ptr(x), ptr(y), BIG, ptr(out), dot=dot),
            self.warmup,
            self.repeat,
        )
        if dot:
            theirs = time_cupy(lambda: cp.dot(x, y), self.warmup, self.repeat)
            terms = x.astype(cp.float64) * y.astype(cp.float64)
            cupy_value = float(cp.dot(x, y))
        else:
            theirs = time_cupy(lambda: cp.sum(x), self.warmup, self.repeat)
            terms = x.astype(cp.float64)
            cupy_value = float(cp.sum(x))
        ref = float(cp.sum(terms))
        scale = float(cp.sum(cp.abs(terms)))
        error = abs(float(out[0]) - ref) / scale
        self.record(
            kernel,
            "256M f32",
            "GB/s",
            (2 if dot else 1) * 4 * BIG,
            ours,
            theirs,
            error,
            1e-5,
            abs(cupy_value - ref) / scale,
        )

    def matmul(self, size: int, *, headline: bool) -> None:
        m = n = k = size
        a, b = self.random(m * k), self.random(k * n)
        c, c_cupy = cp.empty(m * n, cp.float32), cp.empty((m, n), cp.float32)
        a2, b2 = a.reshape(m, k), b.reshape(k, n)
        repeat = self.repeat if size <= 4097 else max(5, self.repeat // 4)
        ours = time_ours(
            self.dev,
            lambda: self.dev.launch_matmul(ptr(a), ptr(b), ptr(c), m, n, k),
            self.warmup,
            repeat,
        )
        theirs = time_cupy(lambda: cp.matmul(a2, b2, out=c_cupy), self.warmup, repeat)
        ref = a2.astype(cp.float64) @ b2.astype(cp.float64)
        error = rel_error(c.reshape(m, n), ref)
        error_cupy = rel_error(c_cupy, ref)
        flops = 2.0 * m * n * k
        if headline:
            self.record(
                "matmul",
                f"{size}x{size}x{size}",
                "TFLOP/s",
                flops,
                ours,
                theirs,
                error,
                1e-4,
                error_cupy,
            )
        ours_t = flops / (statistics.median(ours) * 1e-3) / 1e12
        cupy_t = flops / (statistics.median(theirs) * 1e-3) / 1e12
        aligned = size % 128 == 0
        self.variants.append(
            {
                "size": size,
                "kernel": "matmul_aligned" if aligned else "matmul_checked",
                "ours": ours_t,
                "cupy": cupy_t,
                "ratio": ours_t / cupy_t,
                "error": error,
                "ours_ms": ours,
                "cupy_ms": theirs,
            }
        )
        print(
            f"matmul variant {size:5d} ({'aligned' if aligned else 'checked'}): ours "
            f"{ours_t:6.1f} TFLOP/s, cupy {cupy_t:6.1f}, {100 * ours_t / cupy_t:5.1f}%, "
            f"err {error:.2e}",
            flush=True,
        )


def nvcc_version() -> str:
    try:
        out = subprocess.run(["nvcc", "--version"], capture_output=True, text=True, check=False)
        return out.stdout.strip().splitlines()[-1]
    except OSError:
        return "unknown"


def markdown(
    env: dict[str, Any], rows: list[dict[str, Any]], variants: list[dict[str, Any]]
) -> str:
    lines = [
        "# erlcuda CUDA kernels beside CuPy",
        "",
        f"{env['device']} (compute capability {env['compute_capability']}), "
        f"CuPy {env['cupy']}, PyCUDA {env['pycuda']}, {env['nvcc']}. Kernel time only "
        f"(CUDA events), median of {env['repeat']} launches after {env['warmup']} warm-ups, "
        "random data.",
        "",
        "| kernel | size | ours | CuPy | ratio | target | met? | rel. error (ours / CuPy) |",
        "| --- | --- | ---: | ---: | ---: | ---: | --- | --- |",
    ]
    for r in rows:
        met = "yes" if r["met"] else "no"
        ok = "" if r["error_ok"] else " **over bound**"
        lines.append(
            f"| {r['kernel']} | {r['size']} | {r['ours']:.1f} {r['unit']} | "
            f"{r['cupy']:.1f} {r['unit']} | {100 * r['ratio']:.1f}% | "
            f"≥ {100 * r['target']:.0f}% | {met} | {r['error']:.1e} / {r['error_cupy']:.1e}"
            f"{ok} |"
        )
    lines += [
        "",
        "Bandwidth counts bytes read (reduce, dot_product) or read and written (vector_add). "
        "Errors: ‖out - ref‖ / ‖ref‖ against float64 (vector_add, matmul); "
        "|out - ref| / Σ|terms| (reduce, dot_product).",
    ]
    if variants:
        lines += [
            "",
            "## matmul variants (square, f32)",
            "",
            "| n | kernel | ours TFLOP/s | CuPy TFLOP/s | ratio | rel. error |",
            "| ---: | --- | ---: | ---: | ---: | --- |",
        ]
        for v in variants:
            lines.append(
                f"| {v['size']} | {v['kernel']} | {v['ours']:.1f} | {v['cupy']:.1f} | "
                f"{100 * v['ratio']:.1f}% | {v['error']:.1e} |"
            )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--quick", action="store_true", help="fewer launches and no matmul variants beyond 4096"
    )
    parser.add_argument(
        "--out",
        type=Path,
        help="where to write kernels.md and kernels.json (default: a new folder "
        "_build/bench/kernels-<UTC date>-<time>)",
    )
    parser.add_argument("--device", type=int, default=0)
    args = parser.parse_args(argv)
    if args.out is None:
        stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
        args.out = ROOT / "_build" / "bench" / f"kernels-{stamp}"
    warmup, repeat = (3, 20) if args.quick else (5, 50)

    cp.cuda.Device(args.device).use()
    backend = PrimaryContextBackend()
    # Our device runs on the GPU's primary context, the one CuPy uses (see
    # PrimaryContextDevice); the worker itself uses a context of its own.
    dev = backend.open(args.device)
    try:
        info = dev.info()
        env = {
            "device": info["name"],
            "compute_capability": "{}.{}".format(*info["compute_capability"]),
            "multiprocessors": dev.sm_count,
            "cupy": cp.__version__,
            "pycuda": pycuda.VERSION_TEXT,
            "numpy": np.__version__,
            "python": platform.python_version(),
            "nvcc": nvcc_version(),
            "warmup": warmup,
            "repeat": repeat,
            "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        }
        print(json.dumps(env), flush=True)
        bench = Bench(dev, warmup, repeat)
        steps: list[Callable[[], None]] = [
            lambda: bench.matmul(MATMUL, headline=True),
            lambda: bench.reduction("reduce"),
            lambda: bench.reduction("dot_product"),
            bench.vector_add,
        ]
        for size in VARIANTS:
            if size != MATMUL and not (args.quick and size > MATMUL):
                steps.append(lambda size=size: bench.matmul(size, headline=False))
        for step in steps:
            step()
            cp.get_default_memory_pool().free_all_blocks()  # the step's arrays are gone
        bench.variants.sort(key=lambda v: v["size"])
    finally:
        dev.close()
        backend.close()

    text = markdown(env, bench.rows, bench.variants)
    print()
    print(text)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "kernels.md").write_text(text)
    raw = {"env": env, "rows": bench.rows, "matmul_variants": bench.variants}
    (args.out / "kernels.json").write_text(json.dumps(raw, indent=1))
    print(f"wrote {args.out / 'kernels.md'} and {args.out / 'kernels.json'}")
    failed = [r for r in bench.rows if not r["error_ok"]]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
