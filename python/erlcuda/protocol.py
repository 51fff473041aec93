"""erlcuda's messages, in erlport's shapes, and how results and errors are spelled.

Erlang -> worker:
    {'M', {launch, JobId, ReplyTo, Device, Kernel, Args, Opts}}   a job (an erlport message)
    {'C', Id, erlcuda, Function, Args}                             a control call
Worker -> Erlang:
    {'M', ReplyTo, {erlcuda, JobId, Result}}                       a result (an erlport cast)
    {'r', Id, Result} | {'e', Id, Error}                           a control call's answer
    {'L', Level, Text}                                             a log line for Erlang's logger

``ReplyTo`` (a pid or an alias) and ``JobId`` travel as opaque terms. Every atom sent to
Erlang is one of the fixed set below or one Erlang itself sent: Erlang decodes with
``binary_to_term(B, [safe])`` and never makes atoms from worker text.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .etf import Atom, FloatList

OK = Atom("ok")
ERROR = Atom("error")
ERLCUDA = Atom("erlcuda")
MESSAGE = Atom("M")
CALL = Atom("C")
RESULT = Atom("r")
CALL_ERROR = Atom("e")
LOG = Atom("L")
LAUNCH = Atom("launch")
LIST = Atom("list")
FORMAT = Atom("format")
TRACE = Atom("trace")
BINARY = Atom("binary")

BAD_ARGS = Atom("bad_args")
BAD_DEVICE = Atom("bad_device")
UNKNOWN_KERNEL = Atom("unknown_kernel")
BACKEND_UNAVAILABLE = Atom("backend_unavailable")
CUDA = Atom("cuda")
TOO_LARGE = Atom("too_large")
INTERNAL = Atom("internal")
NON_FINITE = Atom("non_finite")

LEVELS = {name: Atom(name) for name in ("debug", "info", "notice", "warning", "error")}


def error(reason: Any) -> tuple[Atom, Any]:
    return (ERROR, reason)


def encode_result(value: np.ndarray | float, fmt: Atom) -> tuple[Atom, Any]:
    """``{ok, Value}``: a vector as a list of floats or an f32 binary, a scalar as a float.

    Erlang floats hold no infinity or NaN: such a result is ``{error, {non_finite, _}}``
    unless it travels as an f32 binary, which carries any bit pattern.
    """
    if isinstance(value, np.ndarray):
        if fmt == BINARY:
            return (OK, value)
        if not np.isfinite(value).all():
            return (ERROR, (NON_FINITE, _NON_FINITE_VECTOR))
        return (OK, FloatList(value))
    if not math.isfinite(value):
        return (ERROR, (NON_FINITE, f"the result is {value}; Erlang floats cannot hold it"))
    return (OK, float(value))


_NON_FINITE_VECTOR = ("the result holds an infinity or NaN, which Erlang floats cannot hold; "
                      "{format, binary} returns the raw f32 values")


def reply(reply_to: Any, job_id: Any, result: Any) -> tuple[Atom, Any, Any]:
    return (MESSAGE, reply_to, (ERLCUDA, job_id, result))


def traced_reply(reply_to: Any, job_id: Any, result: Any, trace: dict[str, int]) -> Any:
    """A reply carrying the worker's timestamps (``perf_counter_ns``), for the benchmarks."""
    # keys travel as binaries: Erlang makes no atoms from worker data
    return (MESSAGE, reply_to, (ERLCUDA, job_id, result, dict(trace)))
