"""erlcuda's wire contract: kernel catalogue, error codes and atoms, read from ``contract.json``.

The JSON file is the one declaration. The worker reads it here; the Erlang side gets the
module ``erlcuda_contract`` written from it at build time::

    python3 python/erlcuda/contract.py --erlang erlang/erlcuda_contract.erl

(rebar3 runs that before it compiles). This module imports nothing from the package, so the
build can run it as a plain script.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "ATOMS",
    "CUDA_CODES",
    "ELEMENT_TYPES",
    "KERNELS",
    "LOG_LEVELS",
    "MAX_DEVICES",
    "MAX_ELEMENTS",
    "MAX_FRAME",
    "PROTOCOL",
    "REASONS",
    "STATUS_REASONS",
    "WIRE",
    "KernelSpec",
    "Param",
    "Wire",
    "erlang_module",
]

SOURCE = Path(__file__).with_name("contract.json")


@dataclass(frozen=True, slots=True)
class Param:
    """One argument: a ``vector`` of ``type``, a ``dim`` (a non-negative integer) or, for a
    user kernel, a ``scalar`` of ``type``.

    ``length`` names the params whose product is the vector's length: a dim counts with its
    value, a vector with its length; empty means any length. ``access`` says whether a
    kernel reads a vector (``in``), writes it (``out``) or both (``inout``).
    """

    name: str
    kind: str
    type: str | None = None
    length: tuple[str, ...] = ()
    access: str = "in"


@dataclass(frozen=True, slots=True)
class KernelSpec:
    """A kernel of the catalogue. ``types`` are the element types it runs in: its vectors
    and its vector result all share the one a launch picks (``types[0]`` by default).
    A ``general`` kernel (buffer operations) never takes the batched f32 path."""

    name: str
    doc: str
    params: tuple[Param, ...]
    result: Param
    types: tuple[str, ...] = ("f32",)
    general: bool = False

    @property
    def arity(self) -> int:
        return len(self.params)


def _param(raw: dict[str, Any], name: str = "result") -> Param:
    return Param(name=raw.get("name", name), kind=raw["kind"], type=raw.get("type"),
                 length=tuple(raw.get("length", ())), access=raw.get("access", "in"))


def _load(path: Path = SOURCE) -> dict[str, Any]:
    with path.open(encoding="utf-8") as f:
        return json.load(f)


_RAW = _load()

PROTOCOL: int = _RAW["protocol"]
MAX_FRAME: int = _RAW["max_frame"]
MAX_ELEMENTS: int = _RAW["max_elements"]
MAX_DEVICES: int = _RAW["max_devices"]
ELEMENT_TYPES: tuple[str, ...] = tuple(_RAW["element_types"])
KERNELS: dict[str, KernelSpec] = {
    k["name"]: KernelSpec(k["name"], k["doc"], tuple(_param(p) for p in k["params"]),
                          _param(k["result"]), tuple(k.get("types", ("f32",))),
                          bool(k.get("general", False)))
    for k in _RAW["kernels"]
}
CUDA_CODES: tuple[str, ...] = tuple(_RAW["cuda_codes"])
#: The tags of ``{error, Reason}`` in a job's reply (each one in erlcuda's ``reason()`` type).
REASONS: tuple[str, ...] = tuple(_RAW["reasons"])
#: The tags of a worker's ``status`` other than ``ok``, in its hello and info.
STATUS_REASONS: tuple[str, ...] = tuple(_RAW["status_reasons"])
LOG_LEVELS: tuple[str, ...] = tuple(_RAW["log_levels"])
#: Every atom the worker may send: Erlang decodes with ``binary_to_term(B, [safe])``, which
#: refuses atoms the node does not know, and ``erlcuda_contract`` makes these exist.
ATOMS: frozenset[str] = frozenset(
    [*_RAW["wire_atoms"], *REASONS, *STATUS_REASONS, *CUDA_CODES, *LOG_LEVELS,
     *_RAW["info_keys"], *KERNELS]
)


@dataclass(frozen=True, slots=True)
class Wire:
    """The bytes that mark the hot path's binary frames (see ``wire.about`` in the JSON)."""

    launch: int
    batch: int
    results: int
    flag_trace: int
    flag_result_file: int
    flag_keep: int
    flag_geometry: int
    flag_program: int
    flag_floats: int
    arg_vector: int
    arg_dim: int
    arg_file: int
    arg_handle: int
    arg_scalar: int
    arg_empty: int
    tag_vector: int
    tag_scalar: int
    tag_error: int
    tag_traced: int
    tag_file: int
    tag_typed: int
    tag_handle: int
    tag_list: int
    tag_floats: int

    def macros(self) -> dict[str, int]:
        """The Erlang macro names (``WIRE_...``) and their values."""
        return {f"WIRE_{name.upper()}": getattr(self, name) for name in self.__slots__}


