"""Running programs on one device: a run, or a batch of runs of one program and shape.

A lane hands its ``Runner`` the plans of program launches (``programs``): one run that goes
alone, or several that share a batch key (the same program on data of the same shapes,
run as one: each vector laid end to end, the device splitting reductions and products per
run). The runner binds the inputs (uploading data, using buffers in place), queues every
step on the device with no wait between them (``Device.enqueue``), waits once, and answers
each run its outputs as a list (``protocol.Listed``): vectors downloaded or kept as
buffers, scalars as floats. What it allocated goes back to the device's pool whatever
happens; buffers are kept only once every step has run (a run's outputs are all or
nothing).

Where the device has CUDA graphs (``Device.graphs``), a lone run that comes again with the
same shapes, buffers and numbers is captured once as a graph over arrays of its own, and
replayed: its data is copied in, the graph launched, its outputs copied out. The graphs
are bounded per device (``MAX_GRAPHS``, and the bytes of their arrays) and dropped with
every change of the user kernels.

Where the device compiles generated kernels (``Device.arch``), the program's elementwise
runs (``fusion``) are compiled in the background through the one compile cache; until a
group's kernel is loaded into this device, its steps run one by one.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Callable, Sequence
from concurrent.futures import Executor, Future
from dataclasses import dataclass, replace
from typing import Any, TypeVar

import numpy as np

from . import compile as nvcc
from . import fusion, kernels
from .backends.base import STAGE_MAX, Device, stage_layout
from .general import BLOCK, Registry
from .kernels import DTYPES, Operand, Plan
from .programs import Op, ProgramPlan, StepPlan
from .protocol import Kept, Listed, Result

log = logging.getLogger("erlcuda.programs")
_T = TypeVar("_T")

#: Graphs kept per device at most, the oldest going first.
MAX_GRAPHS = 64
#: Runs of one key seen before it is captured (the second run is: a program run once is
#: not worth a capture).
CAPTURE_AFTER = 1
#: A run whose data inputs and fetched outputs are larger (bytes) is never captured: its graph
#: would copy them through the graph's own pinned memory, a host copy that costs more than
#: the launches a replay saves; without one they go as the device copies data past its
#: staging (in place from registered memory, else in chunks).
GRAPH_DATA_MAX = STAGE_MAX
#: Fused modules kept loaded per device at most.
MAX_FUSED = 64

HostOf = Callable[[Operand], np.ndarray]


@dataclass(slots=True)
class _Graph:
    """A captured run: its arrays by slot (its own, and the key's buffers and numbers), the
    host memory it copies the data inputs from and the fetched outputs to (the copies are
    in the graph), and where each lies there."""

    handle: Any
    arrays: dict[int, Any]
    owned: list[Any]
    nbytes: int
    host_in: Any
    host_out: Any
    inputs: tuple[tuple[int, int], ...]  # data input slot, byte offset in host_in
    outputs: tuple[tuple[int, int], ...]  # fetched output slot, byte offset in host_out


class Runner:
    """A lane's programs: their runs, graphs and fused kernels, on the lane's thread."""

    def __init__(self, index: int, registry: Registry, store: Any,
                 compiler: Executor | None = None, graph_bytes: int = 1 << 30,
                 graph_data_max: int = GRAPH_DATA_MAX) -> None:
        self.index = index
        self.registry = registry
        self.store = store
        self.compiler = compiler
        self.graph_bytes = graph_bytes
        self.graph_data_max = graph_data_max
        self._version = registry.version
        self._graphs: OrderedDict[tuple[Any, ...], _Graph] = OrderedDict()
        self._seen: OrderedDict[tuple[Any, ...], int] = OrderedDict()
        self._fused: OrderedDict[str, Future[bytes] | bool] = OrderedDict()
        self.stats = {"runs": 0, "graph_runs": 0, "captures": 0, "fused_runs": 0}

    # -- running ------------------------------------------------------------------------------
    def run(self, plans: Sequence[Plan], device: Device, host_of: HostOf) -> list[Result]:
        """The results of ``plans`` (one run, or runs of one batch key), in order."""
        self._fresh(device)
        typed = plans[0].program.plan  # type: ignore[union-attr]
        self.stats["runs"] += len(plans)
        if typed.launch is not None and plans[0].keep is None and all(
                op.source != "buffer" for op in plans[0].operands):  # a launch on data
            return self._as_launches(plans, typed, device, host_of)
        schedule = self._schedule(typed, device)
        if len(schedule) < len(typed.steps):
            self.stats["fused_runs"] += len(plans)
        if (len(plans) == 1 and typed.definition.graph and device.graphs is not None
                and _data_bytes(plans[0], typed) <= self.graph_data_max):
            found = self._graph(plans[0], typed, schedule, device, host_of)
            if found is not None:
                self.stats["graph_runs"] += 1
                return [found]
        return _Run(self, plans, typed, device, host_of).results(schedule)

    @staticmethod
    def _as_launches(plans: Sequence[Plan], typed: ProgramPlan, device: Device,
                     host_of: HostOf) -> list[Result]:
        """Runs of a program that is one launch (``ProgramPlan.launch``), as that launch's
        batch: no program machinery, so it costs what the launch costs. Each input is read
        once, however often the step names it (a job's own file is unlinked once mapped)."""
        kernel = typed.definition.steps[0].kernel
        args = typed.launch or ()
        named = {a[1] for a in args if isinstance(a, tuple)}

        def value(op: Operand) -> Any:
            return host_of(op) if op.source in ("data", "file") else op.value

        launches = []
        for plan in plans:
            inputs = {i: value(plan.operands[i]) for i in named}
            launches.append(kernels.parse(kernel, [inputs[a[1]] if isinstance(a, tuple) else a
                                                   for a in args]))
        return [Listed((result,)) for result in device.execute(launches)]

    @property
    def graphs(self) -> dict[tuple[Any, ...], Any]:
        """The graphs kept, by key (read by ``info``)."""
        return self._graphs

    def run_rows(self, rows: Any, device: Device) -> list[np.ndarray]:
        """The outputs of a batch frame's runs of one program template
        (``templates.ProgramRows``), each data input a block of rows, run as one batch: a
        column per output, row ``r`` run ``r``'s (``count x n`` for a vector, ``count``
        values for a scalar)."""
        self._fresh(device)
        plan = rows.plan
        typed = plan.program.plan
        self.stats["runs"] += rows.count
        hosts = {i: np.ascontiguousarray(block).reshape(-1) for i, block in rows.blocks.items()}
        run = _Run(self, [plan] * rows.count, typed, device, lambda op: op.value, hosts=hosts)
        schedule = self._schedule(typed, device)
        if len(schedule) < len(typed.steps):
            self.stats["fused_runs"] += rows.count
        return run.columns(schedule)

    def close(self, device: Device | None) -> None:
        """Release the graphs and their arrays (on the lane's thread)."""
        for graph in self._graphs.values():
            self._release(graph, device)
        self._graphs.clear()
        self._seen.clear()

    def _fresh(self, device: Device) -> None:
        """Drop what the user kernels' last change made stale."""
        if self.registry.version == self._version:
            return
        self._version = self.registry.version
        self.close(device)

    # -- fusion -------------------------------------------------------------------------------
    def _schedule(self, typed: ProgramPlan, device: Device) -> list[StepPlan]:
        """The steps to queue: each fused group whose kernel is loaded here in place of its
        steps, the others as they are."""
        if not typed.definition.fuse or device.arch is None or self.compiler is None:
            return list(typed.steps)
        if typed.fusion is None:
            typed.fusion = fusion.groups(typed, self.registry.get)
        steps = list(typed.steps)
        for group in reversed(typed.fusion):
            if self._loaded(group, device):
                steps[group.start : group.end] = [group.step]
        return steps

    def _loaded(self, group: fusion.Group, device: Device) -> bool:
        state = self._fused.get(group.module)
        if state is None:
            arch = device.arch
            assert self.compiler is not None and arch is not None
            state = self._fused[group.module] = self.compiler.submit(
                nvcc.cubin, group.source, [], arch)
            self._bound_fused(device)
            return False
        if state is True or state is False:
            self._fused.move_to_end(group.module)
            return state
        if not state.done():
            return False
        try:
            device.load_module(group.module, state.result(), [group.name])
            self._fused[group.module] = True
        except Exception as exc:  # the steps run unfused
            log.warning("device %d: fusing %s failed: %s", self.index, group.name, exc)
            self._fused[group.module] = False
        return self._fused[group.module] is True

    def _bound_fused(self, device: Device) -> None:
        while len(self._fused) > MAX_FUSED:
            module, state = self._fused.popitem(last=False)
            if state is True:
                device.unload_module(module)

    # -- graphs -------------------------------------------------------------------------------
    def _graph(self, plan: Plan, typed: ProgramPlan, schedule: list[StepPlan], device: Device,
               host_of: HostOf) -> Result | None:
        """A lone run through its graph, captured on its key's second run; ``None``: it runs
        as ever (the first run of a key, a capture that failed or would not fit)."""
        key = self._key(plan, typed, schedule)
        graph = self._graphs.get(key)
        if graph is None:
            seen = self._seen.pop(key, 0)
            self._seen[key] = seen + 1
            if len(self._seen) > 4 * MAX_GRAPHS:
                self._seen.popitem(last=False)
            if seen < CAPTURE_AFTER:
                return None
            graph = self._capture(plan, typed, schedule, device)
            if graph is None:
                return None
            self._graphs[key] = graph
            self._bound_graphs(device)
        self._graphs.move_to_end(key)
        typed_slots = typed.slots
        for slot, at in graph.inputs:
            host = host_of(plan.operands[slot])
            np.copyto(_host_view(graph.host_in, at, host.dtype, host.size), host)
        device.graphs.launch(graph.handle)
        device.synchronize()
        fetched = {slot: _host_view(graph.host_out, at, DTYPES[typed_slots[slot].type or "f32"],
                                    1 if typed_slots[slot].scalar
                                    else typed_slots[slot].elements).copy()
                   for slot, at in graph.outputs}
        return _Run(self, [plan], typed, device, host_of, arrays=graph.arrays).answer(
            fetched, copy_kept=True)[0]

    def _key(self, plan: Plan, typed: ProgramPlan, schedule: list[StepPlan]) -> tuple[Any, ...]:
        inputs = []
        for op in plan.operands:
            if op.source == "buffer":
                array = self.store.get(op.value)
                inputs.append(("buffer", getattr(array, "ptr", id(array))))
            elif op.source == "value":
                inputs.append(("number", repr(op.value)))
        fused = tuple(s.plan.kernel for s in schedule if s.plan.user is not None)
        return (typed.ident, fused, tuple(inputs), plan.keep is None)

    def _capture(self, plan: Plan, typed: ProgramPlan, schedule: list[StepPlan],
                 device: Device) -> _Graph | None:
        slots = _used(typed, schedule)
        inputs = [s for s, op in enumerate(plan.operands) if op.source in ("data", "file")]
        outputs = list(typed.fetch if plan.keep is None else typed.fetch_kept)
        at_in, bytes_in = stage_layout([typed.slots[s].nbytes for s in inputs])
        at_out, bytes_out = stage_layout([typed.slots[s].nbytes for s in outputs])
        nbytes = bytes_in + bytes_out + sum(
            typed.slots[s].nbytes for s in slots
            if s >= len(plan.operands) or plan.operands[s].source in ("data", "file"))
        if nbytes + sum(g.nbytes for g in self._graphs.values()) > self.graph_bytes:
            self._bound_graphs(device, room=nbytes)
            if nbytes > self.graph_bytes:
                return None
        arrays: dict[int, Any] = {}
        owned: list[Any] = []
        hosts: list[Any] = []
        try:
            for slot in sorted(slots):
                arrays[slot] = self._workspace(plan, typed, slot, device, owned)
            hosts = [device.host_buffer(bytes_in), device.host_buffer(bytes_out)]
            run = _Run(self, [plan], typed, device, lambda op: op.value, arrays=arrays)
            copies_in = [(arrays[s], self._view(hosts[0], at, typed, s))
                         for s, at in zip(inputs, at_in, strict=True)]
            copies_out = [(self._view(hosts[1], at, typed, s), arrays[s])
                          for s, at in zip(outputs, at_out, strict=True)]

            def queue() -> None:
                for array, host in copies_in:
                    device.copy_in(array, host)
                run.queue(schedule)
                for host, array in copies_out:
                    device.copy_out(host, array)

            handle = device.graphs.capture(queue)
        except Exception as exc:
            log.warning("device %d: no graph for program %s: %s", self.index, plan.kernel, exc)
            for array in owned:
                device.free(array)
            for host in hosts:
                device.release_host(host)
            return None
        self.stats["captures"] += 1
        return _Graph(handle, arrays, owned, nbytes, hosts[0], hosts[1],
                      tuple(zip(inputs, at_in, strict=True)),
                      tuple(zip(outputs, at_out, strict=True)))

    @staticmethod
    def _view(host: Any, at: int, typed: ProgramPlan, slot: int) -> np.ndarray:
        held = typed.slots[slot]
        return _host_view(host, at, DTYPES[held.type or "f32"],
                          1 if held.scalar else held.elements)

    def _workspace(self, plan: Plan, typed: ProgramPlan, slot: int, device: Device,
                   owned: list[Any]) -> Any:
        if slot < len(plan.operands):
            op = plan.operands[slot]
            if op.source == "buffer":
                return self.store.get(op.value)
            if op.source == "value":
                return op.value
        held = typed.slots[slot]
        array = device.alloc(DTYPES[held.type or "f32"], 1 if held.scalar else held.elements,
                             zero=False)
        owned.append(array)
        return array

    def _bound_graphs(self, device: Device, room: int = 0) -> None:
        total = sum(g.nbytes for g in self._graphs.values())
        while self._graphs and (len(self._graphs) > MAX_GRAPHS
                                or total + room > self.graph_bytes):
            _, graph = self._graphs.popitem(last=False)
            total -= graph.nbytes
            self._release(graph, device)

    @staticmethod
    def _release(graph: _Graph, device: Device | None) -> None:
        if device is None:
            return
        try:
            device.graphs.release(graph.handle)
        except Exception as exc:
            log.warning("releasing a graph failed: %s", exc)
        for array in graph.owned:
            device.free(array)
        device.release_host(graph.host_in)
        device.release_host(graph.host_out)


def _data_bytes(plan: Plan, typed: ProgramPlan) -> int:
    """The bytes a run copies between host and device: its data inputs and fetched outputs."""
    slots = typed.slots
    return sum(slots[s].nbytes for s, op in enumerate(plan.operands)
               if op.source in ("data", "file")) + sum(slots[s].nbytes for s in typed.fetch)


def _host_view(host: Any, at: int, dtype: Any, count: int) -> np.ndarray:
    return host[at : at + count * dtype.itemsize].view(dtype)


def _used(typed: ProgramPlan, schedule: Sequence[StepPlan]) -> set[int]:
    """The slots a schedule reads or writes, and the outputs."""
    used: set[int] = set()
    for step in schedule:
        for op in step.ops:
            if op.kind in ("slot", "new", "copy"):
                used.add(op.slot)
            if op.kind == "copy":
                used.add(op.source)
        if step.out is not None:
            used.add(step.out)
    used.update(typed.outputs)
    return used


class _Run:
    """One run, or a batch of ``count`` runs laid end to end, of one checked program."""

    def __init__(self, runner: Runner, plans: Sequence[Plan], typed: ProgramPlan,
                 device: Device, host_of: HostOf, arrays: dict[int, Any] | None = None,
                 hosts: dict[int, np.ndarray] | None = None) -> None:
        self.runner, self.plans, self.typed = runner, plans, typed
        self.device, self.host_of = device, host_of
        self.hosts = hosts  # data inputs laid end to end already (a batch frame's)
        self.count = len(plans)
        self.fixed = arrays is not None  # a graph's: nothing is allocated or freed here
        self.arrays: dict[int, Any] = dict(arrays) if arrays is not None else {}
        self.temps: list[Any] = []

    def columns(self, schedule: Sequence[StepPlan]) -> list[np.ndarray]:
        """Run a batch that keeps nothing: each output of every run, as a column."""
        return self._run(schedule, self._columns)

    def results(self, schedule: Sequence[StepPlan]) -> list[Result]:
        return self._run(schedule, lambda: self.collect(copy_kept=False))

    def _run(self, schedule: Sequence[StepPlan], answer: Callable[[], _T]) -> _T:
        """Bind, queue every step and answer; this run's own arrays go back either way."""
        try:
            self._inputs()
            self.queue(schedule)
            return answer()
        finally:
            for array in self.temps:
                self.device.free(array)

    def _columns(self) -> list[np.ndarray]:
        typed, count = self.typed, self.count
        host = dict(zip(typed.fetch, self.device.stage_out(
            [self.arrays[s] for s in typed.fetch]), strict=True))
        return [host[s] if typed.slots[s].scalar else host[s].reshape(count, -1)
                for s in typed.outputs]

    def _inputs(self) -> None:
        """Bind the inputs: buffers and numbers as they are, data staged in at once (a
        batch's laid end to end)."""
        data: list[int] = []
        for slot, op in enumerate(self.plans[0].operands):
            if op.source == "buffer":
                self.arrays[slot] = self.runner.store.get(op.value)
            elif op.source == "value":
                self.arrays[slot] = op.value
            else:
                data.append(slot)
        if not data:
            return
        if self.hosts is not None:
            hosts = [self.hosts[s] for s in data]
        else:
            hosts = [self.host_of(self.plans[0].operands[s]) if self.count == 1 else
                     np.concatenate([self.host_of(p.operands[s]) for p in self.plans])
                     for s in data]
        arrays = self.device.stage_in(hosts)
        self.temps += arrays
        self.arrays.update(zip(data, arrays, strict=True))

    def queue(self, schedule: Sequence[StepPlan]) -> None:
        """Queue every step on the device, in order, with no wait."""
        for step in schedule:
            bound = [self._operand(op) for op in step.ops]
            out = self._array(step.out) if step.out is not None else None
            plan = step.plan
            if plan.user is not None and self.count > 1:
                plan, bound = _scaled(plan, bound, self.count)
            self.device.enqueue(plan, bound, out, self.count)

    def _operand(self, op: Op) -> Any:
        kind = op.kind
        if kind == "slot":
            value = self.arrays[op.slot]
            return DTYPES[op.cast].type(value) if op.cast is not None else value
        if kind == "value":
            return op.value
        array = self._array(op.slot)
        if kind == "copy":
            self.device.copy_into(array, self.arrays[op.source])
        elif op.zero:
            self.device.zero(array)
        return array

    def _array(self, slot: int) -> Any:
        """The array of result slot ``slot``: a graph's own, or a new one."""
        found = self.arrays.get(slot)
        if found is not None and (self.fixed or slot < len(self.plans[0].operands)):
            return found
        held = self.typed.slots[slot]
        size = self.count if held.scalar else held.elements * self.count
        array = self.device.alloc(DTYPES[held.type or "f32"], size, zero=False)
        self.temps.append(array)
        self.arrays[slot] = array
        return array

    def collect(self, *, copy_kept: bool) -> list[Result]:
        """Wait for the device, then each run's outputs: downloaded, or kept."""
        typed, arrays = self.typed, self.arrays
        fetch = typed.fetch_kept if self.plans[0].keep is not None else typed.fetch
        if fetch:  # the download waits for the device
            host = dict(zip(fetch, self.device.stage_out([arrays[s] for s in fetch]),
                            strict=True))
        else:
            self.device.synchronize()
            host = {}
        return self.answer(host, copy_kept=copy_kept)

    def answer(self, host: dict[int, Any], *, copy_kept: bool) -> list[Result]:
        """Each run's outputs, the fetched ones being ``host``'s: downloaded, or kept (a
        graph's arrays are its own: copied into new buffers)."""
        device = self.device
        typed = self.typed
        keeps = self.plans[0].keep is not None
        if self.count == 1 and not keeps:  # a lone run: every output downloaded
            slots = typed.slots
            return [Listed(tuple(float(host[s][0]) if slots[s].scalar else host[s]
                                 for s in typed.outputs))]
        kept: list[tuple[int, Any, str]] = []
        results: list[Result] = []
        for r, plan in enumerate(self.plans):
            ids = iter(plan.keep or ())
            items: list[Any] = []
            for slot in typed.outputs:
                held = typed.slots[slot]
                if held.scalar:
                    items.append(float(host[slot][r]))
                elif plan.keep is not None:
                    array = self._keepable(slot, copy_kept, kept)
                    buffer_id = next(ids)
                    kept.append((buffer_id, array, held.type or "f32"))
                    items.append(Kept(buffer_id, held.type or "f32", held.elements))
                else:
                    n = held.elements
                    items.append(host[slot][r * n : (r + 1) * n])
            results.append(Listed(tuple(items)))
        if copy_kept:
            device.synchronize()
        for buffer_id, array, etype in kept:
            self.temps = [a for a in self.temps if a is not array]
            self.runner.store.put(buffer_id, array, etype)
        return results

    def _keepable(self, slot: int, copy: bool, kept: list[tuple[int, Any, str]]) -> Any:
        """The array to keep for output ``slot``: its own, unless it is a graph's or kept
        already by this run (then a copy)."""
        array = self.arrays[slot]
        if not copy and all(a is not array for _, a, _ in kept):
            return array
        held = self.typed.slots[slot]
        fresh = self.device.alloc(DTYPES[held.type or "f32"], held.elements, zero=False)
        self.temps.append(fresh)
        self.device.copy_into(fresh, array)
        return fresh


def _scaled(plan: Plan, bound: list[Any], count: int) -> tuple[Plan, list[Any]]:
    """An elementwise kernel's launch over ``count`` runs laid end to end: its length (the
    last argument) and its grid times ``count``."""
    n = int(bound[-1]) * count
    blocks = max(1, -(-n // BLOCK))
    return replace(plan, geometry=((blocks, 1, 1), (BLOCK, 1, 1), 0)), [*bound[:-1], np.int64(n)]
