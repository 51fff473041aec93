"""The benchmarks' erlcuda worker: the real worker with two calls for measuring it.

    PYTHONPATH=bench/worker:python python -m erlcuda_benchworker serve <the args of erlcuda serve>

- ``echo(Term)``: ``Term`` back: the bare transport.
- ``pure(Device, Kernel, Args, Repeat)``: the bare backend call of one job, timed ``Repeat``
  times on ``Device``'s thread: the nanoseconds of each.
"""

from __future__ import annotations

import time
from typing import Any

from erlcuda import kernels
from erlcuda.backends.base import BackendUnavailable, Device
from erlcuda.worker import Extension, Worker


def echo(worker: Worker, args: list[Any]) -> Any:
    return args[0]


def pure(worker: Worker, args: list[Any]) -> list[int]:
    index, kernel, job_args, repeat = args
    request = kernels.parse(str(kernel), job_args)

    def timed(device: Device | None) -> list[int]:
        if device is None:
            raise BackendUnavailable("device unavailable")
        times = []
        for _ in range(repeat):
            t0 = time.perf_counter_ns()
            device.execute([request])
            times.append(time.perf_counter_ns() - t0)
        return times

    return worker.on_device(index, timed)  # type: ignore[no-any-return]


CALLS: dict[str, Extension] = {"echo": echo, "pure": pure}
