"""Templates of lone launch frames: a repeated launch read with a few slices.

A caller that launches the same kernel on operands of the same sizes, one job at a time,
sends frames that differ only in their JobId and their data. Once one such frame has been
decoded and checked (``protocol.decode``, ``kernels.parse``), its template keeps every
other byte; a later frame of the same length whose other bytes are equal is then that
launch with new data, and its request is the checked one with views of the new data. The
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

The checks also depend on the catalogue (the user kernels loaded): a worker whose catalogue
changes must ``clear`` its templates.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import numpy as np

from . import protocol
from .general import Held, Operand, Plan
from .kernels import Request

#: Templates kept at most; past it, the oldest goes (a caller with ever new shapes).
MAX_TEMPLATES = 32


@dataclass(frozen=True, slots=True)
class Template:
    header: tuple[tuple[int, int, bytes], ...]  # every byte but the JobId and the data
    vectors: tuple[tuple[int, int, np.dtype], ...]  # a's and b's offset, count, dtype
    # The checked request's other fields: kernel, m, n, k, elements, result_elements.
    kernel: str
    dims: tuple[int, int, int, int, int]

    def matches(self, frame: bytearray | memoryview) -> bool:
        return all(frame[start:end] == held for start, end, held in self.header)

    def fill(self, frame: bytearray | memoryview) -> Request:
        """The request of ``frame`` (which ``matches``): the checked one, with its data."""
        views = [np.frombuffer(frame, dtype, count, offset)
                 for offset, count, dtype in self.vectors]
        m, n, k, elements, result_elements = self.dims
        return Request(self.kernel, views[0], views[1] if len(views) > 1 else None, m, n, k,
                       elements, result_elements)


_ID = struct.Struct(">Q")


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
        for start, end, held in self.header:
            if frame[start:end] != held:
                return False
        return True

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
        # (positional: the fields of ``Plan`` in order)
        return Plan(plan.kernel, plan.action, operands, keep, plan.out_type,
                    plan.out_elements, plan.scalar, plan.user, plan.geometry, plan.results)


class Templates:
    """The templates of the lone frames seen, by frame length."""

    def __init__(self) -> None:
        self._by_size: dict[int, Template] = {}
        self._general: dict[int, GeneralTemplate] = {}

    def clear(self) -> None:
        self._by_size.clear()
        self._general.clear()

    def find_general(self, frame: bytearray | memoryview) -> GeneralTemplate | None:
        template = self._general.get(len(frame))
        return template if template is not None and template.matches(frame) else None

    def learn_general(self, frame: bytearray | memoryview, launch: protocol.Launch,
                      plan: Plan, held: Held) -> None:
        """Keep the template of ``frame``, a general launch (no trace, no shared memory, no
        vector data) decoded as ``launch`` and checked as ``plan`` against ``held``, the
        lane's buffers as they are now."""
        if launch.error is not None or launch.trace or launch.result_file:
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
        header, pos = [], 0
        for start, end in sorted(spans):
            if start > pos:
                header.append((pos, start, bytes(frame[pos:start])))
            pos = max(pos, end)
        if pos < len(frame):
            header.append((pos, len(frame), bytes(frame[pos:])))
        if len(self._general) >= MAX_TEMPLATES and len(frame) not in self._general:
            del self._general[next(iter(self._general))]
        self._general[len(frame)] = GeneralTemplate(
            tuple(header), handles, tuple(sigs), tuple(indices),  # type: ignore[arg-type]
            struct.Struct(f">{nkeep}Q") if nkeep else None, keep_at, plan)

    def find(self, frame: bytearray | memoryview) -> Template | None:
        template = self._by_size.get(len(frame))
        return template if template is not None and template.matches(frame) else None

    def learn(self, frame: bytearray | memoryview, launch: protocol.Launch,
              request: Request) -> None:
        """Keep the template of ``frame``, a plain launch (no trace, no shared memory)
        decoded as ``launch`` and checked as ``request``."""
        if launch.error is not None or launch.trace or launch.result_file:
            return  # never a template that would answer such a launch as a plain one
        layout = protocol.vector_spans(launch)
        if layout is None or layout[1] != len(frame):
            return
        spans, _ = layout
        values = [v for v in (request.a, request.b) if v is not None]
        if len(values) != len(spans) or not 1 <= len(spans) <= 2:
            return
        base = _address(np.frombuffer(frame, np.uint8))
        vectors = []
        for value, (start, end) in zip(values, spans, strict=True):
            # The request's a and b must be views of these very bytes (parse took them as
            # they were), else the template would not say what parse made of the frame.
            if _address(value) != base + start or value.nbytes != end - start:
                return
            vectors.append((start, value.size, value.dtype))
        # The header: what lies around the JobId and the data spans.
        header, pos = [], 0
        for start, end in [protocol.LAUNCH_JOB_ID, *spans]:
            if start > pos:
                header.append((pos, start, bytes(frame[pos:start])))
            pos = end
        if pos < len(frame):
            header.append((pos, len(frame), bytes(frame[pos:])))
        if len(self._by_size) >= MAX_TEMPLATES and len(frame) not in self._by_size:
            del self._by_size[next(iter(self._by_size))]
        self._by_size[len(frame)] = Template(
            tuple(header), tuple(vectors), request.kernel,
            (request.m, request.n, request.k, request.elements, request.result_elements))


def _address(array: np.ndarray) -> int:
    return int(array.__array_interface__["data"][0])
