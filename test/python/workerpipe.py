"""Drive a real ``python -m erlcuda serve`` through pipes on its fds 3 and 4, as Erlang does.

Also the wire's two binary frames as Erlang sees them: ``launch_frame`` builds a launch and
``parse_results`` reads a results frame, written here from the spec (``contract.WIRE``), not
from ``erlcuda.protocol``, so that the tests check the worker against the spec.
"""

from __future__ import annotations

import os
import resource
import struct
import subprocess
import sys
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from erlcuda import contract, etf
from erlcuda.etf import Atom
from erlcuda.framing import FrameReader, FrameWriter
from erlcuda.hostmem import Pinning
from erlcuda.shm import SharedFolder
from erlcuda.slots import OperandSlots
from erlcuda.worker import Options, Worker

ROOT = Path(__file__).resolve().parents[2]
W = contract.WIRE
#: The worker with the test calls (fault, print, stall, frozen), and the benchmarks' (echo, pure).
TEST_WORKER = "erlcuda_testworker"
BENCH_WORKER = "erlcuda_benchworker"
#: Where they are: put on the worker's path ahead of the package.
DOUBLES = (ROOT / "test" / "worker", ROOT / "bench" / "worker")

@dataclass(frozen=True)
class Vector:
    """A vector argument of ``launch_frame`` with its ElemType (an index into
    ``contract.ELEMENT_TYPES``), for vectors of another type than f32."""

    data: bytes
    etype: int = 0


@dataclass(frozen=True)
class FileVector:
    """A vector argument of ``launch_frame`` in the worker's shared-memory folder: the part
    files ``name.0``, ``name.1``, ... of ``part_bytes`` each."""

    name: str | bytes
    nbytes: int
    etype: int = 0
    part_bytes: int = 8 << 20


@dataclass(frozen=True)
class Buffer:
    """A buffer argument (arg.handle): the id of a vector kept on the device."""

    buffer_id: int


@dataclass(frozen=True)
class Number:
    """A scalar argument (arg.scalar) of element type ``etype``: 8 bytes, the value
    little-endian and zero-padded (``raw`` overrides them)."""

    value: float | int
    etype: int = 0
    raw: bytes | None = None


@dataclass(frozen=True)
class Zeroed:
    """An empty argument (arg.empty): ``elements`` zeroed elements the worker makes."""

    elements: int
    etype: int = 0


#: The numpy dtype of each ElemType, by index (contract.ELEMENT_TYPES).
DTYPES = {"f32": "<f4", "f64": "<f8", "i32": "<i4", "u32": "<u4", "i64": "<i8", "u8": "u1"}
ETYPE = {name: i for i, name in enumerate(contract.ELEMENT_TYPES)}


def typed(values: Any, etype: str) -> Vector:
    """A vector argument of element type ``etype``."""
    return Vector(np.asarray(values, DTYPES[etype]).tobytes(), ETYPE[etype])


