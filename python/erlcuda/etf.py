"""The Erlang External Term Format (ETF): decode and encode the terms the port carries.

Mapping (decode -> Python -> encode):

- integers <-> ``int``; floats <-> ``float`` (finite only: Erlang has no NaN or infinity)
- atoms <-> ``Atom``, except ``true``/``false`` <-> ``bool``; ``None`` encodes as ``undefined``
- tuples <-> ``tuple``; proper lists <-> ``list`` (STRING_EXT decodes to a list of ints)
- improper lists <-> ``ImproperList``; maps <-> ``dict``
- binaries decode to zero-copy ``memoryview`` slices of the input (``bytes`` inside map keys);
  ``bytes``, ``bytearray``, ``memoryview``, numpy arrays and ``str`` (UTF-8) encode as binaries
- pids, ports, references, funs, exports and bit-binaries <-> ``Opaque`` (kept verbatim)

``decode`` treats its input as hostile: every length is checked against the bytes left before
anything is allocated, nesting is bounded, what the decoded objects may cost is bounded by the
input's size (``DECODE_COST_FACTOR``), and the only exception it raises is ``CodecError``.
"""

from __future__ import annotations

import functools
import math
import re
import struct
import zlib
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = [
    "Atom",
    "CodecError",
    "ImproperList",
    "Opaque",
    "decode",
    "encode",
    "encode_bytes",
    "float_list",
]

VERSION = 131

NEW_FLOAT_EXT = 70
BIT_BINARY_EXT = 77
COMPRESSED = 80
NEW_PID_EXT = 88
NEW_PORT_EXT = 89
NEWER_REFERENCE_EXT = 90
SMALL_INTEGER_EXT = 97
INTEGER_EXT = 98
FLOAT_EXT = 99
ATOM_EXT = 100
REFERENCE_EXT = 101
PORT_EXT = 102
PID_EXT = 103
SMALL_TUPLE_EXT = 104
LARGE_TUPLE_EXT = 105
NIL_EXT = 106
STRING_EXT = 107
LIST_EXT = 108
BINARY_EXT = 109
SMALL_BIG_EXT = 110
LARGE_BIG_EXT = 111
NEW_FUN_EXT = 112
EXPORT_EXT = 113
NEW_REFERENCE_EXT = 114
SMALL_ATOM_EXT = 115
MAP_EXT = 116
ATOM_UTF8_EXT = 118
SMALL_ATOM_UTF8_EXT = 119
V4_PORT_EXT = 120

#: Largest big integer accepted by ``decode``, in digit bytes.
MAX_BIG_BYTES = 1 << 20
#: deflate cannot expand more than this, so a larger declared size is a lie.
MAX_DEFLATE_RATIO = 1032
#: Payloads at least this long travel as their own chunk instead of being copied.
SMALL_PAYLOAD = 256

#: ``decode`` builds Python objects of at most this many bytes per input byte, plus
#: ``DECODE_COST_BASE``: past that it raises ``CodecError``. Each byte can become far more
#: (a one-byte ``[]`` is a 56-byte list plus its 8-byte slot), so a frame of 67 MB of empty
#: lists would take 4.7 GB. 8 keeps what erlcuda carries: a float in a list costs 32 bytes
#: for its 9, an INTEGER_EXT 36 for its 5, a binary 192 bytes however long it is.
DECODE_COST_FACTOR = 8
DECODE_COST_BASE = 1 << 20

# Approximate sizes of what decode builds (CPython, 64-bit), charged before building it.
# Slots in a container are charged with the container; cached objects (small ints, known
# atoms, True/False) cost nothing more.
_SLOT = 8
_LIST = 56
_TUPLE = 40
_DICT = 224
_DICT_ENTRY = 40
_FLOAT = 24
_INT = 32
_VIEW = 184  # a memoryview, whatever its length
_BYTES = 33
_ATOM = 100
_OPAQUE = 48 + _BYTES
_IMPROPER = 48 + _LIST


class CodecError(ValueError):
    """The bytes are not one valid term, or the value cannot be encoded."""


class Atom(str):
    """An Erlang atom. Compares and hashes like the ``str`` of its name."""

    __slots__ = ()

    def __repr__(self) -> str:
        return f"Atom({str.__repr__(self)})"


@dataclass(frozen=True, slots=True)
class Opaque:
    """A term Python does not interpret (pid, port, reference, fun, export, bit-binary).

    ``data`` is its exact external encoding without the version byte; it encodes verbatim.
    """

    data: bytes


