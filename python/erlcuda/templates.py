"""The template cache in front of decode-and-check: a repeated launch read with a few slices.

A caller that launches the same kernel on operands of the same sizes, one job at a time,
sends frames that differ only in their JobId and their data. Once one such frame has been
decoded and checked (``protocol.decode``, ``general.check``), its template keeps every
other byte; a later frame of the same length whose other bytes are equal is then that
launch with new data, and its plan is the checked one with views of the new data. The
checks read only those other bytes, so they would say the same again: nothing is skipped
but their repetition. The worker's lone path learns the template of each plain lone frame
it decodes; a frame that matches none is decoded and checked as ever.

The same goes for a general launch (``general.py``) whose arguments are buffers, dims,
scalars or counts, as a chain of kernels on buffers sends them: frames that differ only in
their JobId and their buffer ids. Its template keeps the checked ``Plan`` and what the lane
held under the buffer ids it was checked with (each buffer's element type and length); a
later frame whose buffers are of the same types and lengths has that plan with its own ids.
The check reads nothing else, so it would say the same again. A frame whose buffers differ,
or are not held (``buffer_lost``), is checked as ever.

A launch whose operands and result are in Erlang's shared-memory slots (``slots.py``) sends
frames that differ only in their JobId and the slots' names (``s<N>``: a few slots taken in
turn). Its template keeps the checked plan's kernel and shape and each operand as it was
decoded; a later frame of the same length whose other bytes are equal names other slots of
the same sizes, whose mappings make the plan (``SlotTemplate``). Mapping them checks them as
before; the check of the launch itself read nothing that differs.

A batch frame whose launches are all one template's (the same kernel on operands of the
same sizes, as Erlang's writer sends many callers' launches under load) is a table: its
first launch is looked up here (decoded, checked and learned where it is new), and every
other row is checked against that template's bytes at once, with numpy (``table``). The
rows are then read as ``count x n`` blocks over the frame and run as one batch.

The checks also depend on the catalogue (the user kernels loaded): a worker whose catalogue
changes must ``clear`` its templates. A cache is used by one thread: the port's reader.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from . import contract, general, kernels, protocol
from .general import Held
from .hostmem import address
from .kernels import Operand, Plan, UniformPlans
from .shm import FileArg, ResultSlot

#: Templates kept at most; past it, the oldest goes (a caller with ever new shapes).
MAX_TEMPLATES = 32


#: Batch frames of fewer launches take the general path: a table costs more than it saves.
MIN_ROWS = 8

_BATCH_HEAD = 5  # the batch byte and Count
_SIZE = 4  # each launch's Size, before it
_U32 = struct.Struct(">I")
_JOB_ID_AT, _JOB_ID_END = protocol.LAUNCH_JOB_ID
#: flag_floats says only how a vector result is sent: launches that differ in it alone are
#: one template's (a caller of lists beside one of binaries), so a plain or slot template
#: keeps the other flags apart (``_flags``) and its header leaves the flags byte out.
_FLOATS = contract.WIRE.flag_floats
_NOT_FLOATS = 0xFF & ~_FLOATS
_FLAGS_SPAN = (protocol.LAUNCH_FLAGS, protocol.LAUNCH_FLAGS + 1)
_FLAGS_COLUMN = _SIZE + protocol.LAUNCH_FLAGS


@dataclass(frozen=True, slots=True)
class Template:
    header: tuple[tuple[int, int, bytes], ...]  # every byte but the JobId, flags and data
    flags: int  # the flags but flag_floats (``_flags``)
    vectors: tuple[tuple[int, int, np.dtype], ...]  # a's and b's offset, count, dtype
    # The checked plan's other fields: kernel, m, n, k, elements, out_elements, scalar.
    kernel: str
    dims: tuple[int, int, int, int, int]
    scalar: bool
    device: int
    # The header as columns of a batch frame's row (its Size, then the launch) and the
    # bytes each must hold, for ``rows``.
    columns: np.ndarray
    expected: np.ndarray

    def matches(self, frame: bytearray | memoryview) -> bool:
        return _matches(self.header, frame) and _flags(frame) == self.flags

    def fill(self, frame: bytearray | memoryview) -> Plan:
        """The plan of ``frame`` (which ``matches``): the checked one, with its data."""
        return _batched(self.kernel, [np.frombuffer(frame, dtype, count, offset)
                                      for offset, count, dtype in self.vectors],
                        self.dims, self.scalar)

    def rows(self, table: np.ndarray) -> UniformPlans | None:
        """The batch of ``table`` (a batch frame's rows, ``count x (Size + launch)``), where
        every row matches; else ``None``."""
        if not (table[:, self.columns] == self.expected).all() or not (
                table[:, _FLAGS_COLUMN] & _NOT_FLOATS == self.flags).all():
            return None
        blocks = [table[:, _SIZE + offset: _SIZE + offset + count * dtype.itemsize].view(dtype)
                  for offset, count, dtype in self.vectors]
        m, n, k, elements, out_elements = self.dims
        return UniformPlans(self.kernel, blocks[0], blocks[1] if len(blocks) > 1 else None,
                            m, n, k, int(table.shape[0]), elements, out_elements, self.scalar)


@dataclass(frozen=True, slots=True)
class SlotTemplate:
    header: tuple[tuple[int, int, bytes], ...]  # every byte but the JobId, flags, slot names
    flags: int  # the flags but flag_floats (``_flags``)
    names: tuple[tuple[int, int], ...]  # where each operand's slot name lies
    files: tuple[FileArg, ...]  # each operand as decoded (its size, type, part size)
    result: tuple[int, int, int] | None  # the result slot's name span and part size
    kernel: str
    dims: tuple[int, int, int, int, int]
    scalar: bool
    # The last frame's slot names and what ``fill`` made of them: a lone caller's jobs name
    # the same slots one after another, and its lane knows them again by identity.
    last: list[tuple[tuple[bytes, ...], tuple[FileArg, ...], ResultSlot | None]] = field(
        default_factory=list, compare=False, repr=False)

    def matches(self, frame: bytearray | memoryview) -> bool:
        return _matches(self.header, frame) and _flags(frame) == self.flags

    def fill(self, frame: bytearray | memoryview
             ) -> tuple[tuple[FileArg, ...], ResultSlot | None] | None:
        """The operands (``FileArg``) and result slot ``frame`` (which ``matches``) names,
        the very objects of the last frame where it named the same slots; ``None`` where a
        name is not UTF-8 (the decoder says why)."""
        names = tuple(bytes(frame[start:end]) for start, end in self.names)
        if self.result is not None:
            names += (bytes(frame[self.result[0]:self.result[1]]),)
        last = self.last
        if last and last[0][0] == names:
            return last[0][1], last[0][2]
        try:
            files = tuple(FileArg(name.decode("utf-8"), f.dtype, f.nbytes, f.part_bytes)
                          for name, f in zip(names[: len(self.files)], self.files,
                                             strict=True))
        except UnicodeDecodeError:
            return None
        result = None
        if self.result is not None:
            result = ResultSlot(names[-1].decode("latin-1"), self.result[2])
        last[:] = [(names, files, result)]
        return files, result

    def plan(self, arrays: list[np.ndarray]) -> Plan:
        """The checked plan on ``arrays``, the operands ``fill`` named, mapped."""
        return _batched(self.kernel, arrays, self.dims, self.scalar)


@dataclass(frozen=True, slots=True)
class Table:
    """A batch frame read as one template's rows: row ``i`` of ``batch`` is the job
    ``job_ids[i]`` on ``device``."""

    device: int
    job_ids: np.ndarray
    batch: UniformPlans
    floats: np.ndarray  # for each row, whether its launch has flag_floats


_ID = struct.Struct(">Q")


@dataclass(frozen=True, slots=True)
class ProgramTable:
    """A batch frame read as one program template's runs: run ``i`` of ``rows`` is the job
    ``job_ids[i]`` on ``device``."""

    device: int
    job_ids: np.ndarray
    rows: ProgramRows


@dataclass(frozen=True, slots=True)
class GeneralTemplate:
    header: tuple[tuple[int, int, bytes], ...]  # every byte but the JobId and buffer ids
    handles: tuple[int, ...]  # where each handle argument's BufferId lies
    held: tuple[tuple[str, int], ...]  # the type and length the lane held under each
    operands: tuple[int, ...]  # the plan's operand of each handle argument
    keep: struct.Struct | None  # the kept ids, where flag_keep is set
    keep_at: int
    plan: Plan

    def matches(self, frame: bytearray | memoryview) -> bool:
        return _matches(self.header, frame)

    def fill(self, frame: bytearray | memoryview, held: Held) -> Plan | None:
        """The plan of ``frame`` (which ``matches``): the checked one with the frame's
        buffer ids, where the lane holds buffers of the same types and lengths under them;
        else ``None``, and the frame is checked as ever."""
        plan = self.plan
        operands = list(plan.operands)
        unpack = _ID.unpack_from
        for at, want, index in zip(self.handles, self.held, self.operands, strict=True):
            buffer_id = unpack(frame, at)[0]
            if held(buffer_id) != want:
                return None
            op = operands[index]
            operands[index] = Operand("buffer", buffer_id, op.type, op.elements, op.result)
        keep = plan.keep
        if self.keep is not None:
            keep = self.keep.unpack_from(frame, self.keep_at)
            if len(keep) > 1 and len(set(keep)) != len(keep):
                return None  # a malformed frame: its error comes from the decoder
        # (positional: the fields of ``Plan`` in order, those of a batched plan left out)
        return Plan(plan.kernel, plan.action, operands, keep, plan.out_type,
                    plan.out_elements, plan.scalar, plan.user, plan.geometry, plan.results,
                    elements=plan.elements, program=plan.program)


@dataclass(frozen=True, slots=True)
class LaunchForm:
    """A program that is one launch (``ProgramPlan.launch``) as that launch's batched plan:
    the plan's other fields (as ``Template``'s), and the data operands that are its
    vectors, in param order."""

    kernel: str
    vectors: tuple[int, ...]  # indexes into ProgramTemplate.data
    dims: tuple[int, int, int, int, int]  # m, n, k, elements, out_elements
    scalar: bool


@dataclass(frozen=True, slots=True)
class ProgramTemplate:
    """A program launch on data and numbers (no buffers, nothing kept): the frames of its
    runs on inputs of the same shapes differ only in their JobId and their data. A program
    that is one launch is filled as that launch's plan (``launch``), whose result the lane
    answers as the program's one output."""

    header: tuple[tuple[int, int, bytes], ...]  # every byte but the JobId and the data
    data: tuple[tuple[int, int, int, np.dtype], ...]  # operand, offset, count, dtype
    plan: Plan
    device: int
    columns: np.ndarray
    expected: np.ndarray
    launch: LaunchForm | None = None

    def matches(self, frame: bytearray | memoryview) -> bool:
        return _matches(self.header, frame)

    def fill(self, frame: bytearray | memoryview) -> Plan:
        """The plan of ``frame`` (which ``matches``): the checked one, with its data; the
        launch's batched plan where the program is one launch."""
        form = self.launch
        if form is not None:
            return _batched(form.kernel, [np.frombuffer(frame, dtype, count, offset)
                                          for _, offset, count, dtype in (
                                              self.data[i] for i in form.vectors)],
                            form.dims, form.scalar)
        plan = self.plan
        operands = list(plan.operands)
        for index, offset, count, dtype in self.data:
            op = operands[index]
            operands[index] = Operand("data", np.frombuffer(frame, dtype, count, offset),
                                      op.type, op.elements)
        return Plan(plan.kernel, "program", operands, elements=plan.elements,
                    program=plan.program)

    def rows(self, table: np.ndarray) -> ProgramRows | None:
        """The runs of ``table`` (a batch frame's rows), where every row matches: each data
        input as a ``count x n`` block; else ``None``."""
        if not (table[:, self.columns] == self.expected).all():
            return None
        blocks = {index: table[:, _SIZE + offset: _SIZE + offset + count * dtype.itemsize]
                  .view(dtype) for index, offset, count, dtype in self.data}
        return ProgramRows(self.plan, blocks, int(table.shape[0]))


