"""Host data at the speed of the bus: vector_add and reduce end to end, beside CuPy.

    bench/bus [--backend auto|cpu|cuda] [--quick] [--probe] [--out DIR]

One Erlang node (``bench/erlcuda_bus.erl``) times, every call waiting for its result
(``launch_sync``, binaries in and out):

- vector_add at 1e3, 1e4, 1e5, 1e6 and 1.6e7 elements and reduce of a 1.6e7-element
  binary, with the defaults (the transport threshold measured at the application's start);
  at each size, in blocks that take turns (``rounds`` of them, the order turned each round,
  so that every ratio compares the same minutes of a shared machine; a block's first call,
  which follows another side's work, is not timed):
  - the lean floor (``bench/lean_floor.py``) doing the same vector_add, its operands through
    its port and through a file shared with it (one ``file:pwrite``, the GPU copying from
    and into the file's registered pages, one ``file:pread``): the least either transport
    costs, whatever the design; a goal below the faster floor cannot be met, and is judged
    so;
  - CuPy from numpy (``bench/cupy_peer.py``, a port of the node that times its own calls:
    ``cp.asarray`` of each operand, the kernel, ``.get()`` or ``float(x.sum())``); skipped
    where CuPy does not load (the CPU backend never runs it);
- lone 1000-element jobs in blocks, against the lean floor (``bench/lean_floor.py``):
  vector_add on binaries and on lists, reduce of a binary;
- with ``--probe``, what the worker and the application choose between: the GPU's copies
  of a fresh mapping at each size (staged through pinned chunks, registered for the one
  copy, from or into memory registered beforehand), and vector_add at operand sizes from
  64 KiB to 16 MiB through the pipe alone and through shared memory alone.

Then, in another node: the list conversion of ``erlcuda_vector`` against the one it
replaced (``bench/erlcuda_lists.erl``).

GB/s = bytes in + out ÷ wall time (reduce: its input). Writes ``report.md``,
``results.json`` and ``bus.png`` (time and GB/s against size, erlcuda beside CuPy) to
``--out`` (default: a new folder under ``_build/bench/``). ``--quick`` finishes in about
three minutes on a GPU machine; the full run in under six.
"""

from __future__ import annotations

import argparse
import math
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

SIZES = [1_000, 10_000, 100_000, 1_000_000, 16_000_000]
REDUCE_SIZE = 16_000_000
#: The goals, on the cuda backend: vector_add p50 ÷ CuPy's at most (from these sizes on),
#: GB/s at 1.6e7 at least, and reduce's GB/s at 1.6e7 at least.
RATIO_GOALS = [(100_000, 1.0), (1_000, 1.5)]
VECTOR_ADD_GBS = 6.0
REDUCE_GBS = 10.0
MIB = 1 << 20


def plan(quick: bool) -> Json:
    if quick:
        return {"sizes": SIZES, "reduce_size": REDUCE_SIZE, "warmup": 3, "budget_s": 1.0,
                "min_iters": 5, "max_iters": 300,
                "lone": {"size": 1_000, "block": 250, "rounds": 4},
                "transfer_sizes": [MIB, 4 * MIB, 16 * MIB, 64 * MIB],
                "transport_sizes": [64 << 10, 256 << 10, MIB, 4 * MIB, 16 * MIB],
                "lists": [1_000, 100_000], "rounds": 5}
    return {"sizes": SIZES, "reduce_size": REDUCE_SIZE, "warmup": 5, "budget_s": 3.0,
            "min_iters": 10, "max_iters": 2000,
            "lone": {"size": 1_000, "block": 250, "rounds": 12},
            "transfer_sizes": [256 << 10, MIB, 4 * MIB, 16 * MIB, 64 * MIB, 256 * MIB],
            "transport_sizes": [(64 << 10) * 2**k for k in range(9)],
            "lists": [1_000, 100_000, 1_000_000], "rounds": 10}


