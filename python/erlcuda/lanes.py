"""Device lanes: one thread per device, owning it, batching what is queued for it.

A lane takes everything already queued (up to ``max_batch`` jobs and ``max_elements``
input elements; it never waits for more, so a lone job pays no added latency), groups the
jobs' plans (``kernels.Plan``) by key, runs one backend call per group (``Device.execute``),
and writes the batch's records in one results frame (more only where the writer's frame
limit demands), in the order the jobs arrived, so one caller's jobs to one device are
answered in the order launched. Each job gets its one reply whatever happens to the others:
a result that cannot travel becomes ``{internal, _}`` and a record over the writer's frame
limit ``too_large``, for that job alone.

A general job (buffers, other element types, user kernels: a plan without a key) runs
alone, in its turn among the others: the lane checks it (``general.check``) against the
buffers it holds, uploads and allocates what it needs, makes one device call and keeps or
downloads its results, freeing every temporary array whatever happens. The lane's
``BufferStore`` holds the buffers; they are made and freed on the lane's thread only.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Executor, Future
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from . import general, kernels, protocol
from .backends.base import Backend, BackendError, Device
from .framing import FrameError, FrameWriter
from .general import Registry
from .kernels import DTYPES, Operand, Plan, UniformPlans
from .program_runner import Runner
from .protocol import Failure, Kept, Launch, Listed, Result
from .shm import FileArg, FileResult, NoFolder, ResultSlot, SharedFolder, ShmError
from .slots import IDLE_S, SWEEP_S, OperandSlots, ResultTarget
from .templates import ProgramRows

log = logging.getLogger("erlcuda.lane")

_STOP = object()  # queued by stop(): the lane ends once it reaches it

#: A traced job's stages, each the nanoseconds between two points of the worker's clock
#: (``perf_counter_ns``) that ``Job.trace`` holds: decode (frame read to queued), queue (to
#: taken by its device's thread), group (to its backend call), backend (the call), encode
#: (the reply's bookkeeping, before its ETF). Durations, so that a reader never sets a point
#: of this clock against one of Erlang's.
STAGES = (("decode", "recv", "queued"), ("queue", "queued", "take"), ("group", "take", "run"),
          ("backend", "run", "done"), ("encode", "done", "encode"))


@dataclass(slots=True)
class Job:
    job_id: int
    plan: Plan | None = None  # a batched plan, checked on the reading thread
    error: Failure | None = None  # decided before the job reached the device
    trace: dict[str, int] | None = None
    result_file: ResultSlot | None = None  # the slot a vector result goes to, if any
    # A launch with operands in shared memory, mapped and checked on the device's own
    # thread (``Lane.prepare``), so that mapping a large launch's part files never holds up
    # the reading thread and the jobs of other devices behind it.
    unmapped: Launch | None = None
    # A launch for the general path, checked and run on its device's thread (it may name
    # buffers, which only that thread knows).
    general: Launch | None = None
    floats: bool = False  # flag_floats: an f32 vector result goes as floats (``as_floats``)

    def stamps(self) -> dict[str, int] | None:
        """A traced job's reply stamps: the nanoseconds of each stage it reached
        (``STAGES``); ``None`` for a job not traced."""
        points = self.trace
        if points is None:
            return None
        return {stage: points[end] - points[start] for stage, start, end in STAGES
                if start in points and end in points}

    @property
    def elements(self) -> int:
        if self.unmapped is not None:
            return sum(a.nbytes // a.dtype.itemsize for a in self.unmapped.args
                       if type(a) is FileArg)
        return 0 if self.plan is None else self.plan.elements


@dataclass(slots=True)
class _Again:
    """A lone job in slots as the lane ran it: its template's ``plan_of``, the operands and
    result slot it named, and what was read from them (its plan on the slots' views, its
    result's target, whether its memory is registered), which hold for the next lone job
    of that template naming the same slots while the slots' ``changes`` stays the same."""

    plan_of: Callable[[list[np.ndarray]], Plan]
    files: Sequence[FileArg]
    result: ResultSlot | None
    changes: int
    plan: Plan
    target: ResultTarget | None
    into: np.ndarray | None
    registered: bool
    names: tuple[str, ...]


@dataclass(slots=True)
class UniformJobs:
    """A batch frame's jobs read as a table (``templates.Table``): row ``i`` of ``batch`` is job
    ``job_ids[i]``'s."""

    job_ids: np.ndarray
    batch: UniformPlans | ProgramRows
    floats: np.ndarray | None = None  # a table's: for each row, whether it has flag_floats


@dataclass(slots=True)
class Control:
    """Work for the lane's thread between batches (info, loading code, freeing, calls an
    entry point added)."""

    fn: Callable[[Device | None], Any]
    future: Future[Any] = field(default_factory=Future)


def results_frames(records: list[protocol.Record], max_frame: int) -> protocol.Encoded:
    """``protocol.encode_results``, logging each record it had to replace."""
    encoded = protocol.encode_results(records, max_frame)
    if encoded.replaced:
        _log_replaced(encoded)
    return encoded


def _log_replaced(encoded: protocol.Encoded) -> None:
    for job_id, why in encoded.replaced:
        log.error("job %d: %s", job_id, why)


class BufferStore:
    """A lane's buffers: id -> (device array, element type), and what they add up to.

    Changed on the lane's thread alone; other threads read the counters (``info``).
    ``limit`` bounds the bytes held (0: no bound): a job that would go over it is refused
    with ``{cuda, out_of_memory, _}``, as a full device would refuse it."""

    def __init__(self, limit: int = 0) -> None:
        self._held: dict[int, tuple[Any, str]] = {}
        self.limit = max(0, limit)
        self.bytes = 0
        self.peak = 0

    def __len__(self) -> int:
        return len(self._held)

    def held(self, buffer_id: int) -> tuple[str, int] | None:
        """The element type and length of buffer ``buffer_id``, if held."""
        entry = self._held.get(buffer_id)
        return None if entry is None else (entry[1], int(entry[0].size))

    def get(self, buffer_id: int) -> Any:
        return self._held[buffer_id][0]

    def room(self, ids: tuple[int, ...], nbytes: int) -> None:
        """Check that ``nbytes`` more can be kept under the new ids ``ids``."""
        for buffer_id in ids:
            if buffer_id in self._held:
                raise general.Refused(protocol.bad_args(f"buffer id {buffer_id} is in use"))
        if self.limit and self.bytes + nbytes > self.limit:
            raise BackendError("out_of_memory",
                               f"the buffer limit: {self.bytes} bytes held, {nbytes} more "
                               f"asked for, {self.limit} at most")

    def put(self, buffer_id: int, array: Any, etype: str) -> None:
        self._held[buffer_id] = (array, etype)
        self.bytes += int(array.nbytes)
        self.peak = max(self.peak, self.bytes)

    def pop(self, buffer_id: int) -> Any | None:
        entry = self._held.pop(buffer_id, None)
        if entry is None:
            return None
        self.bytes -= int(entry[0].nbytes)
        return entry[0]

    def ids(self) -> list[int]:
        return list(self._held)


@dataclass(slots=True)
class Stats:
    jobs: int = 0
    launches: int = 0
    max_batch: int = 0
    errors: int = 0
    table_jobs: int = 0  # jobs of uniform batch frames, run as tables


class Lane(threading.Thread):
    def __init__(
        self,
        index: int,
        backend: Backend | None,
        writer: FrameWriter,
        *,
        max_batch: int,
        max_elements: int,
        on_fatal: Callable[[str], None],
        unavailable: str | None = None,
        spin_us: int = 0,
        shm: SharedFolder | None = None,
        buffer_limit: int = 0,
        registry: Registry | None = None,
        compiler: Executor | None = None,
        shm_keep_s: float = IDLE_S,
    ) -> None:
        super().__init__(name=f"erlcuda-device-{index}", daemon=True)
        self.index = index
        self.backend = backend
        self.writer = writer
        self.max_batch = max(1, max_batch)
        self.max_elements = max_elements
        self.on_fatal = on_fatal
        self.unavailable = unavailable
        self.spin_ns = spin_us * 1000
        self.shm = shm
        self.stats = Stats()
        self.store = BufferStore(buffer_limit)
        self.registry = registry if registry is not None else Registry()
        self.programs = Runner(index, self.registry, self.store, compiler)
        self.ready = threading.Event()
        self.device_info: dict[str, Any] = {}
        self.memory = 1 << 62  # device memory in bytes, where the backend says
        self._queue: queue.SimpleQueue[Job | UniformJobs | Control | object] = (
            queue.SimpleQueue())
        self._held: Job | UniformJobs | Control | object | None = None
        # Shared-memory files kept from job to job (``slots.py``), made once the device is
        # open (they may be pinned through it), and swept on this thread.
        self.slots: OperandSlots | None = None
        self._again: _Again | None = None  # the last lone job in slots (``run_lone_slots``)
        self._keep_s = shm_keep_s
        self._sweep_at = 0.0

    # -- called from other threads ---------------------------------------------------------
    def submit(self, item: Job | UniformJobs | Control) -> None:
        self._queue.put(item)

    def depth(self) -> int:
        return self._queue.qsize() + (self._held is not None)

    def stop(self) -> None:
        self._queue.put(_STOP)

    # -- the lane's own thread -------------------------------------------------------------
    def run(self) -> None:
        device = self.open_here()
        try:
            while True:
                items = self._take()
                if items is None:
                    return
                if isinstance(items, Control):
                    self._control(items, device)
                elif isinstance(items, UniformJobs):
                    self.run_uniform(items, device)
                else:
                    self.run_jobs(items, device)
                self.housekeep()
        finally:
            self.close_here(device)

    def housekeep(self, now: float | None = None) -> None:
        """Sweep the shared-memory files kept from job to job, at most every ``SWEEP_S``:
        on the thread that owns the device, between jobs and when idle."""
        if self.slots is None:
            return
        now = time.monotonic() if now is None else now
        if now < self._sweep_at:
            return
        self._sweep_at = now + SWEEP_S
        try:
            self.slots.sweep(now)
        except Exception:
            log.exception("device %d: sweeping shared-memory files failed", self.index)
        if self._again is not None and self._again.changes != self.slots.changes:
            self._again = None  # its views would keep a dropped slot's mapping

    def idle_wait(self) -> float | None:
        """How long this lane may sleep before its next sweep (``None``: nothing to
        sweep)."""
        if self.slots is None or not len(self.slots):
            return None
        return min(SWEEP_S, self._keep_s)

    # -- a lane run by the port's reading thread (one device: no hand-off) ------------------
    def open_here(self) -> Device | None:
        """Open the device in the calling thread, which then owns it; ``ready`` set
        whatever the opening does (a caller waits on it)."""
        try:
            return self._open()
        finally:
            self.ready.set()

    def close_here(self, device: Device | None) -> None:
        self._again = None
        if self.slots is not None:
            try:
                self.slots.close()
            except Exception:
                log.exception("device %d: releasing shared-memory files failed", self.index)
        self.slots = None
        if device is not None:
            try:
                self.programs.close(device)
            except Exception:
                log.exception("device %d: releasing its programs' graphs failed", self.index)
            try:
                self.free_buffers(device, self.store.ids())
            except Exception:
                log.exception("device %d: freeing its buffers failed", self.index)
            try:
                device.close()
            except Exception:
                log.exception("device %d: close failed", self.index)

    def run_jobs(self, jobs: list[Job], device: Device | None) -> None:
        """Run ``jobs`` in arrival order, in batches within ``max_batch`` and
        ``max_elements`` (what ``_take`` would have formed from a queue); a general job
        alone."""
        start, count = 0, len(jobs)
        while start < count:
            end, elements = start + 1, jobs[start].elements
            if jobs[start].general is not None:
                self._general(jobs[start], device)
                start = end
                continue
            while end < count and end - start < self.max_batch:
                if jobs[end].general is not None:
                    break
                elements += jobs[end].elements
                if elements > self.max_elements:
                    break
                end += 1
            self._batch(jobs[start:end] if start or end < count else jobs, device)
            start = end

    def run_general(self, job: Job, device: Device | None) -> None:
        """Run and answer one general job (``job.general`` set) on the calling thread, which
        owns the device."""
        self._general(job, device)

    def run_control(self, item: Control, device: Device | None) -> None:
        self._control(item, device)

    def free_here(self, device: Device | None, ids: Sequence[int]) -> None:
        """``free_buffers`` on the thread that owns the device, with nothing to answer: a
        device lost while freeing ends the worker (as in ``_control``), anything else is
        logged."""
        try:
            self.free_buffers(device, ids)
        except BackendError as exc:
            fatal = self._lost(exc)
            if fatal is not None:
                self.on_fatal(fatal)
            log.warning("device %d: freeing buffers: %s", self.index, exc.message)
        except Exception:
            log.exception("device %d: freeing buffers failed", self.index)

    def run_uniform(self, jobs: UniformJobs, device: Device | None) -> None:
        """Run a uniform batch in slices within ``max_batch`` and ``max_elements``, and
        answer each slice with one table of records (``protocol.encode_table``): the
        table's plans share one key, so each slice is one backend call."""
        whole = jobs.batch
        per_job = max(whole.elements, 1)
        step = max(1, min(self.max_batch, self.max_elements // per_job))
        for start in range(0, whole.count, step):
            end = min(start + step, whole.count)
            rows = whole.rows(start, end)
            if type(rows) is ProgramRows:
                self._program_slice(jobs.job_ids[start:end], rows, device)
            else:
                assert jobs.floats is not None  # a table says it for each row
                self._uniform_slice(jobs.job_ids[start:end], rows, device,  # type: ignore[arg-type]
                                    jobs.floats[start:end])

    def _program_slice(self, job_ids: np.ndarray, rows: ProgramRows,
                       device: Device | None) -> None:
        """Runs of one program template, as one batch (``programs.Runner``)."""
        columns: list[np.ndarray] | None = None
        fatal: str | None = None
        if device is None:
            failure: Failure = protocol.backend_unavailable(self.unavailable or "")
        else:
            try:
                columns = self.programs.run_rows(rows, device)
                self.stats.launches += 1
                self.stats.max_batch = max(self.stats.max_batch, rows.count)
            except Exception as exc:
                failure, fatal = self._failure(exc, rows.plan.kernel)
        self.stats.jobs += rows.count
        self.stats.table_jobs += rows.count
        frames = [] if columns is None else protocol.encode_list_table(
            job_ids, columns, self.writer.max_frame)
        if frames:
            self._write(frames)
        else:  # a failure, or outputs the table does not encode: run by run
            self._reply([(int(job_id), failure if columns is None else _listed(columns, i),
                          None) for i, job_id in enumerate(job_ids)])
        if fatal is not None:
            self.on_fatal(fatal)

    def _uniform_slice(self, job_ids: np.ndarray, batch: UniformPlans,
                       device: Device | None, floats: np.ndarray) -> None:
        failure: Failure | None = None
        fatal: str | None = None
        values: np.ndarray | None = None
        if device is None:
            failure = protocol.backend_unavailable(self.unavailable or "")
        else:
            try:
                values = device.execute_uniform(batch)
                self.stats.launches += 1
                self.stats.max_batch = max(self.stats.max_batch, batch.count)
            except Exception as exc:
                failure, fatal = self._failure(exc, batch.kernel)
        self.stats.jobs += batch.count
        self.stats.table_jobs += batch.count
        # a table is of one kind of record: every row's launch has flag_floats, or none has
        every = bool(floats.all())
        mixed = not every and bool(floats.any())
        frames = [] if values is None or mixed else protocol.encode_table(
            job_ids, values, self.writer.max_frame, every)
        if frames:
            self._write(frames)
        else:  # a failure, records too large for the table, or of both kinds: one by one
            self._reply([
                (int(job_id), failure if failure is not None else _row(
                    values, i, bool(floats[i]), self.writer.max_frame),
                 None) for i, job_id in enumerate(job_ids)])
        if fatal is not None:
            self.on_fatal(fatal)

    def _run(self, plans: list[Plan], device: Device,
             into: list[np.ndarray | None] | None = None, registered: bool = False) -> (
            tuple[list[Result] | None, Failure | None, str | None]):
        """One backend call for ``plans`` (one batch key): its values, else the failure
        every one of them gets; and why the device is lost, where it is. ``into``: where
        each plan's vector result is to be written, where given; ``registered``: as for
        ``Device.execute``."""
        try:
            if plans[0].program is not None:
                values = self.programs.run(plans, device, self._host)
            elif into is not None:
                values = device.execute(plans, into=into, registered=registered)
            else:
                values = device.execute(plans)
        except Exception as exc:
            return None, *self._failure(exc, plans[0].kernel)
        self.stats.launches += 1
        self.stats.max_batch = max(self.stats.max_batch, len(plans))
        return values, None, None  # type: ignore[return-value]

    def run_lone(self, job_id: int, plan: Plan, device: Device | None,
                 listed: bool = False, floats: bool = False) -> bool:
        """Run and answer one job that arrived alone, with the least Python: what
        ``_batch`` does for a batch of one plain job (``listed``: its result answered as a
        list of one, a program's that is this launch; ``floats``: its launch has
        flag_floats). ``False`` (nothing done) where the job needs more than that: the
        caller then takes the general path."""
        if device is None or plan.device_bytes > self.memory:
            return False
        value, failure, fatal = self._run_one(plan, device)
        result: Result = failure if value is None else value  # type: ignore[assignment]
        if listed and value is not None:
            result = Listed((result,))
        elif floats:
            result = protocol.as_floats(result, self.writer.max_frame)
        self._answer_one(job_id, result, fatal)
        return True

    def run_lone_slots(self, job: Job, files: Sequence[FileArg],
                       plan_of: Callable[[list[np.ndarray]], Plan],
                       device: Device | None) -> None:
        """Run and answer one job that arrived alone and names slots (read by its slot
        template): its operands mapped (``prepare_slots``), its vector result written
        straight into its result slot, with the least Python; what ``_batch`` does for a
        batch of one such job, which takes any job that needs more (an error to answer, no
        device, too large for it, a program). A job that names the slots the last one did,
        through the same template, while they stay as they were, runs on what was read from
        them for it (``_Again``)."""
        again = self._again_for(job, files, plan_of) if device is not None else None
        if again is None:
            again = self._read_slots(job, files, plan_of, device)
            if again is None:
                self._batch([job], device)
                return
        assert device is not None  # ``_read_slots`` reads none without one
        value, failure, fatal = self._run_one(again.plan, device, again.into,
                                              again.registered)
        result = failure if value is None else _placed(value, again.target, again.into)
        self._answer_one(job.job_id, self._sent(job, result), fatal)  # type: ignore[arg-type]

    def _again_for(self, job: Job, files: Sequence[FileArg],
                   plan_of: Callable[[list[np.ndarray]], Plan]) -> _Again | None:
        """The last lone slot job's reading, where ``job`` names what it named (a bound
        method is equal to another of the same object's) and the slots stayed as they were;
        its slots' uses counted."""
        again = self._again
        if (again is None or self.slots is None or again.changes != self.slots.changes
                or again.plan_of != plan_of or again.result != job.result_file
                or again.files != files):
            return None
        self.slots.touch(again.names)
        job.plan = again.plan
        return again

    def _read_slots(self, job: Job, files: Sequence[FileArg],
                    plan_of: Callable[[list[np.ndarray]], Plan],
                    device: Device | None) -> _Again | None:
        """A lone slot job's operands mapped and its result's target: what it runs on,
        kept for the next where its slots are settled (``OperandSlots.settled``); ``None``
        where it needs the batch's path."""
        named = job.result_file
        self.prepare_slots(job, files, plan_of)
        plan = job.plan
        if (device is None or plan is None or plan.program is not None
                or plan.device_bytes > self.memory):
            return None
        target = self._result_target(job)
        into = None if target is None else target.view(kernels.F32)
        slots = self.slots
        registered = (target is not None and target.pinned and slots is not None
                      and slots.registered(files))
        names = tuple(f.name for f in files) + (() if named is None else (named.name,))
        again = _Again(plan_of, files, named, -1 if slots is None else slots.changes, plan,
                       target, into, registered, names)
        # a result slot that could not be had is tried again by the next job
        if (slots is not None and (named is None or target is not None)
                and slots.settled(files, named)):
            self._again = again
        return again

    def _sent(self, job: Job, result: Result) -> Result:
        """A job's result as its reply carries it: a vector not yet in its result slot
        written there (an untraced job's: a traced result never travels through shared
        memory), and as floats where its launch wants them."""
        if job.trace is None and job.result_file is not None and type(result) is np.ndarray:
            result = self._write_result(job, result)
        if job.floats:
            result = protocol.as_floats(result, self.writer.max_frame)
        return result

    def _run_one(self, plan: Plan, device: Device, into: np.ndarray | None = None,
                 registered: bool = False) -> (
            tuple[Result | None, Failure | None, str | None]):
        """``_run`` for one plan (``into``: where its vector result is to be written;
        ``registered`` as for ``Device.execute``): its value, else ``None`` and its
        failure; and why the device is lost, where it is."""
        values, failure, fatal = self._run([plan], device, None if into is None else [into],
                                           registered)
        if values is not None and len(values) != 1:
            failure = protocol.internal(f"the backend gave {len(values)} results for one job")
            values = None
        return (None if values is None else values[0]), failure, fatal

    def _answer_one(self, job_id: int, result: Result, fatal: str | None) -> None:
        """Count and answer one job run alone, then end the worker where its device is
        lost (after the reply is written)."""
        self.stats.jobs += 1
        self._reply([(job_id, result, None)])
        if fatal is not None:
            self.on_fatal(fatal)

    def _failure(self, exc: Exception, what: str) -> tuple[Failure, str | None]:
        """The one mapping from an exception raised while running ``what`` on this lane to
        the reply its jobs get, with why the device is lost where it is (the caller ends
        the worker once the replies are written)."""
        if isinstance(exc, general.Refused):
            return exc.failure, None
        if isinstance(exc, ShmError):
            return _shm_failure(exc), None
        if isinstance(exc, BackendError):
            return protocol.cuda_error(exc.code, exc.message), self._lost(exc)
        log.error("device %d: %s failed", self.index, what, exc_info=exc)
        return protocol.internal(f"{type(exc).__name__}: {exc}"), None

    def _lost(self, exc: BackendError) -> str | None:
        """Why the device is lost, where ``exc`` says it is (a sticky error)."""
        return f"device {self.index}: {exc.code}: {exc.message}" if exc.fatal else None

    def _reply(self, records: list[protocol.Record]) -> None:
        """Encode and write the replies of ``records`` (``protocol.encode_results``, the one
        encoder of job replies), counting those that carry an error."""
        encoded = protocol.encode_results(records, self.writer.max_frame)
        if encoded.replaced:
            _log_replaced(encoded)
        self.stats.errors += encoded.errors
        try:
            if encoded.size:
                self.writer.write_sized(encoded.frames[0], encoded.size)
            else:
                self.writer.write_many(encoded.frames)
        except FrameError:
            log.warning("device %d: replies dropped, the port is closed", self.index)

    def _write(self, frames: Sequence[Sequence[bytes | memoryview]]) -> None:
        """Write ``frames`` (a table's, ``protocol.encode_table``)."""
        try:
            self.writer.write_many(frames)
        except FrameError:
            log.warning("device %d: replies dropped, the port is closed", self.index)

    def _open(self) -> Device | None:
        if self.backend is None or self.unavailable is not None:
            return None
        try:
            device = self.backend.open(self.index)
            self.device_info = device.info()
            self.memory = int(self.device_info.get("total_memory", self.memory))
            if self.shm is not None:
                self.slots = OperandSlots(self.shm, device.pinning, idle_s=self._keep_s)
            return device
        except BackendError as exc:
            self.unavailable = f"device {self.index}: {exc.message}"
        except Exception as exc:
            self.unavailable = f"device {self.index}: {type(exc).__name__}: {exc}"
        log.error("%s", self.unavailable)
        return None

    def _take(self) -> list[Job] | UniformJobs | Control | None:
        """What is queued: a control item or a uniform batch alone, else the jobs queued
        in a row (at most ``max_batch``), which ``run_jobs`` batches. It never waits for
        more than the first item: a lone job pays no added latency."""
        # SimpleQueue is C code with a cheap wake-up; what is already queued is drained
        # without blocking, and an item that is not a job is held for the next turn.
        first = self._held if self._held is not None else self._next()
        self._held = None
        if first is _STOP:
            return None
        if isinstance(first, (Control, UniformJobs)):
            return first
        jobs: list[Job] = [first]  # type: ignore[list-item]
        get = self._queue.get_nowait
        while len(jobs) < self.max_batch:
            try:
                item = get()
            except queue.Empty:
                break
            if type(item) is not Job:
                self._held = item
                break
            jobs.append(item)
        return jobs

    def _next(self) -> Job | UniformJobs | Control | object:
        """The next item; for ``spin_ns`` after the last one, poll instead of sleeping.

        A thread woken from a sleep costs tens of microseconds (more in a virtual machine),
        so a lane that has just worked polls briefly, yielding the GIL at each turn.
        """
        try:
            return self._queue.get_nowait()
        except queue.Empty:
            pass
        if self.spin_ns:
            clock = time.perf_counter_ns
            deadline = clock() + self.spin_ns
            while clock() < deadline:
                time.sleep(0)
                try:
                    return self._queue.get_nowait()
                except queue.Empty:
                    pass
        while True:
            try:
                return self._queue.get(timeout=self.idle_wait())
            except queue.Empty:
                self.housekeep()

    def _control(self, item: Control, device: Device | None) -> None:
        try:
            item.future.set_result(item.fn(device))
        except Exception as exc:
            item.future.set_exception(exc)
            fatal = self._lost(exc) if isinstance(exc, BackendError) else None
            if fatal is not None:
                self.on_fatal(fatal)

    def prepare(self, job: Job) -> None:
        """Map and check a job's shared-memory operands: its plan, else its error."""
        launch = job.unmapped
        if launch is None:
            return
        job.unmapped = None

        def check() -> Plan:
            # The launch is the job's alone: its file operands are replaced by their arrays.
            launch.args = [self._map(a) if type(a) is FileArg else a for a in launch.args]
            return general.check(launch, self.registry)

        self._planned(job, check)

    def prepare_slots(self, job: Job, files: Sequence[FileArg],
                      plan_of: Callable[[list[np.ndarray]], Plan]) -> None:
        """Map the operands ``files`` of a launch read by its slot template: the job's plan
        (``plan_of`` the mappings), else its error."""
        self._planned(job, lambda: plan_of([self._map(arg) for arg in files]))

    @staticmethod
    def _planned(job: Job, make: Callable[[], Plan]) -> None:
        """The job's plan from ``make``, or the error its mapping or check gives."""
        try:
            job.plan = make()
        except ShmError as exc:
            job.error = _shm_failure(exc)
        except general.Refused as exc:
            job.error = exc.failure

    def _batch(self, batch: list[Job], device: Device | None) -> None:
        now = time.perf_counter_ns
        for job in batch:
            self.prepare(job)
        t_take = now()
        groups, results = self._group(batch, device)
        t_run = now()
        fatal = self._run_groups(batch, groups, results, device)
        t_done = now()
        self.stats.jobs += len(batch)
        t_encode = now()
        records: list[protocol.Record] = []
        for job, result in zip(batch, results, strict=True):
            assert result is not None  # every job was answered above
            if job.trace is not None:
                job.trace.update(take=t_take, run=t_run, done=t_done, encode=t_encode)
            records.append((job.job_id, self._sent(job, result), job.stamps()))
        self._reply(records)
        if fatal is not None:
            self.on_fatal(fatal)

    def _group(self, batch: list[Job], device: Device | None) -> (
            tuple[dict[tuple[Any, ...], list[int]], list[Result | None]]):
        """The batch's runnable jobs by plan key (indexes into ``batch``), and the answers
        of those that cannot run."""
        groups: dict[tuple[Any, ...], list[int]] = {}
        results: list[Result | None] = [None] * len(batch)
        for i, job in enumerate(batch):
            if job.error is not None:
                results[i] = job.error
            elif device is None:
                results[i] = protocol.backend_unavailable(self.unavailable or "")
            else:
                assert job.plan is not None  # the check either set it or set job.error
                if job.plan.device_bytes > self.memory:
                    results[i] = protocol.TOO_LARGE
                else:
                    groups.setdefault(job.plan.key, []).append(i)
        return groups, results

    def _run_groups(self, batch: list[Job], groups: dict[tuple[Any, ...], list[int]],
                    results: list[Result | None], device: Device | None) -> str | None:
        """One backend call a group, each answer in ``results``; why the device is lost,
        where it is. A result that goes to a file is written straight into its result slot
        (``into``), or copied there where the backend wrote it elsewhere."""
        fatal: str | None = None
        last = len(groups) - 1
        for g, indices in enumerate(groups.values()):
            plans: list[Plan] = [batch[i].plan for i in indices]  # type: ignore[misc]
            targets: list[ResultTarget | None] = (
                [self._result_target(batch[i]) for i in indices]
                if any(batch[i].result_file is not None for i in indices)
                else [None] * len(indices))
            into = ([t.view(kernels.F32) if t is not None else None for t in targets]
                    if any(t is not None for t in targets) else None)
            values, failure, why = self._run(plans, device, into)  # type: ignore[arg-type]
            fatal = why or fatal
            for n, i in enumerate(indices):
                if values is None:
                    results[i] = failure
                    continue
                placed = _placed(values[n], targets[n], None if into is None else into[n])
                # A backend's arrays may live in its staging memory, valid only until its
                # next run: keep a copy where another group runs before the write.
                results[i] = placed if placed is not values[n] or g == last else _own(placed)
        return fatal

    def _result_target(self, job: Job) -> ResultTarget | None:
        """The job's result slot, mapped for its vector result, where it goes to a file."""
        plan = job.plan
        if (job.trace is not None or plan is None or plan.action != "batched" or plan.scalar
                or plan.out_elements <= 0):
            return None
        return self._slot_for(job, plan.out_elements * kernels.F32.itemsize)

    def _slot_for(self, job: Job, nbytes: int) -> ResultTarget | None:
        """The job's result slot mapped for ``nbytes``; ``None`` where it has none or it
        cannot be had: the result then takes the pipe, and the slot is not tried again."""
        if job.result_file is None or self.slots is None:
            return None
        try:
            return self.slots.result(job.result_file, nbytes)
        except ShmError as exc:
            log.warning("job %d: the result goes through the pipe: %s", job.job_id, exc)
            job.result_file = None
            return None

    # -- the general path ------------------------------------------------------------------
    def _general(self, job: Job, device: Device | None) -> None:
        """Run and answer one general job (``general.check``, then ``run_plan``)."""
        t_take = time.perf_counter_ns()
        launch = job.general
        assert launch is not None
        job.general = None
        try:
            plan = general.check(launch, self.registry, self.store.held)
        except Exception as exc:
            failure, fatal = self._failure(exc, f"job {job.job_id} ({launch.kernel})")
            self._answer_general(job, failure, t_take, t_take, fatal)
            return
        self.run_plan(job, plan, device, t_take)

    def run_plan(self, job: Job, plan: Plan, device: Device | None,
                 t_take: int | None = None) -> None:
        """Run and answer a general job whose launch ``general.check`` made ``plan``, on the
        thread that owns the device (``t_take``: when the job was taken, for its trace)."""
        now = time.perf_counter_ns
        if t_take is None:
            t_take = now()
        result: Result
        fatal: str | None = None
        t_run = t_take
        try:
            if device is None:
                result = protocol.backend_unavailable(self.unavailable or "")
            elif plan.device_bytes > self.memory:
                result = protocol.TOO_LARGE
            else:
                self.store.room(plan.keep or (), plan.kept_bytes)
                t_run = now()
                result = self._execute(plan, device)
                self.stats.launches += 1
                if not self.stats.max_batch:
                    self.stats.max_batch = 1
        except Exception as exc:
            result, fatal = self._failure(exc, f"job {job.job_id} ({plan.kernel})")
        self._answer_general(job, result, t_take, t_run, fatal)

    def _answer_general(self, job: Job, result: Result, t_take: int, t_run: int,
                        fatal: str | None = None) -> None:
        """Write a general job's one reply; then end the worker where its device is lost."""
        self.stats.jobs += 1
        if job.trace is not None:
            job.trace.update(take=t_take, run=t_run, done=time.perf_counter_ns(),
                             encode=time.perf_counter_ns())
        elif (job.result_file is not None and type(result) is np.ndarray
              and result.dtype == kernels.F32):
            # shared memory carries f32 results only (the record names no type)
            result = self._write_result(job, result)
        elif job.floats:
            result = protocol.as_floats(result, self.writer.max_frame)
        self._reply([(job.job_id, result, job.stamps())])
        if fatal is not None:
            self.on_fatal(fatal)

    def _execute(self, plan: Plan, device: Device) -> Result:
        """Run ``plan`` on ``device``: its result, kept or downloaded. Every array made here
        that is not kept is freed, whatever happens."""
        if plan.program is not None:
            return self.programs.run([plan], device, self._host)[0]
        temps: dict[int, Any] = {}  # by id(): device arrays need not compare
        try:
            done = self._outputs(plan, device, temps)
            if not isinstance(done, list):
                return done  # a result with nothing on the device to keep or download
            if plan.keep is not None:
                items: list[Any] = []
                put = self.store.put
                for buffer_id, (array, etype) in zip(plan.keep, done, strict=True):
                    temps.pop(id(array), None)
                    put(buffer_id, array, etype)
                    items.append(Kept(buffer_id, etype, int(array.size)))
            else:
                items = [device.download(array) for array, _ in done]
            return Listed(tuple(items)) if plan.action == "user" else items[0]
        finally:
            for array in temps.values():
                try:
                    device.free(array)
                except Exception:
                    log.exception("device %d: freeing a temporary array failed", self.index)

    def _outputs(self, plan: Plan, device: Device,
                 temps: dict[int, Any]) -> list[tuple[Any, str]] | Result:
        """Run ``plan``'s device call: its result vectors on the device with their types,
        or a result that needs none (a scalar, a copy or fill that keeps nothing)."""
        action = plan.action
        out_type = plan.out_type or "f32"
        if action == "user":
            values = [self._operand(op, device, temps) for op in plan.operands]
            if plan.geometry is not None:
                device.execute([plan], values)
            return [(values[i], plan.operands[i].type or "f32") for i in plan.results]
        if action == "copy":
            return self._copy(plan, device, temps)
        if action == "fill" and plan.keep is None:
            return np.zeros(plan.out_elements, DTYPES[out_type])  # empty's: unspecified
        if action == "builtin":
            values = [self._operand(op, device, temps) for op in plan.operands]
            if plan.scalar:
                return float(device.execute([plan], values)[0])  # type: ignore[arg-type]
        out = device.alloc(DTYPES[out_type], plan.out_elements,
                           zero=action == "fill" and plan.kernel == "zeros")
        temps[id(out)] = out
        if action == "builtin":
            device.execute([plan], values, out)
        return [(out, out_type)]

    def _copy(self, plan: Plan, device: Device,
              temps: dict[int, Any]) -> list[tuple[Any, str]] | Result:
        """``copy``'s outputs: the new buffer, or the copy itself where nothing is kept."""
        op = plan.operands[0]
        out_type = plan.out_type or "f32"
        if plan.keep is None:
            if op.source == "buffer":
                return device.download(self.store.get(op.value))
            if op.source == "zeros":
                return np.zeros(op.elements, DTYPES[out_type])
            return np.array(self._host(op))  # a copy: the frame's memory is reused
        if op.source != "buffer":  # the upload is the new buffer
            return [(self._operand(op, device, temps), out_type)]
        out = device.alloc(DTYPES[out_type], plan.out_elements, zero=False)
        temps[id(out)] = out
        device.execute([plan], [self.store.get(op.value)], out)
        return [(out, out_type)]

    def _operand(self, op: Operand, device: Device, temps: dict[int, Any]) -> Any:
        """An operand of ``_execute``'s device call; an array made for it goes into
        ``temps``."""
        source = op.source
        if source == "buffer":
            return self.store.get(op.value)
        if source == "value":
            return op.value
        assert op.type is not None
        if source == "zeros":
            array = device.alloc(DTYPES[op.type], op.elements, zero=True)
        else:
            array = device.upload(self._host(op))
        temps[id(array)] = array
        return array

    def _host(self, op: Operand) -> np.ndarray:
        """A data operand's elements on the host: the frame's, or shared memory mapped."""
        if op.source == "data":
            return op.value  # type: ignore[no-any-return]
        return self._map(op.value)

    def _map(self, arg: FileArg) -> np.ndarray:
        """A file operand's elements: an operand slot's (kept mapped), or a job's own files
        (mapped and unlinked)."""
        if self.shm is None:
            raise NoFolder("shared memory: this worker has no folder")
        if not OperandSlots.owns(arg.name):
            return self.shm.open_input(arg)
        if self.slots is None:
            # no device, no slots: a slot is Erlang's, never a job's own file to unlink
            raise ShmError(f"shared memory: {arg.name:.80}: no slots without a device")
        return self.slots.open(arg)

    def _write_result(self, job: Job, result: np.ndarray) -> np.ndarray | FileResult:
        """A vector result copied into the job's result slot: its record; the result
        itself (through the pipe) where the slot cannot be had."""
        target = self._slot_for(job, result.nbytes)
        return result if target is None else _into(target, result)

    def free_buffers(self, device: Device | None, ids: Sequence[int]) -> None:
        """Free the buffers ``ids`` (those held: others are ignored), on the lane's thread.
        A device lost while freeing raises its ``BackendError``."""
        for buffer_id in ids:
            array = self.store.pop(buffer_id)
            if array is None or device is None:
                continue
            try:
                device.free(array)
            except BackendError as exc:
                if exc.fatal:
                    raise
                log.warning("device %d: freeing buffer %d: %s", self.index, buffer_id,
                            exc.message)


def _placed(value: Result, target: ResultTarget | None,
            into: np.ndarray | None) -> Result:
    """A job's value where its result slot ``target`` is to hold it: the slot's record once
    the value is there (written by the backend into ``into``, else copied), or the value
    itself where it has no slot or is no vector of the slot's bytes."""
    if target is None:
        return value
    if into is not None and value is into:
        return target.commit()
    if _fits(value, target):
        return _into(target, value)  # type: ignore[arg-type]
    return value


def _into(target: ResultTarget, value: np.ndarray) -> FileResult:
    """``value`` copied into its result slot: the record to send."""
    np.copyto(target.view(value.dtype), value.reshape(-1))
    return target.commit()


def _fits(value: Result, target: ResultTarget) -> bool:
    """Whether ``value`` is an f32 vector of ``target``'s bytes."""
    return (type(value) is np.ndarray and value.dtype == kernels.F32
            and value.nbytes == target.nbytes)


def _own(value: Result) -> Result:
    """``value`` with copies of its arrays (a backend's may be views of its staging)."""
    if type(value) is np.ndarray:
        return value.copy()
    if type(value) is Listed:
        return Listed(tuple(v.copy() if type(v) is np.ndarray else v for v in value.items))
    return value


def _listed(columns: list[np.ndarray], i: int) -> Listed:
    """Run ``i``'s outputs out of a batch's columns."""
    return Listed(tuple(float(c[i]) if c.ndim == 1 else c[i] for c in columns))


def _row(values: np.ndarray | None, i: int, floats: bool, max_frame: int) -> Result:
    assert values is not None
    if values.ndim != 2:
        return float(values[i])
    return protocol.as_floats(values[i], max_frame) if floats else values[i]


def _shm_failure(exc: ShmError) -> protocol.Failure:
    """A file operand's failure: ``{worker_down, shm_unavailable}`` for a launch written,
    while this worker started, to the folder it could not take (sent again, it takes the
    pipe), else ``bad_args`` naming what was wrong with the file."""
    if isinstance(exc, NoFolder):
        return protocol.Failure("worker_down", (protocol.atom("shm_unavailable"),))
    return protocol.bad_args(str(exc))
