"""The benchmarks' erlcuda worker: the real worker with calls for measuring it.

    PYTHONPATH=bench/worker:python python -m erlcuda_benchworker serve <the args of erlcuda serve>

- ``echo(Term)``: ``Term`` back: the bare transport.
- ``pure(Device, Kernel, Args, Repeat)``: the bare backend call of one job, timed ``Repeat``
  times on ``Device``'s thread: the nanoseconds of each.
- ``transfers(Device, Sizes)``: a GPU's copies of a fresh mapping of each size, timed on
  its thread (``CudaDevice.calibrate``): ``[[Bytes, StagedIn, RegisteredIn, PinnedIn,
  StagedOut, PinnedOut], ...]`` in seconds (staged through pinned chunks; registered for
  the one copy; from or into memory registered beforehand, as a slot or a result buffer
  is; -1.0 where a copy could not be timed), then the size from which the device now
  registers a job's own operand files (``[]`` and 0 on a device that makes no copies: the
  CPU backend).
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


def _finite(seconds: float) -> float:
    """Erlang floats hold no NaN (a copy that could not be timed): -1.0 for it."""
    return seconds if seconds == seconds else -1.0


def transfers(worker: Worker, args: list[Any]) -> list[Any]:
    index, sizes = args

    def timed(device: Device | None) -> list[Any]:
        calibrate = getattr(device, "calibrate", None)
        if calibrate is None:
            return [[], 0]
        rows = [[t.nbytes, *(_finite(x) for x in (t.staged_s, t.registered_s, t.pinned_s,
                                                  t.staged_out_s, t.pinned_out_s))]
                for t in calibrate([int(s) for s in sizes])]
        return [rows, int(device.info().get("register_min", 0))]  # type: ignore[union-attr]

    return worker.on_device(index, timed)  # type: ignore[no-any-return]


CALLS: dict[str, Extension] = {"echo": echo, "pure": pure, "transfers": transfers}
