"""erlcuda's messages: the one place that turns them into bytes and back (protocol 9).

The hot path travels in fixed-layout binary frames (``contract.WIRE``; big-endian integers),
everything else as one ETF term in erlport's shapes (first byte 131).

Erlang -> worker (``decode``):
    launch frame:  WIRE.launch, JobId:u64, Device:u16, Flags:u8, KernelLen:u8, Kernel (UTF-8),
                   NArgs:u8, then per argument WIRE.arg_vector, ElemType:u8, Bytes:u64 and the
                   bytes (little-endian elements), or WIRE.arg_dim, Value:u64, or
                   WIRE.arg_file, ElemType:u8, Bytes:u64, PartBytes:u64, NameLen:u8, Name
                   (a vector in the worker's shared-memory folder, in the part files
                   Name.0, Name.1, ... of PartBytes bytes each, ``shm.FileArg``), or
                   WIRE.arg_handle, BufferId:u64 (``Handle``), or WIRE.arg_scalar,
                   ElemType:u8 and 8 bytes of value, little-endian and zero-padded
                   (``Scalar``), or WIRE.arg_empty, ElemType:u8, Elements:u64 (``Empty``);
                   then, with flag_keep, NKeep:u8 and NKeep BufferId:u64, and with
                   flag_geometry, Grid:3xu32, Block:3xu32, SharedBytes:u32  ``Launch``
    {'C', Id, erlcuda, Function, Args}                          a control call   ``Call``
Worker -> Erlang:
    results frame: WIRE.results, Count:u32, then per job JobId:u64, Tag:u8, Len:u32 and the
                   payload: raw f32 (tag_vector), an f64 (tag_scalar), the ETF of the reason
                   (tag_error), Bytes:u64 and PartBytes:u64 (tag_file: the vector is in
                   the result slot its launch named), Type:u8 and raw elements
                   of that type (tag_typed: a vector of another type than f32),
                   BufferId:u64, Type:u8, Elements:u64 (tag_handle: a vector kept on the
                   device, ``Kept``), Count:u32 and per item Tag:u8, Len:u32, payload
                   (tag_list: a user kernel's vectors, ``Listed``), the ETF of a list
                   of floats (tag_floats: an f32 vector for a launch with flag_floats,
                   ``Floats``),
                   or an inner Tag:u8, Len:u32, payload and the ETF of the stamps map
                   (tag_traced)                                            ``encode_results``
    {'r', Id, Answer}                                  a call's answer     ``encode_answer``
    {'e', Id, Text}                                    a call refused      ``encode_call_error``
    {'L', Level, Text}                                 a log line          ``encode_log``

A job's result is its value (a vector as a numpy array, a scalar as a float, a kept vector
as ``Kept``, a user kernel's vectors as ``Listed``) or a ``Failure`` (``{error, Reason}`` on
the Erlang side). Vectors travel as raw little-endian elements (f32 as tag_vector, any
other element type as tag_typed) and scalars as f64, infinities and NaN included: Erlang
converts them and refuses what its floats cannot hold (``non_finite``). hello's and info's
Answer is a map (``encode_info``).

No ``ReplyTo`` travels: Erlang keeps it by JobId. Erlang decodes ETF with
``binary_to_term(B, [safe])``, which refuses atoms the node does not know, so every atom the
worker makes goes through ``atom``, which accepts only the contract's (``contract.ATOMS``,
which ``erlcuda_contract:worker_atoms/0`` makes exist); any other atom in a term is one
Erlang sent. Text travels as UTF-8 binaries.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from . import contract, etf
from .kernels import DTYPES
from .shm import FileArg, FileResult, ResultSlot

__all__ = [
    "OK",
    "TOO_LARGE",
    "Call",
    "Empty",
    "Encoded",
    "Failure",
    "Floats",
    "Handle",
    "Kept",
    "Launch",
    "Listed",
    "ProtocolError",
    "Record",
    "Result",
    "Scalar",
    "atom",
    "backend_unavailable",
    "bad_args",
    "bad_device",
    "bad_program",
    "buffer_lost",
    "compile_error",
    "cuda_error",
    "decode",
    "decode_all",
    "encode_answer",
    "encode_call_error",
    "encode_info",
    "encode_log",
    "encode_results",
    "internal",
    "step_failure",
    "unknown_kernel",
    "version_mismatch",
]

Chunks = list[bytes | bytearray | memoryview]


class ProtocolError(Exception):
    """A frame that is not an erlcuda message, or a term the worker must not send."""


_ATOMS = {name: etf.Atom(name) for name in contract.ATOMS}


def atom(name: str) -> etf.Atom:
    """The atom ``name``, which must be in the contract: Erlang knows no other."""
    try:
        return _ATOMS[name]
    except KeyError:
        raise ProtocolError(f"atom {name!r} is not in contract.json: Erlang would refuse "
                            "the frame") from None


OK = atom("ok")
_CALL = atom("C")
_ANSWER = atom("r")
_CALL_ERROR = atom("e")
_LOG = atom("L")

_W = contract.WIRE

# -- Erlang -> worker ------------------------------------------------------------------------


class Handle(NamedTuple):
    """A buffer argument: the id of a vector kept on the launch's device."""

    buffer_id: int


class Scalar(NamedTuple):
    """A scalar argument of element type ``type``; ``value`` is a numpy scalar of it."""

    type: str
    value: np.generic


class Empty(NamedTuple):
    """An argument the worker makes: ``elements`` zeroed elements of ``type``."""

    type: str
    elements: int


#: A launch's shape for a user kernel: grid (x, y, z), block (x, y, z), shared bytes.
Geometry = tuple[tuple[int, int, int], tuple[int, int, int], int]


@dataclass(slots=True, eq=False)
class Launch:
    """A job, as the frame says: the worker checks ``device``, ``kernel`` and ``args``.

    ``args`` are numpy arrays viewing the frame's bytes (a vector, of its element type),
    ints (a dim), ``shm.FileArg``, ``Handle``, ``Scalar`` and ``Empty``. ``error`` is set
    for a malformed frame whose JobId could be read: the job is answered
    ``{bad_args, error}``; what the frame could not say is then ``device`` -1, ``kernel``
    ``""`` and ``args`` empty. ``general`` says the frame itself needs the general path
    (flag_keep or flag_geometry, a handle, scalar or empty argument, a vector that is not
    f32); a kernel outside the batched catalogue needs it too (``general.route`` decides).
    """

    job_id: int
    device: int
    kernel: str
    args: list[Any]
    trace: bool = False  # flag_trace: the reply carries the worker's time stamps
    error: str | None = None
    result_file: ResultSlot | None = None  # flag_result_file: the slot a vector result goes to
    keep: tuple[int, ...] | None = None  # flag_keep: the ids the vector results stay under
    geometry: Geometry | None = None  # flag_geometry
    general: bool = False
    program: bytes | None = None  # flag_program: the definition's ETF (``programs``)
    floats: bool = False  # flag_floats: an f32 vector result goes as tag_floats


@dataclass(frozen=True, slots=True)
class Call:
    """A control call; ``function`` is the atom's name (an unknown one for other terms)."""

    call_id: Any
    function: str
    args: list[Any]