_WIRE = _RAW["wire"]
WIRE = Wire(
    launch=_WIRE["launch"],
    batch=_WIRE["batch"],
    results=_WIRE["results"],
    flag_trace=_WIRE["flags"]["trace"],
    flag_result_file=_WIRE["flags"]["result_file"],
    flag_keep=_WIRE["flags"]["keep"],
    flag_geometry=_WIRE["flags"]["geometry"],
    flag_program=_WIRE["flags"]["program"],
    flag_floats=_WIRE["flags"]["floats"],
    arg_vector=_WIRE["arg"]["vector"],
    arg_dim=_WIRE["arg"]["dim"],
    arg_file=_WIRE["arg"]["file"],
    arg_handle=_WIRE["arg"]["handle"],
    arg_scalar=_WIRE["arg"]["scalar"],
    arg_empty=_WIRE["arg"]["empty"],
    tag_vector=_WIRE["tag"]["vector"],
    tag_scalar=_WIRE["tag"]["scalar"],
    tag_error=_WIRE["tag"]["error"],
    tag_traced=_WIRE["tag"]["traced"],
    tag_file=_WIRE["tag"]["file"],
    tag_typed=_WIRE["tag"]["typed"],
    tag_handle=_WIRE["tag"]["handle"],
    tag_list=_WIRE["tag"]["list"],
    tag_floats=_WIRE["tag"]["floats"],
)


# -- the Erlang module -------------------------------------------------------------------------


def _atom(name: str) -> str:
    plain = name[:1].islower() and all(c.isalnum() or c == "_" for c in name)
    return name if plain else "'" + name.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _binary(text: str) -> str:
    return '<<"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"/utf8>>'


def _erl_param(p: Param, with_name: bool = True) -> str:
    fields = [f"kind => {_atom(p.kind)}"]
    if with_name:
        fields.insert(0, f"name => {_binary(p.name)}")
    if p.type is not None:
        fields.append(f"type => {_atom(p.type)}")
    fields.append("length => [" + ", ".join(_binary(n) for n in p.length) + "]")
    if p.kind == "vector" and with_name:
        fields.append(f"access => {_atom(p.access)}")
    return "#{" + ", ".join(fields) + "}"


def _union(names: Sequence[str]) -> str:
    return " | ".join(_atom(n) for n in names)


def _element_clauses() -> str:
    """The clauses of the element-type functions, in the order of ``element_types`` (a
    type's index on the wire is its place there)."""
    info = _RAW["element_info"]
    size = ";\n".join(f"element_size({_atom(t)}) -> {info[t]['size']}" for t in ELEMENT_TYPES)
    index = ";\n".join(f"element_index({_atom(t)}) -> {i}" for i, t in enumerate(ELEMENT_TYPES))
    byte = "".join(f"element_type({i}) -> {_atom(t)};\n" for i, t in enumerate(ELEMENT_TYPES))
    ranges = ";\n".join(
        f"element_range({_atom(t)}) -> "
        + (f"{{{info[t]['min']}, {info[t]['max']}}}" if info[t]["kind"] == "int" else "float")
        for t in ELEMENT_TYPES
    )
    return f"""%% @doc Bytes per element.
-spec element_size(element_type()) -> pos_integer().
{size}.

%% @doc A type's byte on the wire: its place in the element types.
-spec element_index(element_type()) -> 0..{len(ELEMENT_TYPES) - 1}.
{index}.

%% @doc The type a byte on the wire names; `error' for none.
-spec element_type(byte()) -> element_type() | error.
{byte}element_type(_) -> error.

%% @doc The values an integer type holds, `{{Min, Max}}'; `float' for a float type.
-spec element_range(element_type()) -> {{integer(), integer()}} | float.
{ranges}.
"""


def erlang_module() -> str:
    """The source of ``erlcuda_contract.erl``."""
    return _erl_head() + _erl_sizes() + _erl_tables()


def _erl_head() -> str:
    return f"""%% @private
%% Generated from python/erlcuda/contract.json by python/erlcuda/contract.py at build time.
%% Do not edit: change the JSON file, and both sides follow.
-module(erlcuda_contract).

-export([protocol/0, max_frame/0, max_elements/0, max_devices/0, element_types/0, kernels/0,
         cuda_codes/0, reasons/0, worker_atoms/0]).
%% Element types and limits.
-export([element_size/1, element_index/1, element_type/1, element_range/1, shm_parts/0,
         kernel_name_bytes/0, log_levels/0]).

-export_type([builtin_kernel/0, cuda_code/0, element_type/0, spec/0, param/0]).

-type builtin_kernel() :: {_union(list(KERNELS))}.
-type cuda_code() :: {_union(CUDA_CODES)}.
-type element_type() :: {_union(ELEMENT_TYPES)}.
-type param() :: #{{name => binary(), kind := vector | dim | scalar,
                   type => element_type(), length := [binary()],
                   access => in | out | inout}}.
-type spec() :: #{{name := atom(), doc := binary(), params := [param()], result := param(),
                  types := [element_type(), ...], general := boolean(), atom() => term()}}.

"""


