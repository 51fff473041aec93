"""Where the benchmarks write, how the plots draw values of zero or less, and how the
large-payload and hold figures are summarized and reported.

- ``bench/run`` (``bench/stack_bench.py``) and ``bench/gpu_kernels.py``, given no ``--out``,
  write to a new scratch folder under ``_build/bench/``, never into the committed figures
  in ``bench/results/``; ``--out`` still names the folder.
- The latency plot draws the overhead (full p50 - pure p50), which may be negative, where
  it is, on an axis that can show it; and no value of zero or less vanishes from a log axis
  without a mark.
- Large payloads: each bandwidth row says its transport (shared memory or the pipe), reduce
  counts its input's bytes, and the run's default row is the one the targets use; the hold
  takes the small jobs in flight (overlapping the big launch..return) and their max's
  excess over the baseline p99; the targets are issue 12's, a missed payload goal shown
  beside the echo of the same bytes; all through ``write_outputs`` as ``--report-only``
  runs it, on synthetic node events.

Each script is copied into a temporary project root (``<tmp>/bench/``) and imported from
there, so the paths it derives from its own location lie under ``<tmp>``: nothing here
writes into the repository, and no benchmark (Erlang node, GPU) runs. The plot tests need
matplotlib, which only ``make setup-bench`` installs into .venv: without it they skip.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import shutil
import sys
import types
from pathlib import Path
from typing import Any

import numpy as np
import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"

# A benchmark node's info event on an H200: machine_name() gives "h200", whose committed
# figures are in bench/results/h200/.
H200_INFO = {"backend": "cuda", "device_name": "NVIDIA H200"}


def load_copy(script: str, root: Path, monkeypatch: pytest.MonkeyPatch) -> types.ModuleType:
    """``bench/<script>`` copied to ``<root>/bench/`` and imported from there."""
    dest = root / "bench" / script
    dest.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(BENCH / script, dest)
    name = f"_bench_under_test_{dest.stem}"
    spec = importlib.util.spec_from_file_location(name, dest)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, name, module)
    spec.loader.exec_module(module)
    return module


def under(path: Path, folder: Path) -> bool:
    return path.resolve().is_relative_to(folder.resolve())


# -- stack_bench: the default output folder ---------------------------------------------------


@pytest.fixture
def stack_bench(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> types.ModuleType:
    return load_copy("stack_bench.py", tmp_path / "root", monkeypatch)


def run_main(mod: types.ModuleType, argv: list[str], monkeypatch: pytest.MonkeyPatch) -> Path:
    """``main(argv)`` with the benchmark node and the report stubbed out: the folder that
    ``write_outputs`` (report, results.json, plots) was given."""
    seen: list[Path] = []
    monkeypatch.setattr(mod, "load_average", lambda: None)
    monkeypatch.setattr(mod, "app_ebin", lambda: Path("ebin"))
    monkeypatch.setattr(mod, "compile_bench", lambda ebin: None)
    monkeypatch.setattr(mod, "run_node", lambda ebin, config, backend, seed: (H200_INFO, []))
    monkeypatch.setattr(mod, "describe_machine", lambda *args, **kwargs: {"wall_s": 0.0})
    monkeypatch.setattr(mod, "write_outputs", lambda out, *args, **kwargs: seen.append(out))
    assert mod.main(argv) == 0
    assert len(seen) == 1
    return Path(seen[0])


def test_set_replaces_a_setting_of_the_plan_and_refuses_one_it_lacks(
    stack_bench: types.ModuleType, monkeypatch: pytest.MonkeyPatch,
) -> None:
    quick = stack_bench.plan("quick")
    config = stack_bench.overridden(
        stack_bench.plan("quick"),
        ["hold.repeats=8", 'hold.shm_modes=["auto"]', "hold.calls=[\"launch\"]",
         "lone.size=2000"])
    assert config["hold"] == {**quick["hold"], "repeats": 8, "shm_modes": ["auto"],
                              "calls": ["launch"]}
    assert config["lone"] == {**quick["lone"], "size": 2000}
    assert {k: v for k, v in config.items() if k not in ("hold", "lone")} == {
        k: v for k, v in quick.items() if k not in ("hold", "lone")}
    for bad in ["hold.repaets=8", "holds.repeats=8", "hold.repeats", "repeats=8"]:
        with pytest.raises(SystemExit, match="--set"):
            stack_bench.overridden(stack_bench.plan("quick"), [bad])
    with pytest.raises(SystemExit, match=r"no hold\.repaets in the plan"):
        run_main(stack_bench, ["--set", "hold.repaets=8"], monkeypatch)


@pytest.mark.parametrize("argv", [[], ["--quick"], ["--full", "--backend", "cuda"]])
def test_stack_bench_writes_to_scratch_by_default(
    stack_bench: types.ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    argv: list[str],
) -> None:
    root = tmp_path / "root"
    out = run_main(stack_bench, argv, monkeypatch)
    assert under(out, root / "_build" / "bench"), f"default output {out} not under _build/bench"
    assert not under(out, root / "bench"), f"default output {out} is inside bench/"
    assert "h200" in out.name  # the machine, so that runs on several machines stay apart
    # The raw samples main() itself writes went there too, and nothing into bench/results.
    assert (out / "raw" / "samples.json").is_file()
    assert not (root / "bench" / "results").exists(), "wrote into bench/results/"


def test_stack_bench_out_still_names_the_folder(
    stack_bench: types.ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    mine = tmp_path / "mine"
    out = run_main(stack_bench, ["--quick", "--out", str(mine)], monkeypatch)
    assert out.resolve() == mine.resolve()
    assert (mine / "raw" / "samples.json").is_file()


# -- gpu_kernels: the default output folder ---------------------------------------------------


class Stop(Exception):
    """Raised by the stand-in CuPy at main's first GPU call."""


