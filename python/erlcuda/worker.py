"""The worker behind the Erlang port: reads frames, routes jobs to device lanes, answers calls.

One loop (``serve``) reads every frame and routes what it holds (``_take``, ``dispatch``);
only where the jobs run differs. With one device (one GPU, or the CPU backend's default),
the thread that reads the port owns the device: the jobs of every frame already in the pipe
are kept and then run as batches by that thread (``_flush``), so a lone job pays no
hand-off between threads, and control calls run on it too, between batches.

With several devices, each device lane runs its jobs on its own thread and writes its own
replies (frames are written under one lock, never interleaved), and control calls run on a
separate thread so that a slow one never stalls the reading of jobs. ``--device-thread``
gives a lone device that layout too.

Each call is a handler in a table (``hello``, ``info``, ``free``, ``load``,
``elementwise``, ``unload``), so a call that is not in the table is refused. An entry point
may add calls of its own: ``cli.main(argv, extensions={name: fn})`` runs this worker with
``fn(worker, args)`` answering the call ``name`` (on the control thread, as ``load`` is; it
reaches a device through ``worker.on_device``). The test double under ``test/worker/`` and
the benchmarks' worker under ``bench/worker/`` are such entry points. A call of Id 0 is one
no caller waits for (Erlang's ``free``, sent after the launches that made the buffers): it
is run in its turn and never answered, a failure logged instead.

Every launch is checked by ``general.check`` into a plan; where it is checked is decided
here (``general.route``): a plain launch of a batched f32 kernel on this thread, a general
one (buffers, other element types, ``copy``/``zeros``/``empty``, user kernels) on its
device's thread, which knows the buffers. User code is compiled here (the
control thread), once per compute capability (once for the host, on the cpu backend), and
loaded into every device on its thread.

Every frame is decoded and checked once, through the template cache in front of the
decoder (``templates.py``): a launch that repeats the layout of one already checked is read
with a few slices, and a batch frame of one template's launches is read as a table. The
reading thread of a lone device takes a frame that comes alone the shortest way: a plain
launch run as a batch of one, a general launch checked and run at once (a chain of kernels
on buffers sends the same frame with other buffer ids: its check is a template too).
Erlang's ``free`` is read with a few slices (``protocol.decode_free``) and queued on its
device in its turn, with no answer.

``hello`` carries Erlang's version and protocol: a worker of another version (a stale copy
in priv/, another checkout on the path) says so in its answer and refuses every job. Its
answer (and ``info``'s) says too why the shared-memory folder Erlang gave cannot be used
(``shm_unavailable``), where it cannot: Erlang then drops the folder and sends everything
through the pipe.
"""

from __future__ import annotations

import functools
import logging
import os
import queue
import sys
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from . import __version__, contract, etf, general, protocol
from .backends import select
from .backends.base import Backend, BackendError, BackendUnavailable, Device
from .framing import FrameError, FrameReader, FrameWriter, frame_size
from .general import Registry, UserKernel
from .lanes import Control, Job, Lane, UniformJobs, results_frames
from .protocol import Call, Failure, Launch, ProtocolError
from .shm import FileArg, SharedFolder
from .templates import ProgramTable, Templates

log = logging.getLogger("erlcuda.worker")

_LAUNCH = contract.WIRE.launch
_ETF = etf.VERSION
#: Launch flags that a lone frame's fast paths leave to the decoder (all but keep, geometry,
#: program and floats: a trace, a result file).
_NOT_LONE = 0xFF & ~(contract.WIRE.flag_keep | contract.WIRE.flag_geometry
                     | contract.WIRE.flag_program | contract.WIRE.flag_floats)
#: A launch whose f32 vector result goes as floats (``protocol.as_floats``).
_FLOATS = contract.WIRE.flag_floats

#: A lone launch with this flag (and no trace) names a result slot: read by its slot
#: template (``_lone_slots``).
_RESULT_FILE = contract.WIRE.flag_result_file

#: Exit status when a device's context is poisoned: Erlang restarts the worker.
EXIT_FATAL = 70
#: How long a GPU's thread polls for work before sleeping: waking a sleeping thread costs
#: more than a small job (bench/ measures it); the CPU backend's virtual devices share the
#: cores with everything else, so they never poll.
AUTO_SPIN_US = 300

#: What a device's info says that changes as it works: read again for each info call.
_FRESH = ("free_memory", "pool_bytes", "pinned_bytes")

Handler = Callable[[list[Any]], Any]
#: A call added by an entry point: ``fn(worker, args)`` is its answer (see the module doc).
Extension = Callable[["Worker", list[Any]], Any]


