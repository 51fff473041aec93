"""The protocol's fast path: a batch frame whose launches differ only in JobIds and data.

Under load, Erlang's writer sends many callers' launches as one batch frame, and most often
they are the same kernel on operands of the same sizes. Such a frame is a table: every
launch is a row of the same length, whose header bytes are equal in every row. It is then
read as numpy arrays over the frame (the JobIds as one column, each vector operand as a
``count x n`` block), run as one batch and answered with one table of records, so a job
costs no Python of its own. Any other frame takes the general path (``protocol.decode_all``),
which answers the same.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

import numpy as np

from . import contract
from .protocol import LAUNCH_HEAD_SIZE, LAUNCH_JOB_ID, Launch, decode, vector_spans

_W = contract.WIRE
_U32 = struct.Struct(">I")
_BATCH_HEAD = 5  # the batch byte and Count
_SIZE = 4  # each launch's Size, before it
_JOB_ID_AT, _JOB_ID_END = LAUNCH_JOB_ID  # the JobId inside a launch

#: Fewer launches than this take the general path: the table costs more than it saves.
MIN_ROWS = 8


@dataclass(frozen=True, slots=True)
class Uniform:
    """A uniform batch frame, read: ``args`` are ``count x n`` arrays (vectors, views of the
    frame) and ints (dims), in the kernel's param order; ``first`` is the first launch as
    ``protocol.decode`` reads it, for the checks the worker makes of every launch."""

    job_ids: np.ndarray  # uint64, one per row
    device: int
    kernel: str
    args: list[Any]
    first: Launch

    @property
    def count(self) -> int:
        return int(self.job_ids.size)


def decode_uniform(frame: bytes | bytearray | memoryview) -> Uniform | None:
    """``frame`` read as a table, or ``None`` where it is not a uniform batch frame.

    The first launch is read by ``protocol.decode``, so whatever it refuses or flags (a
    malformed launch, a trace, a result file, a shared-memory operand) sends the frame down
    the general path.
    """
    size = len(frame)
    if size < _BATCH_HEAD + _SIZE or frame[0] != _W.batch:
        return None
    (count,) = _U32.unpack_from(frame, 1)
    if count < MIN_ROWS:
        return None
    (length,) = _U32.unpack_from(frame, _BATCH_HEAD)
    row = _SIZE + length
    if length <= LAUNCH_HEAD_SIZE or size - _BATCH_HEAD != count * row:
        return None
    first = decode(memoryview(frame)[_BATCH_HEAD + _SIZE : _BATCH_HEAD + row])
    if (not isinstance(first, Launch) or first.error is not None or first.trace
            or first.result_file):
        return None
    # Where each argument's data lies in a row, from the first launch's own layout.
    layout = vector_spans(first)
    if layout is None or _SIZE + layout[1] != row:
        return None  # a shared-memory operand, or a launch that is not what it says
    spans = [(_SIZE + start, _SIZE + end) for start, end in layout[0]]
    # np.frombuffer holds the frame's buffer while a view of it lives: the reader reuses a
    # large frame's buffer once nothing does. (np.ndarray(buffer=...) would not hold it.)
    table = np.frombuffer(frame, np.uint8, count * row, _BATCH_HEAD).reshape(count, row)
    header = np.ones(row, bool)
    header[_SIZE + _JOB_ID_AT : _SIZE + _JOB_ID_END] = False
    for start, end in spans:
        header[start:end] = False
    columns = np.flatnonzero(header)
    if not (table[:, columns] == table[0, columns]).all():
        return None
    job_ids = table[:, _SIZE + _JOB_ID_AT : _SIZE + _JOB_ID_END].view(">u8")[:, 0].astype(
        np.uint64)
    args: list[Any] = []
    spans_left = iter(spans)
    for arg in first.args:
        if isinstance(arg, np.ndarray):
            start, _ = next(spans_left)
            args.append(table[:, start : start + arg.nbytes].view(arg.dtype))
        else:
            args.append(arg)
    return Uniform(job_ids, first.device, first.kernel, args, first)


_RESULTS_HEAD = struct.Struct(">BI")


def encode_uniform(job_ids: np.ndarray, values: np.ndarray, max_frame: int) -> list[list[Any]]:
    """The results frames of a uniform batch: ``values`` is ``count x n`` f32 (vectors) or
    ``count`` floats (scalars, sent as f64), row ``i`` the result of ``job_ids[i]``. As many
    frames as ``max_frame`` needs; ``[]`` when one record alone would be over it (the caller
    then answers each job through ``protocol.encode_results``)."""
    count = int(job_ids.size)
    if values.ndim == 2:
        n = values.shape[1]
        if n == 0:
            return []
        data: tuple[Any, ...] = ("data", "<f4", (n,))
        tag, nbytes = _W.tag_vector, 4 * n
    else:
        data, tag, nbytes = ("data", "<f8"), _W.tag_scalar, 8
    dtype = np.dtype([("id", ">u8"), ("tag", "u1"), ("len", ">u4"), data])
    per_frame = (max_frame - _RESULTS_HEAD.size) // dtype.itemsize
    if per_frame < 1:
        return []
    records = np.empty(count, dtype)
    records["id"] = job_ids
    records["tag"] = tag
    records["len"] = nbytes
    records["data"] = values
    frames = []
    for start in range(0, count, per_frame):
        part = records[start : start + per_frame]
        frames.append([_RESULTS_HEAD.pack(_W.results, part.size), part.data.cast("B")])
    return frames