@dataclass(frozen=True, slots=True)
class ImproperList:
    """A list whose tail is not ``[]``: ``[items... | tail]``."""

    items: list[Any]
    tail: Any


# --------------------------------------------------------------------------------------------
# decode

_u16 = struct.Struct(">H").unpack_from
_u32 = struct.Struct(">I").unpack_from
_i32 = struct.Struct(">i").unpack_from
_f64 = struct.Struct(">d").unpack_from

# Erlang writes FLOAT_EXT with "%.20e"; Python's float() also takes "inf", "1_0" and such.
_FLOAT_TEXT = re.compile(rb"\s*[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?\s*")

_ATOM_TAGS = frozenset((ATOM_EXT, SMALL_ATOM_EXT, ATOM_UTF8_EXT, SMALL_ATOM_UTF8_EXT))

# Decoded atoms by (is_utf8, name bytes); bounded so hostile input cannot grow it forever.
_ATOM_CACHE: dict[tuple[bool, bytes], Any] = {
    (utf8, name): value
    for utf8 in (False, True)
    for name, value in ((b"true", True), (b"false", False))
}
_ATOM_CACHE_MAX = 4096


def decode(data: bytes | bytearray | memoryview, *, max_depth: int = 64,
           max_cost: int | None = None) -> Any:
    """Decode exactly one term (starting with the version byte 131) from ``data``.

    Binaries in the result are memoryviews into ``data`` (or into the decompressed buffer).
    ``max_cost`` bounds the approximate bytes of the Python objects built; by default
    ``DECODE_COST_FACTOR`` per input byte (decompressed) plus ``DECODE_COST_BASE``.
    """
    try:
        buf = memoryview(data)
        if not buf.c_contiguous:
            raise CodecError("input is not a contiguous buffer")
        if buf.format != "B" or buf.ndim != 1:
            buf = buf.cast("B")
        if len(buf) < 2 or buf[0] != VERSION:
            raise CodecError("not an external term (missing version byte 131)")
        if buf[1] == COMPRESSED:
            buf = _decompress(buf)
            pos = 0
        else:
            pos = 1
        if max_cost is None:
            max_cost = DECODE_COST_FACTOR * len(buf) + DECODE_COST_BASE
        term, pos = _dec(buf, pos, max_depth, False, [max_cost])
        if pos != len(buf):
            raise CodecError(f"{len(buf) - pos} trailing bytes after the term")
        return term
    except CodecError:
        raise
    except RecursionError as e:
        raise CodecError("term nested too deeply") from e
    except (struct.error, IndexError, ValueError, OverflowError, zlib.error) as e:
        raise CodecError(f"malformed term: {e}") from e


def _decompress(buf: memoryview) -> memoryview:
    if len(buf) < 6:
        raise CodecError("truncated compressed term")
    size = _u32(buf, 2)[0]
    packed = buf[6:]
    if size == 0 or size > MAX_DEFLATE_RATIO * len(packed):
        raise CodecError(f"implausible uncompressed size {size} for {len(packed)} bytes")
    z = zlib.decompressobj()
    out = z.decompress(packed, size)
    if not z.eof:
        # The output may have hit max_length just before the end-of-stream marker.
        if z.decompress(z.unconsumed_tail, 1) or not z.eof:
            raise CodecError("compressed data is truncated or larger than declared")
    if len(out) != size:
        raise CodecError(f"compressed term is {len(out)} bytes, declared {size}")
    if z.unused_data:
        raise CodecError("trailing bytes after the compressed term")
    return memoryview(out)


def _over() -> None:
    # Charges are inlined (budget[0] -= cost; check): a call per object costs more than the check.
    raise CodecError("the term would take too much memory for its size "
                     f"(over {DECODE_COST_FACTOR} bytes of objects per input byte)")


def _atom(buf: memoryview, pos: int, n: int, utf8: bool, budget: list[int]) -> Any:
    end = pos + n
    if end > len(buf):
        raise CodecError("truncated atom")
    raw = bytes(buf[pos:end])
    key = (utf8, raw)
    atom = _ATOM_CACHE.get(key)
    if atom is None:
        budget[0] -= _ATOM + n
        if budget[0] < 0:
            _over()
        atom = Atom(raw.decode("utf-8" if utf8 else "latin-1"))
        if len(atom) > 255:
            raise CodecError(f"atom of {len(atom)} characters is over Erlang's 255 limit")
        if len(_ATOM_CACHE) < _ATOM_CACHE_MAX:
            _ATOM_CACHE[key] = atom
    return atom


