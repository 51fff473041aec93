"""Programs from Erlang beside CuPy on the same GPU, in one run: `bench/programs --help`.

    bench/programs [--backend auto|cpu|cuda] [--sizes N,...] [--reps N] [--callers N]
                   [--seconds S] [--soak S] [--quick] [--out DIR]

One Erlang node (``bench/erlcuda_programs_bench.erl``) times, on f32 vectors:

1. 10 chained vector_adds and a reduce as one program on two device buffers (fused and
   replayed as a CUDA graph where the GPU and ``cuda-bindings`` allow; and made with
   ``{fuse, false}, {graph, false}``), and the same chain as 11 ``launch_sync`` calls;
2. that program with its inputs as binaries and its sum as the answer, beside a lone
   ``vector_add`` of binaries of the same size (blocks of 25 calls, alternating);
3. a one-step program (vector_add) beside a launch of vector_add, 1000 elements, in blocks of
   250 calls alternating;
4. ``--callers`` processes running a 3-step program (``s = a + b``, ``t = s + b``, sum ``t``)
   on 1000 elements for ``--seconds``, then the same work as 3 ``launch_sync`` calls each;
5. with ``--soak S``, mixed programs for S seconds, reading the worker's RSS and the device's
   pool every 5 s.

Then, in this process once the node has stopped, CuPy does the chain of (1) on device arrays:
unfused (one sync, as the sum's ``float()``), replayed as a ``cupy.cuda.Graph`` captured over
preallocated arrays, and as ``cupy.fuse`` of the whole chain and its sum. Every figure is a
wall time per call from the caller's side. Writes ``report.md``, ``results.json`` and
``programs.png`` to ``--out`` (default: a new folder under ``_build/bench/``).
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

CHAIN = 10
Json = dict[str, Any]


def run_node(args: argparse.Namespace) -> tuple[Json, list[Json]]:
    term = {"backend": args.backend, "sizes": args.sizes, "reps": args.reps,
            "lone_reps": args.lone_reps, "callers": args.callers, "seconds": args.seconds,
            "soak": args.soak, "python": stack_bench.ErlString(sys.executable)}
    return stack_bench.run_bench_module("erlcuda_programs_bench", term)


def vec(n: int, k: int) -> np.ndarray:
    return ((np.arange(n, dtype=np.int64) * k) % 7).astype(np.float32)


def cupy_cases(size: int, reps: int) -> list[Json]:
    """The chain on device arrays: unfused, as a graph, fused; samples in ns."""
    import cupy as cp

    a, b = cp.asarray(vec(size, 1)), cp.asarray(vec(size, 2))
    want = float(vec(size, 1).astype(np.float64).sum() + CHAIN * vec(size, 2).sum())

    def unfused() -> float:
        x = a
        for _ in range(CHAIN):
            x = x + b
        return float(x.sum())

    @cp.fuse()
    def chain_sum(x: Any, y: Any) -> Any:
        for _ in range(CHAIN):
            x = x + y
        return cp.sum(x)

    def fused() -> float:
        return float(chain_sum(a, b))

    cases = [("cupy_unfused", unfused), ("cupy_fuse", fused)]
    graph = _cupy_graph(cp, a, b)
    if graph is not None:
        cases.append(("cupy_graph", graph))
    out = []
    for name, fn in cases:
        got = fn()
        if abs(got - want) > 1e-5 * abs(want) + 1e-6:
            raise SystemExit(f"programs: {name} gives {got}, not {want}")
        samples = []
        for _ in range(max(20, reps // max(1, size // 1_000_000))):
            t0 = time.perf_counter_ns()
            fn()
            samples.append(time.perf_counter_ns() - t0)
        out.append({"event": "result", "case": name, "size": size, "samples": samples})
    return out


def _cupy_graph(cp: Any, a: Any, b: Any) -> Any:
    """The chain captured once as a graph over arrays of its own; ``None`` where CuPy
    cannot capture it."""
    stream = cp.cuda.Stream(non_blocking=True)
    xs = [cp.empty_like(a) for _ in range(CHAIN)]
    total = cp.empty((), dtype=a.dtype)
    try:
        with stream:
            stream.begin_capture()
            cp.add(a, b, out=xs[0])
            for i in range(1, CHAIN):
                cp.add(xs[i - 1], b, out=xs[i])
            cp.sum(xs[-1], out=total)
            graph = stream.end_capture()
    except Exception as exc:  # capture needs a CuPy built for it
        print(f"programs: no CuPy graph: {exc}", file=sys.stderr)
        return None

    def replay() -> float:
        graph.launch(stream)
        stream.synchronize()
        return float(total.get())

    return replay


# -- the report -------------------------------------------------------------------------------


def summarize(results: list[Json]) -> dict[tuple[str, int], Json]:
    out: dict[tuple[str, int], Json] = {}
    for r in results:
        if r.get("event") != "result":
            continue
        ns = np.asarray(r["samples"], dtype=np.float64)
        out[(r["case"], int(r["size"]))] = {
            "n": int(ns.size), **{f"p{q}_ms": float(np.percentile(ns, q)) / 1e6
                                  for q in (50, 90, 99)}}
    return out


def p50(summary: dict[tuple[str, int], Json], case: str, size: int) -> float | None:
    found = summary.get((case, size))
    return None if found is None else float(found["p50_ms"])


def ratio(a: float | None, b: float | None) -> str:
    return "-" if a is None or b is None or b == 0 else f"{a / b:.2f}x"


def ms(x: float | None) -> str:
    return "-" if x is None else (f"{x:.3f}" if x < 10 else f"{x:.1f}")


def target(ok: bool | None) -> str:
    return "-" if ok is None else ("met" if ok else "**missed**")


def chain_lines(summary: dict[tuple[str, int], Json], sizes: list[int]) -> list[str]:
    lines = ["## 1. 10 chained vector_adds + reduce, inputs on the device", "",
             "p50 per call, ms (p90 and p99 in results.json). Targets: <= 1.0x CuPy's unfused "
             "chain at 1e3 and 1e6, <= 1.0x its graph where it can, and at 1.6e7 <= 0.5x the "
             "unfused chain and <= 1.2x `cupy.fuse`.", "",
             "| elements | program | p99 | unfused program | 11 launches | CuPy unfused | "
             "CuPy graph | cupy.fuse | / unfused | / graph | / fuse |",
             "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for n in sizes:
        prog = p50(summary, "chain_program", n)
        p99 = summary.get(("chain_program", n), {}).get("p99_ms")
        cells = [prog, p99, p50(summary, "chain_unfused", n), p50(summary, "chain_launches", n),
                 p50(summary, "cupy_unfused", n), p50(summary, "cupy_graph", n),
                 p50(summary, "cupy_fuse", n)]
        lines.append(f"| {n:,} | " + " | ".join(ms(c) for c in cells) + " | "
                     + " | ".join(ratio(prog, c) for c in cells[4:]) + " |")
    return lines


def port_lines(summary: dict[tuple[str, int], Json], sizes: list[int]) -> list[str]:
    lines = ["", "## 2. The program with its inputs and its sum through the port", "",
             "Beside a lone vector_add of binaries of the same size (result a binary), in "
             "blocks alternating. Target: <= 1.2x the vector_add.", "",
             "| elements | program p50 ms | vector_add p50 ms | / vector_add | target |",
             "| ---: | ---: | ---: | ---: | --- |"]
    for n in sizes:
        prog, add = p50(summary, "chain_port", n), p50(summary, "vector_add_port", n)
        ok = None if prog is None or add is None else prog <= 1.2 * add
        lines.append(f"| {n:,} | {ms(prog)} | {ms(add)} | {ratio(prog, add)} | {target(ok)} |")
    one, launch = p50(summary, "one_step", 1000), p50(summary, "launch", 1000)
    lines += ["", "## 3. A one-step program against a launch", "",
              "vector_add of two 1000-element binaries, blocks of 250 calls alternating. "
              "Target: within 10 %.", "",
              "| one-step program p50 ms | launch p50 ms | ratio | target |",
              "| ---: | ---: | ---: | --- |",
              f"| {ms(one)} | {ms(launch)} | {ratio(one, launch)} | "
              f"{target(None if one is None or launch is None else one <= 1.1 * launch)} |"]
    return lines


def rate_lines(results: list[Json]) -> list[str]:
    rates = {r["case"]: r for r in results if r.get("event") == "rate"}
    if not rates:
        return []
    prog = max(rates[k]["per_second"] for k in ("programs", "programs_again") if k in rates)
    three = rates.get("three_launches", {}).get("per_second")
    callers = rates["programs"]["callers"]
    return ["", "## 4. Many callers", "",
            f"{callers} callers, each running the 3-step program (s = a + b, t = s + b, "
            "sum t) on 1000-element binaries, then the same work as 3 launch_syncs each. "
            "Targets: >= 100,000 programs/s and >= 3x the launches' rate.", "",
            "| case | per second |", "| --- | ---: |",
            *(f"| {k} | {v['per_second']:,.0f} |" for k, v in rates.items()),
            "", f"Programs/s (the better run) {prog:,.0f}: "
            f"{target(prog >= 100_000)} (100,000); / 3 launches "
            + (f"{prog / three:.2f}x: {target(prog >= 3 * three)}" if three else "-")]


def soak_lines(results: list[Json]) -> list[str]:
    samples = [r for r in results if r.get("event") == "soak"]
    done = next((r for r in results if r.get("event") == "soak_done"), None)
    if not samples or done is None:
        return []
    rss = [s["rss_kb"] / 1024 for s in samples]
    pool = [s["pool_bytes"] / 2**20 for s in samples]
    free = [s["free_memory"] / 2**20 for s in samples]
    half = len(samples) // 2
    return ["", "## 5. Memory over a soak of mixed programs", "",
            f"{done['runs']:,} runs in {done['seconds']} s (16 callers; sizes 10 to 1e5; kept "
            "outputs freed; half on buffers; graphs on and off). Readings every 5 s; the last "
            "after the load stopped.", "",
            "| reading | worker RSS MiB | pool MiB | device free MiB | graphs |",
            "| --- | ---: | ---: | ---: | ---: |",
            *(f"| {s['t']} s | {s['rss_kb'] / 1024:.0f} | {s['pool_bytes'] / 2**20:.0f} | "
              f"{s['free_memory'] / 2**20:.0f} | {s['graphs']} |"
              for s in samples[:: max(1, len(samples) // 12)] + samples[-1:]), "",
            f"RSS: {min(rss):.0f} to {max(rss):.0f} MiB; second half {min(rss[half:]):.0f} to "
            f"{max(rss[half:]):.0f} MiB. Pool: {min(pool):.0f} to {max(pool):.0f} MiB. Device "
            f"free: {min(free):.0f} to {max(free):.0f} MiB."]


def report(info: Json, results: list[Json], args: argparse.Namespace, wall: float,
           note: str) -> str:
    summary = summarize(results)
    programs = next((r["devices"] for r in results if r.get("event") == "programs"), [])
    lines = [f"# erlcuda: programs ({info.get('backend')} backend)", "",
             f"- Date: {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC; wall time {wall:.0f} s;"
             f" `bench/programs {' '.join(args.argv)}`",
             f"- erlcuda {stack_bench.git_version()}; {stack_bench.cpu_model()}",
             f"- CuPy: {note}",
             f"- The worker's program counters at the end: {programs}", ""]
    lines += chain_lines(summary, args.sizes)
    lines += port_lines(summary, args.sizes)
    lines += rate_lines(results)
    lines += soak_lines(results)
    return "\n".join(lines) + "\n"


def plot(results: list[Json], out: Path, sizes: list[int]) -> None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    summary = summarize(results)
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for case, label in (("chain_program", "erlcuda program"),
                        ("chain_unfused", "erlcuda program, unfused, no graph"),
                        ("chain_launches", "erlcuda, 11 launches"),
                        ("cupy_unfused", "CuPy, unfused"), ("cupy_graph", "CuPy graph"),
                        ("cupy_fuse", "cupy.fuse")):
        xs = [n for n in sizes if (case, n) in summary]
        if xs:
            ax.plot(xs, [summary[(case, n)]["p50_ms"] for n in xs], marker="o", label=label)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("elements (f32)")
    ax.set_ylabel("p50 ms per call")
    ax.set_title("10 vector_adds + reduce on device data")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "programs.png", dpi=110)
    plt.close(fig)


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=("auto", "cpu", "cuda"), default="auto")
    parser.add_argument("--sizes", default="1000,1000000,16000000")
    parser.add_argument("--reps", type=int, default=500)
    parser.add_argument("--lone-reps", type=int, default=2000)
    parser.add_argument("--callers", type=int, default=1000)
    parser.add_argument("--seconds", type=int, default=5)
    parser.add_argument("--soak", type=int, default=0)
    parser.add_argument("--quick", action="store_true",
                        help="fewer repetitions and shorter rates (about a minute)")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    args.argv = list(argv if argv is not None else sys.argv[1:])
    args.sizes = [int(float(s)) for s in args.sizes.split(",")]
    if args.quick:
        args.reps, args.lone_reps, args.seconds = 100, 500, 2
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    t0 = time.monotonic()
    info, results = run_node(args)
    note = "not run (the cpu backend)"
    if info.get("backend") == "cuda":
        try:
            import cupy as cp

            for n in args.sizes:
                results += cupy_cases(n, args.reps)
            note = f"{cp.__version__}, in this process after the Erlang node stopped"
        except ImportError:
            note = "not installed"
    text = report(info, results, args, time.monotonic() - t0, note)
    out = args.out or stack_bench.BUILD / f"programs-{datetime.now(timezone.utc):%Y%m%d-%H%M%S}"
    stack_bench.write_tool_outputs("programs", out, {"info": info, "results": results}, text)
    plot(results, out, args.sizes)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
