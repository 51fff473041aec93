"""erlcuda's messages, in erlport's shapes: the one place that turns them into ETF and back.

Erlang -> worker (``decode``):
    {'M', {launch, JobId, ReplyTo, Device, Kernel, Args, Opts}}   a job (an erlport message)
    {'C', Id, erlcuda, Function, Args}                             a control call
Worker -> Erlang:
    {'M', ReplyTo, {erlcuda, JobId, Result}}           a result            ``encode_reply``
    {'M', ReplyTo, {erlcuda, JobId, Result, Stamps}}   a traced result     ``encode_traced_reply``
    {'r', Id, Answer}                                  a call's answer     ``encode_answer``
    {'e', Id, Text}                                    a call refused      ``encode_call_error``
    {'L', Level, Text}                                 a log line          ``encode_log``

Result is ``{ok, Value}`` or ``{error, Reason}`` (``Ok``, ``Failure``); hello's and info's
Answer is a map (``encode_info``).

``ReplyTo`` (a pid or an alias) and ``JobId`` travel as opaque terms. Erlang decodes with
``binary_to_term(B, [safe])``, which refuses atoms the node does not know, so every atom the
worker makes goes through ``atom``, which accepts only the contract's (``contract.ATOMS``,
which ``erlcuda_contract:worker_atoms/0`` makes exist); any other atom in a frame is one
Erlang sent. Text travels as UTF-8 binaries.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from . import contract, etf

__all__ = [
    "OK",
    "TOO_LARGE",
    "Call",
    "Failure",
    "Launch",
    "Ok",
    "ProtocolError",
    "Result",
    "atom",
    "backend_unavailable",
    "bad_args",
    "bad_device",
    "cuda_error",
    "decode",
    "encode_answer",
    "encode_call_error",
    "encode_info",
    "encode_log",
    "encode_reply",
    "encode_traced_reply",
    "internal",
    "result",
    "unknown_kernel",
    "version_mismatch",
]

Chunks = list[bytes | memoryview]


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
_ERROR = atom("error")
_ERLCUDA = atom("erlcuda")
_MESSAGE = atom("M")
_CALL = atom("C")
_ANSWER = atom("r")
_CALL_ERROR = atom("e")
_LOG = atom("L")
_LAUNCH = atom("launch")
_FORMAT = atom("format")
_BINARY = atom("binary")
_TRACE = atom("trace")


# -- Erlang -> worker ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Launch:
    """A job. ``device``, ``kernel`` and ``args`` are as sent: the worker checks them."""

    job_id: Any
    reply_to: Any
    device: Any
    kernel: Any
    args: Any
    binary: bool = False  # {format, binary}: a vector result as an f32 binary
    trace: bool = False  # {trace, true}: the reply carries the worker's timestamps

    @property
    def kernel_name(self) -> str | None:
        """The kernel's name when it was sent as an atom."""
        return str(self.kernel) if isinstance(self.kernel, etf.Atom) else None


@dataclass(frozen=True, slots=True)
class Call:
    """A control call; ``function`` is the atom's name (an unknown one for other terms)."""

    call_id: Any
    function: str
    args: list[Any]


Message = Launch | Call


def decode(frame: bytes | bytearray | memoryview) -> Message:
    """The message in ``frame``; ``ProtocolError`` for anything else."""
    try:
        term = etf.decode(frame)
    except etf.CodecError as exc:
        raise ProtocolError(f"undecodable term: {exc}") from exc
    if type(term) is tuple and term:
        if (len(term) == 2 and term[0] == _MESSAGE and type(term[1]) is tuple
                and len(term[1]) == 7 and term[1][0] == _LAUNCH and type(term[1][6]) is dict):
            _, job_id, reply_to, device, kernel, args, opts = term[1]
            return Launch(job_id, reply_to, device, kernel, args,
                          binary=opts.get(_FORMAT) == _BINARY, trace=opts.get(_TRACE) is True)
        if len(term) == 5 and term[0] == _CALL and type(term[4]) is list:
            _, call_id, _module, function, args = term
            name = str(function) if isinstance(function, etf.Atom) else f"{function!r:.80}"
            return Call(call_id, name, args)
    raise ProtocolError(f"not an erlcuda message: {term!r:.200}")


# -- results ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Ok:
    """``{ok, Value}``: a vector as a list of floats (or an f32 binary), a scalar as a float."""

    value: np.ndarray | float
    binary: bool = False


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


Result = Ok | Failure

TOO_LARGE = Failure("too_large")


def bad_args(text: str) -> Failure:
    return Failure("bad_args", (text,))


def bad_device(device: Any) -> Failure:
    """``{bad_device, Device}``, with the device term as Erlang sent it."""
    return Failure("bad_device", (device,))


def unknown_kernel(kernel: Any) -> Failure:
    """``{unknown_kernel, Kernel}``, with the kernel term as Erlang sent it."""
    return Failure("unknown_kernel", (kernel,))


def backend_unavailable(text: str) -> Failure:
    return Failure("backend_unavailable", (text,))


def cuda_error(code: str, text: str) -> Failure:
    """``{cuda, Code, Text}``; a code outside ``contract.CUDA_CODES`` travels as ``unknown``."""
    return Failure("cuda", (atom(code if code in contract.CUDA_CODES else "unknown"), text))


def internal(text: str) -> Failure:
    return Failure("internal", (text,))


def non_finite(text: str) -> Failure:
    return Failure("non_finite", (text,))


def version_mismatch(text: str) -> Failure:
    return Failure("version_mismatch", (text,))


_NON_FINITE_VECTOR = ("the result holds an infinity or NaN, which Erlang floats cannot hold; "
                      "{format, binary} returns the raw f32 values")


def result(value: np.ndarray | float, *, binary: bool = False) -> Result:
    """A kernel's value as the job's result.

    Erlang floats hold no infinity or NaN: such a result is ``{error, {non_finite, _}}``
    unless it travels as an f32 binary, which carries any bit pattern.
    """
    if isinstance(value, np.ndarray):
        if not binary and not np.isfinite(value).all():
            return non_finite(_NON_FINITE_VECTOR)
        return Ok(value, binary)
    if not math.isfinite(value):
        return non_finite(f"the result is {value}; Erlang floats cannot hold it")
    return Ok(float(value))


def _result_term(res: Result) -> Any:
    if isinstance(res, Failure):
        return (_ERROR, res.term)
    value = res.value
    if isinstance(value, np.ndarray):
        return (OK, value if res.binary else etf.FloatList(value))
    return (OK, value)


# -- worker -> Erlang ------------------------------------------------------------------------


def _encode(term: Any) -> Chunks:
    try:
        return etf.encode(term)
    except etf.CodecError as exc:
        raise ProtocolError(f"not encodable: {exc}") from exc


def encode_reply(reply_to: Any, job_id: Any, res: Result) -> Chunks:
    """``{'M', ReplyTo, {erlcuda, JobId, Result}}``. Arrays are sent from their own memory."""
    return _encode((_MESSAGE, reply_to, (_ERLCUDA, job_id, _result_term(res))))


def encode_traced_reply(reply_to: Any, job_id: Any, res: Result,
                        stamps: Mapping[str, int]) -> Chunks:
    """``{'M', ReplyTo, {erlcuda, JobId, Result, Stamps}}``: the worker's timestamps
    (``perf_counter_ns``) in a map whose keys are binaries, for the benchmarks."""
    return _encode((_MESSAGE, reply_to, (_ERLCUDA, job_id, _result_term(res), dict(stamps))))


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