Message = Launch | Call

# Launch byte, JobId, Device, Flags, KernelLen: the fixed part, in one unpack.
_LAUNCH_HEAD = struct.Struct(">BQHBB")
_HEAD_SIZE = _LAUNCH_HEAD.size
_JOB_ID = struct.Struct(">Q")
_DEVICE = struct.Struct(">H")
#: Where a launch frame's JobId lies, and its Flags byte (the fixed part above).
LAUNCH_JOB_ID = (1, 1 + _JOB_ID.size)
LAUNCH_FLAGS = LAUNCH_JOB_ID[1] + _DEVICE.size
#: The fixed part's size: a launch frame is longer (its kernel name and NArgs follow).
LAUNCH_HEAD_SIZE = _HEAD_SIZE


def launch_job_id(frame: bytes | bytearray | memoryview) -> int:
    """The JobId of a launch frame at least ``LAUNCH_HEAD_SIZE`` long."""
    return int(_JOB_ID.unpack_from(frame, LAUNCH_JOB_ID[0])[0])
# After the argument's kind byte: ElemType and Bytes of a vector; Value of a dim.
_VECTOR_HEAD = struct.Struct(">BQ")
_FILE_HEAD = struct.Struct(">BQQ")  # ElemType, Bytes, PartBytes
_DIM = struct.Struct(">Q")
_GEOMETRY = struct.Struct(">7I")  # Grid x, y, z, Block x, y, z, SharedBytes

_W_LAUNCH = _W.launch
_W_BATCH = _W.batch
_U32 = struct.Struct(">I")
_RESULT_SLOT = struct.Struct(">QB")  # a result slot's PartBytes and NameLen
# The argument kinds and launch flags, as module constants for the decoder's loop.
(_W_VECTOR, _W_DIM, _W_FILE, _W_HANDLE, _W_SCALAR, _W_EMPTY) = (
    _W.arg_vector, _W.arg_dim, _W.arg_file, _W.arg_handle, _W.arg_scalar, _W.arg_empty)
(_W_TRACE, _W_RESULT_FILE, _W_KEEP, _W_GEOMETRY, _W_PROGRAM, _W_FLOATS) = (
    _W.flag_trace, _W.flag_result_file, _W.flag_keep, _W.flag_geometry, _W.flag_program,
    _W.flag_floats)
_ETF = etf.VERSION

#: numpy dtypes of the wire's element types, by index (a contract type without one fails
#: here, at import).
_ELEMENT_DTYPES: tuple[np.dtype[Any], ...] = tuple(DTYPES[t] for t in contract.ELEMENT_TYPES)
_ELEMENT_SIZES: tuple[int, ...] = tuple(d.itemsize for d in _ELEMENT_DTYPES)
_N_TYPES = len(_ELEMENT_DTYPES)

# The catalogue's names as their UTF-8 bytes, to skip decoding the known ones.
_KERNEL_NAMES = {name.encode(): name for name in contract.KERNELS}


def decode(frame: bytes | bytearray | memoryview) -> Message:
    """The message in ``frame``: a ``Launch`` for a launch frame, a ``Call`` for an ETF one.

    A malformed launch frame whose JobId can be read is a ``Launch`` with ``error`` set; any
    other frame that is not an erlcuda message raises ``ProtocolError``. A launch's vectors
    are views into ``frame`` (never copied, possibly unaligned), so what a launch costs is
    bounded by the frame's size; an ETF frame is bounded by ``etf.decode``'s cost model.
    """
    if not frame:
        raise ProtocolError("empty frame")
    first = frame[0]
    if first == _W_LAUNCH:
        return _decode_launch(frame)
    if first == _ETF:
        return _decode_call(frame)
    raise ProtocolError(f"a frame of {len(frame)} bytes starting with byte {first} is neither "
                        "a launch nor an external term")


def decode_all(frame: bytes | bytearray | memoryview) -> tuple[list[Message], list[str]]:
    """The messages in ``frame`` (a batch frame's launches in order, else
    ``[decode(frame)]``) and what was wrong with the frame, for the log.

    A launch inside a batch that is no launch at all is skipped; a batch whose framing breaks
    off keeps the launches before the break (its writer, Erlang, would have a bug).
    """
    if not frame or frame[0] != _W_BATCH:
        return [decode(frame)], []
    view = memoryview(frame)
    size = len(view)
    if size < 5:
        raise ProtocolError(f"a batch frame of {size} bytes has no count")
    (count,) = _U32.unpack_from(view, 1)
    messages: list[Message] = []
    problems: list[str] = []
    pos = 5
    for i in range(1, count + 1):
        if pos + 4 > size:
            problems.append(f"batch frame: ends before launch {i} of {count}")
            break
        (n,) = _U32.unpack_from(view, pos)
        pos += 4
        if n > size - pos:
            problems.append(f"batch frame: launch {i} of {count} announces {n} bytes, "
                            f"{size - pos} left")
            break
        try:
            messages.append(decode(view[pos : pos + n]))
        except ProtocolError as exc:
            problems.append(f"batch frame: launch {i} of {count} dropped: {exc}")
        pos += n
    else:
        if pos != size:
            problems.append(f"batch frame: {size - pos} bytes after its {count} launches")
    return messages, problems


class _Malformed(Exception):
    """A launch frame that is not what it says; ``str()`` is the reason sent back."""


def _decode_launch(frame: bytes | bytearray | memoryview) -> Launch:
    size = len(frame)
    if size < _HEAD_SIZE:
        return _truncated_head(frame, size)
    _, job_id, device, flags, klen = _LAUNCH_HEAD.unpack_from(frame)
    trace = flags & _W_TRACE != 0
    pos = _HEAD_SIZE + klen
    if pos >= size:  # the name, then NArgs
        return Launch(job_id, device, "", [], trace,
                      f"launch of {size} bytes ends inside its kernel name or before NArgs")
    raw = bytes(frame[_HEAD_SIZE:pos])
    kernel = _KERNEL_NAMES.get(raw)
    if kernel is None:
        try:
            kernel = raw.decode("utf-8")
        except UnicodeDecodeError:
            return Launch(job_id, device, "", [], trace, "the kernel name is not UTF-8")
    try:
        args, general, pos = _decode_args(frame, pos, size)
        keep, geometry, pos = _decode_tail(frame, pos, size, flags)
        program, pos = _decode_program(frame, pos, size, flags)
        result_file, pos = _decode_result_slot(frame, pos, size, flags)
    except _Malformed as exc:
        return Launch(job_id, device, kernel, [], trace, str(exc))
    if pos != size:
        return Launch(job_id, device, kernel, [], trace,
                      f"{size - pos} trailing bytes after the last argument")
    return Launch(job_id, device, kernel, args, trace,
                  result_file=result_file, keep=keep, geometry=geometry,
                  general=general or flags & (_W_KEEP | _W_GEOMETRY | _W_PROGRAM) != 0,
                  program=program, floats=flags & _W_FLOATS != 0)


