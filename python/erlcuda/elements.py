"""The element types and limits of ``contract.json`` (``element_info``, ``limits``), read.

Every table of the worker that names an element type's numpy dtype, C type, struct format
or range is derived from here, so that the contract is the one place a type is described;
Erlang reads the same file at its build (``erlcuda_contract``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import numpy as np

from .contract import ELEMENT_TYPES, SOURCE


@dataclass(frozen=True, slots=True)
class Element:
    """One element type: its size in bytes, numpy dtype, C type, ``struct`` format, kind
    (``float`` or ``int``) and, for an int, its range."""

    name: str
    size: int
    dtype: np.dtype[Any]
    c_type: str
    struct: str
    kind: str
    low: int | None = None
    high: int | None = None


def _read() -> tuple[dict[str, Element], dict[str, int]]:
    with SOURCE.open(encoding="utf-8") as f:
        raw = json.load(f)
    info = raw["element_info"]
    elements = {
        name: Element(name, info[name]["size"], np.dtype(info[name]["numpy"]),
                      info[name]["c_type"], info[name]["struct"], info[name]["kind"],
                      info[name].get("min"), info[name].get("max"))
        for name in ELEMENT_TYPES}
    for element in elements.values():
        if element.dtype.itemsize != element.size:
            raise ValueError(f"contract.json: {element.name} is {element.size} bytes but "
                             f"its numpy type {element.dtype.str} is not")
    return elements, dict(raw["limits"])


_ELEMENTS, _LIMITS = _read()

#: Every element type by name, in the contract's order (its index is the wire's ElemType).
ELEMENTS: dict[str, Element] = _ELEMENTS
#: numpy dtype, C type and ``struct`` format of each element type.
DTYPES: dict[str, np.dtype[Any]] = {name: e.dtype for name, e in ELEMENTS.items()}
C_TYPES: dict[str, str] = {name: e.c_type for name, e in ELEMENTS.items()}
#: The element type of each numpy dtype.
TYPE_OF: dict[np.dtype[Any], str] = {e.dtype: name for name, e in ELEMENTS.items()}
STRUCT_FORMATS: dict[str, str] = {name: e.struct for name, e in ELEMENTS.items()}
#: The parts a shared-memory operand is cut into at most (Erlang cuts it so).
SHM_PARTS: int = _LIMITS["shm_parts"]
#: The bytes of a kernel's (or a user module's) name at most.
KERNEL_NAME_BYTES: int = _LIMITS["kernel_name_bytes"]


def in_range(name: str, value: int) -> bool:
    """Whether the integer ``value`` fits element type ``name`` (any value fits a float)."""
    element = ELEMENTS[name]
    if element.low is None or element.high is None:
        return True
    return element.low <= value <= element.high