def stop(*_args: Any, **_kwargs: Any) -> Any:
    raise Stop


def stub_gpu_modules(monkeypatch: pytest.MonkeyPatch) -> None:
    """Stand-ins for what gpu_kernels imports at module level (CuPy, PyCUDA, erlcuda's CUDA
    backend), in sys.modules for this test only: it imports on any machine, and its
    ``main`` stops at the first GPU call, after the arguments are settled."""
    cupy = types.ModuleType("cupy")
    cupy.cuda = types.SimpleNamespace(Device=stop)  # type: ignore[attr-defined]
    driver = types.ModuleType("pycuda.driver")
    pycuda = types.ModuleType("pycuda")
    pycuda.driver = driver  # type: ignore[attr-defined]
    backend = types.ModuleType("erlcuda.backends.cuda")
    backend.CudaBackend = type("CudaBackend", (), {})  # type: ignore[attr-defined]
    backend.CudaDevice = type("CudaDevice", (), {})  # type: ignore[attr-defined]
    backends = types.ModuleType("erlcuda.backends")
    backends.cuda = backend  # type: ignore[attr-defined]
    erlcuda = types.ModuleType("erlcuda")
    erlcuda.backends = backends  # type: ignore[attr-defined]
    for name, module in [("cupy", cupy), ("pycuda", pycuda), ("pycuda.driver", driver),
                         ("erlcuda", erlcuda), ("erlcuda.backends", backends),
                         ("erlcuda.backends.cuda", backend)]:
        monkeypatch.setitem(sys.modules, name, module)