@dataclass(frozen=True, slots=True)
class Options:
    backend: str = "auto"
    cpu_devices: int = 1
    max_batch: int = 256
    max_batch_elements: int = 1 << 24
    spin_us: int = -1  # -1: AUTO_SPIN_US on a GPU, none on the CPU backend
    device_thread: bool = False  # a lone device on a thread of its own, not the reader's
    buffer_limit: int = 0  # bytes of buffers per device (0: no bound but the device's)
    shm_keep_s: float = 10.0  # shared-memory files kept from job to job go once idle so long


class Worker:
    def __init__(self, reader: FrameReader, writer: FrameWriter, options: Options,
                 shm: SharedFolder | None = None,
                 extensions: Mapping[str, Extension] | None = None, *,
                 shm_unavailable: str | None = None) -> None:
        self.reader = reader
        self.shm = shm
        # Why the folder Erlang gave could not be used: info says so, and Erlang drops it.
        self.shm_unavailable = shm_unavailable
        self.writer = writer
        self.options = options
        self.backend: Backend | None = None
        # What info reports as the status (None: ok); why the backend never started; and
        # the reason every job is refused with once hello found another version.
        self.status: Failure | None = None
        self.unavailable: Failure | None = None
        self.refusal: Failure | None = None
        try:
            self.backend, self.reason = select(options.backend, cpu_devices=options.cpu_devices)
            count = self.backend.device_count()
            unavailable = None
        except BackendUnavailable as exc:
            self.reason = f"{options.backend} backend unavailable: {exc.message}"
            self.status = self.unavailable = protocol.backend_unavailable(exc.message)
            count, unavailable = 0, exc.message
        # the backend that runs, else the one asked for (cuda, when it could not start)
        self.backend_name = self.backend.name if self.backend is not None else options.backend
        # The reason is not logged here: it is in the hello, and Erlang logs the start once.
        spin_us = options.spin_us
        if spin_us < 0:
            spin_us = AUTO_SPIN_US if self.backend_name == "cuda" else 0
        self.registry = Registry()  # user kernels, shared with every lane
        # Programs' fused kernels are compiled here, off the device threads.
        self._compiler = ThreadPoolExecutor(1, thread_name_prefix="erlcuda-compile")
        self._spin_ns = spin_us * 1000
        self.lanes = [
            Lane(i, self.backend, writer, max_batch=options.max_batch,
                 max_elements=options.max_batch_elements, on_fatal=self._fatal,
                 unavailable=unavailable, spin_us=spin_us, shm=shm,
                 buffer_limit=options.buffer_limit, registry=self.registry,
                 compiler=self._compiler, shm_keep_s=options.shm_keep_s)
            for i in range(count)
        ]
        self.extensions = dict(extensions or {})
        self.handlers = self._handlers()
        # One device: the reading thread owns it and runs its jobs (``serve``).
        self.inline = len(self.lanes) == 1 and not options.device_thread
        self._device: Device | None = None
        self._pending: list[Job] = []  # jobs kept for the device this thread owns
        # of the frames read, for the reading thread alone
        self._templates = Templates(self.registry)
        self._calls: queue.SimpleQueue[Call | _Freed | None] = queue.SimpleQueue()
        self._once_open: Callable[[], None] | None = None  # ``serve``'s, for the threads'
        self._control = threading.Thread(target=self._serve_calls, name="erlcuda-control",
                                         daemon=True)

    # -- main loop -------------------------------------------------------------------------
    def serve(self, once_open: Callable[[], None] | None = None) -> int:
        """The one loop: read a frame, take what it holds (``_take``), and run what was
        taken once nothing more is read ahead (``_flush``); at the end of the input, stop.
        ``once_open`` is called once every device is open (or could not be), before the
        first call is answered (with several devices, launches are not held for it)."""
        if self.inline:
            self._device = self.lanes[0].open_here()
            _call_once_open(once_open)
        else:
            for lane in self.lanes:
                lane.start()
            self._once_open = once_open
            self._control.start()
        try:
            while True:
                self._await_input()
                frame = self.reader.read()
                if frame is None:
                    break
                self._take(frame)
                if not self.reader.pending():
                    self._flush()
            self._flush()
            return self.shutdown(0)
        except FrameError as exc:
            log.error("port closed: %s", exc)
            return self.shutdown(1)

    def _await_input(self) -> None:
        """Return once the next frame has begun to arrive (or the input ended). Right after
        work, the reading thread polls for ``spin_us`` before it sleeps: a thread woken
        from a sleep costs more than a small job. While it sleeps, the device it owns (one
        device) sweeps the shared-memory files it keeps from job to job."""
        reader = self.reader
        if self._spin_ns:
            clock = time.perf_counter_ns
            deadline = clock() + self._spin_ns
            while not reader.wait(0):
                if clock() >= deadline:
                    break
            else:
                return
        lane = self.lanes[0] if self.inline else None
        while lane is not None:
            lane.housekeep()
            wait = lane.idle_wait()
            if wait is None or reader.wait(wait):
                return

    def _take(self, frame: bytearray | memoryview) -> None:
        """Route what ``frame`` holds: Erlang's ``free`` (read with a few slices,
        ``protocol.decode_free``) to its lane at once, a lone frame the shortest way
        (``_lone``), a batch frame of one template's launches as a table, anything else
        decoded into jobs for the lanes and calls."""
        if frame and frame[0] == _ETF:
            free = protocol.decode_free(frame)
            if free is not None:
                self._flush()  # the launches read before it first
                try:
                    self._free(list(free))
                except ValueError as exc:  # nobody waits for an answer: logged
                    log.error("call free (Id 0) failed: %s", exc)
                return
        if self.inline and not self._pending and not self.reader.pending() and self._lone(
                frame, self.lanes[0], self._device):
            return
        uniform = self._uniform(frame)
        if uniform is not None:
            self._to_lane(uniform[0], uniform[1])
            return
        recv = time.perf_counter_ns()
        for message in self._messages(frame):
            self.dispatch(message, recv)

    def _to_lane(self, index: int, item: Job | UniformJobs) -> None:
        """Hand ``item`` to lane ``index``: queued for its thread, or, where this thread
        owns the device, kept for ``_flush`` (a job) or run after what is kept (a table)."""
        if not self.inline:
            self.lanes[index].submit(item)
        elif type(item) is Job:
            self._pending.append(item)
            if len(self._pending) >= self.options.max_batch:
                self._flush()
        else:
            self._flush()
            self.lanes[0].run_uniform(item, self._device)  # type: ignore[arg-type]

    def _flush(self) -> None:
        """Run the jobs kept for the device this thread owns, as batches (``run_jobs``)."""
        if self._pending:
            jobs, self._pending = self._pending, []
            self.lanes[0].run_jobs(jobs, self._device)

    def _lone(self, frame: bytearray | memoryview, lane: Lane, device: Device | None) -> bool:
        """Run a launch frame that came alone, by its template (``templates.py``) or
        checked here (``general.check``): a batched plan as a batch of one, where it is a
        plain launch (no trace, no shared memory, nothing to refuse), any other plan alone
        (kept results, buffers, a geometry); ``False``, with nothing done, for any other
        frame."""
        if len(frame) < protocol.LAUNCH_HEAD_SIZE or frame[0] != _LAUNCH or (
                self.refusal is not None):
            return False
        flags = frame[protocol.LAUNCH_FLAGS]
        floats = flags & _FLOATS != 0
        if flags & _NOT_LONE:
            if flags & _NOT_LONE == _RESULT_FILE:
                return self._lone_slots(frame, lane, device, floats)
            return False  # a traced launch: decoded once, by dispatch
        if flags in (0, _FLOATS):
            template = self._templates.find(frame)
            if template is not None and template.device == lane.index:
                return lane.run_lone(protocol.launch_job_id(frame), template.fill(frame),
                                     device, floats=floats)
        program = self._templates.find_program(frame)
        if program is not None and program.device == lane.index:
            return lane.run_lone(protocol.launch_job_id(frame), program.fill(frame), device,
                                 listed=program.launch is not None, floats=floats)
        general_template = self._templates.find_general(frame)
        if general_template is not None:
            plan = general_template.fill(frame, lane.store.held)
            if plan is not None:
                lane.run_plan(Job(protocol.launch_job_id(frame), floats=floats), plan, device)
                return True
        try:
            message = protocol.decode(frame)
        except ProtocolError:
            return False
        if (type(message) is not Launch or message.error is not None
                or message.device != lane.index):
            return False
        path = general.route(message, self.registry)
        if path == "unknown":
            return False  # unknown_kernel: answered by the usual path
        t_take = time.perf_counter_ns()
        try:
            plan = general.check(message, self.registry, lane.store.held)
        except Exception:
            if path == "batched":
                return False  # its refusal: answered by the usual path
            lane.run_general(Job(message.job_id, general=message, floats=floats), device)
            return True
        if plan.key is not None:
            if plan.program is not None:
                self._templates.learn_program(frame, message, plan)
            else:
                self._templates.learn(frame, message, plan)
            return lane.run_lone(message.job_id, plan, device, floats=floats)
        # its template learned, then run by the lane
        self._templates.learn_general(frame, message, plan, lane.store.held)
        lane.run_plan(Job(message.job_id, floats=floats), plan, device, t_take)
        return True

    def _lone_slots(self, frame: bytearray | memoryview, lane: Lane,
                    device: Device | None, floats: bool) -> bool:
        """Run a lone launch that names a result slot: by its slot template
        (``templates.SlotTemplate``, learned only from launches of this lane's device), run
        by the lane (``Lane.run_lone_slots``); else decoded and checked as
        ``dispatch`` would, its template learned where it has one. ``False``, with nothing
        done, for a frame that is no launch of this lane's."""
        template = self._templates.find_slots(frame)
        named = None if template is None else template.fill(frame)
        if template is not None and named is not None:
            files, result = named
            job = Job(protocol.launch_job_id(frame), result_file=result, floats=floats)
            lane.run_lone_slots(job, files, template.plan, device)
            return True
        try:
            message = protocol.decode(frame)
        except ProtocolError:
            return False
        if type(message) is not Launch or message.device != lane.index:
            return False
        files = list(message.args)  # ``prepare`` replaces the launch's args with mappings
        job = self.launch(message)
        if job is not None:
            lane.prepare(job)
            if job.plan is not None:
                self._templates.learn_slots(frame, message, files, job.plan)
            lane.run_jobs([job], device)
        return True

    def _uniform(self, frame: bytearray | memoryview) -> tuple[int, UniformJobs] | None:
        """A batch frame of one template's launches (``templates.Table``) to run on its
        device as one table, or ``None`` for the general path, which also answers whatever
        this one would refuse."""
        if self.refusal is not None or self.options.max_batch < 2 or not frame:
            return None
        found = self._templates.table(frame)
        if found is None or not 0 <= found.device < len(self.lanes):
            return None
        lane = self.lanes[found.device]
        if isinstance(found, ProgramTable):
            if lane.unavailable is not None or found.rows.plan.device_bytes > lane.memory:
                return None
            return found.device, UniformJobs(found.job_ids, found.rows)
        batch = found.batch
        if lane.unavailable is not None or 4 * (batch.elements + batch.out_elements) > (
                lane.memory):
            return None
        return found.device, UniformJobs(found.job_ids, batch, found.floats)

    def _messages(self, frame: bytearray | memoryview) -> list[Launch | Call]:
        try:
            messages, problems = protocol.decode_all(frame)
        except ProtocolError as exc:
            log.error("frame of %d bytes dropped: %s", len(frame), exc)
            return []
        for problem in problems:
            log.error("%s", problem)
        return messages

    def dispatch(self, message: Launch | Call, recv: int = 0) -> None:
        """Route one message: a launch to its device's lane (``_to_lane``), a ``free`` to
        its lane in its turn, any other call to the control thread, or, where this thread
        owns the device, run here after the jobs kept before it (which keeps each caller's
        replies in order)."""
        if isinstance(message, Launch):
            job = self.launch(message, recv)
            if job is not None:
                self._to_lane(message.device, job)
        elif self.inline:
            self._flush()
            self._answer_here(message)
        elif message.function == "free":
            # Queued on its device here, between the launches read before it and those read
            # after: a launch that follows a free finds that memory given back.
            self._dispatch_free(message)
        else:
            self._calls.put(message)

    def _dispatch_free(self, call: Call) -> None:
        """Queue a ``free`` on its device's lane now; one with an answer is answered by the
        control thread once the lane has run it, so that whatever follows the answer finds
        the buffers freed (the reading thread never waits on a lane)."""
        if _unanswered(call):
            self._run_unanswered(call)
            return
        try:
            done = self._free(call.args)
        except ValueError as exc:
            self.writer.write(protocol.encode_call_error(call.call_id,
                                                         f"{type(exc).__name__}: {exc}"))
            return
        self._calls.put(_Freed(call.call_id, done))

    def launch(self, message: Launch, recv: int = 0) -> Job | None:
        """Check a job: the ``Job`` to run on ``message.device``'s lane, or ``None`` where it
        was answered at once.

        A malformed frame is ``{bad_args, _}``; it goes through its device's lane (keeping
        the order of the replies) where the frame named a device, else it is answered here.
        """
        job = Job(message.job_id, result_file=message.result_file, floats=message.floats)
        if message.trace:
            job.trace = {"recv": recv, "queued": time.perf_counter_ns()}
        if self.refusal is not None:
            return self._reply_now(job, self.refusal)
        device = message.device
        lanes = len(self.lanes)
        if message.error is not None:
            log.error("job %d: malformed launch: %s", message.job_id, message.error)
            job.error = protocol.bad_args(message.error)
            if not 0 <= device < lanes:
                return self._reply_now(job, job.error)
        elif not 0 <= device < (lanes or 1):
            return self._reply_now(job, protocol.bad_device(device))
        elif (path := general.route(message, self.registry)) == "general":
            job.general = message  # checked on its device's thread
        elif path == "unknown":
            job.error = protocol.unknown_kernel(message.kernel)
        elif any(type(a) is FileArg for a in message.args):
            job.unmapped = message  # mapped on its device's thread
        else:
            try:
                job.plan = general.check(message, self.registry)
            except general.Refused as exc:
                job.error = exc.failure
        if not lanes:  # the backend never started: answer at once
            return self._reply_now(
                job, job.error or self.unavailable or protocol.backend_unavailable("no device"))
        return job

    def _reply_now(self, job: Job, failure: Failure) -> None:
        encoded = results_frames([(job.job_id, failure, job.stamps())], self.writer.max_frame)
        self.writer.write_many(encoded.frames)
        return None

    # -- control calls ---------------------------------------------------------------------
    def _handlers(self) -> dict[str, Handler]:
        handlers: dict[str, Handler] = {
            "hello": self.hello, "info": self.info_call, "free": self.free_call,
            "load": self.load_call, "elementwise": self.elementwise_call,
            "unload": self.unload_call}
        for name, extension in self.extensions.items():
            if name in handlers:
                raise ValueError(f"the call {name} is the worker's own")
            handlers[name] = functools.partial(extension, self)
        return handlers

    def _serve_calls(self) -> None:
        if self._once_open is not None:
            for lane in self.lanes:
                lane.ready.wait()
            _call_once_open(self._once_open)
        while (call := self._calls.get()) is not None:
            if type(call) is _Freed:
                frame = call.answer()
            elif _unanswered(call):
                self._run_unanswered(call)
                continue
            else:
                frame = self.answer(call)
            try:
                self.writer.write(frame)
            except FrameError:
                return

    def _answer_here(self, call: Call) -> None:
        if _unanswered(call):
            self._run_unanswered(call)
        else:
            self.writer.write(self.answer(call))

    def _run_unanswered(self, call: Call) -> None:
        """Run a call of Id 0 (Erlang's ``free``): Erlang waits for no answer and would
        drop one, so none is written; a failure is logged instead."""
        try:
            if call.function == "free":
                self._free(call.args)
                return
            handler = self.handlers.get(call.function)
            if handler is None:
                log.error("call %s (Id 0): %s", f"{call.function:.80}",
                          _refused(call.function))
                return
            handler(call.args)
        except Exception as exc:
            log.error("call %s (Id 0) failed: %s: %s", f"{call.function:.80}",
                      type(exc).__name__, exc)

    def answer(self, call: Call) -> list[bytes | memoryview]:
        """The frame answering ``call``: ``{'r', Id, Answer}`` or ``{'e', Id, Text}``."""
        handler = self.handlers.get(call.function)
        if handler is None:
            return protocol.encode_call_error(call.call_id, _refused(call.function))
        try:
            frame = protocol.encode_answer(call.call_id, handler(call.args))
        except Exception as exc:
            return protocol.encode_call_error(call.call_id, f"{type(exc).__name__}: {exc}")
        size = frame_size(frame)
        if size > self.writer.max_frame:
            return protocol.encode_call_error(
                call.call_id, f"the answer of {size} bytes is over the frame limit")
        return frame

    def hello(self, args: list[Any]) -> dict[Any, Any]:
        """The info map with the worker's version and protocol. ``args`` is ``[]`` (nothing
        checked) or ``[Version, Protocol]``, Erlang's: another version or protocol than the
        worker's sets the status to ``{version_mismatch, Text}`` and refuses every job."""
        match args:
            case []:
                pass
            case [bytes() | bytearray() | memoryview() as raw, int() as theirs] if (
                    not isinstance(theirs, bool)):
                version = bytes(raw).decode("utf-8", "replace")
                if version != __version__ or theirs != contract.PROTOCOL:
                    self._mismatch(version, theirs)
            case _:
                raise ValueError("hello takes [] or [Version :: binary(), Protocol :: integer()]")
        return protocol.encode_info(
            {**self.info(), "version": __version__, "protocol": contract.PROTOCOL})

    def _mismatch(self, version: str, theirs: int) -> None:
        text = (f"version mismatch: the erlcuda application is {version:.40} (protocol "
                f"{theirs}) but its worker is {__version__} (protocol {contract.PROTOCOL}), "
                f"loaded from {Path(__file__).resolve().parent}; every job is refused until "
                "both come from the same build")
        log.error("%s", text)
        self.refusal = protocol.backend_unavailable(text)
        self.status = protocol.version_mismatch(text)

    def info_call(self, args: list[Any]) -> dict[Any, Any]:
        return protocol.encode_info(self.info())

    def info(self) -> dict[str, Any]:
        for lane in self.lanes:
            lane.ready.wait()
        devices = []
        for lane in self.lanes:
            store = lane.store
            entry: dict[str, Any] = {
                "jobs": lane.stats.jobs,
                "launches": lane.stats.launches,
                "max_batch": lane.stats.max_batch,
                "errors": lane.stats.errors,
                "table_jobs": lane.stats.table_jobs,
                "queue": lane.depth(),
                "buffers": len(store),
                "buffer_bytes": store.bytes,
                "buffer_peak": store.peak,
                "buffer_limit": store.limit,
                "programs": {**lane.programs.stats, "graphs": len(lane.programs.graphs)},
            }
            if lane.unavailable:
                entry["unavailable"] = lane.unavailable
            entry.update(lane.device_info)
            if lane.unavailable is None and any(k in entry for k in _FRESH):
                try:
                    fresh = self.on_device(lane.index, lambda d: d.info(), timeout=1.0)
                    entry.update((k, fresh[k]) for k in _FRESH if k in fresh)
                except Exception:
                    pass  # a busy device keeps its last reading
            devices.append(entry)
        info: dict[str, Any] = {
            "backend": protocol.atom(self.backend_name),
            "status": self.status or protocol.OK,
            "reason": self.reason,
            "devices": len(self.lanes),
            "os_pid": os.getpid(),
            "python": sys.version.split()[0],
            "python_executable": sys.executable,
            "numpy": np.__version__,
            "batching": self.options.max_batch > 1,
            "hooks": list(self.extensions),  # the calls an entry point added
            "device_info": devices,
            "modules": sorted(self.registry.modules),
        }
        if self.shm_unavailable is not None:
            info["shm_unavailable"] = self.shm_unavailable
        return info

    def on_device(self, index: int, fn: Callable[[Device | None], Any],
                  timeout: float | None = None) -> Any:
        """``fn(device)`` on the thread that owns device ``index``; its result."""
        item = Control(fn)
        if self.inline:  # calls run on the reading thread, which owns the device
            self.lanes[index].run_control(item, self._device)
        else:
            self.lanes[index].submit(item)
        return item.future.result(timeout)

    # -- buffers and user code -------------------------------------------------------------
    def free_call(self, args: list[Any]) -> Any:
        """``free(Device, Ids)``: the buffers ``Ids`` of ``Device`` are freed on its thread,
        after the launches queued there before (ids it does not hold are ignored). Erlang
        sends it as a call of Id 0, which is not answered (``_run_unanswered``)."""
        self._free(args)
        return protocol.OK

    def _free(self, args: list[Any]) -> Future[Any] | None:
        """Free the buffers ``args`` name: now where this thread owns the device, else
        queued on its lane (the future of that)."""
        match args:
            case [int() as index, list() as ids] if all(
                    type(i) is int and i >= 0 for i in ids) and not isinstance(index, bool):
                pass
            case _:
                raise ValueError("free takes [Device :: integer(), Ids :: [integer()]]")
        if 0 <= index < len(self.lanes) and ids:
            lane = self.lanes[index]
            if self.inline:  # this thread owns the device: freed now, in its turn
                lane.free_here(self._device, ids)
            else:  # not awaited: the reading thread calls this and must not wait on a lane
                item = Control(lambda d: lane.free_buffers(d, ids))
                lane.submit(item)
                return item.future
        return None

    def load_call(self, args: list[Any]) -> Any:
        """``load(Module, Source, Options, Kernels)``: ``ok`` or ``{error, Reason}``."""
        try:
            match args:
                case [module_term, source_term, options_term, kernels_term]:
                    pass
                case _:
                    raise general.Refused(protocol.bad_args(
                        "load takes [Module, Source, Options, Kernels]"))
            module = general.text(module_term, "the module name")
            source = general.text(source_term, "the source")
            flags = general.options(options_term)
            found = general.user_kernels(module, kernels_term)
        except general.Refused as exc:
            return _error(exc.failure)
        return self._install(module, source, flags, found)

    def elementwise_call(self, args: list[Any]) -> Any:
        """``elementwise(Name, Inputs, Outputs, Operation, Options)``: the kernel written
        from ``Operation`` and loaded as module ``Name``; answers as ``load``."""
        try:
            match args:
                case [name_term, inputs_term, outputs_term, operation_term, options_term]:
                    pass
                case _:
                    raise general.Refused(protocol.bad_args(
                        "elementwise takes [Name, Inputs, Outputs, Operation, Options]"))
            kernel, inputs, outputs = general.elementwise_kernel(name_term, inputs_term,
                                                                 outputs_term)
            operation = general.text(operation_term, "the operation")
            flags = general.options(options_term)
        except general.Refused as exc:
            return _error(exc.failure)
        try:
            from . import usercode
        except ImportError as exc:
            return _error(protocol.backend_unavailable(f"no user code support: {exc}"))
        try:
            source = usercode.elementwise_source(kernel.name, inputs, outputs, operation)
        except ValueError as exc:
            return _error(protocol.bad_args(str(exc)))
        body = general.ElementwiseBody(tuple(inputs), tuple(outputs), operation, tuple(flags))
        return self._install(kernel.name, source, flags, [replace(kernel, body=body)])

    def unload_call(self, args: list[Any]) -> Any:
        """``unload(Module)``: ``ok``, whether it was loaded or not."""
        match args:
            case [module_term]:
                module = general.text(module_term, "the module name")
            case _:
                raise ValueError("unload takes [Module :: binary()]")
        if self.registry.remove(module):
            self._templates.clear()
            self._unload_everywhere(module)
        return protocol.OK

    def _install(self, module: str, source: str, flags: list[str],
                 found: list[UserKernel]) -> Any:
        """Compile ``source`` for each device (a GPU's compute capability, or the host on
        the cpu backend), load it into every device and register its kernels:
        ``{ok, Compile}``, or ``{error, Reason, Compile}`` once the compile has run
        (``{error, Reason}`` before). ``Compile`` says what the compile took
        (``duration_ns``) and whether the cache held every image (``cache_hit``), for
        Erlang's compile event."""
        for kernel in found:
            owner = self.registry.owner(kernel.name, module)
            if owner is not None:
                return _error(protocol.bad_args(
                    f"already loaded: the kernel {kernel.name} belongs to {owner}"))
        for lane in self.lanes:
            lane.ready.wait()
        images, report = self._compile(module, source, flags, found)
        if isinstance(images, Failure):
            return _error(images) if report is None else (*_error(images), report)
        failure = self.unavailable or self._load_everywhere(module, images,
                                                            [k.name for k in found])
        if failure is not None:
            return (*_error(failure), report)
        self.registry.install(module, found)
        self._templates.clear()
        return (protocol.OK, report)

    def _compile(self, module: str, source: str, flags: list[str], found: list[UserKernel]
                 ) -> tuple[list[bytes] | Failure, dict[str, Any] | None]:
        """An image per lane, one compile per target (``_targets``); with the compile's
        report, or None where it never ran."""
        try:
            from . import usercode
        except ImportError as exc:
            return protocol.backend_unavailable(f"no user code support: {exc}"), None
        targets = self._targets(usercode)
        started = time.monotonic_ns()
        built = _build(usercode, module, source, flags, found, targets)
        if isinstance(built, Failure):
            ran = built.reason == "compile"
            return built, ({"duration_ns": time.monotonic_ns() - started, "cache_hit": False}
                           if ran else None)
        images, hits = built
        report = {"duration_ns": time.monotonic_ns() - started, "cache_hit": all(hits)}
        return [images[target] for target in targets], report

    def _targets(self, usercode: Any) -> list[str]:
        """What each lane loads: ``host`` (a library of the host, on the cpu backend), else
        the architecture of its compute capability. A device without one (a backend that
        could not start) gets the default architecture's, so that a compile error is
        reported before the backend says it is unavailable."""
        if self.backend is not None and self.backend.user_code == "host":
            return ["host"] * len(self.lanes) or ["host"]
        return [usercode.arch_of(cc) if _capability(cc := lane.device_info.get(
                    "compute_capability")) else usercode.default_arch()
                for lane in self.lanes] or [usercode.default_arch()]

    def _load_everywhere(self, module: str, images: list[bytes],
                         names: list[str]) -> Failure | None:
        """Load a module's images into their devices, in each device's thread; where one
        fails, no device keeps it."""
        try:
            for lane, image in zip(self.lanes, images, strict=False):
                self.on_device(lane.index, lambda d, image=image, lane=lane: _load(
                    d, lane, module, image, names))
        except BackendError as exc:
            self.registry.remove(module)
            self._templates.clear()
            self._unload_everywhere(module)
            if isinstance(exc, BackendUnavailable):
                return protocol.backend_unavailable(exc.message)
            return protocol.cuda_error(exc.code, exc.message)
        return None

    def _unload_everywhere(self, module: str) -> None:
        for lane in self.lanes:
            try:
                self.on_device(lane.index,
                               lambda d: d.unload_module(module) if d is not None else None)
            except Exception as exc:
                log.warning("device %d: unloading %s: %s", lane.index, module, exc)

    # -- ending ----------------------------------------------------------------------------
    def _fatal(self, why: str) -> None:
        # A sticky CUDA error poisons the context for good: exit and let Erlang restart us.
        # os._exit skips interpreter teardown, which would touch the dead context.
        log.critical("fatal device error, restarting the worker: %s", why)
        logging.shutdown()
        os._exit(EXIT_FATAL)

    def shutdown(self, status: int) -> int:
        if self.inline:
            self.lanes[0].close_here(self._device)
            self._device = None
        else:
            self._calls.put(None)
            for lane in self.lanes:
                lane.stop()
            for lane in self.lanes:
                lane.join(timeout=10)
        self._compiler.shutdown(wait=False, cancel_futures=True)
        if self.shm is not None:
            self.shm.stop_sweeps()
        if self.backend is not None:
            self.backend.close()
        return status