@dataclass(frozen=True, slots=True)
class ProgramRows:
    """A batch frame's runs of one program template: ``count`` runs of ``plan``, data input
    ``i`` of run ``r`` being row ``r`` of ``blocks[i]``."""

    plan: Plan
    blocks: dict[int, np.ndarray]
    count: int

    @property
    def elements(self) -> int:
        return self.plan.elements

    def rows(self, start: int, end: int) -> ProgramRows:
        return ProgramRows(self.plan, {i: b[start:end] for i, b in self.blocks.items()},
                           end - start)


class Templates:
    """The templates of the lone frames seen, by frame length. ``registry`` holds the user
    kernels a batch frame's first launch is checked against."""

    def __init__(self, registry: general.Registry | None = None) -> None:
        self._by_size: dict[int, Template] = {}
        self._general: dict[int, GeneralTemplate] = {}
        self._programs: dict[int, ProgramTemplate] = {}
        self._slots: dict[int, SlotTemplate] = {}
        self._registry = registry if registry is not None else general.Registry()

    def clear(self) -> None:
        self._by_size.clear()
        self._general.clear()
        self._programs.clear()
        self._slots.clear()

    def find_slots(self, frame: bytearray | memoryview) -> SlotTemplate | None:
        template = self._slots.get(len(frame))
        return template if template is not None and template.matches(frame) else None

    def learn_slots(self, frame: bytearray | memoryview, launch: protocol.Launch,
                    files: list[Any], plan: Plan) -> None:
        """Keep the template of ``frame``, a launch (no trace) decoded as ``launch`` with the
        arguments ``files`` (operands in shared memory, dims) and checked as ``plan`` on
        their mappings (``launch.args`` now)."""
        if launch.error is not None or launch.trace or plan.action != "batched":
            return
        layout = protocol.slot_name_spans(launch, files)
        if layout is None or layout[2] != len(frame):
            return
        names, result, _ = layout
        operands = [f for f in files if type(f) is FileArg]
        mapped = [a for a, f in zip(launch.args, files, strict=True) if type(f) is FileArg]
        values = [v for v in (plan.a, plan.b) if v is not None]
        # The plan's a and b must be the operands' mappings, in order, else the template
        # would not say what the check made of the frame.
        if not operands or len(values) != len(mapped) or any(
                address(v) != address(m) or v.nbytes != m.nbytes or v.dtype != m.dtype
                for v, m in zip(values, mapped, strict=True)):
            return
        spans = [protocol.LAUNCH_JOB_ID, _FLAGS_SPAN, *names, *([result] if result else [])]
        header = _header(frame, spans)
        _make_room(self._slots, len(frame))
        slot = launch.result_file
        self._slots[len(frame)] = SlotTemplate(
            tuple(header), _flags(frame), tuple(names), tuple(operands),
            None if result is None or slot is None else (*result, slot.part_bytes),
            plan.kernel, (plan.m, plan.n, plan.k, plan.elements, plan.out_elements),
            plan.scalar)

    def find_program(self, frame: bytearray | memoryview) -> ProgramTemplate | None:
        template = self._programs.get(len(frame))
        return template if template is not None and template.matches(frame) else None

    def learn_program(self, frame: bytearray | memoryview, launch: protocol.Launch,
                      plan: Plan) -> None:
        """Keep the template of ``frame``, a program launch on data and numbers alone (no
        trace, no shared memory) decoded as ``launch`` and checked as ``plan``."""
        if launch.error is not None or launch.trace or launch.result_file or (
                plan.program is None or plan.key is None):
            return
        layout = protocol.program_data_spans(launch)
        if layout is None or layout[1] != len(frame):
            return
        spans, _ = layout
        data = []
        base = address(np.frombuffer(frame, np.uint8))
        for index, (start, end) in spans:
            value = plan.operands[index].value
            if address(value) != base + start or value.nbytes != end - start:
                return  # the plan's data must be views of these very bytes
            data.append((index, start, value.size, value.dtype))
        header = _header(frame, [protocol.LAUNCH_JOB_ID, *(span for _, span in spans)])
        _make_room(self._programs, len(frame))
        self._programs[len(frame)] = ProgramTemplate(
            tuple(header), tuple(data), plan, launch.device, *_columns(header, len(frame)),
            launch=_launch_form(plan, [index for index, *_ in data]))

    def find_general(self, frame: bytearray | memoryview) -> GeneralTemplate | None:
        template = self._general.get(len(frame))
        return template if template is not None and template.matches(frame) else None

    def learn_general(self, frame: bytearray | memoryview, launch: protocol.Launch,
                      plan: Plan, held: Held) -> None:
        """Keep the template of ``frame``, a general launch (no trace, no shared memory, no
        vector data) decoded as ``launch`` and checked as ``plan`` against ``held``, the
        lane's buffers as they are now."""
        if launch.error is not None or launch.trace or launch.result_file or plan.key:
            return
        layout = protocol.buffer_id_spans(launch)
        if layout is None or layout[2] != len(frame) or plan.keep != launch.keep:
            return
        handles, keep_at, _ = layout
        indices = [i for i, arg in enumerate(launch.args) if type(arg) is protocol.Handle]
        ids = [launch.args[i].buffer_id for i in indices]
        # The plan's buffers are the handle arguments', each its argument's operand.
        if sum(op.source == "buffer" for op in plan.operands) != len(ids) or any(
                i >= len(plan.operands) or plan.operands[i].source != "buffer"
                or plan.operands[i].value != buffer_id
                for i, buffer_id in zip(indices, ids, strict=True)):
            return
        sigs = [held(buffer_id) for buffer_id in ids]
        if any(sig is None for sig in sigs):
            return
        nkeep = 0 if launch.keep is None else len(launch.keep)
        spans = [protocol.LAUNCH_JOB_ID, *((at, at + _ID.size) for at in handles)]
        if nkeep:
            spans.append((keep_at, keep_at + _ID.size * nkeep))
        header = _header(frame, spans)
        _make_room(self._general, len(frame))
        self._general[len(frame)] = GeneralTemplate(
            tuple(header), handles, tuple(sigs), tuple(indices),  # type: ignore[arg-type]
            struct.Struct(f">{nkeep}Q") if nkeep else None, keep_at, plan)

    def table(self, frame: bytes | bytearray | memoryview) -> Table | ProgramTable | None:
        """``frame`` read as a table (see the module doc), or ``None`` where it is not a
        batch frame of one template's launches; those take the general path, which answers
        whatever this one would refuse."""
        size = len(frame)
        if size < _BATCH_HEAD + _SIZE or frame[0] != contract.WIRE.batch:
            return None
        (count,) = _U32.unpack_from(frame, 1)
        if count < MIN_ROWS:
            return None
        (length,) = _U32.unpack_from(frame, _BATCH_HEAD)
        row = _SIZE + length
        if length <= protocol.LAUNCH_HEAD_SIZE or size - _BATCH_HEAD != count * row:
            return None
        first = memoryview(frame)[_BATCH_HEAD + _SIZE: _BATCH_HEAD + row]
        template: Template | ProgramTemplate | None = (
            self.find(first) or self.find_program(first) or self._learn_first(first))
        if template is None:
            return None
        # np.frombuffer holds the frame's buffer while a view of it lives: the reader reuses
        # a large frame's buffer once nothing does. (np.ndarray(buffer=...) would not.)
        rows = np.frombuffer(frame, np.uint8, count * row, _BATCH_HEAD).reshape(count, row)
        batch = template.rows(rows)
        if batch is None:
            return None
        job_ids = rows[:, _SIZE + _JOB_ID_AT: _SIZE + _JOB_ID_END].view(">u8")[:, 0]
        if type(batch) is ProgramRows:
            return ProgramTable(template.device, job_ids.astype(np.uint64), batch)
        floats = rows[:, _FLAGS_COLUMN] & _FLOATS != 0
        return Table(template.device, job_ids.astype(np.uint64), batch,  # type: ignore[arg-type]
                     floats)

    def _learn_first(self, frame: memoryview) -> Template | ProgramTemplate | None:
        """The template of a batch frame's first launch, decoded and checked here; ``None``
        where it is not a plain launch of a batched kernel, or of a program on data, that
        checks."""
        launch = protocol.decode(frame)
        if type(launch) is not protocol.Launch or launch.error is not None or (
                general.route(launch, self._registry) != "batched"):
            return None
        try:
            plan = general.check(launch, self._registry)
        except general.Refused:
            return None
        if plan.program is not None:
            self.learn_program(frame, launch, plan)
            return self.find_program(frame)
        self.learn(frame, launch, plan)
        return self.find(frame)

    def find(self, frame: bytearray | memoryview) -> Template | None:
        template = self._by_size.get(len(frame))
        return template if template is not None and template.matches(frame) else None

    def learn(self, frame: bytearray | memoryview, launch: protocol.Launch,
              plan: Plan) -> None:
        """Keep the template of ``frame``, a plain launch (no trace, no shared memory)
        decoded as ``launch`` and checked as ``plan``, a batched one."""
        if launch.error is not None or launch.trace or launch.result_file or (
                plan.action != "batched"):
            return  # never a template that would answer such a launch as a plain one
        layout = protocol.vector_spans(launch)
        if layout is None or layout[1] != len(frame):
            return
        spans, _ = layout
        values = [v for v in (plan.a, plan.b) if v is not None]
        if len(values) != len(spans) or not 1 <= len(spans) <= 2:
            return
        base = address(np.frombuffer(frame, np.uint8))
        vectors = []
        for value, (start, end) in zip(values, spans, strict=True):
            # The plan's a and b must be views of these very bytes (the check took them as
            # they were), else the template would not say what the check made of the frame.
            if address(value) != base + start or value.nbytes != end - start:
                return
            vectors.append((start, value.size, value.dtype))
        # The header: what lies around the JobId and the data spans.
        header = _header(frame, [protocol.LAUNCH_JOB_ID, _FLAGS_SPAN, *spans])
        _make_room(self._by_size, len(frame))
        self._by_size[len(frame)] = Template(
            tuple(header), _flags(frame), tuple(vectors), plan.kernel,
            (plan.m, plan.n, plan.k, plan.elements, plan.out_elements), plan.scalar,
            launch.device, *_columns(header, len(frame)))


