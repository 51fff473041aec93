"""The messages, and the guard that keeps every atom the worker sends within the contract.

Erlang decodes the worker's frames with ``binary_to_term(B, [safe])``, which fails on an atom
the node has never seen: one stray atom would make a reply undecodable and lose a job. The
node knows the contract's atoms (``erlcuda_contract:worker_atoms/0``) and those it sent.
"""

from __future__ import annotations

import re
import shutil
import struct
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import erlcuda
from erlcuda import contract, etf, kernels, protocol
from erlcuda.backends.base import ERROR_CODES, BackendError
from erlcuda.backends.cpu import CpuBackend
from erlcuda.etf import Atom, ImproperList
from erlcuda.protocol import Call, Failure, Launch, ProtocolError
from erlcuda.shm import FileResult, ResultSlot
from strategies import PID
from workerpipe import (
    BENCH_WORKER,
    TEST_WORKER,
    Reply,
    Vector,
    W,
    WorkerPipe,
    launch_frame,
    parse_results,
)

# An atom only Erlang knows: the worker may send it back only where Erlang sent it.
THEIRS = Atom("only_erlang_knows_this")


def atoms_in(term: Any) -> Iterator[str]:
    """Every atom in ``term`` (pids and other opaque terms are Erlang's own, as sent)."""
    if isinstance(term, Atom):
        yield str(term)
    elif isinstance(term, (list, tuple)):
        for t in term:
            yield from atoms_in(t)
    elif isinstance(term, dict):
        for k, v in term.items():
            yield from atoms_in(k)
            yield from atoms_in(v)
    elif isinstance(term, ImproperList):
        yield from atoms_in(term.items)
        yield from atoms_in(term.tail)


def decoded(chunks: list[bytes | memoryview]) -> Any:
    return etf.decode(b"".join(bytes(c) for c in chunks))


def test_the_guard_accepts_contract_atoms_only() -> None:
    for name in contract.ATOMS:
        assert protocol.atom(name) == name and isinstance(protocol.atom(name), Atom)
    for name in ("undefined", "nope", "", "Ok"):
        with pytest.raises(ProtocolError, match=r"not in contract\.json"):
            protocol.atom(name)
    with pytest.raises(ProtocolError):
        Failure("no_such_reason")
    with pytest.raises(ProtocolError):
        protocol.encode_log("critical", "not a level Erlang has")


def test_backend_error_codes_are_the_contracts() -> None:
    assert ERROR_CODES == contract.CUDA_CODES
    assert BackendError("made_up", "x").code == "unknown"
    failure = protocol.cuda_error("made_up", "x")
    assert failure.term == ("cuda", "unknown", "x")


def every_result() -> list[protocol.Result]:
    return [
        np.array([1.0, 2.0], np.float32), np.array([np.inf], np.float32), 2.5, float("nan"),
        protocol.bad_args("A: not a number"), protocol.bad_device(7),
        protocol.unknown_kernel("fft"), protocol.unknown_kernel("ok"),
        protocol.unknown_kernel(str(THEIRS)),
        protocol.backend_unavailable("no GPU"), protocol.internal("bug"),
        protocol.version_mismatch("0.1.0 and 0.2.0"), protocol.TOO_LARGE,
        *(protocol.cuda_error(code, "message") for code in (*contract.CUDA_CODES, "other")),
    ]


def records(chunks_of_frames: list[list[bytes | bytearray | memoryview]]) -> list[Reply]:
    return [r for chunks in chunks_of_frames for r in parse_results(joined(chunks))]


def joined(chunks: list[bytes | bytearray | memoryview]) -> bytes:
    return b"".join(bytes(c) for c in chunks)


def test_every_record_holds_contract_atoms_only() -> None:
    # No term of Erlang's travels back in a job's record any more (no ReplyTo; the JobId
    # and the device are integers; a kernel name is an atom only where the contract has it).
    for res in every_result():
        for stamps in (None, {"recv": 1}):
            (reply,) = records(protocol.encode_results([(7, res, stamps)]).frames)
            assert reply.job_id == 7
            for blob in reply.etf:
                assert set(atoms_in(etf.decode(blob))) <= contract.ATOMS, blob