def run_node(args: argparse.Namespace, config: Json) -> tuple[Json, list[Json]]:
    term = {**config, "backend": args.backend, "probe": args.probe,
            "python": stack_bench.ErlString(sys.executable),
            "worker_path": stack_bench.ErlString(str(ROOT / "bench" / "worker")),
            "cupy_script": stack_bench.ErlString(str(ROOT / "bench" / "cupy_peer.py")),
            "lone": {**config["lone"],
                     "script": stack_bench.ErlString(str(ROOT / "bench" / "lean_floor.py")),
                     "python_dir": stack_bench.ErlString(str(ROOT / "python"))}}
    return stack_bench.run_bench_module("erlcuda_bus", term, extra=("erlcuda_lone",))


def run_lists(sizes: list[int]) -> list[Json]:
    _, events = stack_bench.run_bench_module("erlcuda_lists", {"sizes": sizes})
    return events


# -- figures -------------------------------------------------------------------------------


def ms(ns: list[int]) -> Json:
    values = np.asarray(ns, dtype=np.float64) / 1e6
    return {f"p{q}": float(np.percentile(values, q)) for q in (50, 90, 99)} | {
        "n": int(values.size)}


def summarize(info: Json, events: list[Json]) -> Json:
    rows = []
    cupy = {(e["kernel"], e["size"]): ms(e["samples_ns"]) for e in events
            if e.get("section") == "cupy"}
    floors: dict[tuple[str, int], Json] = {}
    for e in events:
        if e.get("section") == "floors":
            floors.setdefault((e["kernel"], e["size"]), {})[e["transport"]] = ms(
                e["samples_ns"])
    for e in events:
        if e.get("section") != "bus":
            continue
        key = (e["kernel"], e["size"])
        nbytes = e["bytes_in"] + (e["bytes_out"] if e["kernel"] != "reduce" else 0)
        mine, theirs = ms(e["samples_ns"]), cupy.get(key)
        floor = floors.get(key, {})
        least = min((f["p50"] for f in floor.values()), default=None)
        rows.append({"kernel": e["kernel"], "size": e["size"], "bytes": nbytes,
                     "erlcuda_ms": mine, "gbs": nbytes / mine["p50"] / 1e6,
                     "cupy_ms": theirs,
                     "cupy_gbs": nbytes / theirs["p50"] / 1e6 if theirs else None,
                     "ratio": mine["p50"] / theirs["p50"] if theirs else None,
                     "floor_ms": floor, "floor_ratio": mine["p50"] / least if least else None,
                     "floor_vs_cupy": least / theirs["p50"] if least and theirs else None})
    section = {s: [e for e in events if e.get("section") == s]
               for s in ("lone", "transfers", "transports", "lists")}
    return {"info": info, "bus": rows, "lone": stack_bench.summarize_lone(section["lone"]),
            "transfers": section["transfers"][0] if section["transfers"] else None,
            "transports": transports(section["transports"]),
            "lists": section["lists"]}


def transports(events: list[Json]) -> list[Json]:
    by_size: dict[int, Json] = {}
    for e in events:
        row = by_size.setdefault(e["bytes"], {"bytes": e["bytes"]})
        row[e["transport"]] = ms(e["samples_ns"])
    for row in by_size.values():
        pipe, shm = row.get("pipe"), row.get("shm")
        row["faster"] = ("-" if not (pipe and shm)
                         else "shm" if shm["p50"] <= pipe["p50"] else "pipe")
    return [by_size[k] for k in sorted(by_size)]