@dataclass(frozen=True, slots=True)
class _Freed:
    """An answered ``free`` queued on a lane: the control thread answers it once done."""

    call_id: Any
    done: Future[Any] | None

    def answer(self) -> list[bytes | memoryview]:
        try:
            if self.done is not None:
                self.done.result()
        except Exception as exc:
            return protocol.encode_call_error(self.call_id, f"{type(exc).__name__}: {exc}")
        return protocol.encode_answer(self.call_id, protocol.OK)


def _refused(function: str) -> str:
    return f"unknown call {function:.80}"


def _call_once_open(once_open: Callable[[], None] | None) -> None:
    """``serve``'s ``once_open``, whose failure is logged: it must not end the thread that
    answers calls, nor the serve loop."""
    if once_open is None:
        return
    try:
        once_open()
    except Exception:
        log.exception("once the devices were open: %r failed", once_open)


def _unanswered(call: Call) -> bool:
    """Whether ``call`` wants no answer: Id 0, which no call of the port owner has."""
    return type(call.call_id) is int and call.call_id == 0


def _error(failure: Failure) -> tuple[Any, Any]:
    """A call's ``{error, Reason}`` answer."""
    return (protocol.atom("error"), failure.term)


def _capability(value: Any) -> bool:
    """Whether a device's info names a compute capability ``(Major, Minor)``."""
    return isinstance(value, (tuple, list)) and len(value) == 2 and all(
        type(v) is int for v in value)