def test_results_and_their_records() -> None:
    vector = np.array([1.5, -2.0, np.nan], np.float32)
    encoded = protocol.encode_results([
        (1, vector, None), (2, 3.0, None), (3, np.float32(0.5), None), (4, float("inf"), None),
        (5, protocol.TOO_LARGE, None), (6, protocol.bad_device(3), {"recv": 5}),
        (2**64 - 1, np.empty(0, np.float32), None)])
    assert encoded.errors == 2 and encoded.replaced == []
    (frame,) = encoded.frames
    replies = parse_results(joined(frame))
    assert [r.job_id for r in replies] == [1, 2, 3, 4, 5, 6, 2**64 - 1]
    assert replies[0].tag == W.tag_vector and replies[0].payload == vector.tobytes()
    assert replies[1].tag == W.tag_scalar and replies[1].payload == struct.pack("<d", 3.0)
    assert replies[2].result == ("ok", 0.5)
    assert replies[3].result == ("ok", float("inf"))  # Erlang refuses it, not the worker
    assert replies[4].result == ("error", "too_large")
    assert replies[5].result == ("error", ("bad_device", 3))
    assert replies[5].stamps == {b"recv": 5} and replies[5].tag == W.tag_error
    assert replies[6].result == ("ok", [])
    assert protocol.encode_results([]).frames == []


def test_the_bytes_of_a_results_frame() -> None:
    (frame,) = protocol.encode_results([(258, 1.0, None)]).frames
    assert joined(frame) == (b"R\0\0\0\x01" + (258).to_bytes(8, "big") + b"s\0\0\0\x08"
                             + struct.pack("<d", 1.0))
    (frame,) = protocol.encode_results([(1, np.ones(1, np.float32), {})]).frames
    assert joined(frame) == (b"R\0\0\0\x01" + (1).to_bytes(8, "big") + b"T\0\0\0\x0f"
                             + b"v\0\0\0\x04" + np.ones(1, "<f4").tobytes()
                             + b"\x83t\0\0\0\0")


@given(st.dictionaries(st.text(max_size=10), st.integers(-(2**70), 2**2100), max_size=8))
def test_stamps_travel_as_etf_would_encode_them(stamps: dict[str, int]) -> None:
    # The stamps travel as the ETF of their map, as etf writes it.
    (frame,) = protocol.encode_results([(1, 1.0, stamps)]).frames
    (reply,) = parse_results(joined(frame))
    assert reply.etf == (etf.encode_bytes(dict(stamps)),)
    assert reply.stamps == {k.encode(): v for k, v in stamps.items()}


def test_vectors_are_sent_from_their_own_memory() -> None:
    big = np.arange(1000, dtype=np.float32)
    small = np.arange(3, dtype=np.float32)
    (frame,) = protocol.encode_results([(1, big, None), (2, small, None)]).frames
    shared = [c for c in frame if isinstance(c, memoryview) and np.shares_memory(c, big)]
    assert len(shared) == 1 and shared[0].nbytes == big.nbytes
    assert not any(isinstance(c, memoryview) and np.shares_memory(c, small) for c in frame)
    # A strided array is made contiguous (a copy); another element type of the contract
    # travels as itself (tag_typed), any other numeric dtype as f32.
    (frame,) = protocol.encode_results([(1, np.arange(4, dtype=np.float32)[::2], None),
                                        (2, np.arange(4.0)[::2], None),
                                        (3, np.arange(3, dtype=np.int16), None)]).frames
    strided, typed, converted = parse_results(joined(frame))
    assert strided.result == ("ok", [0.0, 2.0]) and strided.tag == W.tag_vector
    assert typed.tag == W.tag_typed and typed.payload == b"\x01" + np.arange(4.0)[::2].tobytes()
    assert converted.result == ("ok", [0.0, 1.0, 2.0]) and converted.tag == W.tag_vector


def test_a_result_that_cannot_travel_is_internal_for_its_job_alone() -> None:
    encoded = protocol.encode_results([
        (1, np.array([object()]), None), (2, 1.0, None), (3, "text", {"recv": 1}),
        (4, protocol.bad_args("fine"), None)])
    replies = records(encoded.frames)
    assert [r.job_id for r in replies] == [1, 2, 3, 4]
    assert replies[0].result[1][0] == "internal"
    assert replies[1].result == ("ok", 1.0)
    assert replies[2].result[1][0] == "internal" and replies[2].stamps == {b"recv": 1}
    assert encoded.errors == 3 and [job for job, _ in encoded.replaced] == [1, 3]


