"""``bench/programs``'s report, on synthetic node events: each target's verdict against the
reference measured beside it, the many-callers rates, and the soak's memory readings (no
node, no GPU)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))
import programs  # noqa: E402  (bench/ is not a package)

Json = dict[str, Any]


def result(case: str, size: int, ms: float) -> Json:
    return {"event": "result", "case": case, "size": size, "samples": [int(ms * 1e6)] * 5}


def args(**kw: Any) -> argparse.Namespace:
    found = programs.parse(["--sizes", "1000,16000000"])
    for key, value in kw.items():
        setattr(found, key, value)
    return found


def test_each_target_is_judged_against_its_reference() -> None:
    events = [result("chain_program", 1000, 0.08), result("cupy_unfused", 1000, 0.1),
              result("cupy_graph", 1000, 0.03), result("chain_port", 1000, 0.13),
              result("vector_add_port", 1000, 0.1), result("one_step", 1000, 0.105),
              result("launch", 1000, 0.1),
              {"event": "rate", "case": "programs", "callers": 1000, "done": 1,
               "seconds": 1.0, "per_second": 120_000.0},
              {"event": "rate", "case": "three_launches", "callers": 1000, "done": 1,
               "seconds": 1.0, "per_second": 50_000.0}]
    text = programs.report({"backend": "cuda"}, events, args(), 1.0, "14.2")
    assert "| 1,000 | 0.080 |" in text and "0.80x | 2.67x" in text
    assert "| 1,000 | 0.130 | 0.100 | 1.30x | **missed** |" in text  # over 1.2x
    assert "| 0.105 | 0.100 | 1.05x | met |" in text  # within 10 %
    assert "120,000: met (100,000)" in text and "2.40x: **missed**" in text  # under 3x


def test_the_soak_reports_its_readings_and_their_range() -> None:
    events = [{"event": "soak", "t": t, "rss_kb": 1024 * rss, "pool_bytes": 0,
               "free_memory": 2**30, "buffers": 0, "graphs": 3}
              for t, rss in ((0, 100), (5, 120), (10, 110), (15, 111))]
    events.append({"event": "soak_done", "runs": 12_345, "seconds": 15})
    text = programs.report({"backend": "cpu"}, events, args(sizes=[]), 1.0, "-")
    assert "12,345 runs in 15 s" in text
    assert "RSS: 100 to 120 MiB; second half 110 to 111 MiB" in text