def _dec(buf: memoryview, pos: int, depth: int, key: bool, budget: list[int]) -> tuple[Any, int]:
    """Decode the term at ``pos``; return it and the position after it.

    ``depth`` is how many more levels of nesting are allowed; ``key`` is set inside map keys,
    where binaries become ``bytes`` so that the key is hashable. ``budget[0]`` is what the
    objects still to be built may cost; each is charged before it is built.
    """
    tag = buf[pos]
    pos += 1
    # The tags of the calls Erlang sends, commonest first; the rest in _dec_rare.
    if tag == SMALL_ATOM_UTF8_EXT or tag == ATOM_EXT:
        if tag == ATOM_EXT:
            n = _u16(buf, pos)[0]
            pos += 2
        else:
            n = buf[pos]
            pos += 1
        end = pos + n
        if end > len(buf):
            raise CodecError("truncated atom")
        atom = _ATOM_CACHE.get((tag == SMALL_ATOM_UTF8_EXT, buf[pos:end].tobytes()))
        if atom is not None:
            return atom, end
        return _atom(buf, pos, n, tag == SMALL_ATOM_UTF8_EXT, budget), end
    if tag == SMALL_TUPLE_EXT:
        return _dec_tuple(buf, pos + 1, buf[pos], depth, key, budget)
    if tag == SMALL_INTEGER_EXT:
        return buf[pos], pos + 1
    if tag == BINARY_EXT:
        n = _u32(buf, pos)[0]
        pos += 4
        end = pos + n
        if end > len(buf):
            raise CodecError(f"binary size {n} exceeds the input")
        if key:
            budget[0] -= _BYTES + n
            if budget[0] < 0:
                _over()
            return bytes(buf[pos:end]), end
        budget[0] -= _VIEW
        if budget[0] < 0:
            _over()
        return buf[pos:end], end
    if tag == INTEGER_EXT:
        budget[0] -= _INT
        if budget[0] < 0:
            _over()
        return _i32(buf, pos)[0], pos + 4
    if tag == NIL_EXT:
        budget[0] -= _LIST
        if budget[0] < 0:
            _over()
        return [], pos
    if tag == LIST_EXT:
        return _dec_list(buf, pos, depth, key, budget)
    if tag == MAP_EXT:
        return _dec_map(buf, pos, depth, budget)
    return _dec_rare(buf, tag, pos, depth, key, budget)

def _dec_rare(buf: memoryview, tag: int, pos: int, depth: int, key: bool,
              budget: list[int]) -> tuple[Any, int]:
    """``_dec`` for the rarer tags (floats, large tuples, older atom encodings, strings,
    i.e. lists of bytes, big integers) and the opaque ones, off the common chain of tests."""
    if tag == LARGE_TUPLE_EXT:
        return _dec_tuple(buf, pos + 4, _u32(buf, pos)[0], depth, key, budget)
    if tag == ATOM_UTF8_EXT:
        n = _u16(buf, pos)[0]
        return _atom(buf, pos + 2, n, True, budget), pos + 2 + n
    if tag == SMALL_ATOM_EXT:
        n = buf[pos]
        return _atom(buf, pos + 1, n, False, budget), pos + 1 + n
    if tag == STRING_EXT:
        n = _u16(buf, pos)[0]
        pos += 2
        if n > len(buf) - pos:
            raise CodecError(f"string length {n} exceeds the input")
        budget[0] -= _LIST + _SLOT * n
        if budget[0] < 0:
            _over()
        return list(buf[pos : pos + n]), pos + n
    if tag in _NUMBER_TAGS:
        return _dec_number(buf, tag, pos, budget)
    end = _opaque_end(buf, tag, pos, depth, budget)
    budget[0] -= _OPAQUE + end - pos
    if budget[0] < 0:
        _over()
    return Opaque(bytes(buf[pos - 1 : end])), end


_NUMBER_TAGS = frozenset({NEW_FLOAT_EXT, FLOAT_EXT, SMALL_BIG_EXT, LARGE_BIG_EXT})


