"""The worker behind the Erlang port: reads frames, routes jobs to device lanes, answers calls.

The reading thread only decodes and routes; each device lane runs its jobs and writes its
own replies (frames are written under one lock, never interleaved). Control calls run on a
separate thread so that a slow one never stalls the reading of jobs.
"""

from __future__ import annotations

import logging
import os
import queue
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from . import etf, kernels, protocol
from .backends import select
from .backends.base import Backend, BackendUnavailable, Device
from .framing import FrameError, FrameReader, FrameWriter
from .lanes import Control, Job, Lane

log = logging.getLogger("erlcuda.worker")

#: Exit status when a device's context is poisoned: Erlang restarts the worker.
EXIT_FATAL = 70
#: How long a GPU's thread polls for work before sleeping: waking a sleeping thread cost
#: about 30 us a job on the H200 machine (bench/results/h200); the CPU backend's virtual
#: devices share the cores with everything else, so they never poll.
AUTO_SPIN_US = 300


@dataclass(frozen=True, slots=True)
class Options:
    backend: str = "auto"
    cpu_devices: int = 1
    max_batch: int = 256
    max_batch_elements: int = 1 << 24
    test_hooks: bool = False
    spin_us: int = -1  # -1: AUTO_SPIN_US on a GPU, none on the CPU backend