def gpu_kernels_out(argv: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The output folder gpu_kernels' ``main(argv)`` has settled on by its first GPU call."""
    stub_gpu_modules(monkeypatch)
    mod = load_copy("gpu_kernels.py", tmp_path / "root", monkeypatch)
    parsed: list[argparse.Namespace] = []
    real_parse = argparse.ArgumentParser.parse_args

    def parse_args(self: argparse.ArgumentParser, *args: Any, **kwargs: Any) -> Any:
        ns = real_parse(self, *args, **kwargs)
        parsed.append(ns)
        return ns

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", parse_args)
    with pytest.raises(Stop):
        mod.main(argv)
    assert len(parsed) == 1
    assert parsed[0].out is not None, "no output folder settled before the first GPU call"
    return Path(parsed[0].out)


@pytest.mark.parametrize("argv", [[], ["--quick"], ["--device", "1"]])
def test_gpu_kernels_writes_to_scratch_by_default(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, argv: list[str]
) -> None:
    root = tmp_path / "root"
    out = gpu_kernels_out(argv, tmp_path, monkeypatch)
    assert under(out, root / "_build" / "bench"), f"default output {out} not under _build/bench"
    assert not under(out, root / "bench"), f"default output {out} is inside bench/"


def test_gpu_kernels_out_still_names_the_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    mine = tmp_path / "mine"
    assert gpu_kernels_out(["--out", str(mine)], tmp_path, monkeypatch) == mine


# -- the plots: negative and zero values -------------------------------------------------------


@pytest.fixture
def plt() -> Any:
    matplotlib = pytest.importorskip("matplotlib")
    matplotlib.use("Agg")
    import matplotlib.pyplot as pyplot

    yield pyplot
    pyplot.close("all")


def pcts(p50: float) -> dict[str, float]:
    return {"p50": p50, "p90": p50 * 1.3 if p50 > 0 else p50, "p99": p50 * 2 if p50 > 0 else p50}


def latency_row(kernel: str, size: int, full: float, pure: float) -> dict[str, Any]:
    """One row of results.json's "latency" (bench/results/*/results.json), p50s in µs."""
    over = full - pure
    return {"kernel": kernel, "size": size, "elements": size if kernel != "matmul" else size**2,
            "bytes_in": 8 * size, "bytes_out": 4 * size, "n": 200,
            "full_us": pcts(full), "pure_us": pcts(pure),
            "overhead_us": {"p50": over, "p90": over + 3.0, "p99": over + 9.0},
            "overhead_p50_ci95_us": [over - 3.0, over + 3.0]}


def summary(latency: list[dict[str, Any]], **sections: list[dict[str, Any]]) -> dict[str, Any]:
    return {"machine_name": "cpu-2core", "machine": {"backend": "cpu"}, "latency": latency,
            "stages": [], "bandwidth": [], "throughput": [], **sections}


TAIL = " — test, cpu backend"


def test_negative_overhead_is_drawn_where_it_is(
    stack_bench: types.ModuleType, plt: Any, tmp_path: Path
) -> None:
    # At 1e3 the pure call (25 µs) is slower than the whole stack (20 µs): overhead -5 µs.
    rows = [latency_row("vector_add", 1_000, 20.0, 25.0),
            latency_row("vector_add", 100_000, 120.0, 60.0),
            latency_row("vector_add", 1_000_000, 900.0, 700.0),
            latency_row("matmul", 64, 80.0, 30.0)]
    assert stack_bench.plot_latency(plt, summary(rows), TAIL)
    fig = plt.gcf()
    fig.savefig(tmp_path / "latency.png", dpi=50)
    assert (tmp_path / "latency.png").stat().st_size > 0

    holding = [(ax, line) for ax in fig.axes for line in ax.get_lines()
               if any(x == 1_000 and y == pytest.approx(-5.0)
                      for x, y in zip(line.get_xdata(), line.get_ydata(), strict=True))]
    assert holding, "the overhead of -5 µs at 1e3 is not plotted at -5"
    for ax, _line in holding:
        assert ax.get_yscale() != "log", "the negative overhead is on a log axis"
        low, high = sorted(ax.get_ylim())
        assert low < -5.0 < high, f"-5 µs outside the axis' limits {low, high}"
        assert low <= 0.0 <= high


def off_scale_points(fig: Any) -> list[str]:
    """Points of lines on log-y axes that land outside their axes (a value of zero or less
    on a log axis is drawn decades below it, i.e. not at all)."""
    fig.canvas.draw()
    bad = []
    for ax in fig.axes:
        if ax.get_yscale() != "log":
            continue
        box = ax.bbox
        for line in ax.get_lines():
            xy = list(zip(line.get_xdata(), line.get_ydata(), strict=True))
            if not xy:
                continue
            for (x, y), (px, py) in zip(xy, line.get_transform().transform(xy), strict=True):
                inside = (math.isfinite(px) and math.isfinite(py)
                          and box.x0 - 1 <= px <= box.x1 + 1 and box.y0 - 1 <= py <= box.y1 + 1)
                if not inside:
                    bad.append(f"{line.get_label()!r} at ({x}, {y})")
    return bad


def shown_at(fig: Any, x: float) -> int:
    """How many points at ``x`` lines on log-y axes draw inside their axes."""
    count = 0
    for ax in fig.axes:
        if ax.get_yscale() != "log":
            continue
        for line in ax.get_lines():
            for lx, ly in zip(line.get_xdata(), line.get_ydata(), strict=True):
                if lx == x:
                    _px, py = line.get_transform().transform((lx, ly))
                    count += ax.bbox.y0 - 1 <= py <= ax.bbox.y1 + 1
    return count


def zero_latency(mod: types.ModuleType, plt: Any) -> bool:
    # The pure call timed at 0 µs at 1e5 (a clock too coarse for it, say).
    rows = [latency_row("vector_add", 1_000, 50.0, 10.0),
            latency_row("vector_add", 100_000, 90.0, 0.0),
            latency_row("vector_add", 1_000_000, 900.0, 700.0)]
    return mod.plot_latency(plt, summary(rows), TAIL)


def zero_bandwidth(mod: types.ModuleType, plt: Any) -> bool:
    rows = [{"size": n, "full_gbs": 1.0, "echo_gbs": echo, "pure_gbs": 5.0}
            for n, echo in ((1_000_000, 2.0), (100_000, 0.0), (4_000_000, 3.0))]
    return mod.plot_bandwidth(plt, summary([], bandwidth=rows), TAIL)


def zero_throughput(mod: types.ModuleType, plt: Any) -> bool:
    rows = [{"kernel": "vector_add", "size": 1_000, "callers": c, "batching": b,
             "jobs_per_s": 0.0 if (c, b) == (100_000, False) else 1000.0 * c}
            for c in (1, 100, 100_000) for b in (True, False)]
    return mod.plot_throughput(plt, summary([], throughput=rows), TAIL)


# Each plot with one value of zero at x = 1e5, and how many series it draws at 1e5: full
# and pure; end to end, echo and pure; batching on and off.
@pytest.mark.parametrize(("draw", "series"),
                         [(zero_latency, 2), (zero_bandwidth, 3), (zero_throughput, 2)])
def test_zero_on_a_log_axis_is_marked_not_lost(
    stack_bench: types.ModuleType, plt: Any, tmp_path: Path, draw: Any, series: int
) -> None:
    assert draw(stack_bench, plt)
    fig = plt.gcf()
    fig.savefig(tmp_path / "plot.png", dpi=50)
    assert off_scale_points(fig) == [], "values drawn off a log axis, silently"
    # Every series shows something at 1e5: a mark for the zero, a point for the others.
    assert shown_at(fig, 100_000) == series, "the value of zero at 1e5 has no mark"


# -- large payloads and the hold: summaries, targets and the report -------------------------
#
# Synthetic node events (the shape bench/erlcuda_bench.erl emits) through the summaries,
# the targets and write_outputs (what `bench/run --report-only` runs), no node.

MIB = 1 << 20


def bandwidth_event(kernel: str, size: int, shm: bool | None, full_ms: float, echo_ms: float,
                    pure_ms: float = 1.0, iters: int = 4) -> dict[str, Any]:
    """A bandwidth result; ``shm`` None: a run from before shared memory (no such key)."""
    per_job = 12 * size if kernel == "vector_add" else 4 * size
    event: dict[str, Any] = {
        "event": "result", "section": "bandwidth", "kernel": kernel, "size": size,
        "bytes_per_job": per_job, "echo_bytes": per_job, "iters": iters,
        "full_ns": [full_ms * 1e6] * iters, "echo_ns": [echo_ms * 1e6] * iters,
        "pure_ns": [pure_ms * 1e6] * 3}
    if shm is not None:
        event |= {"shm": shm, "shm_threshold": MIB}
    return event


def hold_event(shm_dir: str, baseline_us: list[float], window: list[tuple[float, float]],
               launch_ms: float, return_ms: float, call: str = "launch") -> dict[str, Any]:
    """A hold result with one window: small jobs as (start ms from the big launch,
    latency µs)."""
    return {"event": "result", "section": "hold", "backend": "cpu", "devices": 2,
            "big_call": call,
            "forced_cpu": True, "shm_dir": shm_dir, "shm": shm_dir != "none",
            "shm_threshold": MIB, "small_kernel": "reduce", "small_size": 1000,
            "small_device": 1, "big_kernel": "vector_add", "big_size": 30_000_000,
            "big_device": 0, "big_bytes": 360_000_000,
            "baseline_start_ns": [-1e9 + i * 1e5 for i in range(len(baseline_us))],
            "baseline_ns": [x * 1e3 for x in baseline_us],
            "windows": [{"start_ns": [s * 1e6 for s, _ in window],
                         "latency_ns": [lat * 1e3 for _, lat in window],
                         "big_launch_ns": launch_ms * 1e6, "big_return_ns": return_ms * 1e6}]}


def test_bandwidth_rows_say_their_transport_and_count_reduce_by_its_input(
    stack_bench: types.ModuleType,
) -> None:
    rows = stack_bench.summarize_bandwidth([
        bandwidth_event("vector_add", 16_000_000, False, 192.0, 192.0),
        bandwidth_event("vector_add", 16_000_000, True, 96.0, 192.0),
        bandwidth_event("reduce", 16_000_000, True, 16.0, 64.0),
        bandwidth_event("reduce", 300_000, True, 1.0, 1.0),  # 1.2 MB vectors: over 1 MiB
        bandwidth_event("reduce", 200_000, True, 1.0, 1.0),  # 800 kB: under the threshold
        bandwidth_event("vector_add", 1_000_000, None, 12.0, 12.0),  # an old run
    ])
    got = [(r["kernel"], r["size"], r["transport"]) for r in rows]
    assert got == [("vector_add", 16_000_000, "pipe"), ("vector_add", 16_000_000, "shm"),
                   ("reduce", 16_000_000, "shm"), ("reduce", 300_000, "shm"),
                   ("reduce", 200_000, "pipe"), ("vector_add", 1_000_000, "pipe")]
    # 192 MB in 96 ms = 2 GB/s; reduce: its 64 MB input in 16 ms = 4 GB/s, its echo 1 GB/s
    assert rows[1]["full_gbs"] == pytest.approx(2.0)
    assert rows[2]["full_gbs"] == pytest.approx(4.0)
    assert rows[2]["echo_gbs"] == pytest.approx(1.0)

    defaults = stack_bench.bandwidth_defaults(rows)
    # the run's default (shared memory) wherever the pipe was measured as well
    assert defaults[("vector_add", 16_000_000)]["transport"] == "shm"
    assert defaults[("vector_add", 1_000_000)]["transport"] == "pipe"
    pairs = stack_bench.shm_vs_pipe(rows)
    assert [(p["kernel"], p["size"]) for p in pairs] == [("vector_add", 16_000_000)]
    assert pairs[0]["shm_over_pipe"] == pytest.approx(2.0)


def test_hold_takes_the_jobs_in_flight_and_the_excess_over_the_baseline_p99(
    stack_bench: types.ModuleType,
) -> None:
    baseline = [100.0] * 99 + [300.0]  # p99 just under 300 µs, max 300
    # the big job: launch/3 returned at 20 ms, the result at 300 ms
    window = [
        (-5.0, 4_000.0),    # ended at -1 ms, before the launch: not in flight
        (-1.0, 2_000.0),    # waiting at the launch (ended at +1 ms): in flight
        (10.0, 1_000.0),    # during launch/3
        (200.0, 2_500.0),   # the worst in flight
        (299.0, 200.0),     # started before the return: in flight
        (301.0, 90_000.0),  # started after the return: not in flight
    ]
    (row,) = stack_bench.summarize_hold([hold_event("auto", baseline, window, 20.0, 300.0)])
    assert row["transport"] == "shm"
    assert row["in_flight_us"]["n"] == 4
    assert row["in_flight_us"]["max"] == pytest.approx(2_500.0)
    p99 = float(np.percentile(baseline, 99))
    assert row["baseline_us"]["p99"] == pytest.approx(p99)
    assert row["max_excess_ms"] == pytest.approx((2_500.0 - p99) / 1e3)
    worst = row["windows"][0]["worst"]
    assert [w["latency_ms"] for w in worst] == pytest.approx([2.5, 2.0, 1.0])
    assert [w["phase"] for w in worst] == ["after launch", "launch", "launch"]


def fake_machine(backend: str = "cpu") -> dict[str, Any]:
    return {"date": "2026-01-01 00:00 UTC", "mode": "quick", "command": "bench/run --quick",
            "wall_s": 1.0, "load_start": None, "load_end": None, "cpu": "test cpu",
            "cores": 2, "memory_gib": 8.0, "os": "Linux", "backend": backend,
            "requested_backend": backend, "backend_reason": "test",
            "device_name": "NVIDIA H200" if backend == "cuda" else "cpu:0",
            "device_info": [], "floor": None, "shm": True, "shm_threshold": MIB,
            "nvidia_smi": None, "erlcuda": "test", "otp": "26", "erts": "14",
            "schedulers": 2, "worker_python": "python3", "worker": {"python": "3.12"},
            "bench_python": "3.12", "matplotlib": None}


def run_outputs(mod: types.ModuleType, tmp_path: Path, results: list[dict[str, Any]],
                backend: str = "cuda") -> tuple[dict[str, Any], str]:
    """write_outputs on synthetic results (as --report-only does): results.json, report."""
    out = tmp_path / "out"
    out.mkdir()
    info = {"backend": backend, "device_name": "NVIDIA H200"}
    mod.write_outputs(out, info, results, fake_machine(backend), {}, 1)
    return json.loads((out / "results.json").read_text()), (out / "report.md").read_text()


def target_row(report: str, start: str) -> str:
    rows = [line for line in report.splitlines() if line.startswith("| " + start)]
    assert len(rows) == 1, f"no single target row starting {start!r}: {rows}"
    return rows[0]


def test_targets_are_issue_12s_with_the_echo_beside_a_missed_payload_goal(
    stack_bench: types.ModuleType, tmp_path: Path,
) -> None:
    results = [
        # vector_add 1.6e7: 1 GB/s end to end (missed), its echo 1.5 GB/s (below 2 too)
        bandwidth_event("vector_add", 16_000_000, True, 192.0, 128.0),
        bandwidth_event("vector_add", 16_000_000, False, 384.0, 128.0),
        # reduce 1.6e7: 4 GB/s (met), echo 0.5 GB/s
        bandwidth_event("reduce", 16_000_000, True, 16.0, 128.0),
        hold_event("auto", [100.0] * 100, [(1.0, 100.0), (2.0, 600.0)], 1.0, 10.0),
        hold_event("none", [100.0] * 100, [(1.0, 100.0), (2.0, 250_000.0)], 1.0, 10.0),
    ]
    summary, report = run_outputs(stack_bench, tmp_path, results)
    by = {t["target"].split(" ")[0] + (" pipe" if "(pipe)" in t["target"] else ""): t
          for t in summary["targets"]}
    assert by["vector_add"]["status"] == "missed"
    assert by["vector_add"]["floor_gbs"] == pytest.approx(1.5)
    assert by["reduce"]["status"] == "met"
    assert by["reduce"]["goal"] == 3.0 and by["vector_add"]["goal"] == 2.0
    holds = [t for t in summary["targets"] if t["unit"] == "ms"]
    assert [t["status"] for t in holds] == ["met", "missed"]
    assert holds[1]["measured"] == pytest.approx(249.9)
    # the goal is the default transport's; the pipe's row beside it is marked as reference
    assert [t.get("not_default") for t in holds] == [False, True]
    hold_rows = {"pipe" if "(pipe)" in line else "shm": line for line in report.splitlines()
                 if line.startswith("| small job on another device")}
    assert "not the default transport" in hold_rows["pipe"]
    assert "not the default transport" not in hold_rows["shm"]
    # the older issue's goals are gone
    assert not any("1000 callers" in t["target"] or "µs" == t["unit"]
                   for t in summary["targets"])

    va = target_row(report, "vector_add of 1.6e7")
    assert "**missed**" in va and "1.50 GB/s" in va and "below the goal" in va
    assert "shared memory" in va  # the run's default transport, not the pipe row
    assert "below the goal" not in target_row(report, "reduce of a 1.6e7")
    for section in ("## Large payloads: end to end beside the bare transport",
                    "## Large payloads: shared memory against the pipe",
                    "## A 3e7-element result beside a small job on another device"):
        assert section in report
    assert "half each way" in report
    assert "cpu backend with 2 virtual devices" in report
    assert summary["shm_vs_pipe"][0]["pipe_gbs"] == pytest.approx(0.5)


def test_targets_not_measured_without_the_sections(
    stack_bench: types.ModuleType, tmp_path: Path,
) -> None:
    # an old run's samples: vector_add rows only, no 1.6e7, no hold
    summary, report = run_outputs(
        stack_bench, tmp_path, [bandwidth_event("vector_add", 1_000_000, None, 12.0, 12.0)],
        backend="cpu")
    assert [t["status"] for t in summary["targets"]] == ["not measured"] * 3
    assert summary["hold"] == []
    assert "## A 3e7-element result" not in report
    assert "shared memory against the pipe" not in report
    assert "reference only here" in target_row(report, "vector_add of 1.6e7")


def test_hold_reports_the_launch_sync_case_beside_launch(
    stack_bench: types.ModuleType, tmp_path: Path,
) -> None:
    results = [
        hold_event("auto", [100.0] * 100, [(1.0, 100.0), (2.0, 600.0)], 1.0, 10.0),
        hold_event("auto", [100.0] * 100, [(1.0, 100.0), (2.0, 90_000.0)], 10.0, 10.0,
                   call="launch_sync"),
    ]
    summary, report = run_outputs(stack_bench, tmp_path, results)
    assert [r["big_call"] for r in summary["hold"]] == ["launch", "launch_sync"]
    # only launch/3's row is a target; the launch_sync row is in the hold section's table
    holds = [t for t in summary["targets"] if t["unit"] == "ms"]
    assert [t["status"] for t in holds] == ["met"]
    assert "launch_sync" not in holds[0]["target"]
    assert "| `launch_sync` |" in report and "**89.90**" in report
    assert "launch_sync" not in target_row(report, "small job")


def test_hold_plot_draws_each_transport(
    stack_bench: types.ModuleType, plt: Any, tmp_path: Path
) -> None:
    rows = stack_bench.summarize_hold([
        hold_event(mode, [100.0] * 100, [(-1.0, 100.0), (5.0, 3_000.0), (20.0, 90.0)],
                   1.0, 10.0) for mode in ("auto", "none")])
    assert stack_bench.plot_hold(plt, summary([], hold=rows), TAIL)
    fig = plt.gcf()
    fig.savefig(tmp_path / "hold.png", dpi=50)
    assert off_scale_points(fig) == []
    titles = [ax.get_title() for ax in fig.axes]
    assert any("shared memory" in t for t in titles) and any("pipe" in t for t in titles)
    assert shown_at(fig, 5.0) == 2  # the slow small job, in each panel


def test_a_lone_job_goal_the_floor_itself_misses_reads_floor_above(
    stack_bench: types.ModuleType,
) -> None:
    def lone(kernel: str, overhead: float, floor_over_pure: float, full_p99: float,
             floor_p99: float) -> dict[str, Any]:
        return {"kernel": kernel, "size": stack_bench.FLOOR_SIZE,
                "over_floor": {"p50": 1.0}, "overhead_us": {"p50": overhead},
                "full_us": {"p50": 100.0, "p99": full_p99},
                "floor_us": {"p50": 100.0, "p99": floor_p99},
                "floor_over_pure_us": {"p50": floor_over_pure}}

    summary = {"machine": {"backend": "cuda"}, "throughput": [], "floor_throughput": [],
               "latency": [lone("vector_add", 40.0, 60.0, 300.0, 250.0),  # floor above both
                           lone("reduce", 40.0, 20.0, 300.0, 150.0)]}  # the floor meets both
    got = {t["target"]: t for t in stack_bench.floor_targets(summary)}
    status = {(name.split(" ")[0], "overhead" if "overhead" in name else "p99"): t["status"]
              for name, t in got.items() if "lone job" in name and "floor p50" not in name}
    assert status == {("vector_add", "overhead"): "floor above",
                      ("vector_add", "p99"): "floor above",
                      ("reduce", "overhead"): "missed", ("reduce", "p99"): "missed"}
    floors = [t["floor"] for name, t in got.items() if name.startswith("vector_add 1e3, lone")]
    assert floors == [None, 60.0, 2.5]


def test_lone_job_targets_take_each_side_after_a_call_of_its_own_kind(
    stack_bench: types.ModuleType,
) -> None:
    # Shuffled, each side follows a call of its own kind only part of the time; a switch
    # between the two processes costs both sides 200 us, and erlcuda's job after a pure
    # call 40 us. The targets read each side's samples that follow a call of its own kind.
    full, full_after, floor, floor_after = [], [], [], []
    for i in range(300):
        prev = ("full", "pure", "floor")[i % 3]
        full.append({"full": 120_000, "pure": 160_000, "floor": 320_000}[prev] + i)
        full_after.append(prev)
        floor.append((100_000 if prev == "floor" else 300_000) + i)
        floor_after.append(prev)
    event = {"section": "latency", "kernel": "vector_add", "size": stack_bench.FLOOR_SIZE,
             "elements": stack_bench.FLOOR_SIZE, "bytes_in": 8000, "bytes_out": 4000,
             "full_ns": full, "pure_ns": [50_000] * 300, "floor_ns": floor,
             "after": {"full": full_after, "floor": floor_after, "pure": ["full"] * 300}}
    (row,) = stack_bench.summarize_latency([event], np.random.default_rng(0))
    # All samples: erlcuda 160 us (its median), the floor 300 us (two in three).
    assert row["over_floor"]["p50"] == pytest.approx(160 / 300, abs=0.01)
    own = row["own"]
    assert (own["n_full"], own["n_floor"]) == (100, 100)
    assert own["over_floor"]["p50"] == pytest.approx(1.2, abs=0.01)
    summary = {"machine": {"backend": "cuda"}, "throughput": [], "floor_throughput": [],
               "latency": [row]}
    got = {t["target"]: t for t in stack_bench.floor_targets(summary)}
    (p50,) = [t for name, t in got.items() if "floor p50" in name and "vector_add" in name]
    assert p50["measured"] == pytest.approx(1.2, abs=0.01) and p50["status"] == "met"
    (over,) = [t for name, t in got.items() if "overhead" in name and "vector_add" in name]
    assert over["measured"] == pytest.approx(70.0, abs=1.0)
    assert over["floor"] == pytest.approx(50.0, abs=1.0)
    assert "own kind" in over["target"]


def test_stages_are_read_as_durations_by_stage(stack_bench: types.ModuleType) -> None:
    # A traced job's stamps are nanoseconds by stage (the port owner's forward among them);
    # the node reports those, the caller's launch_call and total, and the rest as transit.
    cols = {"launch_call": [4000, 6000], "total": [90000, 110000], "decode": [1000, 3000],
            "queue": [500, 500], "group": [200, 400], "backend": [50000, 70000],
            "encode": [300, 300], "forward": [2000, 4000], "transit": [30000, 30000]}
    (row,) = stack_bench.summarize_stages(
        [{"kernel": "vector_add", "size": 1000, "elements": 1000, "iters": 2, "stages": cols,
          "echo_bytes": 8000, "echo_ns": [20000, 20000]}], aligned=False)
    assert set(row["stages_us"]) == set(cols)
    assert row["stages_us"]["forward"]["p50"] == 3.0
