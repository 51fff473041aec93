"""Logs every cyclic collection of a Python process, for the bench's notes on the worker.

    GCLOG_DIR=DIR PYTHONPATH=bench/gclog bench/run ...

Python imports this module at start wherever it is on the path, in every process the run
starts (the worker, the bench's own): with ``GCLOG_DIR`` set, each appends one line per
collection to ``DIR/<pid>.txt``: the monotonic time, the generation collected, how long it
took in ms, and how many objects were frozen (``gc.get_freeze_count``) when it ended.
"""

from __future__ import annotations

import gc
import os
import time
from typing import Any

_DIR = os.environ.get("GCLOG_DIR")
_started: list[float] = []


def _log(phase: str, info: dict[str, Any]) -> None:
    if phase == "start":
        _started[:] = [time.perf_counter()]
        return
    took = (time.perf_counter() - _started[0]) * 1e3 if _started else float("nan")
    with open(os.path.join(str(_DIR), f"{os.getpid()}.txt"), "a") as f:
        f.write(f"{time.monotonic():.4f} {info['generation']} {took:.3f} "
                f"{gc.get_freeze_count()}\n")


if _DIR:
    gc.callbacks.append(_log)