class Worker:
    def __init__(self, reader: FrameReader, writer: FrameWriter, options: Options) -> None:
        self.reader = reader
        self.writer = writer
        self.options = options
        self.backend: Backend | None = None
        self.status: Any = protocol.OK
        try:
            self.backend, self.reason = select(options.backend, cpu_devices=options.cpu_devices,
                                               test_hooks=options.test_hooks)
            count = self.backend.device_count()
            unavailable = None
        except BackendUnavailable as exc:
            self.reason = f"{options.backend} backend unavailable: {exc.message}"
            self.status = (protocol.BACKEND_UNAVAILABLE, exc.message)
            count, unavailable = 0, exc.message
        # the backend that runs, else the one asked for (cuda, when it could not start)
        self.backend_name = self.backend.name if self.backend is not None else options.backend
        log.info("%s", self.reason)
        spin_us = options.spin_us
        if spin_us < 0:
            spin_us = AUTO_SPIN_US if self.backend_name == "cuda" else 0
        self.lanes = [
            Lane(i, self.backend, writer, max_batch=options.max_batch,
                 max_elements=options.max_batch_elements, on_fatal=self._fatal,
                 unavailable=unavailable, spin_us=spin_us)
            for i in range(count)
        ]
        self._calls: queue.SimpleQueue[tuple[Any, Any, list[Any]] | None] = queue.SimpleQueue()
        self._control = threading.Thread(target=self._serve_calls, name="erlcuda-control",
                                         daemon=True)

    # -- main loop -------------------------------------------------------------------------
    def serve(self) -> int:
        for lane in self.lanes:
            lane.start()
        self._control.start()
        try:
            while True:
                frame = self.reader.read()
                if frame is None:
                    return self.shutdown(0)
                recv = time.perf_counter_ns()
                try:
                    message = etf.decode(frame)
                except etf.CodecError as exc:
                    log.error("undecodable frame of %d bytes dropped: %s", len(frame), exc)
                    continue
                self.dispatch(message, recv)
        except FrameError as exc:
            log.error("port closed: %s", exc)
            return self.shutdown(1)

    def dispatch(self, message: Any, recv: int = 0) -> None:
        match message:
            case (protocol.MESSAGE, (protocol.LAUNCH, job_id, reply_to, device, kernel, args,
                                     dict() as opts)):
                self.launch(job_id, reply_to, device, kernel, args, opts, recv)
            case (protocol.CALL, call_id, _module, function, list() as args):
                self._calls.put((call_id, function, args))
            case _:
                log.error("unexpected message dropped: %.200r", message)

    def launch(self, job_id: Any, reply_to: Any, device: Any, kernel: Any, args: Any,
               opts: dict[Any, Any], recv: int) -> None:
        fmt = protocol.BINARY if opts.get(protocol.FORMAT) == protocol.BINARY else protocol.LIST
        job = Job(job_id, reply_to, fmt)
        if opts.get(protocol.TRACE) is True:
            job.trace = {"recv": recv, "queued": time.perf_counter_ns()}
        if isinstance(device, bool) or not isinstance(device, int) or not (
                0 <= device < max(len(self.lanes), 1)):
            return self._reply_now(job, (protocol.BAD_DEVICE, device))
        if not isinstance(kernel, etf.Atom) or kernel not in kernels.KERNELS:
            job.error = (protocol.UNKNOWN_KERNEL, kernel)
        else:
            try:
                job.request = kernels.parse(kernel, args)
            except kernels.BadArgs as exc:
                job.error = (protocol.BAD_ARGS, str(exc))
        if not self.lanes:  # the backend never started: answer at once
            return self._reply_now(job, job.error or self.status)
        self.lanes[device].submit(job)

    def _reply_now(self, job: Job, reason: Any) -> None:
        self.writer.write(etf.encode(protocol.reply(job.reply_to, job.job_id,
                                                    protocol.error(reason))))

    # -- control calls ---------------------------------------------------------------------
    def _serve_calls(self) -> None:
        while (item := self._calls.get()) is not None:
            call_id, function, args = item
            try:
                answer = (protocol.RESULT, call_id, self.call(str(function), args))
            except Exception as exc:
                answer = (protocol.CALL_ERROR, call_id, f"{type(exc).__name__}: {exc}")
            try:
                self.writer.write(etf.encode(answer))
            except FrameError:
                return

    def call(self, function: str, args: list[Any]) -> Any:
        if function in ("hello", "info"):
            return self.info()
        if function == "echo":  # the bare transport, for the benchmarks
            return args[0]
        if function == "pure":
            return self.pure(*args)
        if function == "fault" and self.options.test_hooks:
            return self.on_device(args[0], lambda d: d.inject_fault())  # type: ignore[attr-defined]
        if function == "print" and self.options.test_hooks:
            os.write(1, bytes(args[0]) + b"\n")
            os.write(2, bytes(args[1]) + b"\n")
            return None
        if function == "stall" and self.options.test_hooks:
            return self.on_device(args[0], lambda _d: time.sleep(args[1] / 1000))
        raise ValueError(f"unknown call {function}")

    def on_device(self, index: int, fn: Callable[[Device | None], Any],
                  timeout: float | None = None) -> Any:
        item = Control(fn)
        self.lanes[index].submit(item)
        return item.future.result(timeout)

    def pure(self, index: int, kernel: etf.Atom, args: list[Any], repeat: int) -> list[int]:
        """Time the bare backend call for one job, ``repeat`` times, on the device's thread."""
        request = kernels.parse(str(kernel), args)

        def timed(device: Device | None) -> list[int]:
            if device is None:
                raise BackendUnavailable("device unavailable")
            times = []
            for _ in range(repeat):
                t0 = time.perf_counter_ns()
                device.run(request.kernel, [request])
                times.append(time.perf_counter_ns() - t0)
            return times

        return self.on_device(index, timed)

    def info(self) -> dict[etf.Atom, Any]:
        for lane in self.lanes:
            lane.ready.wait()
        devices = []
        for lane in self.lanes:
            entry: dict[Any, Any] = {
                etf.Atom("jobs"): lane.stats.jobs,
                etf.Atom("launches"): lane.stats.launches,
                etf.Atom("max_batch"): lane.stats.max_batch,
                etf.Atom("errors"): lane.stats.errors,
                etf.Atom("queue"): lane.depth(),
            }
            if lane.unavailable:
                entry[etf.Atom("unavailable")] = lane.unavailable
            for key, value in lane.device_info.items():
                entry[etf.Atom(key)] = list(value) if isinstance(value, tuple) else value
            if etf.Atom("free_memory") in entry and lane.unavailable is None:
                try:
                    entry[etf.Atom("free_memory")] = self.on_device(
                        lane.index, lambda d: d.info()["free_memory"], timeout=1.0)
                except Exception:
                    pass  # a busy device keeps its last reading
            devices.append(entry)
        return {
            etf.Atom("backend"): etf.Atom(self.backend_name),
            etf.Atom("status"): self.status,
            etf.Atom("reason"): self.reason,
            etf.Atom("devices"): len(self.lanes),
            etf.Atom("os_pid"): os.getpid(),
            etf.Atom("python"): sys.version.split()[0],
            etf.Atom("batching"): self.options.max_batch > 1,
            etf.Atom("device_info"): devices,
        }

    # -- ending ----------------------------------------------------------------------------
    def _fatal(self, why: str) -> None:
        # A sticky CUDA error poisons the context for good: exit and let Erlang restart us.
        # os._exit skips interpreter teardown, which would touch the dead context.
        log.critical("fatal device error, restarting the worker: %s", why)
        logging.shutdown()
        os._exit(EXIT_FATAL)

    def shutdown(self, status: int) -> int:
        self._calls.put(None)
        for lane in self.lanes:
            lane.stop()
        for lane in self.lanes:
            lane.join(timeout=10)
        if self.backend is not None:
            self.backend.close()
        return status