def _launch_form(plan: Plan, data: list[int]) -> LaunchForm | None:
    """``ProgramTemplate.launch`` of ``plan``, whose data operands are ``data`` in the
    template's order; ``None`` where the program is more than one launch."""
    typed = plan.program.plan if plan.program is not None else None
    if typed is None or typed.launch is None:
        return None
    kernel = typed.definition.steps[0].kernel
    args = [plan.operands[a[1]].value if isinstance(a, tuple) else a for a in typed.launch]
    try:
        first = kernels.parse(kernel, args)
        vectors = tuple(data.index(a[1]) for a in typed.launch
                        if isinstance(a, tuple) and typed.slots[a[1]].vector)
    except (kernels.BadArgs, ValueError):  # a vector that is no data of the frame
        return None
    return LaunchForm(kernel, vectors,
                      (first.m, first.n, first.k, first.elements, first.out_elements),
                      first.scalar)


def _batched(kernel: str, views: list[np.ndarray], dims: tuple[int, int, int, int, int],
             scalar: bool) -> Plan:
    """A batched plan of a frame's vectors (``a``, then ``b`` where there is one) and a
    checked plan's other fields: what a template fills."""
    m, n, k, elements, out_elements = dims
    # (positional: the fields of ``Plan`` in order)
    return Plan(kernel, "batched", (), None, "f32", out_elements, scalar, None, None, (),
                views[0], views[1] if len(views) > 1 else None, m, n, k, elements)