def launch_frame(job_id: int, kernel: str | bytes, args: list[Any], *, device: int = 0,
                 trace: bool = False, flags: int | None = None,
                 result_file: tuple[str, int] | None = None, keep: list[int] | None = None,
                 geometry: tuple[tuple[int, int, int], tuple[int, int, int], int] | None = None,
                 program: bytes | None = None, floats: bool = False) -> bytes:
    """The launch frame Erlang writes: bytes (or a numpy array) are an f32 vector argument,
    an int a dim, a ``Vector`` a vector of its element type, a ``FileVector`` a vector in
    shared memory, a ``Buffer`` a buffer, a ``Number`` a scalar, a ``Zeroed`` an empty
    argument; ``keep`` (flag keep) the ids to keep the results under, ``geometry`` (flag
    geometry) a user kernel's grid, block and shared bytes, ``program`` (flag program) a
    program's definition (the arguments are its inputs), ``result_file`` (flag result_file)
    the name and part size of the slot a vector result goes to (``result_slot``), ``floats``
    (flag floats) an f32 vector result wanted as the ETF of its floats."""
    name = kernel.encode() if isinstance(kernel, str) else kernel
    if flags is None:
        flags = ((W.flag_trace if trace else 0)
                 | (W.flag_result_file if result_file is not None else 0)
                 | (W.flag_keep if keep is not None else 0)
                 | (W.flag_geometry if geometry is not None else 0)
                 | (W.flag_program if program is not None else 0)
                 | (W.flag_floats if floats else 0))
    parts = [struct.pack(">BQHBB", W.launch, job_id, device, flags, len(name)), name,
             bytes((len(args),))]
    for arg in args:
        if isinstance(arg, int):
            parts.append(struct.pack(">BQ", W.arg_dim, arg))
            continue
        if isinstance(arg, Buffer):
            parts.append(struct.pack(">BQ", W.arg_handle, arg.buffer_id))
            continue
        if isinstance(arg, Number):
            raw = arg.raw
            if raw is None:
                dtype = DTYPES[contract.ELEMENT_TYPES[arg.etype]]
                raw = np.asarray(arg.value, dtype).tobytes().ljust(8, b"\0")
            parts.append(struct.pack(">BB", W.arg_scalar, arg.etype) + raw)
            continue
        if isinstance(arg, Zeroed):
            parts.append(struct.pack(">BBQ", W.arg_empty, arg.etype, arg.elements))
            continue
        if isinstance(arg, FileVector):
            fname = arg.name.encode() if isinstance(arg.name, str) else arg.name
            parts += [struct.pack(">BBQQB", W.arg_file, arg.etype, arg.nbytes, arg.part_bytes,
                                  len(fname)), fname]
            continue
        if isinstance(arg, np.ndarray):
            arg = Vector(arg.astype("<f4").tobytes())
        elif not isinstance(arg, Vector):
            arg = Vector(bytes(arg))
        parts += [struct.pack(">BBQ", W.arg_vector, arg.etype, len(arg.data)), arg.data]
    if keep is not None:
        parts.append(struct.pack(f">B{len(keep)}Q", len(keep), *keep))
    if geometry is not None:
        (gx, gy, gz), (bx, by, bz), shared = geometry
        parts.append(struct.pack(">7I", gx, gy, gz, bx, by, bz, shared))
    if program is not None:
        parts += [struct.pack(">I", len(program)), program]
    if result_file is not None:
        slot, part_bytes = result_file
        parts += [struct.pack(">QB", part_bytes, len(slot)), slot.encode()]
    return b"".join(parts)


def result_slot(folder: Path, name: str = "s900", part_bytes: int = 1 << 20) -> tuple[str, int]:
    """A result slot as Erlang makes one in the worker's folder (its part file, as long as
    a part): what ``launch_frame``'s ``result_file`` takes."""
    with open(folder / f"{name}.0", "wb") as f:
        f.truncate(part_bytes)
    return name, part_bytes


def pinned_slot_worker(folder: Path, pinning: Pinning) -> tuple[Worker, int, int]:
    """A worker on the cpu backend, its device open on this thread (``_take`` runs a lone
    frame there) and its slots in ``folder`` registering through ``pinning``: the worker,
    and the read and write ends of the pipe its replies go to."""
    replies_r, replies_w = os.pipe()
    dead_r, _ = os.pipe()
    shared = SharedFolder(str(folder))
    worker = Worker(FrameReader(dead_r), FrameWriter(replies_w),
                    Options(backend="cpu", spin_us=0), shm=shared)
    lane = worker.lanes[0]
    worker._device = lane.open_here()
    lane.slots = OperandSlots(shared, pinning)
    return worker, replies_r, replies_w


