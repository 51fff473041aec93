"""Templates of lone launch frames: a repeated launch read with a few slices.

A caller that launches the same kernel on operands of the same sizes, one job at a time,
sends frames that differ only in their JobId and their data. Once one such frame has been
decoded and checked (``protocol.decode``, ``kernels.parse``), its template keeps every
other byte; a later frame of the same length whose other bytes are equal is then that
launch with new data, and its request is the checked one with views of the new data. The
checks read only those other bytes, so they would say the same again: nothing is skipped
but their repetition. The worker's lone path learns the template of each plain lone frame
it decodes; a frame that matches none is decoded and checked as ever.

The checks also depend on the catalogue: a worker whose catalogue changes must ``clear``
its templates.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from . import protocol
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


class Templates:
    """The templates of the lone frames seen, by frame length."""

    def __init__(self) -> None:
        self._by_size: dict[int, Template] = {}

    def clear(self) -> None:
        self._by_size.clear()

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