def _dec_number(buf: memoryview, tag: int, pos: int, budget: list[int]) -> tuple[Any, int]:
    """A float (new or old encoding) or a big integer, for ``_dec_rare``."""
    if tag == NEW_FLOAT_EXT:
        budget[0] -= _FLOAT
        if budget[0] < 0:
            _over()
        value = _f64(buf, pos)[0]
        if not math.isfinite(value):
            raise CodecError("non-finite float")
        return value, pos + 8
    if tag == SMALL_BIG_EXT or tag == LARGE_BIG_EXT:
        if tag == SMALL_BIG_EXT:
            n = buf[pos]
            pos += 1
        else:
            n = _u32(buf, pos)[0]
            pos += 4
        if n > MAX_BIG_BYTES:
            raise CodecError(f"big integer of {n} bytes is over the limit")
        sign = buf[pos]
        pos += 1
        end = pos + n
        if end > len(buf):
            raise CodecError("truncated big integer")
        if sign > 1:
            raise CodecError(f"bad big integer sign byte {sign}")
        budget[0] -= _INT + n
        if budget[0] < 0:
            _over()
        value = int.from_bytes(buf[pos:end], "little")
        return (-value if sign else value), end
    if tag == FLOAT_EXT:
        end = pos + 31
        if end > len(buf):
            raise CodecError("truncated FLOAT_EXT")
        budget[0] -= _FLOAT
        if budget[0] < 0:
            _over()
        text = bytes(buf[pos:end]).split(b"\0", 1)[0]
        if not _FLOAT_TEXT.fullmatch(text):
            raise CodecError(f"bad FLOAT_EXT text {text!r}")
        value = float(text)
        if not math.isfinite(value):
            raise CodecError("non-finite float")
        return value, end
    raise CodecError(f"tag {tag} is not a number's")

def _dec_items(buf: memoryview, pos: int, n: int, depth: int, key: bool,
               budget: list[int]) -> tuple[list[Any], int]:
    """The ``n`` terms of a tuple or list, one level deeper."""
    if depth <= 0:
        raise CodecError("term nested too deeply")
    items: list[Any] = []
    for _ in range(n):
        item, pos = _dec(buf, pos, depth - 1, key, budget)
        items.append(item)
    return items, pos


def _dec_tuple(buf: memoryview, pos: int, n: int, depth: int, key: bool,
               budget: list[int]) -> tuple[Any, int]:
    if n > len(buf) - pos:
        raise CodecError(f"tuple arity {n} exceeds the input")
    budget[0] -= _TUPLE + _SLOT * n
    if budget[0] < 0:
        _over()
    items, pos = _dec_items(buf, pos, n, depth, key, budget)
    return tuple(items), pos


def _dec_list(buf: memoryview, pos: int, depth: int, key: bool,
              budget: list[int]) -> tuple[Any, int]:
    n = _u32(buf, pos)[0]
    pos += 4
    if n >= len(buf) - pos:  # n elements and a tail, at least one byte each
        raise CodecError(f"list length {n} exceeds the input")
    budget[0] -= _LIST + _SLOT * n
    if budget[0] < 0:
        _over()
    items, pos = _dec_items(buf, pos, n, depth, key, budget)
    tail, pos = _dec(buf, pos, depth - 1, key, budget)
    # Erlang never writes these, but reads them: a list of no items is just its tail, and a
    # list or string tail still makes a proper list.
    if not items:
        return tail, pos
    if type(tail) is list:
        items.extend(tail)
        return items, pos
    if type(tail) is ImproperList:
        budget[0] -= _IMPROPER + _SLOT * len(tail.items)
        if budget[0] < 0:
            _over()
        return ImproperList(items + tail.items, tail.tail), pos
    budget[0] -= _IMPROPER
    if budget[0] < 0:
        _over()
    return ImproperList(items, tail), pos


def _dec_map(buf: memoryview, pos: int, depth: int,
             budget: list[int]) -> tuple[dict[Any, Any], int]:
    n = _u32(buf, pos)[0]
    pos += 4
    if n > (len(buf) - pos) // 2:
        raise CodecError(f"map arity {n} exceeds the input")
    if depth <= 0:
        raise CodecError("term nested too deeply")
    budget[0] -= _DICT + _DICT_ENTRY * n
    if budget[0] < 0:
        _over()
    result: dict[Any, Any] = {}
    for _ in range(n):
        k, pos = _dec(buf, pos, depth - 1, True, budget)
        v, pos = _dec(buf, pos, depth - 1, False, budget)
        try:
            result[k] = v
        except TypeError as e:
            raise CodecError(f"map key cannot be a Python dict key: {e}") from e
    if len(result) != n:
        # Erlang keys that Python considers equal (1, 1.0 and true) would be silently merged.
        raise CodecError("map has keys that collide in Python")
    return result, pos


