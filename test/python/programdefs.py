"""Programs' definitions as Erlang's erlcuda_program writes them, and launches of them."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from erlcuda import etf, general
from erlcuda.etf import Atom
from erlcuda.general import ElementwiseBody, Registry, UserKernel
from erlcuda.kernels import Plan
from erlcuda.protocol import Launch


def inp(i: int) -> tuple[Atom, int]:
    """Input ``i`` (from 0)."""
    return (Atom("in"), i)


def step(j: int, k: int = 0) -> tuple[Atom, int, int]:
    """Result ``k`` of step ``j`` (both from 0)."""
    return (Atom("step"), j, k)


def definition(ninputs: int, steps: Sequence[tuple[str, list[Any]]],
               outputs: Sequence[tuple[Atom, int, int]],
               options: Sequence[str] = ("fuse", "graph"), version: int = 1) -> bytes:
    """The ETF of ``{erlcuda_program, Version, NInputs, Steps, Outputs, Options}``."""
    return etf.encode_bytes((Atom("erlcuda_program"), version, ninputs,
                             [(kernel.encode(), list(args)) for kernel, args in steps],
                             list(outputs), [Atom(o) for o in options]))


def chain(links: int = 10, total: bool = True, **kw: Any) -> bytes:
    """``links`` vector_adds of input 0, each adding input 1 to the last, then its sum:
    outputs the sum (if ``total``) and the last vector."""
    steps: list[tuple[str, list[Any]]] = [("vector_add", [inp(0), inp(1)])]
    steps += [("vector_add", [step(j), inp(1)]) for j in range(links - 1)]
    outputs = [step(links - 1)]
    if total:
        steps.append(("reduce", [step(links - 1)]))
        outputs.insert(0, step(links))
    return definition(2, steps, outputs, **kw)


def launch(raw: bytes, args: list[Any], job_id: int = 1, keep: tuple[int, ...] | None = None,
           kernel: str = "prog") -> Launch:
    return Launch(job_id, 0, kernel, args, general=True, program=raw, keep=keep)


def check(raw: bytes, args: list[Any], registry: Registry | None = None,
          held: Any = None, **kw: Any) -> Plan:
    return general.check(launch(raw, args, **kw), registry or Registry(), held)


def saxpy_registry() -> Registry:
    """A registry with the elementwise kernel ``saxpy(x, a, y) -> z = a * x + y`` (f32) and
    the raw kernel ``scale(inout f32, scalar f32)``."""
    registry = Registry()
    body = ElementwiseBody((("x", "f32", "vector"), ("a", "f32", "scalar"),
                            ("y", "f32", "vector")), (("z", "f32"),), "z = a * x + y", ())
    registry.install("saxpy", [UserKernel(
        "saxpy", "saxpy", (("in", "f32"), ("scalar", "f32"), ("in", "f32"), ("out", "f32")),
        "elementwise", 3, body)])
    registry.install("scaling", [UserKernel(
        "scale", "scaling", (("inout", "f32"), ("scalar", "f32")))])
    return registry


def f32(values: Any) -> np.ndarray:
    return np.asarray(values, dtype=np.float32)