def targets(summary: Json, cuda: bool) -> list[Json]:
    out: list[Json] = []
    for r in summary["bus"]:
        if r["kernel"] != "vector_add":
            continue
        goal = next(g for start, g in RATIO_GOALS if r["size"] >= start)
        row = target(f"vector_add {stack_bench.sci(r['size'])}: p50 ÷ CuPy's p50",
                     goal, r["ratio"], "x", True, cuda)
        floor = r.get("floor_vs_cupy")
        if row["status"] == "missed" and floor is not None and floor > goal:
            row["status"] = (f"floor above: the faster lean floor is {floor:.2f}x CuPy; "
                             f"erlcuda {r['floor_ratio']:.2f}x that floor")
        out.append(row)
        if r["size"] == 16_000_000:
            out.append(target("vector_add 1.6e7: GB/s (in + out ÷ p50)", VECTOR_ADD_GBS,
                              r["gbs"], " GB/s", False, cuda))
    for r in summary["bus"]:
        if r["kernel"] == "reduce":
            out.append(target("reduce 1.6e7: GB/s (in ÷ p50)", REDUCE_GBS, r["gbs"],
                              " GB/s", False, cuda))
    for r in summary["lone"]:
        out.append(target(f"lone 1000: {stack_bench.LONE_WHAT[r['kind']]} p50 ÷ the lean "
                          "floor's", r["goal"], r["ratio"]["p50"], "x", True, True))
    return out


def target(what: str, goal: float, measured: float | None, unit: str, at_most: bool,
           judged: bool) -> Json:
    status = stack_bench.target_status(measured, goal, at_most=at_most)
    if not judged and status != "not measured":
        status += " (a GPU goal: reference only here)"
    return {"target": what, "goal": goal, "measured": measured, "unit": unit,
            "at_most": at_most, "status": status}


# -- the report ----------------------------------------------------------------------------


def f(x: float | None, digits: int = 2) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    return f"{x:,.{digits}f}" if abs(x) < 1000 else f"{x:,.0f}"


def cupy_note(events: list[Json], backend: str | None) -> str:
    got = next((e["cupy"] for e in events if e.get("event") == "reference"), "not run")
    if backend != "cuda":
        return "not run (the cpu backend)"
    return (f"{got}, in a port of the node, its blocks taking turns with erlcuda's and the "
            "floor's" if got != "not run" else "not run (it did not load)")


def report(summary: Json, args: argparse.Namespace, wall: float, plots: list[str]) -> str:
    info = summary["info"]
    dev = (info.get("devices") or [{}])[0]
    lines = [f"# erlcuda: host data at the speed of the bus ({info.get('backend')} backend)",
             "",
             f"- Date: {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC; wall time {wall:.0f} s;"
             f" `bench/bus {' '.join(sys.argv[1:])}`",
             f"- erlcuda {stack_bench.git_version()}; {stack_bench.cpu_model()}; "
             f"{dev.get('name', 'no GPU')}; OTP {info.get('otp_release')} "
             f"({info.get('schedulers')} schedulers)",
             f"- CuPy: {summary['cupy_note']}", ""]
    lines += target_lines(summary["targets"])
    lines += bus_lines(summary["bus"])
    lines += floor_lines(summary["bus"])
    lines += stack_bench.lone_lines(summary["lone"], summary["config"]["lone"]["block"])
    lines += choice_lines(summary, info)
    lines += list_lines(summary["lists"])
    lines += [f"![{p}]({p})" for p in plots] + [""]
    return "\n".join(lines)


def target_lines(rows: list[Json]) -> list[str]:
    lines = ["## Targets", ""]
    lines += stack_bench.table(["target", "goal", "measured", "status"], (
        [t["target"], ("≤ " if t["at_most"] else "≥ ") + f"{t['goal']:g}{t['unit']}",
         "-" if t["measured"] is None else f"{f(t['measured'])}{t['unit']}",
         f"**{t['status']}**"] for t in rows), "lrrl")
    return [*lines, ""]