def _atom_end(buf: memoryview, pos: int) -> int:
    """Skip an atom (the node or module name inside an opaque term)."""
    tag = buf[pos]
    if tag == SMALL_ATOM_UTF8_EXT or tag == SMALL_ATOM_EXT:
        end = pos + 2 + buf[pos + 1]
    elif tag == ATOM_EXT or tag == ATOM_UTF8_EXT:
        end = pos + 3 + _u16(buf, pos + 1)[0]
    else:
        raise CodecError(f"expected an atom, found tag {tag}")
    if end > len(buf):
        raise CodecError("truncated atom")
    return end


def _opaque_end(buf: memoryview, tag: int, pos: int, depth: int, budget: list[int]) -> int:
    """Return where the opaque term whose body starts at ``pos`` ends."""
    if tag == NEW_PID_EXT:
        end = _atom_end(buf, pos) + 12
    elif tag == PID_EXT:
        end = _atom_end(buf, pos) + 9
    elif tag == NEWER_REFERENCE_EXT or tag == NEW_REFERENCE_EXT:
        n = _u16(buf, pos)[0]
        creation = 4 if tag == NEWER_REFERENCE_EXT else 1
        end = _atom_end(buf, pos + 2) + creation + 4 * n
    elif tag == REFERENCE_EXT:
        end = _atom_end(buf, pos) + 5
    elif tag == NEW_PORT_EXT:
        end = _atom_end(buf, pos) + 8
    elif tag == PORT_EXT:
        end = _atom_end(buf, pos) + 5
    elif tag == V4_PORT_EXT:
        end = _atom_end(buf, pos) + 12
    elif tag == EXPORT_EXT:
        end = _atom_end(buf, _atom_end(buf, pos))
        if buf[end] != SMALL_INTEGER_EXT:
            raise CodecError("export arity is not a small integer")
        end += 2
    elif tag == NEW_FUN_EXT:
        end = _fun_end(buf, pos, depth, budget)
    elif tag == BIT_BINARY_EXT:
        n = _u32(buf, pos)[0]
        bits = buf[pos + 4]
        if bits > 8 or (bits == 0) != (n == 0):
            raise CodecError(f"bad bit count {bits} in a bit-binary")
        end = pos + 5 + n
    elif tag == COMPRESSED:
        raise CodecError("compressed term inside a term")
    else:
        raise CodecError(f"unknown or unsupported term tag {tag}")
    if end > len(buf):
        raise CodecError(f"truncated term (tag {tag})")
    return end


def _fun_end(buf: memoryview, pos: int, depth: int, budget: list[int]) -> int:
    # Size Arity Uniq[16] Index NumFree Module OldIndex OldUniq Pid FreeVars...; Size counts
    # itself. Walk the fields anyway so that a wrong Size cannot pass unnoticed.
    size: int = _u32(buf, pos)[0]
    num_free: int = _u32(buf, pos + 25)[0]
    end = pos + size
    if size < 29 or end > len(buf):
        raise CodecError("bad NEW_FUN_EXT size")
    if num_free > end - pos:
        raise CodecError("bad NEW_FUN_EXT free variable count")
    if depth <= 0:
        raise CodecError("term nested too deeply")
    p = _atom_end(buf, pos + 29)
    for _ in range(3 + num_free):  # OldIndex, OldUniq, Pid, free variables
        _, p = _dec(buf, p, depth - 1, False, budget)
    if p != end:
        raise CodecError("NEW_FUN_EXT size does not match its contents")
    return end


# --------------------------------------------------------------------------------------------
# encode

_pack_int = struct.Struct(">Bi").pack
_pack_float = struct.Struct(">Bd").pack
_pack_tag_u32 = struct.Struct(">BI").pack
_pack_small_big = struct.Struct(">BBB").pack
_pack_large_big = struct.Struct(">BIB").pack

_SMALL_INTS = [bytes((SMALL_INTEGER_EXT, i)) for i in range(256)]
_NIL = bytes((NIL_EXT,))

_ATOM_BYTES: dict[str, bytes] = {}
_ATOM_BYTES_MAX = 4096