def _erl_sizes() -> str:
    return f"""%% @doc The version of the wire protocol; the worker must speak the same.
-spec protocol() -> pos_integer().
protocol() -> {PROTOCOL}.

%% @doc The largest frame a 4-byte length prefix can describe.
-spec max_frame() -> pos_integer().
max_frame() -> {MAX_FRAME}.

%% @doc The most elements one operand may have.
-spec max_elements() -> pos_integer().
max_elements() -> {MAX_ELEMENTS}.

%% @doc The most devices a worker may have (and the cpu backend may be given).
-spec max_devices() -> pos_integer().
max_devices() -> {MAX_DEVICES}.

%% @doc The element types, in the order of their index on the wire.
-spec element_types() -> [element_type()].
element_types() -> [{", ".join(_atom(t) for t in ELEMENT_TYPES)}].

{_element_clauses()}
"""


def _erl_tables() -> str:
    kernels = ",\n     ".join(
        f"#{{name => {_atom(k.name)},\n       doc => {_binary(k.doc)},\n"
        f"       params => [" + ",\n                  ".join(_erl_param(p) for p in k.params)
        + f"],\n       result => {_erl_param(k.result, with_name=False)},\n"
        f"       types => [" + ", ".join(_atom(t) for t in k.types) + "],\n"
        f"       general => {'true' if k.general else 'false'}}}"
        for k in KERNELS.values()
    )
    atoms = ", ".join(_atom(a) for a in sorted(ATOMS))
    limits = _RAW["limits"]
    return f"""\
%% @doc The most part files one vector in shared memory is cut into; a result record that
%% names more is no result the worker wrote.
-spec shm_parts() -> pos_integer().
shm_parts() -> {limits["shm_parts"]}.

%% @doc The most bytes of a kernel's name: the launch frame gives its length one byte.
-spec kernel_name_bytes() -> pos_integer().
kernel_name_bytes() -> {limits["kernel_name_bytes"]}.

%% @doc The levels of the worker's log lines (each one of logger's).
-spec log_levels() -> [logger:level()].
log_levels() -> [{", ".join(_atom(x) for x in LOG_LEVELS)}].

%% @doc The built-in kernels.
-spec kernels() -> [spec()].
kernels() ->
    [{kernels}].

%% @doc The codes a `{{cuda, Code, Message}}' error can carry.
-spec cuda_codes() -> [cuda_code()].
cuda_codes() -> [{", ".join(_atom(c) for c in CUDA_CODES)}].

%% @doc The tags of the error reasons the worker sends in a job's reply.
-spec reasons() -> [atom()].
reasons() -> [{", ".join(_atom(r) for r in REASONS)}].

%% @doc Every atom the worker may send (listing them makes them exist for `[safe]').
-spec worker_atoms() -> [atom()].
worker_atoms() ->
    [{atoms}].
"""


def erlang_header() -> str:
    """The source of ``erlcuda_contract.hrl``: the wire's bytes, and each element type's
    index and size, as macros, for binary patterns and guards (which cannot call
    functions)."""
    lines = [f"-define({name}, {value})." for name, value in WIRE.macros().items()]
    info = _RAW["element_info"]
    for index, t in enumerate(ELEMENT_TYPES):
        lines.append(f"-define(ELEMENT_INDEX_{t.upper()}, {index}).")
        lines.append(f"-define(ELEMENT_SIZE_{t.upper()}, {info[t]['size']}).")
    return ("%% Generated from python/erlcuda/contract.json by python/erlcuda/contract.py at "
            "build time.\n%% Do not edit: change the JSON file, and both sides follow.\n"
            + "\n".join(lines) + "\n")


def _write(path: Path, text: str) -> None:
    # Rewritten only when it changes, so rebar3 recompiles only then.
    if not path.is_file() or path.read_text(encoding="utf-8") != text:
        path.write_text(text, encoding="utf-8")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="write erlcuda's contract for the Erlang side")
    parser.add_argument("--erlang", required=True, type=Path, metavar="FILE.erl")
    parser.add_argument("--erlang-header", type=Path, metavar="FILE.hrl")
    args = parser.parse_args(argv)
    _write(args.erlang, erlang_module())
    if args.erlang_header is not None:
        _write(args.erlang_header, erlang_header())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