def _decode_args(frame: bytes | bytearray | memoryview, pos: int,
                 size: int) -> tuple[list[Any], bool, int]:
    """NArgs and the arguments at ``pos``: them, whether one is for the general path only,
    and where they end."""
    nargs = frame[pos]
    pos += 1
    args: list[Any] = []
    general = False
    for i in range(1, nargs + 1):
        if pos >= size:
            raise _Malformed(f"launch of {size} bytes ends before argument {i} of {nargs}")
        decode = _ARGS.get(frame[pos])
        if decode is None:
            raise _Malformed(f"argument {i}: unknown kind byte {frame[pos]}")
        arg, pos, only_general = decode(frame, pos, size, i)
        args.append(arg)
        general = general or only_general
    return args, general, pos


def _etype(etype: int, i: int) -> int:
    if etype >= _N_TYPES:
        raise _Malformed(f"argument {i}: element type {etype} is not one of "
                         f"{list(contract.ELEMENT_TYPES)}")
    return etype


def _room(pos: int, need: int, size: int, i: int, what: str = "") -> None:
    if pos + need > size:
        raise _Malformed(f"launch of {size} bytes ends inside argument {i}{what}")


def _arg_vector(frame: Any, pos: int, size: int, i: int) -> tuple[Any, int, bool]:
    _room(pos, 10, size, i, "'s header")
    etype, nbytes = _VECTOR_HEAD.unpack_from(frame, pos + 1)
    pos += 10
    _etype(etype, i)
    if nbytes > size - pos:
        raise _Malformed(f"argument {i}: {nbytes} bytes announced, {size - pos} left in the "
                         "frame")
    itemsize = _ELEMENT_SIZES[etype]
    if nbytes % itemsize:
        raise _Malformed(f"argument {i}: {nbytes} bytes is not a whole number of "
                         f"{contract.ELEMENT_TYPES[etype]} elements")
    value = np.frombuffer(frame, _ELEMENT_DTYPES[etype], nbytes // itemsize, pos)
    return value, pos + nbytes, etype != 0


def _arg_file(frame: Any, pos: int, size: int, i: int) -> tuple[Any, int, bool]:
    _room(pos, 19, size, i, "'s header")
    etype, nbytes, part = _FILE_HEAD.unpack_from(frame, pos + 1)
    nlen = frame[pos + 18]
    pos += 19
    if etype >= _N_TYPES or nbytes % _ELEMENT_SIZES[etype] or nlen > size - pos or part == 0:
        raise _Malformed(f"argument {i}: a malformed shared-memory argument")
    try:
        name = bytes(frame[pos : pos + nlen]).decode("utf-8")
    except UnicodeDecodeError:
        raise _Malformed(f"argument {i}: the file name is not UTF-8") from None
    return FileArg(name, _ELEMENT_DTYPES[etype], nbytes, part), pos + nlen, etype != 0


def _arg_dim(frame: Any, pos: int, size: int, i: int) -> tuple[Any, int, bool]:
    _room(pos, 9, size, i)
    return _DIM.unpack_from(frame, pos + 1)[0], pos + 9, False


def _arg_handle(frame: Any, pos: int, size: int, i: int) -> tuple[Any, int, bool]:
    _room(pos, 9, size, i)
    return Handle(_DIM.unpack_from(frame, pos + 1)[0]), pos + 9, True


def _arg_scalar(frame: Any, pos: int, size: int, i: int) -> tuple[Any, int, bool]:
    _room(pos, 10, size, i)
    etype = _etype(frame[pos + 1], i)
    itemsize = _ELEMENT_SIZES[etype]
    # Zero padding, as the contract says: a value written in another width (an f32 sent
    # as an f64) would otherwise be read as some other number.
    if any(frame[pos + 2 + itemsize : pos + 10]):
        raise _Malformed(f"argument {i}: a {contract.ELEMENT_TYPES[etype]} scalar whose "
                         "padding is not zero")
    value = np.frombuffer(frame, _ELEMENT_DTYPES[etype], 1, pos + 2)[0]
    return Scalar(contract.ELEMENT_TYPES[etype], value), pos + 10, True


def _arg_empty(frame: Any, pos: int, size: int, i: int) -> tuple[Any, int, bool]:
    _room(pos, 10, size, i)
    etype, count = _VECTOR_HEAD.unpack_from(frame, pos + 1)
    _etype(etype, i)
    return Empty(contract.ELEMENT_TYPES[etype], count), pos + 10, True


#: The decoder of each argument kind: the argument, where it ends, and whether it is for
#: the general path only.
_ARGS: dict[int, Callable[[Any, int, int, int], tuple[Any, int, bool]]] = {
    _W_VECTOR: _arg_vector, _W_FILE: _arg_file, _W_DIM: _arg_dim, _W_HANDLE: _arg_handle,
    _W_SCALAR: _arg_scalar, _W_EMPTY: _arg_empty}


def _decode_tail(frame: bytes | bytearray | memoryview, pos: int, size: int,
                 flags: int) -> tuple[tuple[int, ...] | None, Geometry | None, int]:
    """The kept ids and the geometry after the arguments, where the flags say so."""
    keep: tuple[int, ...] | None = None
    if flags & _W_KEEP:
        if pos >= size:
            raise _Malformed(f"launch of {size} bytes ends before its NKeep")
        nkeep = frame[pos]
        pos += 1
        if 8 * nkeep > size - pos:
            raise _Malformed(f"launch of {size} bytes ends inside its {nkeep} kept ids")
        keep = struct.unpack_from(f">{nkeep}Q", frame, pos)
        pos += 8 * nkeep
        if len(set(keep)) != nkeep:
            raise _Malformed("a buffer id is kept twice")
    geometry: Geometry | None = None
    if flags & _W_GEOMETRY:
        if _GEOMETRY.size > size - pos:
            raise _Malformed(f"launch of {size} bytes ends inside its geometry")
        gx, gy, gz, bx, by, bz, shared = _GEOMETRY.unpack_from(frame, pos)
        pos += _GEOMETRY.size
        geometry = ((gx, gy, gz), (bx, by, bz), shared)
    return keep, geometry, pos


def _decode_result_slot(frame: bytes | bytearray | memoryview, pos: int, size: int,
                        flags: int) -> tuple[ResultSlot | None, int]:
    """The result slot after the program (if any), where flag_result_file says so: its
    part size and name (checked where it is mapped, ``slots.py``), and where they end."""
    if not flags & _W_RESULT_FILE:
        return None, pos
    if _RESULT_SLOT.size > size - pos:
        raise _Malformed(f"launch of {size} bytes ends before its result slot")
    part_bytes, length = _RESULT_SLOT.unpack_from(frame, pos)
    pos += _RESULT_SLOT.size
    if length > size - pos:
        raise _Malformed(f"a result slot's name of {length} bytes announced, {size - pos} left")
    name = bytes(frame[pos : pos + length]).decode("latin-1")
    return ResultSlot(name, part_bytes), pos + length


def _decode_program(frame: bytes | bytearray | memoryview, pos: int, size: int,
                    flags: int) -> tuple[bytes | None, int]:
    """A program's definition after the geometry, where flag_program says so: its bytes
    (decoded and checked by ``programs``), and where they end."""
    if not flags & _W_PROGRAM:
        return None, pos
    if _U32.size > size - pos:
        raise _Malformed(f"launch of {size} bytes ends before its program's length")
    (length,) = _U32.unpack_from(frame, pos)
    pos += _U32.size
    if length > size - pos:
        raise _Malformed(f"a program of {length} bytes announced, {size - pos} left")
    return bytes(frame[pos : pos + length]), pos + length


def vector_spans(launch: Launch) -> tuple[list[tuple[int, int]], int] | None:
    """Where each vector argument's data lies in ``launch``'s frame (``(start, end)``, in
    param order) and where the frame ends, worked out from the decoded launch alone; ``None``
    where an argument is in shared memory and for a ``general`` launch (the batched f32
    path's layouts only). Everything else in the frame (the JobId aside) is header: two
    launch frames whose headers are equal differ in their data only."""
    if launch.general:
        return None
    pos = _HEAD_SIZE + len(launch.kernel.encode()) + 1
    spans: list[tuple[int, int]] = []
    for arg in launch.args:
        if type(arg) is np.ndarray:
            start = pos + _VECTOR_HEAD.size + 1
            pos = start + arg.nbytes
            spans.append((start, pos))
        elif type(arg) is int:
            pos += _DIM.size + 1
        else:
            return None
    return spans, pos


def program_data_spans(launch: Launch) -> tuple[list[tuple[int, tuple[int, int]]], int] | None:
    """Where each data input of a program launch lies in its frame (its argument's index and
    ``(start, end)``) and where the frame ends, worked out from the decoded launch alone;
    ``None`` where an argument is a buffer or in shared memory, or the launch keeps its
    outputs. Everything else in the frame (the JobId aside) is header."""
    if launch.program is None or launch.keep is not None or launch.geometry is not None:
        return None
    pos = _HEAD_SIZE + len(launch.kernel.encode()) + 1
    spans: list[tuple[int, tuple[int, int]]] = []
    for index, arg in enumerate(launch.args):
        cls = type(arg)
        if cls is np.ndarray:
            start = pos + _VECTOR_HEAD.size + 1
            pos = start + arg.nbytes
            spans.append((index, (start, pos)))
        elif cls is int:
            pos += 1 + _DIM.size
        elif cls is Scalar:
            pos += 2 + _DIM.size
        else:
            return None
    return spans, pos + _U32.size + len(launch.program)


def buffer_id_spans(launch: Launch) -> tuple[tuple[int, ...], int, int] | None:
    """Where a launch frame's buffer ids lie, worked out from the decoded launch alone: the
    offset of each handle argument's BufferId (in argument order), of its first kept id
    (-1 without flag_keep), and where the frame ends; ``None`` where an argument carries
    data (a vector, or one in shared memory). Everything else in such a frame (the JobId
    aside) is header: two launch frames whose headers are equal differ in their buffer ids
    only."""
    pos = _HEAD_SIZE + len(launch.kernel.encode()) + 1
    handles: list[int] = []
    for arg in launch.args:
        cls = type(arg)
        if cls is Handle:
            handles.append(pos + 1)
            pos += 1 + _DIM.size
        elif cls is int:
            pos += 1 + _DIM.size
        elif cls is Scalar or cls is Empty:
            pos += 2 + _DIM.size
        else:
            return None
    keep_at = -1
    if launch.keep is not None:
        keep_at = pos + 1
        pos += 1 + _DIM.size * len(launch.keep)
    if launch.geometry is not None:
        pos += _GEOMETRY.size
    if launch.program is not None:
        pos += _U32.size + len(launch.program)
    return tuple(handles), keep_at, pos


def slot_name_spans(launch: Launch, files: Sequence[Any]
                    ) -> tuple[list[tuple[int, int]], tuple[int, int] | None, int] | None:
    """Where the names of a launch's shared-memory operands lie in its frame (``(start,
    end)``, in argument order), where its result slot's name lies (``None`` without one),
    and where the frame ends, worked out from the decoded launch and its arguments as
    decoded (``files``: ``FileArg`` and dims); ``None`` where any other argument, a kept id,
    a geometry or a program is in it. Everything else in such a frame (the JobId aside) is
    header: two launch frames whose headers are equal differ in their slots' names only."""
    if launch.keep is not None or launch.geometry is not None or launch.program is not None:
        return None
    pos = _HEAD_SIZE + len(launch.kernel.encode()) + 1
    names: list[tuple[int, int]] = []
    for arg in files:
        if type(arg) is int:
            pos += 1 + _DIM.size
        elif type(arg) is FileArg:
            start = pos + 2 + _FILE_HEAD.size
            pos = start + len(arg.name.encode())
            names.append((start, pos))
        else:
            return None
    result = None
    if launch.result_file is not None:
        start = pos + _RESULT_SLOT.size
        pos = start + len(launch.result_file.name.encode("latin-1"))
        result = (start, pos)
    return names, result, pos


def _truncated_head(frame: bytes | bytearray | memoryview, size: int) -> Launch:
    """A launch frame shorter than its fixed part: an error for its JobId, if it has one."""
    if size < 1 + _JOB_ID.size:
        raise ProtocolError(f"launch frame of {size} bytes is too short to hold a JobId")
    job_id = _JOB_ID.unpack_from(frame, 1)[0]
    device = _DEVICE.unpack_from(frame, 9)[0] if size >= 11 else -1
    trace = size >= 12 and frame[11] & _W_TRACE != 0
    return Launch(job_id, device, "", [], trace,
                  f"launch frame of {size} bytes is shorter than its {_HEAD_SIZE} byte header")


def _atom_ext(name: bytes) -> tuple[bytes, ...]:
    """An atom as ETF writes it: ATOM_EXT (OTP 25), SMALL_ATOM_UTF8_EXT (OTP 26 on)."""
    return (bytes((etf.ATOM_EXT, 0, len(name))) + name,
            bytes((etf.SMALL_ATOM_UTF8_EXT, len(name))) + name)


#: The head of Erlang's ``term_to_binary({'C', 0, erlcuda, free, [Device, Ids]})`` up to its
#: argument list, as each OTP writes it, by the tag of its first atom: the frees Erlang
#: sends after launches (an owner's, or its death's) are read without the general decoder.
_FREE_HEADS = {
    c[0]: bytes((_ETF, etf.SMALL_TUPLE_EXT, 5)) + c + bytes((etf.SMALL_INTEGER_EXT, 0)) + m + f
    for c, m, f in zip(_atom_ext(b"C"), _atom_ext(b"erlcuda"), _atom_ext(b"free"),
                       strict=True)}
_I32 = struct.Struct(">i")
_U16 = struct.Struct(">H")
_FREE_CALL = "free"


def _free_int(frame: bytes | bytearray | memoryview, pos: int) -> tuple[int, int]:
    """A non-negative integer of the free frame at ``pos`` and where it ends; ``(-1, 0)``
    for anything else."""
    tag = frame[pos]
    if tag == etf.SMALL_INTEGER_EXT:
        return frame[pos + 1], pos + 2
    if tag == etf.INTEGER_EXT:
        return _I32.unpack_from(frame, pos + 1)[0], pos + 5
    if tag == etf.SMALL_BIG_EXT:
        n, sign = frame[pos + 1], frame[pos + 2]
        if sign or n > 8 or pos + 3 + n > len(frame):
            return -1, 0
        return int.from_bytes(frame[pos + 3 : pos + 3 + n], "little"), pos + 3 + n
    return -1, 0


def decode_free(frame: bytes | bytearray | memoryview) -> tuple[int, list[int]] | None:
    """The ``Device`` and ``Ids`` of Erlang's ``free`` call (``{'C', 0, erlcuda, free,
    [Device, Ids]}``, all of them non-negative integers) read with a few slices; ``None``
    for any other frame, or one written otherwise, which ``decode`` reads with the general
    decoder."""
    size = len(frame)
    expected = _FREE_HEADS.get(frame[3]) if size > 3 else None
    if expected is None:
        return None
    head = len(expected)
    if size < head + 8 or frame[:head] != expected:
        return None
    try:
        # [Device, Ids]: a list of two, then NIL
        if frame[head] != etf.LIST_EXT or _U32.unpack_from(frame, head + 1)[0] != 2:
            return None
        device, pos = _free_int(frame, head + 5)
        if device < 0:
            return None
        tag = frame[pos]
        ids: list[int]
        if tag == etf.NIL_EXT:
            ids, pos = [], pos + 1
        elif tag == etf.STRING_EXT:  # ids that are all below 256
            n = _U16.unpack_from(frame, pos + 1)[0]
            ids, pos = list(frame[pos + 3 : pos + 3 + n]), pos + 3 + n
            if len(ids) != n:
                return None
        elif tag == etf.LIST_EXT:
            n = _U32.unpack_from(frame, pos + 1)[0]
            if n > size:  # each id takes two bytes at least
                return None
            pos += 5
            ids = []
            for _ in range(n):
                value, pos = _free_int(frame, pos)
                if value < 0:
                    return None
                ids.append(value)
            if frame[pos] != etf.NIL_EXT:
                return None
            pos += 1
        else:
            return None
        if pos + 1 != size or frame[pos] != etf.NIL_EXT:
            return None
    except (IndexError, struct.error):
        return None
    return device, ids


def _decode_call(frame: bytes | bytearray | memoryview) -> Call:
    free = decode_free(frame)
    if free is not None:
        return Call(0, _FREE_CALL, list(free))
    try:
        term = etf.decode(frame)
    except etf.CodecError as exc:
        raise ProtocolError(f"undecodable term: {exc}") from exc
    if type(term) is tuple and len(term) == 5 and term[0] == _CALL and type(term[4]) is list:
        _, call_id, _module, function, args = term
        name = str(function) if isinstance(function, etf.Atom) else f"{function!r:.80}"
        return Call(call_id, name, args)
    raise ProtocolError(f"not an erlcuda message: {term!r:.200}")


# -- results ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Failure:
    """``{error, Reason}``: ``reason`` is a tag of ``contract.REASONS``; ``detail`` follows it
    in a tuple (``{Tag, Detail...}``), or the reason is the bare tag. Build one with the
    functions below, which decide what each detail is."""

    reason: str
    detail: tuple[Any, ...] = ()

    def __post_init__(self) -> None:
        if self.reason not in contract.REASONS and self.reason not in contract.STATUS_REASONS:
            raise ProtocolError(f"{self.reason!r} is not a reason of contract.json")

    @property
    def term(self) -> Any:
        tag = atom(self.reason)
        return (tag, *self.detail) if self.detail else tag


class Kept(NamedTuple):
    """A vector result kept on the device as buffer ``buffer_id`` (tag_handle)."""

    buffer_id: int
    type: str  # an element type of the contract
    elements: int


@dataclass(frozen=True, slots=True)
class Listed:
    """A user kernel's vector results, in param order, or a program's outputs (tag_list):
    arrays, ``Kept`` and (a program's scalars) floats."""

    items: tuple[np.ndarray | Kept | float, ...]


#: A job's result: a vector (a numpy array, or a ``FileResult`` once written to shared
#: memory), a scalar (a float), a kept vector, a user kernel's vectors or a ``Failure``.
@dataclass(frozen=True, slots=True)
class Floats:
    """An f32 vector result for a launch with flag_floats: sent as the ETF of its values as
    a list of floats (tag_floats), which Erlang turns into its floats in one
    ``binary_to_term`` (one that refuses an infinity or NaN: the caller then answers
    ``non_finite``, as for a raw vector)."""

    values: np.ndarray  # 1-D, f32


Result = np.ndarray | float | Failure | FileResult | Kept | Listed | Floats


def as_floats(result: Result, max_frame: int = contract.MAX_FRAME) -> Result:
    """``result`` as ``Floats`` where it is a 1-D f32 vector whose record of floats fits
    ``max_frame`` (more than twice its raw bytes); else ``result`` itself, sent as ever."""
    if (type(result) is np.ndarray and result.dtype == _F32 and result.ndim == 1
            and _FRAME_HEAD + _RECORD + etf.float_list_size(result.size) <= max_frame):
        return Floats(result)
    return result

TOO_LARGE = Failure("too_large")


def bad_args(text: str) -> Failure:
    return Failure("bad_args", (text,))


def bad_option(option: str, value: str) -> Failure:
    """``{bad_option, {Option, Value}}``: a load option the worker refuses (an nvcc flag)."""
    return Failure("bad_option", ((atom(option), value),))


def bad_device(device: int) -> Failure:
    """``{bad_device, Device}``, the device number the launch named."""
    return Failure("bad_device", (device,))


def unknown_kernel(kernel: str) -> Failure:
    """``{unknown_kernel, Kernel}``: the name as an atom where the contract has that atom
    (a kernel of the catalogue: Erlang knows it), else as a UTF-8 binary."""
    return Failure("unknown_kernel", (_ATOMS.get(kernel, kernel),))


def backend_unavailable(text: str) -> Failure:
    return Failure("backend_unavailable", (text,))


def buffer_lost(buffer_id: int) -> Failure:
    """``{buffer_lost, Id}``: the launch named a buffer its device does not hold."""
    return Failure("buffer_lost", (buffer_id,))


def compile_error(log: str) -> Failure:
    """``{compile, Log}``: nvcc's message for user code that does not compile."""
    return Failure("compile", (log,))


def cuda_error(code: str, text: str) -> Failure:
    """``{cuda, Code, Text}``; a code outside ``contract.CUDA_CODES`` travels as ``unknown``."""
    return Failure("cuda", (atom(code if code in contract.CUDA_CODES else "unknown"), text))


def bad_program(text: str) -> Failure:
    """``{bad_program, Text}``: a program's definition the worker cannot run."""
    return Failure("bad_program", (text,))


def step_failure(index: int, failure: Failure) -> Failure:
    """``{step, Index, Reason}``: a program's step ``Index`` (from 1) refused ``failure``."""
    return Failure("step", (index, failure.term))


def internal(text: str) -> Failure:
    return Failure("internal", (text,))


def version_mismatch(text: str) -> Failure:
    return Failure("version_mismatch", (text,))


# -- worker -> Erlang: the results frame -----------------------------------------------------

#: One job's record to send: its JobId, its result and its stamps (``None``: not traced).
Record = tuple[int, Result, Mapping[str, int] | None]


class Encoded(NamedTuple):
    """What ``encode_results`` made: the frames, how many records carry an error, and the
    records it had to replace (JobId, why) with ``internal`` or ``too_large``."""

    frames: list[Chunks]
    errors: int
    replaced: list[tuple[int, str]]
    #: The one frame's size where ``encode_results`` knew it (a lone plain record), else 0.
    size: int = 0


# (without NamedTuple's own __new__, which is Python code: a lone job's reply makes one)
_new_encoded = tuple.__new__
_RESULTS_HEAD = struct.Struct(">BI")  # results byte, Count
_RECORD_HEAD = struct.Struct(">QBI")  # JobId, Tag, Len
_INNER_HEAD = struct.Struct(">BI")  # a traced record's inner Tag, Len
_F64 = struct.Struct("<d")
_pack_record = _RECORD_HEAD.pack
_pack_inner = _INNER_HEAD.pack
_pack_f64 = _F64.pack
_FRAME_HEAD = _RESULTS_HEAD.size
_RECORD = _RECORD_HEAD.size
_TRACED = _RECORD + _INNER_HEAD.size
_F32 = DTYPES["f32"]
# The record tags, as module constants for the encoder's loops.
(_T_VECTOR, _T_SCALAR, _T_ERROR, _T_TRACED, _T_FILE, _T_TYPED, _T_HANDLE, _T_LIST,
 _T_FLOATS) = (
    _W.tag_vector, _W.tag_scalar, _W.tag_error, _W.tag_traced, _W.tag_file, _W.tag_typed,
    _W.tag_handle, _W.tag_list, _W.tag_floats)
_FILE_RECORD = struct.Struct(">QQ")
_HANDLE_RECORD = struct.Struct(">QBQ")  # BufferId, Type, Elements
_ITEM_HEAD = _INNER_HEAD  # a list item's Tag, Len
#: The index on the wire of each element type, by its little-endian numpy dtype.
_TYPE_INDEX: dict[np.dtype[Any], int] = {d: i for i, d in enumerate(_ELEMENT_DTYPES)}
_TYPE_BYTE = [bytes((i,)) for i in range(_N_TYPES)]
_TYPE_OF_NAME = {name: i for i, name in enumerate(contract.ELEMENT_TYPES)}
#: Payloads shorter than this are copied next to their header; longer ones are chunks of
#: their own that share the result's memory (``writev``).
SMALL_PAYLOAD = etf.SMALL_PAYLOAD


def _error_bytes(failure: Failure) -> bytes:
    try:
        return etf.encode_bytes(failure.term)
    except etf.CodecError as exc:
        raise ProtocolError(f"reason not encodable: {exc}") from exc


_TOO_LARGE_BYTES = _error_bytes(TOO_LARGE)


#: A payload: one piece, or several (a typed vector's Type byte and its elements, a list's
#: items), each copied next to its header or sent from its own memory by its size.
Payload = bytes | memoryview | list[bytes | memoryview]


def _array_payload(res: np.ndarray) -> tuple[int, Payload]:
    """A vector's tag and payload: f32 as tag_vector; another element type as tag_typed;
    any other numeric dtype converted to f32."""
    if res.dtype is not _F32:
        index = _TYPE_INDEX.get(res.dtype.newbyteorder("<")) if res.dtype.kind in "fiu" else 0
        if index is None or index == 0:
            if res.dtype.kind not in "fiu":
                raise ProtocolError(f"a vector of {res.dtype} has no f32 values")
            res = res.astype(_F32)
        else:
            if res.ndim != 1 or not res.flags.c_contiguous or res.dtype.byteorder == ">":
                res = np.ascontiguousarray(res, _ELEMENT_DTYPES[index]).reshape(-1)
            return _T_TYPED, [_TYPE_BYTE[index], res.data.cast("B")]
    if res.ndim != 1 or not res.flags.c_contiguous:
        res = np.ascontiguousarray(res).reshape(-1)
    return _T_VECTOR, res.data.cast("B")


def _kept_payload(res: Kept) -> bytes:
    index = _TYPE_OF_NAME.get(res.type)
    if index is None:
        raise ProtocolError(f"a buffer of type {res.type!r:.40} has no record")
    return _HANDLE_RECORD.pack(res.buffer_id, index, res.elements)


def _list_payload(res: Listed) -> list[bytes | memoryview]:
    pieces: list[bytes | memoryview] = [_U32.pack(len(res.items))]
    for item in res.items:
        if type(item) is Kept:
            data = _kept_payload(item)
            pieces += [_ITEM_HEAD.pack(_T_HANDLE, len(data)), data]
        elif type(item) is np.ndarray:
            tag, payload = _array_payload(item)
            parts = payload if type(payload) is list else [payload]
            pieces.append(_ITEM_HEAD.pack(tag, sum(_size(p) for p in parts)))
            pieces += parts
        elif type(item) is float:  # a program's scalar output
            pieces += [_ITEM_HEAD.pack(_T_SCALAR, _F64.size), _pack_f64(item)]
        else:
            raise ProtocolError(f"a list item of type {type(item).__name__} has no record")
    return pieces


def _size(piece: bytes | memoryview) -> int:
    return len(piece) if type(piece) is bytes else piece.nbytes  # type: ignore[union-attr]


def _payload(res: Any, errors: dict[int, bytes]) -> tuple[int, Payload]:
    """The tag and payload of a result; ``ProtocolError`` for one that cannot travel."""
    cls = type(res)
    if cls is np.ndarray:
        if res.dtype is not _F32:
            return _array_payload(res)
        if res.ndim != 1 or not res.flags.c_contiguous:
            res = np.ascontiguousarray(res).reshape(-1)
        return _T_VECTOR, res.data.cast("B")
    if cls is float:
        return _T_SCALAR, _pack_f64(res)
    if cls is Floats:
        return _T_FLOATS, memoryview(etf.float_list(res.values))
    if cls is FileResult:
        return _T_FILE, _FILE_RECORD.pack(res.nbytes, res.part_bytes)
    if cls is Kept:
        return _T_HANDLE, _kept_payload(res)
    if cls is Listed:
        return _T_LIST, _list_payload(res)
    if cls is Failure:
        data = errors.get(id(res))
        if data is None:
            data = errors[id(res)] = _error_bytes(res)
        return _T_ERROR, data
    if isinstance(res, (float, int, np.floating, np.integer)) and not isinstance(res, bool):
        return _T_SCALAR, _pack_f64(float(res))
    raise ProtocolError(f"a result of type {cls.__name__} has no record")


def _stamps(stamps: Mapping[str, int]) -> bytes:
    """The ETF of the stamps map (binary keys; traced jobs only, for the benchmarks)."""
    try:
        return etf.encode_bytes(dict(stamps))
    except etf.CodecError as exc:
        raise ProtocolError(f"stamps not encodable: {exc}") from exc


def encode_results(records: Sequence[Record], max_frame: int = contract.MAX_FRAME) -> Encoded:
    """The results frames of ``records``, in their order: one frame, or as many as it takes
    to keep each within ``max_frame`` bytes.

    Every record gets its one reply: a result that cannot travel becomes ``{internal, _}``
    and a record that alone would be over ``max_frame`` becomes ``too_large``, for that job
    alone. Vector payloads are chunks that share the arrays' memory: write the frames
    before that memory changes. A JobId must be a u64. A lone record of a plain result (a
    float, a 1-D f32 array, a kept buffer; no trace) is packed in one call, the same bytes
    (``_lone``): the common case at low load, where every microsecond is the caller's.
    """
    if len(records) == 1 and records[0][2] is None:
        lone = _lone(records[0][0], records[0][1], max_frame)
        if lone is not None:
            return _new_encoded(Encoded, ([lone[0]], 0, [], lone[1]))
    return _encode_records(records, max_frame)


def _encode_records(records: Iterable[Record], max_frame: int) -> Encoded:
    """``encode_results``, record by record."""
    frames: list[Chunks] = []
    replaced: list[tuple[int, str]] = []
    failures = 0
    errors: dict[int, bytes] = {}
    first = cur = bytearray(_FRAME_HEAD)  # the frame's head, packed once Count is known
    chunks: Chunks = [cur]
    size, count = _FRAME_HEAD, 0
    for job_id, res, stamps in records:
        tag, payload, n, extra, record = _record(job_id, res, stamps, errors, replaced,
                                                 max_frame)
        if size + record > max_frame and count:
            _RESULTS_HEAD.pack_into(first, 0, _W.results, count)
            frames.append(chunks)
            first = cur = bytearray(_FRAME_HEAD)
            chunks = [cur]
            size, count = _FRAME_HEAD, 0
        failures += tag == _T_ERROR
        if stamps is None:
            cur += _pack_record(job_id, tag, n)
        else:
            cur += _pack_record(job_id, _T_TRACED, _INNER_HEAD.size + n + len(extra))
            cur += _pack_inner(tag, n)
        if type(payload) is list:
            for piece in payload:
                if _size(piece) < SMALL_PAYLOAD:
                    cur += piece
                else:
                    chunks.append(piece)
                    cur = bytearray()
                    chunks.append(cur)
        elif n < SMALL_PAYLOAD:
            cur += payload  # type: ignore[operator]
        else:
            chunks.append(payload)  # type: ignore[arg-type]
            cur = bytearray()
            chunks.append(cur)
        if extra:
            cur += extra
        size += record
        count += 1
    if count:
        _RESULTS_HEAD.pack_into(first, 0, _W.results, count)
        frames.append(chunks)
    return Encoded(frames, failures, replaced)


_LONE_HEAD = struct.Struct(">BIQBI")  # a one-record results frame: results byte, Count, record


def _record(job_id: int, res: Result, stamps: Mapping[str, int] | None,
            errors: dict[int, bytes], replaced: list[tuple[int, str]],
            max_frame: int) -> tuple[int, Payload, int, bytes, int]:
    """One record's tag, payload, payload bytes, stamps and size: ``internal`` where the
    result cannot travel, ``too_large`` where the record alone is over ``max_frame`` (each
    noted in ``replaced``)."""
    try:
        tag, payload = _payload(res, errors)
        extra = b"" if stamps is None else _stamps(stamps)
    except ProtocolError as exc:
        replaced.append((job_id, f"reply not encodable: {exc}"))
        tag, payload = _T_ERROR, _error_bytes(internal(f"reply not encodable: {exc}"))
        extra = b""
        if stamps is not None:
            try:
                extra = _stamps(stamps)
            except ProtocolError:
                extra = _stamps({})
    if type(payload) is bytes:
        n = len(payload)
    elif type(payload) is list:
        n = sum(_size(p) for p in payload)
    else:
        n = payload.nbytes  # type: ignore[union-attr]
    record = _RECORD + n if stamps is None else _TRACED + n + len(extra)
    if _FRAME_HEAD + record > max_frame:
        replaced.append((job_id, f"a reply of {_FRAME_HEAD + record} bytes is over the "
                                 f"{max_frame} byte frame limit"))
        tag, payload = _T_ERROR, _TOO_LARGE_BYTES
        n = len(payload)
        record = _RECORD + n if stamps is None else _TRACED + n + len(extra)
    return tag, payload, n, extra, record


def _lone(job_id: int, res: Result, max_frame: int) -> tuple[Chunks, int] | None:
    """A lone job's results frame and its size, byte for byte what ``_encode_records``
    makes of ``[(job_id, res, None)]``, for the plain results (a float, a 1-D contiguous
    f32 array that fits ``max_frame``, ``Floats``, a buffer kept: ``Kept``, a result written
    into its slot: ``FileResult``); ``None`` for any other, which ``_encode_records`` then
    answers."""
    cls = type(res)
    if cls is float:
        size = _LONE_HEAD.size + 8
        if size > max_frame:
            return None
        return [_LONE_HEAD.pack(_W.results, 1, job_id, _T_SCALAR, 8) + _pack_f64(res)], size
    if cls is FileResult:  # a result written into its slot: a lone shm job's reply
        size = _LONE_HEAD.size + _FILE_RECORD.size
        if size > max_frame:
            return None
        return [_LONE_HEAD.pack(_W.results, 1, job_id, _T_FILE, _FILE_RECORD.size)
                + _FILE_RECORD.pack(res.nbytes, res.part_bytes)], size
    if cls is Kept:
        index = _TYPE_OF_NAME.get(res.type)
        size = _LONE_HEAD.size + _HANDLE_RECORD.size
        if index is None or size > max_frame:
            return None
        return [_LONE_HEAD.pack(_W.results, 1, job_id, _T_HANDLE, _HANDLE_RECORD.size)
                + _HANDLE_RECORD.pack(res.buffer_id, index, res.elements)], size
    if cls is np.ndarray and res.dtype is _F32 and res.ndim == 1 and res.flags.c_contiguous:
        n = res.nbytes
        size = _LONE_HEAD.size + n
        if size > max_frame:
            return None
        head = _LONE_HEAD.pack(_W.results, 1, job_id, _T_VECTOR, n)
        if n < SMALL_PAYLOAD:
            return [head + res.tobytes()], size
        return [head, res.data.cast("B")], size
    if cls is Floats:
        data = etf.float_list(res.values)
        size = _LONE_HEAD.size + len(data)
        if size > max_frame:
            return None
        return [_LONE_HEAD.pack(_W.results, 1, job_id, _T_FLOATS, len(data)), data], size
    if cls is Listed and len(res.items) == 1:
        return _lone_item(job_id, res.items[0], max_frame)
    return None


def _lone_item(job_id: int, item: Any, max_frame: int) -> tuple[Chunks, int] | None:
    """``_lone`` of a list of one item (a program's one output): a float or an f32 vector."""
    cls = type(item)
    if cls is float:
        body = _U32.pack(1) + _ITEM_HEAD.pack(_T_SCALAR, 8) + _pack_f64(item)
        size = _LONE_HEAD.size + len(body)
        if size > max_frame:
            return None
        return [_LONE_HEAD.pack(_W.results, 1, job_id, _T_LIST, len(body)) + body], size
    if cls is not np.ndarray or item.dtype is not _F32 or item.ndim != 1 or (
            not item.flags.c_contiguous):
        return None
    n = item.nbytes
    inner = _U32.size + _ITEM_HEAD.size + n
    size = _LONE_HEAD.size + inner
    if size > max_frame:
        return None
    head = (_LONE_HEAD.pack(_W.results, 1, job_id, _T_LIST, inner) + _U32.pack(1)
            + _ITEM_HEAD.pack(_T_VECTOR, n))
    if n < SMALL_PAYLOAD:
        return [head + item.tobytes()], size
    return [head, item.data.cast("B")], size


def encode_table(job_ids: np.ndarray, values: np.ndarray, max_frame: int,
                 floats: bool = False) -> list[list[Any]]:
    """The results frames of a table of jobs (``templates.Table``): ``values`` is
    ``count x n`` f32 (vectors) or ``count`` floats (scalars, sent as f64), row ``i`` the
    result of ``job_ids[i]``; byte for byte what ``encode_results`` makes of those records
    (``floats``: of each vector as ``as_floats`` makes it, the table's launches having
    flag_floats). As many frames as ``max_frame`` needs; ``[]`` when one record alone would
    be over it: the caller then answers each job through ``encode_results``."""
    count = int(job_ids.size)
    fields, tag, nbytes = _table_fields(values, floats)
    if not nbytes:
        return []
    dtype = np.dtype([("id", ">u8"), ("tag", "u1"), ("len", ">u4"), *fields])
    per_frame = (max_frame - _RESULTS_HEAD.size) // dtype.itemsize
    if per_frame < 1:
        return []
    records = np.empty(count, dtype)
    records["id"] = job_ids
    records["tag"] = tag
    records["len"] = nbytes
    if tag == _T_FLOATS:
        etf.blank_float_lists(records["floats"], values.shape[1])
        records["floats"]["items"]["value"] = values
    else:
        records["data"] = values
    frames = []
    for start in range(0, count, per_frame):
        part = records[start : start + per_frame]
        frames.append([_RESULTS_HEAD.pack(_W.results, part.size), part.data.cast("B")])
    return frames


def _table_fields(values: np.ndarray, floats: bool) -> tuple[list[tuple[Any, ...]], int, int]:
    """A table's record payload: its fields, tag and bytes (0: no table for ``values``)."""
    if values.ndim != 2:
        return [("data", "<f8")], _T_SCALAR, 8
    n = values.shape[1]
    if n == 0:
        return [], _T_VECTOR, 0
    if not floats:
        return [("data", "<f4", (n,))], _T_VECTOR, 4 * n
    return [("floats", etf.float_list_dtype(n))], _T_FLOATS, etf.float_list_size(n)


def encode_list_table(job_ids: np.ndarray, columns: Sequence[np.ndarray],
                      max_frame: int) -> list[list[Any]]:
    """The results frames of runs of one program (``templates.ProgramRows``), each answered
    by the list of its outputs: ``columns[k]`` holds output ``k`` of every run, ``count x
    n`` f32 (vectors) or ``count`` floats (scalars, sent as f64); byte for byte what
    ``encode_results`` makes of each run's ``Listed``. ``[]`` where a column is of another
    kind (the caller then answers each run through ``encode_results``), or one record alone
    would be over ``max_frame``."""
    fields: list[tuple[Any, ...]] = [("id", ">u8"), ("tag", "u1"), ("len", ">u4"),
                                     ("count", ">u4")]
    heads: list[tuple[int, int]] = []
    for k, column in enumerate(columns):
        if column.ndim == 2 and column.dtype == _F32 and column.shape[1]:
            data: tuple[Any, ...] = (f"d{k}", "<f4", (column.shape[1],))
            heads.append((_T_VECTOR, 4 * column.shape[1]))
        elif column.ndim == 1 and column.dtype.kind == "f":
            data = (f"d{k}", "<f8")
            heads.append((_T_SCALAR, 8))
        else:
            return []
        fields += [(f"t{k}", "u1"), (f"l{k}", ">u4"), data]
    dtype = np.dtype(fields)
    per_frame = (max_frame - _RESULTS_HEAD.size) // dtype.itemsize
    if per_frame < 1:
        return []
    records = np.empty(int(job_ids.size), dtype)
    records["id"] = job_ids
    records["tag"] = _T_LIST
    records["len"] = dtype.itemsize - _RECORD_HEAD.size
    records["count"] = len(columns)
    for k, (column, (tag, nbytes)) in enumerate(zip(columns, heads, strict=True)):
        records[f"t{k}"] = tag
        records[f"l{k}"] = nbytes
        records[f"d{k}"] = column
    return [[_RESULTS_HEAD.pack(_W.results, part.size), part.data.cast("B")]
            for part in (records[i : i + per_frame] for i in range(0, records.size, per_frame))]


# -- worker -> Erlang: ETF frames ------------------------------------------------------------


def _encode(term: Any) -> Chunks:
    try:
        return etf.encode(term)  # type: ignore[return-value]
    except etf.CodecError as exc:
        raise ProtocolError(f"not encodable: {exc}") from exc


def encode_answer(call_id: Any, answer: Any) -> Chunks:
    """``{'r', Id, Answer}``. ``answer`` is a term built here (``encode_info``, ``OK``),
    plain data (numbers, text, lists of them) or a term Erlang sent."""
    return _encode((_ANSWER, call_id, answer))


def encode_call_error(call_id: Any, text: str) -> Chunks:
    """``{'e', Id, Text}``."""
    return _encode((_CALL_ERROR, call_id, text))


def encode_log(level: str, text: str) -> Chunks:
    """``{'L', Level, Text}``, ``Level`` one of ``contract.LOG_LEVELS``."""
    if level not in contract.LOG_LEVELS:
        raise ProtocolError(f"{level!r} is not a log level of contract.json")
    return _encode((_LOG, atom(level), text))


def encode_info(info: Mapping[str, Any]) -> dict[etf.Atom, Any]:
    """The map term of ``info``: its keys, and those of maps inside it, become contract atoms.

    Values: a ``Failure`` becomes its reason term, an atom must be a contract atom (made by
    ``atom``), tuples become lists, text a binary; numbers and bools stay as they are.
    """
    return {atom(key): _info_value(value) for key, value in info.items()}


def _info_value(value: Any) -> Any:
    if isinstance(value, Mapping):
        return encode_info(value)
    if isinstance(value, Failure):
        return value.term
    if isinstance(value, etf.Atom):
        return atom(value)
    if isinstance(value, (list, tuple)):
        return [_info_value(v) for v in value]
    if value is None or not isinstance(value, (str, bytes, int, float)):
        raise ProtocolError(f"info value {value!r:.80} has no term")
    return value
