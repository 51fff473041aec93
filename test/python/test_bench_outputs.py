"""Where the benchmarks write, and how the latency plot draws an overhead of zero or less.

- ``bench/run`` (``bench/stack_bench.py``) and ``bench/gpu_kernels.py``, given no ``--out``,
  write to a new scratch folder under ``_build/bench/``, never into the committed figures
  in ``bench/results/``; ``--out`` still names the folder.
- The latency plot draws the overhead (full p50 - pure p50), which may be negative, where
  it is, on an axis that can show it; and no value of zero or less vanishes from a log axis
  without a mark.

Each script is copied into a temporary project root (``<tmp>/bench/``) and imported from
there, so the paths it derives from its own location lie under ``<tmp>``: nothing here
writes into the repository, and no benchmark (Erlang node, GPU) runs. The plot tests need
matplotlib, which only ``make setup-bench`` installs into .venv: without it they skip.
"""

from __future__ import annotations

import argparse
import importlib.util
import math
import shutil
import sys
import types
from pathlib import Path
from typing import Any

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