def bus_lines(rows: list[Json]) -> list[str]:
    lines = ["## End to end, beside CuPy from numpy (ms per call)", "",
             "erlcuda: `launch_sync` of binaries, result as a binary, wall time in the "
             "caller. CuPy: `cp.asarray` of each numpy operand, the kernel, `.get()` (reduce: "
             "`float(x.sum())`). Ratio = erlcuda p50 ÷ CuPy p50.", ""]
    lines += stack_bench.table(
        ["kernel", "elements", "MB", "n", "p50", "p90", "p99", "GB/s", "CuPy p50", "p90",
         "p99", "CuPy GB/s", "÷ CuPy"],
        ([r["kernel"], stack_bench.sci(r["size"]), f(r["bytes"] / 1e6, 3),
          str(r["erlcuda_ms"]["n"]), *(f(r["erlcuda_ms"][q], 3) for q in ("p50", "p90", "p99")),
          f(r["gbs"]), *((f(r["cupy_ms"][q], 3) for q in ("p50", "p90", "p99"))
                         if r["cupy_ms"] else ("-", "-", "-")),
          f(r["cupy_gbs"]), stack_bench.fratio(r["ratio"])] for r in rows))
    return [*lines, ""]


def floor_lines(rows: list[Json]) -> list[str]:
    rows = [r for r in rows if r.get("floor_ms")]
    if not rows:
        return []
    lines = ["## The same vector_adds by the lean floor (ms per call)", "",
             "`bench/lean_floor.py` from this node: through its port (`{packet, 4}`, the "
             "operands copied into pinned memory allocated once), and through a file in "
             "shared memory (one `file:pwrite` of both operands, a 5-byte request, the GPU "
             "copying straight from and into the file's registered pages, one `file:pread` "
             "of the result). No design of either transport does less. ÷ floor = erlcuda p50 "
             "÷ the faster floor's p50; floor ÷ CuPy = that floor's p50 ÷ CuPy's.", ""]
    lines += stack_bench.table(
        ["elements", "erlcuda p50", "floor pipe p50", "p99", "floor shm p50", "p99",
         "÷ floor", "floor ÷ CuPy"],
        ([stack_bench.sci(r["size"]), f(r["erlcuda_ms"]["p50"], 3),
          *(f(r["floor_ms"].get(t, {}).get(q), 3) for t in ("pipe", "shm")
            for q in ("p50", "p99")),
          stack_bench.fratio(r["floor_ratio"]), stack_bench.fratio(r["floor_vs_cupy"])]
         for r in rows))
    return [*lines, ""]


def choice_lines(summary: Json, info: Json) -> list[str]:
    """What the application and the worker chose between, and what they chose."""
    lines = ["## The transport: pipe or shared memory", "",
             f"Chosen at the application's start (`shm_threshold` auto): vectors of "
             f"**{info.get('shm_threshold'):,} bytes** or more through shared memory, from "
             "these quiet vector_add jobs (two operands and a result of the size, µs, median):", ""]
    lines += stack_bench.table(["bytes", "pipe µs", "shared memory µs"], (
        [f"{p['bytes']:,}", f"{p['pipe_us']:,}", f"{p['shm_us']:,}"]
        for p in info.get("shm_probe", [])))
    if summary["transports"]:
        lines += ["", "With `--probe`: vector_add with operands of each size, the application "
                  "restarted with everything through the pipe, then everything through shared "
                  "memory (ms, p50 and p99):", ""]
        lines += stack_bench.table(["operand bytes", "pipe p50", "p99", "shm p50", "p99",
                                    "faster"], (
            [f"{r['bytes']:,}", *(f(r.get(t, {}).get(q), 3) for t in ("pipe", "shm")
                                  for q in ("p50", "p99")), r["faster"]]
            for r in summary["transports"]))
    lines += ["", *transfer_lines(summary["transfers"], info), ""]
    return lines


