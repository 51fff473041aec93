"""The messages, and the guard that keeps every atom the worker sends within the contract.

Erlang decodes the worker's frames with ``binary_to_term(B, [safe])``, which fails on an atom
the node has never seen: one stray atom would make a reply undecodable and lose a job. The
node knows the contract's atoms (``erlcuda_contract:worker_atoms/0``) and those it sent.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from erlcuda import contract, etf, protocol
from erlcuda.backends.base import ERROR_CODES, BackendError
from erlcuda.backends.cpu import CpuBackend
from erlcuda.etf import Atom, ImproperList
from erlcuda.protocol import Call, Failure, Launch, ProtocolError
from workerpipe import PID, WorkerPipe

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
    vector = np.array([1.0, 2.0], np.float32)
    return [
        protocol.result(vector), protocol.result(vector, binary=True), protocol.result(2.5),
        protocol.result(np.array([np.inf], np.float32)), protocol.result(float("nan")),
        protocol.bad_args("A: not a number"), protocol.bad_device(THEIRS),
        protocol.bad_device((THEIRS, [1])), protocol.unknown_kernel(THEIRS),
        protocol.backend_unavailable("no GPU"), protocol.internal("bug"),
        protocol.version_mismatch("0.1.0 and 0.2.0"), protocol.TOO_LARGE,
        *(protocol.cuda_error(code, "message") for code in (*contract.CUDA_CODES, "other")),
    ]


def test_every_reply_holds_contract_atoms_or_erlangs() -> None:
    reply_to, job_id = PID, (THEIRS, 7)
    for res in every_result():
        for chunks in (protocol.encode_reply(reply_to, job_id, res),
                       protocol.encode_traced_reply(reply_to, job_id, res, {"recv": 1})):
            term = decoded(chunks)
            assert set(atoms_in(term)) <= contract.ATOMS | {THEIRS}, term
            assert term[1] == PID and term[2][1] == job_id


def test_results_and_their_terms() -> None:
    assert decoded(protocol.encode_reply(PID, 1, protocol.result(3.0)))[2][2] == ("ok", 3.0)
    as_list = decoded(protocol.encode_reply(PID, 1, protocol.result(np.ones(2, np.float32))))
    assert as_list[2][2] == ("ok", [1.0, 1.0])
    raw = decoded(protocol.encode_reply(PID, 1, protocol.result(np.ones(2, np.float32),
                                                                binary=True)))
    assert bytes(raw[2][2][1]) == np.ones(2, "<f4").tobytes()
    nan = decoded(protocol.encode_reply(PID, 1, protocol.result(np.array([np.nan]))))
    assert nan[2][2][0] == "error" and nan[2][2][1][0] == "non_finite"
    assert protocol.TOO_LARGE.term == "too_large"
    traced = decoded(protocol.encode_traced_reply(PID, 1, protocol.TOO_LARGE, {"recv": 5}))
    assert traced[2][3] == {b"recv": 5}


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
    opts = {Atom("format"): Atom("binary"), Atom("trace"): True}
    launch = protocol.decode(etf.encode_bytes(
        (Atom("M"), (Atom("launch"), 5, PID, 0, Atom("reduce"), [b"\0" * 4], opts))))
    assert launch == Launch(5, PID, 0, Atom("reduce"), [memoryview(b"\0" * 4)], True, True)
    assert isinstance(launch, Launch) and launch.kernel_name == "reduce"
    plain = protocol.decode(etf.encode_bytes(
        (Atom("M"), (Atom("launch"), 5, PID, 0, b"reduce", [], {}))))
    assert isinstance(plain, Launch) and plain.kernel_name is None and not plain.binary
    call = protocol.decode(etf.encode_bytes((Atom("C"), 9, Atom("erlcuda"), Atom("info"), [])))
    assert call == Call(9, "info", [])
    for frame in (b"\x83\xff", etf.encode_bytes((Atom("M"), 1)),
                  etf.encode_bytes((Atom("C"), 9, Atom("erlcuda"), Atom("info"), 1))):
        with pytest.raises(ProtocolError):
            protocol.decode(frame)


def test_the_erlang_module_lists_every_worker_atom() -> None:
    source = contract.erlang_module()
    exports = re.search(r"-export\(\[([^\]]*)\]\)", source)
    assert exports is not None
    assert exports[1].split() == ["protocol/0,", "max_frame/0,", "max_elements/0,",
                                  "kernels/0,", "cuda_codes/0,", "reasons/0,", "worker_atoms/0"]
    body = source.split("\nworker_atoms() ->", 1)[1].split("].", 1)[0].strip(" \n[")
    assert {a.strip().strip("'") for a in body.split(",")} == contract.ATOMS


# -- the real worker -------------------------------------------------------------------------


def every_frame_a_worker_sends() -> tuple[list[bytes], set[str]]:
    """The frames workers send for every kind of request, and the atoms Erlang sent."""
    f32 = np.ones(3, "<f4").tobytes()
    hooked = WorkerPipe("--backend", "cpu", "--test-hooks", "--bench-hooks", record=True)
    try:
        hooked.call("hello")
        hooked.call("info")
        hooked.call("print", "out", "err")
        hooked.call("echo", [THEIRS])
        hooked.call("pure", 0, Atom("reduce"), [f32], 1)
        hooked.call("no_such_call")
        hooked.call("hello", b"0.0.1", 1)  # a mismatch: jobs are refused from here on
        hooked.launch(1, "reduce", [f32])
        hooked.receive()
    finally:
        assert hooked.close() == 0
    plain = WorkerPipe("--backend", "cpu", record=True)
    try:
        plain.call("hello", b"0.2.0", contract.PROTOCOL)
        plain.call("stall", 0, 1)  # disabled
        plain.writer.write([b"\x83\xff"])  # undecodable: logged
        jobs: list[tuple[str, list[Any], Any]] = [
            ("reduce", [f32], 0), ("vector_add", [f32, f32], 0),
            ("matmul", [f32, f32, 1, 1, 3], 0), ("reduce", [b"\0\0"], 0), ("fft", [f32], 0),
            ("reduce", [f32], 7), ("reduce", [f32], THEIRS)]
        for job_id, (kernel, args, device) in enumerate(jobs):
            plain.launch(job_id, kernel, args, device=device)
        plain.send((Atom("M"), (Atom("launch"), 99, PID, 0, THEIRS, [f32],
                                {Atom("trace"): True})))
        for _ in range(len(jobs) + 1):
            plain.receive()
        plain.call("info")  # after the log line of the undecodable frame
    finally:
        assert plain.close() == 0
    sent = {a for term in hooked.sent + plain.sent for a in atoms_in(term)}
    return hooked.received + plain.received, sent


def test_every_frame_of_a_real_worker_holds_contract_atoms_or_erlangs() -> None:
    frames, sent = every_frame_a_worker_sends()
    kinds = {str(etf.decode(f)[0]) for f in frames}
    assert kinds == {"M", "r", "e", "L"}
    for frame in frames:
        term = etf.decode(frame)
        assert set(atoms_in(term)) <= contract.ATOMS | sent, term


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