def write_part(folder: Path, name: str, values: np.ndarray, part: int = 1 << 20) -> int:
    """``values`` written in place into slot ``name``'s first part (of ``part`` bytes), as
    Erlang writes a slot, so that its pages (registered) stay: its bytes."""
    fd = os.open(folder / f"{name}.0", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        if os.fstat(fd).st_size != part:
            os.ftruncate(fd, part)
        os.pwrite(fd, values.tobytes(), 0)
    finally:
        os.close(fd)
    return values.nbytes


def read_slot(folder: Path, name: str, nbytes: int, dtype: str = "<f4") -> np.ndarray:
    """The first ``nbytes`` of a slot's part, as Erlang reads a result from it."""
    with open(folder / f"{name}.0", "rb") as f:
        return np.frombuffer(f.read(nbytes), dtype)


def batch_frame(launches: list[bytes]) -> bytes:
    """Several launch frames as the one batch frame Erlang's writer sends."""
    return b"".join([struct.pack(">BI", W.batch, len(launches)),
                     *(struct.pack(">I", len(f)) + f for f in launches)])


@dataclass(frozen=True)
class Reply:
    """One record of a results frame, as Erlang reads it.

    ``result`` is ``("ok", Value)`` (a vector as a list of floats, a typed vector as a list
    of its numbers, a scalar a float, a list record as the list of its items' values, a
    buffer as ``("buffer", Id, Type, Elements)``) or ``("error", Reason)`` (the decoded
    term); ``payload`` the raw payload of the result's
    tag; ``stamps`` the decoded map of a traced record (else ``None``); ``etf`` every ETF
    blob in the record (the reason, the stamps) as sent.
    """

    job_id: int
    tag: int
    payload: bytes
    result: tuple[str, Any]
    stamps: dict[Any, Any] | None
    etf: tuple[bytes, ...]


def _result(tag: int, payload: bytes) -> tuple[str, Any]:
    if tag == W.tag_vector:
        assert len(payload) % 4 == 0, "a vector's payload is whole f32s"
        return "ok", np.frombuffer(payload, "<f4").astype(float).tolist()
    if tag == W.tag_floats:
        value = etf.decode(payload)
        assert type(value) is list and all(type(x) is float for x in value), \
            "tag_floats is the ETF of a list of floats"
        return "ok", value
    if tag == W.tag_scalar:
        assert len(payload) == 8, "a scalar is one f64"
        return "ok", struct.unpack("<d", payload)[0]
    if tag == W.tag_error:
        return "error", etf.decode(payload)
    if tag == W.tag_file:
        assert len(payload) == 16, "a file result's payload is its size and part size"
        return "file", struct.unpack(">QQ", payload)
    if tag == W.tag_typed:
        assert len(payload) >= 1, "a typed vector starts with its type"
        etype = contract.ELEMENT_TYPES[payload[0]]
        dtype = np.dtype(DTYPES[etype])
        assert etype != "f32", "an f32 vector travels as tag_vector"
        assert (len(payload) - 1) % dtype.itemsize == 0, "a typed payload is whole elements"
        return "ok", np.frombuffer(payload, dtype, offset=1).tolist()
    if tag == W.tag_handle:
        assert len(payload) == 17, "a handle is BufferId:64 Type:8 Elements:64"
        buffer_id, etype, elements = struct.unpack(">QBQ", payload)
        return "ok", ("buffer", buffer_id, contract.ELEMENT_TYPES[etype], elements)
    if tag == W.tag_list:
        (count,) = struct.unpack_from(">I", payload)
        pos, items = 4, []
        for _ in range(count):
            item_tag, n = struct.unpack_from(">BI", payload, pos)
            pos += 5
            assert item_tag in (W.tag_vector, W.tag_typed, W.tag_handle, W.tag_scalar), item_tag
            assert pos + n <= len(payload), "a list item runs past its record"
            items.append(_result(item_tag, payload[pos : pos + n])[1])
            pos += n
        assert pos == len(payload), "trailing bytes after a list's items"
        return "ok", items
    raise AssertionError(f"unknown tag {tag}")


def parse_results(frame: bytes | bytearray | memoryview) -> list[Reply]:
    """The records of a results frame, checking its layout to the last byte."""
    data = bytes(frame)
    assert data[0] == W.results, f"not a results frame: {data[:1]!r}"
    (count,) = struct.unpack_from(">I", data, 1)
    pos, replies = 5, []
    for _ in range(count):
        job_id, tag, n = struct.unpack_from(">QBI", data, pos)
        pos += 13
        payload = data[pos : pos + n]
        assert len(payload) == n, "a record's payload runs past the frame"
        pos += n
        stamps, blobs = None, ()
        if tag == W.tag_traced:
            tag, inner = struct.unpack_from(">BI", payload)
            assert tag != W.tag_traced and 5 + inner <= n
            stamps_etf = payload[5 + inner :]
            stamps = etf.decode(stamps_etf)
            assert isinstance(stamps, dict)
            payload = payload[5 : 5 + inner]
            blobs = (stamps_etf,)
        if tag == W.tag_error:
            blobs = (payload, *blobs)
        replies.append(Reply(job_id, tag, payload, _result(tag, payload), stamps, blobs))
    assert pos == len(data), f"{len(data) - pos} trailing bytes after {count} records"
    return replies


def spawn_on_port_fds(argv: list[str], *, nofile: int | None = None,
                      **popen: Any) -> tuple[subprocess.Popen[bytes], int, int]:
    """Start ``argv`` as an Erlang port would (its input on fd 3, its output on fd 4), with
    the package on its path, at most ``nofile`` descriptors if given; returns the process,
    the fd to write to and the fd to read."""
    to_child_r, to_child_w = os.pipe()
    from_child_r, from_child_w = os.pipe()
    high = [os.dup(fd) for fd in (to_child_r, from_child_w)]  # keep clear of 3 and 4

    def remap() -> None:
        os.dup2(high[0], 3)
        os.dup2(high[1], 4)
        if nofile is not None:
            resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))

    # Ahead of what the path holds already (where PyCUDA may come from, as on the GPU host).
    path = os.pathsep.join(p for p in (*map(str, DOUBLES), str(ROOT / "python"),
                                       os.environ.get("PYTHONPATH")) if p)
    env = dict(os.environ, PYTHONPATH=path)
    proc = subprocess.Popen(argv, pass_fds=(3, 4), preexec_fn=remap, env=env,
                            stdin=subprocess.DEVNULL, **popen)
    for fd in (to_child_r, from_child_w, *high):
        os.close(fd)
    return proc, to_child_w, from_child_r


