"""Hypothesis strategies for Erlang terms, as the Python values ``erlcuda.etf`` round-trips.

Values are chosen so that ``decode(encode(v))`` gives ``v`` back (binaries come back as
memoryviews; compare with ``normalize``): no ``None``, no ``str`` (both encode to other
types), no atoms named ``true``/``false`` (they decode to bools), finite floats only.
"""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from erlcuda.etf import Atom, ImproperList, Opaque

# A pid as OTP 25 encodes it (NEW_PID_EXT, node 'nonode@nohost').
PID = Opaque(bytes.fromhex("5864000D6E6F6E6F6465406E6F686F7374000000090000000000000000"))

atoms = (
    st.text(max_size=20)
    .filter(lambda s: s not in ("true", "false"))
    .map(Atom)
)

# Encoding boundaries: INTEGER_EXT/SMALL_BIG_EXT, then SMALL_BIG_EXT/LARGE_BIG_EXT.
_BOUNDARIES = [2**31 - 1, 2**31, -(2**31), -(2**31) - 1, 2**2040 - 1, 2**2040, -(2**2040)]


def _big(digits: bytes, negative: bool) -> int:
    value = int.from_bytes(digits, "little")
    return -value if negative else value


# Big bounds are built with .map so that the strategies' reprs stay short.
ints = st.one_of(
    st.integers(min_value=0, max_value=255),
    st.integers(min_value=-(2**31), max_value=2**31 - 1),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.builds(_big, st.binary(min_size=1, max_size=400), st.booleans()),
    st.sampled_from(range(len(_BOUNDARIES))).map(lambda i: _BOUNDARIES[i]),
)

floats = st.floats(allow_nan=False, allow_infinity=False)

binaries = st.binary(max_size=600)

scalars = st.one_of(atoms, ints, floats, binaries, st.booleans(), st.just(PID))

# Map keys must be hashable in Python (binaries decode as bytes there).
keys = st.recursive(
    st.one_of(atoms, ints, floats, binaries, st.booleans()),
    lambda inner: st.tuples(inner, inner) | st.lists(inner, max_size=3).map(tuple),
    max_leaves=6,
)


def _containers(inner: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.one_of(
        st.lists(inner, max_size=6),
        st.lists(inner, max_size=6).map(tuple),
        st.dictionaries(keys, inner, max_size=5),
        # The tail is a scalar: a list tail would make a longer list, proper or not.
        st.builds(ImproperList, st.lists(inner, min_size=1, max_size=4), scalars),
    )


terms = st.recursive(scalars, _containers, max_leaves=25)


def normalize(term: Any) -> Any:
    """``term`` with every memoryview replaced by ``bytes``."""
    if isinstance(term, memoryview):
        return term.tobytes()
    if isinstance(term, list):
        return [normalize(t) for t in term]
    if isinstance(term, tuple):
        return tuple(normalize(t) for t in term)
    if isinstance(term, dict):
        return {k: normalize(v) for k, v in term.items()}
    if isinstance(term, ImproperList):
        return ImproperList(normalize(term.items), normalize(term.tail))
    return term


def same(a: Any, b: Any) -> bool:
    """Equal in value *and* type, recursively (so ``1 != True`` and ``0.0 != -0.0``)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, list | tuple):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(
            same(k, _key(b, k)) and same(v, b[k]) for k, v in a.items()
        )
    if isinstance(a, ImproperList):
        return same(a.items, b.items) and same(a.tail, b.tail)
    if isinstance(a, float):
        return a == b and str(a) == str(b)
    return bool(a == b)


def _key(d: dict[Any, Any], k: Any) -> Any:
    return next(key for key in d if key == k)
