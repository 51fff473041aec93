"""erlcuda on several BEAM nodes of one host: remote launches against local ones, in one run.

    bench/cluster [--backend auto|cpu|cuda] [--peers N] [--gpus N] [--out DIR]

A distributed Erlang node (``bench/erlcuda_cluster_bench.erl``) runs erlcuda and starts
``--peers`` more nodes with OTP's ``peer``, each with its own erlcuda (on a host with
several GPUs, ``--gpus N``: node K sees GPU K only, one BEAM node per GPU as a stand-in for
one machine per GPU). It measures, from the first node:

- latency: ``launch_sync`` of vector_add on the node itself and on a peer (``{node,
  Peer}``), shuffled job by job, at 1000 and 1e6 elements; the remote overhead is the
  difference of the medians;
- throughput: 1000 callers looping ``launch_sync`` on the node alone, then with ``{node,
  any}`` over every node: vector_add 1000 and matmul (their trip bounds the rate) and, on
  GPUs, a user kernel that spins on each element (the device bounds it).

Writes ``report.md`` and ``results.json`` to ``--out`` (default: a new folder under
``_build/bench/``).
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
Json = dict[str, Any]


def run_node(args: argparse.Namespace) -> tuple[Json, list[Json]]:
    term = {"backend": args.backend, "peers": args.peers, "gpus": args.gpus,
            "sizes": [1000, 1_000_000], "reps": args.reps, "callers": 1000,
            "seconds": args.seconds, "cpu_devices": 1, "matmul": args.matmul,
            "spin_iters": args.spin_iters,
            "python": stack_bench.ErlString(sys.executable)}
    return stack_bench.run_bench_module("erlcuda_cluster_bench", term, distributed=True)


def pct(ns: list[int], q: float) -> float:
    return float(np.percentile(np.asarray(ns, dtype=np.float64), q)) / 1e3


def report(info: Json, events: list[Json], args: argparse.Namespace, wall: float) -> tuple[
        str, Json]:
    nodes = info.get("nodes", [])
    lines = [
        f"# erlcuda on {len(nodes)} BEAM nodes of one host ({info.get('backend')} backend)",
        "",
        f"- Date: {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC; wall time {wall:.0f} s; "
        f"`bench/cluster --backend {args.backend} --peers {args.peers} --gpus {args.gpus} "
        f"--matmul {args.matmul} --spin-iters {args.spin_iters}`",
        f"- erlcuda {stack_bench.git_version()}; {stack_bench.cpu_model()}; devices per node "
        f"{info.get('devices')}", "",
        "## Remote launch against local (µs, `launch_sync` of vector_add, shuffled job by job)",
        "", "| elements | n | local p50 | local p99 | remote p50 | remote p99 | "
        "remote - local, p50 |", "| ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    summary: Json = {"latency": [], "throughput": {}}
    for e in events:
        if e.get("section") != "latency":
            continue
        lp50, rp50 = pct(e["local_ns"], 50), pct(e["remote_ns"], 50)
        row = {"size": e["size"], "n": len(e["local_ns"]), "local_p50_us": lp50,
               "local_p99_us": pct(e["local_ns"], 99), "remote_p50_us": rp50,
               "remote_p99_us": pct(e["remote_ns"], 99), "overhead_p50_us": rp50 - lp50}
        summary["latency"].append(row)
        lines.append(f"| {row['size']:,} | {row['n']} | {lp50:,.0f} | {row['local_p99_us']:,.0f}"
                     f" | {rp50:,.0f} | {row['remote_p99_us']:,.0f} | "
                     f"{row['overhead_p50_us']:,.0f} |")
    spin = next((e for e in events if e.get("event") == "spin"), None)
    lines += ["", "## 1000 callers on the first node", "",
              f"Each job alone on that node, then with `{{node, any}}` over {len(nodes)} nodes:",
              "",
              "- vector_add of 1000 elements: the trip bounds the rate;",
              f"- matmul {args.matmul}x{args.matmul}: "
              f"{2 * 4 * args.matmul ** 2 / 2**20:.1f} MiB of operands a job, whose trip "
              "bounds the rate;"]
    if spin:
        lines.append(f"- spin: a user kernel that runs {spin['spin_iters']:,} dependent "
                     f"multiply-adds on each of {spin['spin_elements']:,} elements (0.4 MB "
                     f"a job): the device bounds the rate. One job alone took "
                     f"{spin['spin_lone_ns'] / 1e6:.2f} ms (the mean of 20 `launch_sync`).")
    lines += ["", "| job | routing | jobs | jobs/s | cluster ÷ alone | jobs per node |",
              "| --- | --- | ---: | ---: | ---: | --- |"]
    summary["spread"] = {}
    for e in events:
        if e.get("section") == "throughput":
            kernel = e.get("kernel", "vector_add")
            rate = e["jobs"] / (e["wall_ns"] / 1e9)
            rates = summary["throughput"].setdefault(kernel, {})
            rates[e["mode"]] = rate
            what = "alone" if e["mode"] == "local" else "`{node, any}`"
            ratio = (f"{rate / rates['local']:.2f}x" if e["mode"] != "local"
                     and rates.get("local") else "")
            spread = e.get("spread", [])
            summary["spread"].setdefault(kernel, {})[e["mode"]] = spread
            per_node = " / ".join(f"{s['jobs']:,}" for s in spread)
            lines.append(f"| {kernel} | {what} | {e['jobs']:,} | {rate:,.0f} | {ratio} | "
                         f"{per_node} |")
    lines += ["", "Jobs per node: as each node's devices counted them, first node first."]
    return "\n".join(lines) + "\n", summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=("auto", "cpu", "cuda"), default="auto")
    parser.add_argument("--peers", type=int, default=2)
    parser.add_argument("--gpus", type=int, default=0)
    parser.add_argument("--reps", type=int, default=300)
    parser.add_argument("--seconds", type=int, default=5)
    parser.add_argument("--matmul", type=int, default=256, help="the side of the matmul jobs")
    parser.add_argument("--spin-iters", type=int, default=1_000_000,
                        help="the spin kernel's loop (GPUs only; 0: no spin jobs)")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    t0 = time.monotonic()
    info, events = run_node(args)
    text, summary = report(info, events, args, time.monotonic() - t0)
    stack_bench.write_tool_outputs("cluster", args.out,
                              {"info": info, "summary": summary, "events": events}, text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