def test_frames_split_at_the_limit_and_an_oversized_record_is_too_large() -> None:
    vector = np.ones(100, np.float32)  # a record of 13 + 400 bytes
    batch = [(i, vector, None) for i in range(5)]
    for limit in (5 + 413, 5 + 2 * 413, 5 + 2 * 413 + 412, 5 + 5 * 413):
        encoded = protocol.encode_results(batch, limit)
        per_frame = (limit - 5) // 413
        sizes = [len(joined(f)) for f in encoded.frames]
        assert all(size <= limit for size in sizes), (limit, sizes)
        assert [len(parse_results(joined(f))) for f in encoded.frames] == \
            [per_frame] * (5 // per_frame) + ([5 % per_frame] if 5 % per_frame else [])
        assert [r.job_id for r in records(encoded.frames)] == list(range(5))
        assert encoded.errors == 0
    # One record over the limit alone is too_large; its neighbours are delivered.
    encoded = protocol.encode_results(
        [(1, np.ones(2, np.float32), None), (2, np.ones(500, np.float32), {"recv": 1}),
         (3, 2.0, None)], 400)
    replies = records(encoded.frames)
    assert [(r.job_id, r.result) for r in replies] == [
        (1, ("ok", [1.0, 1.0])), (2, ("error", "too_large")), (3, ("ok", 2.0))]
    assert replies[1].stamps == {b"recv": 1}
    assert encoded.errors == 1 and encoded.replaced[0][0] == 2


def test_logs_answers_and_info_hold_contract_atoms_only() -> None:
    for level in contract.LOG_LEVELS:
        term = decoded(protocol.encode_log(level, "text"))
        assert term[0] == "L" and term[1] == level and bytes(term[2]) == b"text"
    device = CpuBackend(1).open(0).info()
    info = protocol.encode_info({
        "backend": protocol.atom("cpu"), "status": protocol.version_mismatch("text"),
        "reason": "why", "devices": 1, "batching": True, "hooks": ["echo"],
        "device_info": [{**device, "jobs": 0, "compute_capability": (9, 0)}]})
    for term in (decoded(protocol.encode_answer(3, info)),
                 decoded(protocol.encode_call_error(3, "refused"))):
        assert set(atoms_in(term)) <= contract.ATOMS, term
    answer = decoded(protocol.encode_answer(3, info))[2]
    assert answer["status"] == ("version_mismatch", memoryview(b"text"))
    assert answer["device_info"][0]["compute_capability"] == [9, 0]
    assert bytes(answer["hooks"][0]) == b"echo"
    with pytest.raises(ProtocolError):
        protocol.encode_info({"not_a_key_of_the_contract": 1})
    with pytest.raises(ProtocolError):
        protocol.encode_info({"backend": Atom("made_up")})
    with pytest.raises(ProtocolError):
        protocol.encode_info({"status": None})  # would travel as 'undefined'


def test_decode_gives_typed_messages() -> None:
    a = np.arange(5, dtype="<f4")
    frame = bytearray(launch_frame(2**64 - 1, "matmul", [a, Vector(b""), 7, 0, 2**64 - 1],
                                   device=65535, trace=True))
    launch = protocol.decode(frame)
    assert isinstance(launch, Launch) and launch.error is None
    assert (launch.job_id, launch.device, launch.kernel, launch.trace) == (
        2**64 - 1, 65535, "matmul", True)
    assert launch.args[2:] == [7, 0, 2**64 - 1]
    vector = launch.args[0]
    assert vector.dtype == np.dtype("<f4") and vector.tolist() == a.tolist()
    assert np.shares_memory(vector, np.frombuffer(frame, np.uint8))  # a view, no copy
    assert launch.args[1].size == 0
    # Flag bits the protocol does not define are ignored (keep, geometry, program and
    # result_file add fields).
    flags = 0xFF ^ (W.flag_trace | W.flag_keep | W.flag_geometry | W.flag_program
                    | W.flag_result_file)
    plain = protocol.decode(memoryview(launch_frame(1, "reduce", [a], flags=flags)))
    assert isinstance(plain, Launch) and not plain.trace and plain.error is None
    assert plain.keep is None and plain.geometry is None and not plain.general
    assert plain.program is None
    # flag_floats: the f32 vector result wanted as floats (it adds no field)
    assert plain.floats and not launch.floats
    assert protocol.decode(launch_frame(1, "тест", [])).kernel == "тест"
    # flag_result_file: the result slot after the rest, its part size and name
    slotted = protocol.decode(launch_frame(1, "reduce", [a], result_file=("s12", 3 << 20)))
    assert isinstance(slotted, Launch) and slotted.error is None
    assert slotted.result_file == ResultSlot("s12", 3 << 20)
    whole = launch_frame(1, "reduce", [a], result_file=("s12", 3 << 20))
    # (the slot is PartBytes:u64, NameLen:u8 and the name's 3 bytes: 12 at the end)
    for cut, why in ((8, "ends before its result slot"), (1, "name of 3 bytes announced")):
        broken = protocol.decode(whole[:-cut])
        assert isinstance(broken, Launch) and why in (broken.error or ""), broken.error
    call = protocol.decode(etf.encode_bytes((Atom("C"), 9, Atom("erlcuda"), Atom("info"), [])))
    assert call == Call(9, "info", [])
    for bad in (b"", b"\x83\xff", b"Z", bytes((W.launch,)) + bytes(7),
                etf.encode_bytes((Atom("M"), 1)),
                etf.encode_bytes((Atom("C"), 9, Atom("erlcuda"), Atom("info"), 1)),
                etf.encode_bytes((Atom("M"), (Atom("launch"), 5, PID, 0, Atom("reduce"), [],
                                              {})))):
        with pytest.raises(ProtocolError):
            protocol.decode(bad)


# Erlang's frees as OTP 25 writes them (atoms as ATOM_EXT; OTP 26 on writes
# SMALL_ATOM_UTF8_EXT, as etf.encode does): term_to_binary({'C', 0, erlcuda, free, Args}).
_OTP25_FREE_HEAD = bytes([131, 104, 5, 100, 0, 1, 67, 97, 0, 100, 0, 7, 101, 114, 108, 99,
                          117, 100, 97, 100, 0, 4, 102, 114, 101, 101])
OTP25_FREES = [
    # [0, [1000, 5]]: a list of integers
    (_OTP25_FREE_HEAD + bytes([108, 0, 0, 0, 2, 97, 0, 108, 0, 0, 0, 2, 98, 0, 0, 3, 232, 97,
                               5, 106, 106]), (0, [1000, 5])),
    # [0, [3, 5]]: ids below 256 are a string
    (_OTP25_FREE_HEAD + bytes([108, 0, 0, 0, 2, 97, 0, 107, 0, 2, 3, 5, 106]), (0, [3, 5])),
    # [1, [16#1FFFFFFFF]]: a bignum
    (_OTP25_FREE_HEAD + bytes([108, 0, 0, 0, 2, 97, 1, 108, 0, 0, 0, 1, 110, 5, 0, 255, 255,
                               255, 255, 1, 106, 106]), (1, [2**33 - 1])),
    # [0, []]
    (_OTP25_FREE_HEAD + bytes([108, 0, 0, 0, 2, 97, 0, 106, 106]), (0, [])),
]


def free_frame(device: int, ids: list[int]) -> bytes:
    return etf.encode_bytes((Atom("C"), 0, Atom("erlcuda"), Atom("free"), [device, ids]))


@pytest.mark.parametrize(("frame", "args"), OTP25_FREES)
def test_erlangs_free_is_read_without_the_general_decoder(frame: bytes,
                                                          args: tuple[int, list[int]]) -> None:
    term = etf.decode(frame)
    assert (term[4][0], list(term[4][1])) == args  # what the general decoder reads
    assert protocol.decode_free(frame) == args
    assert protocol.decode_free(bytearray(frame)) == args
    assert protocol.decode(memoryview(frame)) == Call(0, "free", list(args))


@given(st.integers(0, 2**16), st.lists(st.integers(0, 2**64 - 1), max_size=20))
def test_every_free_reads_as_the_general_decoder_reads_it(device: int, ids: list[int]) -> None:
    frame = free_frame(device, ids)
    assert protocol.decode_free(frame) == (device, ids)
    assert protocol.decode(frame) == Call(0, "free", [device, ids])


def test_any_other_call_or_a_damaged_free_is_left_to_the_general_decoder() -> None:
    for term in [(Atom("C"), 1, Atom("erlcuda"), Atom("free"), [0, [1]]),
                 (Atom("C"), 0, Atom("erlcuda"), Atom("info"), []),
                 (Atom("C"), 0, Atom("erlcuda"), Atom("free"), [0, [-1]]),
                 (Atom("C"), 0, Atom("erlcuda"), Atom("free"), [-1, [1]]),
                 (Atom("C"), 0, Atom("erlcuda"), Atom("free"), [0, [1.5]]),
                 (Atom("C"), 0, Atom("erlcuda"), Atom("free"), [0, [2**64]]),
                 (Atom("C"), 0, Atom("erlcuda"), Atom("free"), [0, 5]),
                 (Atom("C"), 0, Atom("erlcuda"), Atom("free"), [0, [1], 2]),
                 (Atom("C"), 0, Atom("erlcuda"), Atom("free"), [0]),
                 (Atom("C"), 0, Atom("erlcuda"), Atom("free"), [0, ImproperList([1], 2)])]:
        frame = etf.encode_bytes(term)
        assert protocol.decode_free(frame) is None, term
        call = protocol.decode(frame)  # the general decoder: the call as it is
        assert (call.call_id, call.function, call.args) == (term[1], str(term[3]), term[4])
    for frame, _ in [*OTP25_FREES, (free_frame(3, [7, 300, 2**40]), None)]:
        for cut in range(len(frame)):
            assert protocol.decode_free(frame[:cut]) is None
        assert protocol.decode_free(frame + b"\x6a") is None
        for at in range(len(frame)):  # any other byte: the general decoder's, or refused
            damaged = bytearray(frame)
            damaged[at] ^= 0x40
            got = protocol.decode_free(damaged)
            if got is not None:
                term = etf.decode(damaged)
                assert term[:4] == (Atom("C"), 0, Atom("erlcuda"), Atom("free"))
                assert got == (term[4][0], list(term[4][1]))


def test_vectors_may_sit_at_any_offset() -> None:
    # The kernel name's length decides the alignment of what follows: views may be unaligned.
    rng = np.random.default_rng(2)
    a, b = rng.standard_normal((2, 33), dtype=np.float32)
    for name in ("", "x", "xy", "xyz"):
        frame = bytearray(launch_frame(1, name + "vector_add", [a, b]))
        launch = protocol.decode(frame)
        assert isinstance(launch, Launch)
        got_a, got_b = launch.args
        np.testing.assert_array_equal(got_a + got_b, a + b)
        request = kernels.parse("vector_add", launch.args) if not name else None
        assert request is None or request.elements == 66


@given(st.lists(st.one_of(st.integers(0, 2**64 - 1),
                          st.binary(max_size=40).map(lambda b: b[: len(b) // 4 * 4])),
                max_size=8),
       st.integers(0, 2**64 - 1), st.integers(0, 65535), st.booleans(),
       st.text(max_size=30).filter(lambda t: len(t.encode()) < 256))
def test_any_launch_frame_decodes_to_what_it_says(args: list[Any], job_id: int, device: int,
                                                  trace: bool, kernel: str) -> None:
    launch = protocol.decode(launch_frame(job_id, kernel, args, device=device, trace=trace))
    assert isinstance(launch, Launch) and launch.error is None
    assert (launch.job_id, launch.device, launch.kernel, launch.trace) == (
        job_id, device, kernel, trace)
    assert [x if isinstance(x, int) else x.tobytes() for x in launch.args] == args


@given(st.binary(max_size=80), st.integers(0, 80))
def test_a_damaged_launch_frame_is_an_error_never_an_exception(tail: bytes, cut: int) -> None:
    good = launch_frame(3, "matmul", [np.ones(2, np.float32), np.ones(2, np.float32), 1, 1, 2])
    for frame in (good[:cut], good[:cut] + tail, bytes((W.launch,)) + tail):
        try:
            launch = protocol.decode(frame)
        except ProtocolError:
            # only a frame without a JobId is dropped (or one that is not a launch)
            assert len(frame) < 9 or frame[0] != W.launch
            continue
        assert isinstance(launch, Launch)
        if launch.error is None:  # what parses is whole: its vectors lie inside the frame
            assert all(isinstance(x, int) or x.base is not None for x in launch.args)
        else:
            assert launch.args == []


def test_the_erlang_module_lists_every_worker_atom() -> None:
    source = contract.erlang_module()
    exports = re.search(r"-export\(\[([^\]]*)\]\)", source)
    assert exports is not None
    assert exports[1].split() == ["protocol/0,", "max_frame/0,", "max_elements/0,",
                                  "max_devices/0,", "element_types/0,", "kernels/0,",
                                  "cuda_codes/0,", "reasons/0,", "worker_atoms/0"]
    types = source.split("\nelement_types() -> [", 1)[1].split("].", 1)[0]
    assert [t.strip() for t in types.split(",")] == list(contract.ELEMENT_TYPES)
    body = source.split("\nworker_atoms() ->", 1)[1].split("].", 1)[0].strip(" \n[")
    assert {a.strip().strip("'") for a in body.split(",")} == contract.ATOMS


# -- the real worker -------------------------------------------------------------------------


def every_frame_a_worker_sends() -> tuple[list[bytes], set[str]]:
    """The frames workers send for every kind of request, and the atoms Erlang sent."""
    f32 = np.ones(3, "<f4").tobytes()
    benched = WorkerPipe("--backend", "cpu", record=True, module=BENCH_WORKER)
    try:
        benched.call("echo", [THEIRS])
        benched.call("pure", 0, Atom("reduce"), [f32], 1)
    finally:
        assert benched.close() == 0
    hooked = WorkerPipe("--backend", "cpu", record=True, module=TEST_WORKER)
    try:
        hooked.call("hello")
        hooked.call("info")
        hooked.call("print", "out", "err")
        hooked.call("no_such_call")
        hooked.call("hello", b"0.0.1", 1)  # a mismatch: jobs are refused from here on
        hooked.launch(1, "reduce", [f32])
        hooked.launch(2, "reduce", [f32], trace=True)
        hooked.receive()
        hooked.receive()
    finally:
        assert hooked.close() == 0
    plain = WorkerPipe("--backend", "cpu", record=True)
    try:
        plain.call("hello", erlcuda.__version__.encode(), contract.PROTOCOL)
        plain.call("stall", 0, 1)  # unknown to the shipped worker
        plain.writer.write([b"\x83\xff"])  # undecodable: logged
        plain.send_raw(launch_frame(50, "reduce", [f32])[:-1])  # malformed: bad_args
        jobs: list[tuple[str, list[Any], int]] = [
            ("reduce", [f32], 0), ("vector_add", [f32, f32], 0),
            ("matmul", [f32, f32, 1, 1, 3], 0), ("reduce", [b"\0\0"], 0), ("fft", [f32], 0),
            ("reduce", [f32], 7), ("ok", [f32], 0), (str(THEIRS), [f32], 0)]
        for job_id, (kernel, args, device) in enumerate(jobs):
            plain.launch(job_id, kernel, args, device=device)
        plain.launch(99, str(THEIRS), [f32], trace=True)
        plain.launch(98, "reduce", [f32], trace=True)
        for _ in range(len(jobs) + 3):
            plain.receive()
        plain.call("info")  # after the log line of the undecodable frame
    finally:
        assert plain.close() == 0
    sent = {a for term in benched.sent + hooked.sent + plain.sent for a in atoms_in(term)}
    return benched.received + hooked.received + plain.received, sent


def etf_blobs(frames: list[bytes]) -> list[bytes]:
    """Every ETF term in ``frames``: the ETF frames, and a results frame's reasons and stamps."""
    blobs = []
    for frame in frames:
        if frame[0] == W.results:
            blobs += [blob for reply in parse_results(frame) for blob in reply.etf]
        else:
            blobs.append(frame)
    return blobs


def test_every_frame_of_a_real_worker_holds_contract_atoms_or_erlangs() -> None:
    frames, sent = every_frame_a_worker_sends()
    kinds = {str(etf.decode(f)[0]) for f in frames if f[0] == etf.VERSION}
    assert kinds == {"r", "e", "L"}
    replies = [r for f in frames if f[0] == W.results for r in parse_results(f)]
    assert {r.tag for r in replies} == {W.tag_vector, W.tag_scalar, W.tag_error}
    assert any(r.stamps for r in replies)
    for frame in frames:
        assert frame[0] in (etf.VERSION, W.results)
    for blob in etf_blobs(frames):
        term = etf.decode(blob)
        assert set(atoms_in(term)) <= contract.ATOMS | sent, term
    for reply in replies:  # a job's record names no atom of Erlang's
        for blob in reply.etf:
            assert set(atoms_in(etf.decode(blob))) <= contract.ATOMS


ERL_SAFE = r"""
[Module, Frames | Theirs] = init:get_plain_arguments(),
{ok, erlcuda_contract, Bin} = compile:file(Module, [binary, report]),
{module, _} = code:load_binary(erlcuda_contract, Module, Bin),
_ = erlcuda_contract:worker_atoms(),
_ = [list_to_atom(A) || A <- Theirs],  % what the node sent exists on the node
{ok, Data} = file:read_file(Frames),
Check = fun(Hex) ->
    try binary_to_term(binary:decode_hex(Hex), [safe]) of _ -> ok
    catch C:E -> {C, E}
    end
end,
[io:format("~w~n", [Check(L)]) || L <- binary:split(Data, <<"\n">>, [global, trim_all])],
halt().
"""


def test_erlang_decodes_every_frame_with_safe(tmp_path: Path) -> None:
    if shutil.which("erl") is None:
        pytest.skip("erl is not on PATH")
    frames, sent = every_frame_a_worker_sends()
    frames = etf_blobs(frames)
    module = tmp_path / "erlcuda_contract.erl"
    module.write_text(contract.erlang_module())
    listing = tmp_path / "frames.txt"
    listing.write_text("".join(f.hex() + "\n" for f in frames))
    proc = subprocess.run(
        ["erl", "-noshell", "-eval", ERL_SAFE, "-extra", str(module), str(listing),
         *(sent - contract.ATOMS)], capture_output=True, timeout=120, check=False)
    verdicts = proc.stdout.decode().split()
    assert len(verdicts) == len(frames), proc.stderr.decode()
    assert set(verdicts) == {"ok"}, [v for v in verdicts if v != "ok"][:3]


def test_a_result_file_of_4_gib_or_more_has_a_record() -> None:
    # A result slot over 4 GiB names a part size over 32 bits.
    from erlcuda.shm import FileResult

    nbytes = (1 << 32) + 4
    encoded = protocol.encode_results([(1, FileResult(nbytes, (1 << 32) + (1 << 20)), None)])
    (reply,) = parse_results(b"".join(bytes(c) for c in encoded.frames[0]))
    assert reply.result == ("file", (nbytes, (1 << 32) + (1 << 20)))


@pytest.mark.parametrize("res", [
    1.0, -0.0, float("inf"), 2.5e300,
    np.array([], np.float32), np.array([1.5, -2.0, np.nan], np.float32),
    np.arange(63, dtype=np.float32), np.arange(64, dtype=np.float32),  # 252 and 256 bytes
    np.arange(100_000, dtype=np.float32),
    protocol.Kept(2**64 - 1, "u8", 2**40), protocol.Kept(3, "f64", 2),
    # a result written into its slot
    FileResult(40_000, 1 << 20), FileResult((1 << 32) + 4, (1 << 32) + (1 << 20)),
    # a program's one output
    protocol.Listed((1.5,)), protocol.Listed((np.arange(63, dtype=np.float32),)),
    protocol.Listed((np.arange(100_000, dtype=np.float32),))])
def test_a_lone_jobs_frame_is_the_general_frame(res: Any) -> None:
    job_id = 2**64 - 2
    lone = protocol.encode_results([(job_id, res, None)])
    assert lone.size  # packed in one call, its size known
    (chunks,) = lone.frames
    (general,) = protocol._encode_records([(job_id, res, None)], contract.MAX_FRAME).frames
    assert joined(chunks) == joined(general) and lone.size == len(joined(general))
    # A large vector travels from its own memory, as the general frame's does.
    vector = res.items[0] if isinstance(res, protocol.Listed) else res
    assert any(isinstance(c, memoryview) for c in chunks) == (
        isinstance(vector, np.ndarray) and vector.nbytes >= protocol.SMALL_PAYLOAD)


@pytest.mark.parametrize("res", [
    protocol.TOO_LARGE, np.float32(0.5), 3, np.arange(4.0), np.ones((2, 2), np.float32),
    np.arange(8, dtype=np.float32)[::2], "text", protocol.Kept(1, "f16", 1),
    protocol.Listed((1.0, 2.0)), protocol.Listed((np.arange(4.0),))], ids=repr)
def test_a_lone_result_the_general_encoder_must_judge_is_left_to_it(res: Any) -> None:
    assert protocol._lone(1, res, contract.MAX_FRAME) is None
    assert protocol.encode_results([(1, res, None)]).size == 0


def test_a_lone_result_over_the_frame_limit_is_left_to_the_general_encoder() -> None:
    vector = np.ones(100, np.float32)
    assert protocol.encode_results([(1, vector, None)], max_frame=18 + 400).size == 18 + 400
    over = protocol.encode_results([(1, vector, None)], max_frame=18 + 399)
    assert over.size == 0 and over.replaced  # too_large, from the general encoder
    assert protocol._lone(1, 1.0, max_frame=18 + 7) is None


def test_a_program_launch_carries_its_definition() -> None:
    definition = b"\x83" + bytes(range(40))
    a = np.ones(3, np.float32)
    launch = protocol.decode(launch_frame(4, "chain", [a, 2], program=definition))
    assert isinstance(launch, Launch) and launch.error is None
    assert launch.program == definition and launch.general and launch.args[1] == 2
    frame = launch_frame(4, "chain", [a], program=definition)
    cut = protocol.decode(frame[:-10])
    assert isinstance(cut, Launch) and "program of 41 bytes announced" in (cut.error or "")
    head = protocol.decode(frame[: len(frame) - len(definition) - 2])
    assert isinstance(head, Launch) and "before its program's length" in (head.error or "")


def test_a_table_of_program_runs_is_their_lists_byte_for_byte() -> None:
    ids = np.array([5, 2**64 - 1, 7], dtype=np.uint64)
    columns = [np.array([1.5, 2.5, 3.5], np.float32),
               np.arange(12, dtype=np.float32).reshape(3, 4),
               np.array([1e300, -0.0, 2.0])]
    records = [(int(job), protocol.Listed(tuple(
        float(c[r]) if c.ndim == 1 else c[r] for c in columns)), None)
        for r, job in enumerate(ids)]
    general = protocol._encode_records(records, contract.MAX_FRAME).frames
    table = protocol.encode_list_table(ids, columns, contract.MAX_FRAME)
    assert b"".join(joined(f) for f in table) == b"".join(joined(f) for f in general)
    # a frame limit splits it by records; a column of another type is the caller's
    record = len(joined(general[0])[5:]) // 3
    assert len(protocol.encode_list_table(ids, columns, 5 + 2 * record)) == 2
    assert protocol.encode_list_table(ids, [np.zeros((3, 2), np.float64)], 1 << 20) == []
    assert protocol.encode_list_table(ids, columns, 5 + record - 1) == []


def test_only_a_one_dimensional_f32_vector_goes_as_floats() -> None:
    # A launch with flag_floats: its f32 vector result as the ETF of its floats, whatever
    # they hold (Erlang refuses an infinity or NaN, as it does in a raw vector); any other
    # result as ever.
    v = np.array([1.5, -0.0, np.inf], np.float32)
    floats = protocol.as_floats(v)
    assert type(floats) is protocol.Floats
    frame = protocol.encode_results([(9, floats, None)]).frames[0]
    record = b"".join(bytes(c) for c in frame)
    payload = etf.float_list(v)
    assert record == (struct.pack(">BIQBI", W.results, 1, 9, W.tag_floats, len(payload))
                      + bytes(payload))
    assert record == b"".join(bytes(c) for c in protocol._encode_records(
        [(9, floats, None)], contract.MAX_FRAME).frames[0])  # the lone encoder's bytes
    for other in (np.ones((2, 2), np.float32), np.ones(3, np.float64), 2.5,
                  protocol.internal("no")):
        assert protocol.as_floats(other) is other
    # floats take more than twice the raw bytes: a vector whose floats would not fit a
    # frame goes raw, as it fits
    fits = 5 + 13 + 7 + 9 * 3
    assert type(protocol.as_floats(v, fits)) is protocol.Floats
    assert protocol.as_floats(v, fits - 1) is v