def encode(term: Any) -> list[bytes | memoryview]:
    """Encode ``term``; the chunks' concatenation is the external format, version byte first.

    Large binaries and float lists are chunks of their own that share the caller's memory:
    keep them unmodified until the chunks are written.
    """
    cur = bytearray(b"\x83")
    chunks: list[bytes | memoryview] = []
    try:
        _enc(term, cur, chunks)
    except RecursionError as e:
        raise CodecError("term nested too deeply (or cyclic)") from e
    if cur:
        chunks.append(bytes(cur))
    return chunks


#: A float list's head (version, LIST_EXT, Count) and each of its items (NEW_FLOAT_EXT and
#: the value as a big-endian double).
FLOAT_LIST_HEAD = struct.Struct(">BBI")
FLOAT_ITEM = np.dtype([("tag", "u1"), ("value", ">f8")])
#: Float lists up to this long start from a copy of a blank kept for their length.
_BLANK_ITEMS = 1 << 14


def float_list_size(n: int) -> int:
    """The bytes of the ETF of a list of ``n`` floats."""
    return FLOAT_LIST_HEAD.size + FLOAT_ITEM.itemsize * n + 1


def float_list_dtype(n: int) -> np.dtype:
    """The ETF of a list of ``n`` floats as one numpy record: its head's fields, ``items``
    (each ``tag`` and ``value``) and the closing ``nil``."""
    return np.dtype([("version", "u1"), ("list", "u1"), ("count", ">u4"),
                     ("items", FLOAT_ITEM, (n,)), ("nil", "u1")])


def blank_float_lists(records: np.ndarray, n: int) -> None:
    """Write every byte of ``records`` (of ``float_list_dtype(n)``) but the values."""
    records["version"], records["list"], records["count"] = VERSION, LIST_EXT, n
    records["items"]["tag"] = NEW_FLOAT_EXT
    records["nil"] = NIL_EXT


def float_list(values: np.ndarray) -> bytearray:
    """The ETF of the list of ``values`` (a 1-D array of reals) as floats, made at once by
    numpy: what ``encode_bytes`` makes of that list, without a Python float each (an empty
    one too is a LIST_EXT, of no items, which ``binary_to_term`` reads as []). An infinity
    or NaN is written as it is, which ``binary_to_term`` refuses."""
    n = int(values.size)
    out = bytearray(_blank(n)) if n <= _BLANK_ITEMS else _made_blank(n)
    np.frombuffer(out, FLOAT_ITEM, n, FLOAT_LIST_HEAD.size)["value"] = values
    return out


@functools.lru_cache(maxsize=16)
def _blank(n: int) -> bytes:
    return bytes(_made_blank(n))


def _made_blank(n: int) -> bytearray:
    """A float list of ``n`` items, every byte but the values written."""
    out = bytearray(float_list_size(n))
    blank_float_lists(np.frombuffer(out, float_list_dtype(n), 1), n)
    return out


def encode_bytes(term: Any) -> bytes:
    """Encode ``term`` into one ``bytes`` object."""
    return b"".join(encode(term))


def _atom_bytes(name: str) -> bytes:
    encoded = _ATOM_BYTES.get(name)
    if encoded is None:
        if len(name) > 255:
            raise CodecError(f"atom of {len(name)} characters is over Erlang's 255 limit")
        raw = name.encode("utf-8")
        n = len(raw)
        if n <= 255:
            encoded = bytes((SMALL_ATOM_UTF8_EXT, n)) + raw
        else:
            encoded = bytes((ATOM_UTF8_EXT, n >> 8, n & 0xFF)) + raw
        if len(_ATOM_BYTES) < _ATOM_BYTES_MAX:
            _ATOM_BYTES[name] = encoded
    return encoded


def _payload(header: bytes, data: bytes | memoryview, n: int, cur: bytearray,
             chunks: list[bytes | memoryview]) -> None:
    cur += header
    if n < SMALL_PAYLOAD:
        cur += data
    else:
        chunks.append(bytes(cur))
        cur.clear()
        chunks.append(data)


def _binary(data: bytes | memoryview, n: int, cur: bytearray,
            chunks: list[bytes | memoryview]) -> None:
    if n > 0xFFFFFFFF:
        raise CodecError(f"binary of {n} bytes is over the 4 GiB limit")
    _payload(_pack_tag_u32(BINARY_EXT, n), data, n, cur, chunks)