def _build(usercode: Any, module: str, source: str, flags: list[str],
           found: list[UserKernel], targets: list[str]
           ) -> tuple[dict[str, bytes], list[bool]] | Failure:
    """The image of ``source`` for each of ``targets``, compiled once each, and whether the
    cache held each one; or the failure: ``{compile, Log}``, ``{backend_unavailable, _}``
    (no compiler, or a source the cpu backend cannot run), ``{bad_option, _}``,
    ``{bad_args, _}``."""
    images: dict[str, bytes] = {}
    hits: list[bool] = []
    target = targets[0]
    try:
        for target in targets:
            if target in images:
                continue
            if target == "host":
                compiled = usercode.compile_host_entry(
                    source, flags, [(k.name, k.launch_params) for k in found],
                    what=f"kernel {found[0].name}" if len(found) == 1 else f"module {module}",
                    progress=lambda t: log.info("module %s: g++ has run %.0f s", module, t))
            else:
                compiled = usercode.compile_entry(
                    source, flags, target,
                    progress=lambda t: log.info("module %s: nvcc has run %.0f s", module, t))
            images[target] = compiled.image
            hits.append(compiled.cache_hit)
    except usercode.CompileError as exc:
        return protocol.compile_error(exc.log)
    except usercode.Unsupported as exc:
        return protocol.backend_unavailable(str(exc))
    except usercode.NoCompiler as exc:
        needs = ("user kernels on the cpu backend need a C++ compiler (g++)" if target == "host"
                 else "user code needs nvcc")
        return protocol.backend_unavailable(f"{needs}: {exc}")
    except usercode.BadOption as exc:
        return protocol.bad_option("options", exc.option)
    except ValueError as exc:  # a name or a source a compiler must not see
        return protocol.bad_args(str(exc))
    return images, hits


def _load(device: Device | None, lane: Lane, module: str, image: bytes,
          names: list[str]) -> None:
    if device is None:
        raise BackendUnavailable(lane.unavailable or f"device {lane.index} is unavailable")
    device.load_module(module, image, names)