def transfer_lines(t: Json | None, info: Json) -> list[str]:
    dev = (info.get("devices") or [{}])[0]
    lines = ["## Host memory: staged or registered", ""]
    if t is None:
        return [*lines, "Not measured (run with `--probe`)."]
    if not t["rows"]:
        return [*lines, "Nothing to choose on this backend: the CPU backend makes no copies."]
    lines += ["The GPU's copies of a fresh mapping (a job's own operand file, written but not "
              "yet mapped), GB/s: in through pinned chunks (staged), in registered for the one "
              "copy (register + copy + unregister), in and out of memory registered beforehand "
              "(an operand slot or a result buffer from its second use), out through pinned "
              "chunks.", ""]
    lines += stack_bench.table(["bytes", "in staged", "in registered for it",
                                "in registered before", "out staged",
                                "out registered before"], (
        [f"{r['bytes']:,}", *(f(r["bytes"] / r[k] / 1e9) if r[k] > 0 else "-"
                              for k in ("staged_in_s", "registered_in_s", "pinned_in_s",
                                        "staged_out_s", "pinned_out_s"))]
        for r in t["rows"]))
    chosen = t["register_min"]
    lines += ["", "A job's own operand file is registered for its copy from "
              + ("**never** (staging was faster at every size)" if chosen >= 1 << 60
                 else f"**{chosen:,} bytes**") + f" (the device's `register_min`; at start "
              f"it had chosen {dev.get('register_min', '?'):,})."]
    return lines


def list_lines(events: list[Json]) -> list[str]:
    if not events:
        return []
    lines = ["## Lists: erlcuda_vector against the conversion it replaced (ns per element)",
             "", "The same lists and binaries, in one node, the caller's own process: f32 "
             "lists packed into binaries (with the range checks) and binaries unpacked into "
             "floats, by `erlcuda_vector` now and by the code it replaced.", ""]
    lines += stack_bench.table(["elements", "pack before", "pack now", "unpack before",
                                "unpack now"], (
        [stack_bench.sci(e["size"]), *(f(e[k], 1) for k in
                                       ("pack_before", "pack_now", "unpack_before",
                                        "unpack_now"))] for e in events))
    return [*lines, ""]


# -- the plot ------------------------------------------------------------------------------


def plot(summary: Json, out: Path) -> list[str]:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return []
    rows = [r for r in summary["bus"] if r["kernel"] == "vector_add"]
    if not rows:
        return []
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    x = [r["size"] for r in rows]
    for ax, key, cupy_key, label in ((left, "erlcuda_ms", "cupy_ms", "ms per call (p50)"),
                                     (right, "gbs", "cupy_gbs", "GB/s (in + out ÷ p50)")):
        mine = [r[key]["p50"] if key == "erlcuda_ms" else r[key] for r in rows]
        ax.plot(x, mine, "o-", label="erlcuda")
        theirs = [(r[cupy_key] or {}).get("p50") if cupy_key == "cupy_ms" else r[cupy_key]
                  for r in rows]
        if any(v for v in theirs):
            ax.plot(x, [v or float("nan") for v in theirs], "s--", label="CuPy from numpy")
        for transport in ("pipe", "shm") if key == "erlcuda_ms" else ():
            floor = [r.get("floor_ms", {}).get(transport, {}).get("p50") for r in rows]
            if any(v for v in floor):
                ax.plot(x, [v or float("nan") for v in floor], ":", marker=".",
                        label=f"lean floor ({transport})")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("vector_add elements")
        ax.set_ylabel(label)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
    fig.suptitle(f"vector_add end to end — {summary['info'].get('backend')} backend")
    fig.savefig(out / "bus.png", dpi=110, bbox_inches="tight")
    plt.close(fig)
    return ["bus.png"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=("auto", "cpu", "cuda"), default="auto")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--probe", action="store_true",
                        help="also measure what the transports and the copies choose between")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    t0 = time.monotonic()
    config = plan(args.quick)
    info, events = run_node(args, config)
    events += run_lists(config["lists"])
    summary = summarize(info, events)
    summary["cupy_note"] = cupy_note(events, info.get("backend"))
    summary["config"] = config
    summary["targets"] = targets(summary, info.get("backend") == "cuda")
    out = args.out or BUILD / f"bus-{datetime.now(timezone.utc):%Y%m%d-%H%M%S}"
    out.mkdir(parents=True, exist_ok=True)
    plots = plot(summary, out)
    text = report(summary, args, time.monotonic() - t0, plots)
    stack_bench.write_tool_outputs("bus", out, {**summary, "events": events}, text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