def _array_bytes(array: np.ndarray) -> memoryview:
    if array.dtype.hasobject:
        raise CodecError("cannot encode a numpy array of Python objects")
    # Non-contiguous arrays are copied; contiguous ones are viewed as raw bytes in place.
    return np.ascontiguousarray(array).reshape(-1).view(np.uint8).data


def _enc(t: Any, cur: bytearray, chunks: list[bytes | memoryview]) -> None:
    cls = type(t)
    if cls is Atom:
        cur += _atom_bytes(t)
    elif cls is tuple:
        n = len(t)
        if n < 256:
            cur += bytes((SMALL_TUPLE_EXT, n))
        else:
            cur += _pack_tag_u32(LARGE_TUPLE_EXT, n)
        for item in t:
            _enc(item, cur, chunks)
    elif cls is int:
        if 0 <= t < 256:
            cur += _SMALL_INTS[t]
        elif -0x80000000 <= t <= 0x7FFFFFFF:
            cur += _pack_int(INTEGER_EXT, t)
        else:
            _enc_big(t, cur, chunks)
    elif cls is float:
        if not math.isfinite(t):
            raise CodecError(f"Erlang has no float {t}")
        cur += _pack_float(NEW_FLOAT_EXT, t)
    elif cls is Opaque:
        cur += t.data
    elif cls is bool:
        cur += _atom_bytes("true" if t else "false")
    elif cls is list:
        if t:
            cur += _pack_tag_u32(LIST_EXT, len(t))
            for item in t:
                _enc(item, cur, chunks)
        cur += _NIL
    elif cls is bytes:
        _binary(t, len(t), cur, chunks)
    elif cls is np.ndarray:
        data = _array_bytes(t)
        _binary(data, data.nbytes, cur, chunks)
    elif cls is str:
        raw = t.encode("utf-8")
        _binary(raw, len(raw), cur, chunks)
    elif cls is dict:
        cur += _pack_tag_u32(MAP_EXT, len(t))
        for k, v in t.items():
            _enc(k, cur, chunks)
            _enc(v, cur, chunks)
    elif t is None:
        cur += _atom_bytes("undefined")
    elif cls is memoryview or cls is bytearray:
        view = memoryview(t)
        if not view.c_contiguous:
            view = memoryview(view.tobytes())
        if view.format != "B" or view.ndim != 1:
            view = view.cast("B")
        _binary(view, view.nbytes, cur, chunks)
    else:
        _enc_other(t, cur, chunks)


def _enc_other(t: Any, cur: bytearray, chunks: list[bytes | memoryview]) -> None:
    """Improper lists, subclasses of the supported types, and numpy scalars."""
    if type(t) is ImproperList:
        if not t.items:
            raise CodecError("an improper list needs at least one item")
        cur += _pack_tag_u32(LIST_EXT, len(t.items))
        for item in t.items:
            _enc(item, cur, chunks)
        _enc(t.tail, cur, chunks)
    elif isinstance(t, Atom):
        _enc(Atom(t), cur, chunks)
    elif isinstance(t, bool | np.bool_):
        _enc(bool(t), cur, chunks)
    elif isinstance(t, int | np.integer):
        _enc(int(t), cur, chunks)
    elif isinstance(t, float | np.floating):
        _enc(float(t), cur, chunks)
    elif isinstance(t, str):
        _enc(str(t), cur, chunks)
    elif isinstance(t, bytes | bytearray | memoryview):
        _enc(memoryview(t), cur, chunks)
    elif isinstance(t, np.ndarray):
        data = _array_bytes(t)
        _binary(data, data.nbytes, cur, chunks)
    elif isinstance(t, tuple):
        _enc(tuple(t), cur, chunks)
    elif isinstance(t, list):
        _enc(list(t), cur, chunks)
    elif isinstance(t, dict):
        _enc(dict(t), cur, chunks)
    else:
        raise CodecError(f"cannot encode a {type(t).__name__} as an Erlang term")


def _enc_big(t: int, cur: bytearray, chunks: list[bytes | memoryview]) -> None:
    magnitude = -t if t < 0 else t
    n = (magnitude.bit_length() + 7) // 8
    digits = magnitude.to_bytes(n, "little")
    sign = 1 if t < 0 else 0
    if n < 256:
        header = _pack_small_big(SMALL_BIG_EXT, n, sign)
    elif n <= 0xFFFFFFFF:
        header = _pack_large_big(LARGE_BIG_EXT, n, sign)
    else:
        raise CodecError("integer too large")
    _payload(header, digits, n, cur, chunks)