class WorkerPipe:
    """A worker started with ``args``; ``record`` keeps every frame received and term sent.
    ``module`` is the one run with ``-m``: ``erlcuda``, or ``TEST_WORKER`` / ``BENCH_WORKER``
    for the worker with the test or the benchmark calls."""

    def __init__(self, *args: str, record: bool = False, nofile: int | None = None,
                 module: str = "erlcuda") -> None:
        self.proc, self._to_child_w, self._from_child_r = spawn_on_port_fds(
            [sys.executable, "-m", module, "serve", *args], nofile=nofile)
        self.writer = FrameWriter(self._to_child_w)
        self.reader = FrameReader(self._from_child_r)
        self.logs: list[tuple[str, str]] = []
        self.record = record
        self.received: list[bytes] = []
        self.sent: list[Any] = []
        self.results_frames = 0  # results frames received
        self._pending: deque[Reply] = deque()
        self._next_call = 1

    def send(self, term: Any) -> None:
        if self.record:
            self.sent.append(term)
        self.writer.write(etf.encode(term))

    def send_raw(self, frame: bytes) -> None:
        self.writer.write([frame])

    def launch(self, job_id: int, kernel: str, args: list[Any], *, device: int = 0,
               trace: bool = False, result_file: tuple[str, int] | None = None,
               keep: list[int] | None = None,
               geometry: tuple[tuple[int, int, int], tuple[int, int, int], int] | None = None,
               program: bytes | None = None) -> None:
        if self.record:
            self.sent.append(Atom(kernel))
        self.send_raw(launch_frame(job_id, kernel, args, device=device, trace=trace,
                                   result_file=result_file, keep=keep, geometry=geometry,
                                   program=program))

    def receive(self) -> Any:
        """The next message that is not a log line: a ``Reply`` (one record of a results
        frame at a time) or an ETF term."""
        while not self._pending:
            frame = self.reader.read()
            assert frame is not None, "worker closed its output"
            if self.record:
                self.received.append(bytes(frame))
            if frame[0] == W.results:
                self.results_frames += 1
                self._pending.extend(parse_results(frame))
                continue
            term = etf.decode(frame)
            if term[0] == "L":
                self.logs.append((str(term[1]), bytes(term[2]).decode()))
                continue
            return term
        return self._pending.popleft()

    def reply(self) -> Reply:
        """The next job's record."""
        got = self.receive()
        assert isinstance(got, Reply), f"expected a result, got {got!r:.200}"
        return got

    def result(self) -> tuple[int, Any]:
        """(JobId, Result) of the next reply."""
        reply = self.reply()
        return reply.job_id, reply.result

    def call(self, function: str, *args: Any) -> Any:
        call_id = self._next_call
        self._next_call += 1
        self.send((Atom("C"), call_id, Atom("erlcuda"), Atom(function), list(args)))
        while True:
            term = self.receive()
            if isinstance(term, tuple) and term[0] in ("r", "e") and term[1] == call_id:
                return term
            raise AssertionError(f"unexpected frame {term!r:.200}")

    def close(self) -> int:
        os.close(self._to_child_w)
        try:
            while self.reader.read() is not None:
                pass
        finally:
            os.close(self._from_child_r)
        return self.proc.wait(timeout=20)