def _columns(header: list[tuple[int, int, bytes]], length: int) -> tuple[np.ndarray, np.ndarray]:
    """A batch row's header columns (its Size, then ``header``'s spans of the launch) and
    the bytes they hold."""
    columns = [np.arange(_SIZE), *(np.arange(_SIZE + start, _SIZE + end)
                                   for start, end, _ in header)]
    expected = [np.frombuffer(_U32.pack(length), np.uint8),
                *(np.frombuffer(held, np.uint8) for _, _, held in header)]
    return np.concatenate(columns), np.concatenate(expected)


def _header(frame: bytearray | memoryview, spans: Iterable[tuple[int, int]]
            ) -> list[tuple[int, int, bytes]]:
    """The bytes of ``frame`` around ``spans`` (the JobId and what a template reads): each
    run as ``(start, end, bytes)``."""
    header: list[tuple[int, int, bytes]] = []
    pos = 0
    for start, end in sorted(spans):
        if start > pos:
            header.append((pos, start, bytes(frame[pos:start])))
        pos = max(pos, end)
    if pos < len(frame):
        header.append((pos, len(frame), bytes(frame[pos:])))
    return header


def _make_room(cache: dict[int, Any], length: int) -> None:
    """Drop the oldest template where ``cache`` is full and has none of ``length``."""
    if len(cache) >= MAX_TEMPLATES and length not in cache:
        del cache[next(iter(cache))]


def _flags(frame: bytearray | memoryview) -> int:
    """A launch frame's flags but flag_floats."""
    return frame[protocol.LAUNCH_FLAGS] & _NOT_FLOATS


def _matches(header: tuple[tuple[int, int, bytes], ...], frame: bytearray | memoryview) -> bool:
    """Whether ``frame`` holds a template's header bytes where it holds them."""
    return all(frame[start:end] == held for start, end, held in header)


