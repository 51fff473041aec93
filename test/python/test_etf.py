"""The ETF codec: round trips, real Erlang encodings both ways, and hostile input."""

from __future__ import annotations

import functools
import shutil
import struct
import subprocess
import tracemalloc
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from erlcuda.etf import (
    DECODE_COST_BASE,
    DECODE_COST_FACTOR,
    Atom,
    CodecError,
    ImproperList,
    Opaque,
    decode,
    encode,
    encode_bytes,
    float_list,
)
from strategies import PID, normalize, same, terms

FIXTURES = Path(__file__).parent / "fixtures"


@functools.cache
def vectors() -> list[tuple[str, bytes, Any]]:
    """(name, Erlang's encoding, expected Python value) from etf_vectors.txt."""
    names = {
        "__builtins__": {},
        "A": Atom,
        "I": ImproperList,
        "O": lambda h: Opaque(bytes.fromhex(h)),
    }
    out = []
    for line in (FIXTURES / "etf_vectors.txt").read_text("utf-8").splitlines():
        name, hexed, expr = line.split("\t")
        out.append((name, bytes.fromhex(hexed), eval(expr, names)))
    return out


def vector(name: str) -> bytes:
    return next(data for n, data, _ in vectors() if n == name)


# --------------------------------------------------------------------------------------------
# round trips and exact encodings


@given(terms)
def test_round_trip(term: Any) -> None:
    assert same(normalize(decode(encode_bytes(term))), term)


@given(terms)
def test_chunks_concatenate_to_the_encoding(term: Any) -> None:
    chunks = encode(term)
    assert chunks[0][:1] == b"\x83"
    assert all(len(c) > 0 for c in chunks)
    assert b"".join(chunks) == encode_bytes(term)


@pytest.mark.parametrize(
    ("term", "expected"),
    [
        (0, "6100"),
        (255, "61ff"),
        (256, "6200000100"),
        (-1, "62ffffffff"),
        (2**31 - 1, "627fffffff"),
        (-(2**31), "6280000000"),
        (2**31, "6e040000000080"),
        (-(2**31) - 1, "6e040101000080"),
        (1.5, "463ff8000000000000"),
        (Atom("ok"), "77026f6b"),
        (True, "770474727565"),
        (False, "770566616c7365"),
        (None, "7709756e646566696e6564"),
        ("hé", "6d0000000368c3a9"),
        (b"", "6d00000000"),
        ([], "6a"),
        ([1], "6c0000000161016a"),
        ((), "6800"),
        ({}, "7400000000"),
        (ImproperList([1], 2), "6c0000000161016102"),
        (Opaque(b"\x61\x07"), "6107"),
    ],
)
def test_exact_encodings(term: Any, expected: str) -> None:
    assert encode_bytes(term).hex() == "83" + expected


def test_long_atoms() -> None:
    assert encode_bytes(Atom("a" * 255))[:3] == bytes((131, 119, 255))
    long_utf8 = encode_bytes(Atom("中" * 255))
    assert long_utf8[:4] == bytes((131, 118, 765 >> 8, 765 & 0xFF))
    assert decode(long_utf8) == "中" * 255
    with pytest.raises(CodecError):
        encode(Atom("a" * 256))


def test_large_tuple_and_big_ints() -> None:
    t = tuple(range(300))
    assert encode_bytes(t)[1] == 105
    assert decode(encode_bytes(t)) == t
    huge = -(2 ** (8 * 300))
    assert encode_bytes(huge)[1] == 111
    assert decode(encode_bytes(huge)) == huge


def test_other_python_types() -> None:
    assert decode(encode_bytes(np.float32(2.5))) == 2.5
    assert decode(encode_bytes(np.int64(-7))) == -7
    assert decode(encode_bytes(np.bool_(True))) is True
    assert bytes(decode(encode_bytes(bytearray(b"xyz")))) == b"xyz"
    assert bytes(decode(encode_bytes(memoryview(b"abcdef")[::2]))) == b"ace"
    arr = np.arange(6, dtype=np.int16).reshape(2, 3)
    assert bytes(decode(encode_bytes(arr))) == arr.tobytes()
    assert bytes(decode(encode_bytes(arr.T))) == np.ascontiguousarray(arr.T).tobytes()


@pytest.mark.parametrize(
    "term",
    [
        object(),
        {1, 2},
        1j,
        float("nan"),
        float("inf"),
        [1, float("-inf")],
        np.array([object()]),
        ImproperList([], 1),
    ],
)
def test_unencodable(term: Any) -> None:
    with pytest.raises(CodecError):
        encode(term)


def test_cyclic_term_is_a_codec_error() -> None:
    cyclic: list[Any] = []
    cyclic.append(cyclic)
    with pytest.raises(CodecError):
        encode(cyclic)


# --------------------------------------------------------------------------------------------
# zero copy


def test_binary_decodes_as_a_view_of_the_input() -> None:
    data = bytearray(encode_bytes((Atom("a"), b"payload" * 100)))
    _, view = decode(data)
    assert isinstance(view, memoryview)
    assert view.obj is data
    data[-1] = ord("!")
    assert view[-1] == ord("!")


def test_map_key_binaries_are_bytes() -> None:
    got = decode(encode_bytes({b"k": b"v", (b"t",): 1}))
    assert set(got) == {b"k", (b"t",)}
    assert all(type(k) is bytes or type(k[0]) is bytes for k in got)
    assert isinstance(got[b"k"], memoryview)


def test_large_binary_decodes_without_copying() -> None:
    payload = bytearray(64 << 20)
    data = bytearray(b"\x83m" + struct.pack(">I", len(payload))) + payload
    del payload
    tracemalloc.start()
    try:
        view = decode(data)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert len(view) == 64 << 20 and view.obj is data
    assert peak < 64 << 10


def test_large_payloads_are_chunks_of_their_own() -> None:
    blob = bytes(10_000)
    arr = np.arange(5000, dtype=np.float32)
    chunks = encode((Atom("ok"), blob, arr, b"small"))
    assert any(c is blob for c in chunks)
    assert any(isinstance(c, memoryview) and np.shares_memory(np.asarray(c), arr)
               for c in chunks)
    assert len(chunks) == 5  # header, blob, header, array, small tail


def test_hot_path_message_is_few_chunks() -> None:
    reply = (Atom("M"), PID, (Atom("erlcuda"), 12345, (Atom("ok"), 3.25)))
    assert len(encode(reply)) == 1
    floats = np.arange(4096, dtype="<f4")
    chunks = encode((Atom("M"), PID, (Atom("erlcuda"), 12345, (Atom("ok"), floats))))
    assert len(chunks) == 2  # the head, then the array's bytes as a chunk of their own
    assert bytes(decode(b"".join(chunks))[2][2][1]) == floats.tobytes()


# --------------------------------------------------------------------------------------------
# real Erlang encodings


@pytest.mark.parametrize("name", [v[0] for v in vectors()])
def test_decodes_erlang_encoding(name: str) -> None:
    data, expected = next((d, e) for n, d, e in vectors() if n == name)
    assert same(normalize(decode(data)), expected)
    assert same(normalize(decode(bytearray(data))), expected)
    assert same(normalize(decode(memoryview(data))), expected)


def test_otp_atom_tags() -> None:
    # OTP 25 writes latin-1 atoms as ATOM_EXT unless minor_version 2 is asked for.
    assert vector("atom_2")[1] == 100
    assert vector("atom_v2_2")[1] == 119
    assert vector("atom_6")[1] == 119
    assert vector("atom_12")[1] == 118


def test_decodes_old_float_ext() -> None:
    assert vector("old_float_0_1")[1] == 99
    assert decode(vector("old_float_0_1")) == 0.1


def test_opaque_pid_round_trips() -> None:
    data = vector("pid")
    pid = decode(data)
    assert isinstance(pid, Opaque)
    assert encode_bytes(pid) == data
    assert {pid: 1}[decode(data)] == 1


def erl_source(term: Any) -> str:
    """``term`` as an Erlang expression (for the terms ``strategies.terms`` makes)."""
    if term is True or term is False:
        return str(term).lower()
    if isinstance(term, Atom):
        return "'" + "".join(f"\\x{{{ord(c):x}}}" for c in term) + "'"
    if isinstance(term, int):
        return str(term)
    if isinstance(term, float):
        return f"{term:.17e}"
    if isinstance(term, bytes | memoryview):
        return "<<" + ",".join(str(b) for b in bytes(term)) + ">>"
    if isinstance(term, tuple):
        return "{" + ",".join(erl_source(t) for t in term) + "}"
    if isinstance(term, list):
        return "[" + ",".join(erl_source(t) for t in term) + "]"
    if isinstance(term, ImproperList):
        items = ",".join(erl_source(t) for t in term.items)
        return f"[{items}|{erl_source(term.tail)}]"
    if isinstance(term, dict):
        pairs = ",".join(f"{erl_source(k)}=>{erl_source(v)}" for k, v in term.items())
        return "#{" + pairs + "}"
    if isinstance(term, Opaque):
        return f"binary_to_term({erl_source(bytes((131,)) + term.data)})"
    raise TypeError(term)


# For each line "KIND EXPECTED PYTHON", binary_to_term(PYTHON, [safe]) must be =:= the
# expected term: KIND h: EXPECTED is the hex of Erlang's own encoding of it; KIND e: the hex
# of an Erlang expression for it. Prints one line per case: ok, or what went wrong.
ERL_CHECK = r"""
[Path] = init:get_plain_arguments(),
Eval = fun(Src) ->
    {ok, Toks, _} = erl_scan:string(unicode:characters_to_list(Src) ++ "."),
    {ok, [Expr]} = erl_parse:parse_exprs(Toks),
    {value, V, _} = erl_eval:expr(Expr, []),
    V
end,
{ok, Data} = file:read_file(Path),
Check = fun(Line) ->
    [Kind, A, B] = binary:split(Line, <<" ">>, [global]),
    try
        Expected = case Kind of
            <<"h">> -> binary_to_term(binary:decode_hex(A));
            <<"e">> -> Eval(binary:decode_hex(A))
        end,
        Got = binary_to_term(binary:decode_hex(B), [safe]),
        case Got =:= Expected of
            true -> ok;
            false -> {mismatch, Expected, Got}
        end
    catch C:E -> {C, E}
    end
end,
[io:format("~w~n", [Check(L)]) || L <- binary:split(Data, <<"\n">>, [global, trim_all])],
halt().
"""


def run_erl(cases: list[tuple[str, str, bytes]], tmp: Path) -> list[str]:
    """Check each (kind, expected, python encoding) in one erl run; return erl's verdicts."""
    if shutil.which("erl") is None:
        pytest.skip("erl is not on PATH")
    path = tmp / "cases.txt"
    path.write_text("".join(f"{k} {a} {b.hex()}\n" for k, a, b in cases))
    proc = subprocess.run(
        ["erl", "-noshell", "-eval", ERL_CHECK, "-extra", str(path)],
        capture_output=True, timeout=120, check=False,
    )
    lines = proc.stdout.decode("utf-8", "replace").splitlines()
    assert len(lines) == len(cases), proc.stderr.decode("utf-8", "replace")
    return lines


def native_cases() -> Iterator[tuple[str, Any, str]]:
    """(label, Python value, Erlang expression it must decode to) beyond the fixtures."""
    f64 = np.linspace(-1e300, 1e300, 33)
    yield "floats_f64", f64.tolist(), erl_source(f64.tolist())
    yield "str", "héllo 中", '<<"héllo 中"/utf8>>'
    yield "none", None, "undefined"
    yield "bools", [True, False], "[true, false]"
    yield "ndarray", np.array([1, 2], dtype=">u2"), "<<0,1,0,2>>"
    yield "long_utf8_atom", Atom("中" * 255), erl_source(Atom("中" * 255))
    yield "big", [2**64, -(2**2040), 2**2048], erl_source([2**64, -(2**2040), 2**2048])
    yield "tuple300", tuple(range(300)), erl_source(tuple(range(300)))
    yield "big_binary", bytes(range(256)) * 40, erl_source(bytes(range(256)) * 40)
    yield "improper", ImproperList([Atom("a"), 1], 2.5), "[a, 1 | 2.5]"


@pytest.fixture(scope="module")
def erl_verdicts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    cases: list[tuple[str, str, bytes]] = []
    labels: list[str] = []
    for name, data, _ in vectors():
        labels.append(name)
        cases.append(("h", data.hex(), encode_bytes(decode(data))))
    for label, term, source in native_cases():
        labels.append(label)
        cases.append(("e", source.encode().hex(), encode_bytes(term)))
    for i, term in enumerate(sample_terms()):
        labels.append(f"random_{i}")
        cases.append(("e", erl_source(term).encode().hex(), encode_bytes(term)))
    return dict(zip(labels, run_erl(cases, tmp_path_factory.mktemp("erl")), strict=True))


def sample_terms() -> list[Any]:
    """A fixed sample of generated terms, to be checked by Erlang in the one erl run."""
    found: list[Any] = []

    @settings(max_examples=60, database=None, derandomize=True,
              suppress_health_check=list(HealthCheck))
    @given(terms)
    def collect(term: Any) -> None:
        found.append(term)

    collect()
    return found


def test_erlang_reads_python_reencodings_of_its_terms(erl_verdicts: dict[str, str]) -> None:
    bad = {n: v for n, v in erl_verdicts.items() if n in {x[0] for x in vectors()} and v != "ok"}
    assert not bad


def test_erlang_reads_python_values(erl_verdicts: dict[str, str]) -> None:
    labels = {label for label, _, _ in native_cases()}
    bad = {n: v for n, v in erl_verdicts.items() if n in labels and v != "ok"}
    assert not bad


def test_erlang_reads_generated_terms(erl_verdicts: dict[str, str]) -> None:
    bad = {n: v for n, v in erl_verdicts.items() if n.startswith("random_") and v != "ok"}
    assert not bad


# --------------------------------------------------------------------------------------------
# hostile input


def prefixes(data: bytes) -> Iterator[bytes]:
    cuts = range(len(data)) if len(data) <= 600 else [
        *range(0, len(data), len(data) // 150 + 1), *range(len(data) - 40, len(data))]
    for cut in cuts:
        yield data[:cut]


def test_every_truncation_is_a_codec_error() -> None:
    samples = [data for _, data, _ in vectors()]
    samples.append(encode_bytes((Atom("M"), PID, (Atom("ok"), np.ones(20).tolist()))))
    for data in samples:
        for prefix in prefixes(data):
            with pytest.raises(CodecError):
                decode(prefix)


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"\x83",
        b"\x84a\x01",
        b"\x83a\x01\x00",  # trailing byte
        b"\x83\x00",  # unknown tag
        b"\x83R\x00",  # atom cache reference
        b"\x83F\x7f\xf8\x00\x00\x00\x00\x00\x00",  # NaN
        b"\x83F\x7f\xf0\x00\x00\x00\x00\x00\x00",  # infinity
        b"\x83c" + b"inf".ljust(31, b"\0"),
        b"\x83c" + b"1_0.5".ljust(31, b"\0"),
        b"\x83c" + b"1e999".ljust(31, b"\0"),
        b"\x83n\x01\x02\x01",  # bad sign byte
        b"\x83v\x00\x02\xff\xfe",  # not UTF-8 (test_latin1_atom_ext reads it as ATOM_EXT)
        b"\x83d\x01\x00" + b"a" * 256,  # atom over 255 characters
        b"\x83t\x00\x00\x00\x02a\x01a\x01a\x01a\x02",  # duplicate key
        b"\x83t\x00\x00\x00\x02a\x01a\x01F" + struct.pack(">d", 1.0) + b"a\x02",  # 1 vs 1.0
        b"\x83t\x00\x00\x00\x01ja\x01",  # list as a map key
        b"\x83t\x00\x00\x00\x01t\x00\x00\x00\x00a\x01",  # map as a map key
        b"\x83M\x00\x00\x00\x01\x00\x01",  # bit-binary with 0 bits
        b"\x83M\x00\x00\x00\x01\x09\x01",  # ... and with 9
        b"\x83qa\x01d\x00\x01fa\x01",  # export whose module is not an atom
        b"\x83P\x00\x00\x00\x00",
        b"\x83h\x01P\x00\x00\x00\x01x\x9c\x03\x00\x00\x00\x00\x01",  # nested compression
    ],
)
def test_rejects_malformed(data: bytes) -> None:
    with pytest.raises(CodecError):
        decode(data)


def test_latin1_atom_ext() -> None:
    assert decode(b"\x83d\x00\x02\xff\xfe") == "ÿþ"


def test_non_canonical_lists() -> None:
    # Erlang reads these as the tail alone, and as one proper list.
    assert decode(b"\x83l\x00\x00\x00\x00a\x01") == 1
    assert decode(b"\x83l\x00\x00\x00\x01a\x01l\x00\x00\x00\x01a\x02a\x03") == (
        ImproperList([1, 2], 3)
    )


def test_input_buffer_kinds() -> None:
    data = encode_bytes([1, 2])
    assert decode(np.frombuffer(data, dtype=np.uint8)) == [1, 2]  # type: ignore[arg-type]
    assert decode(memoryview(data).cast("c")) == [1, 2]
    with pytest.raises(CodecError):
        decode(memoryview(data + data)[::2])


HUGE = [
    b"\x83l\xff\xff\xff\xff" + b"a\x01" * 4,  # list
    b"\x83i\xff\xff\xff\xff" + b"a\x01" * 4,  # tuple
    b"\x83t\xff\xff\xff\xff" + b"a\x01" * 4,  # map
    b"\x83m\x80\x00\x00\x00" + b"x" * 8,  # binary
    b"\x83k\xff\xffabc",  # string
    b"\x83o\xff\xff\xff\xff\x00abc",  # big integer
    b"\x83o\x00\x20\x00\x01\x00abc",  # big integer over the cap
    b"\x83d\xff\xffabc",  # atom
    b"\x83Z\xff\xffw\x01a\x00\x00\x00\x00",  # reference ids
    b"\x83M\xff\xff\xff\xff\x03abc",  # bit-binary
    b"\x83p\xff\xff\xff\xff" + bytes(40),  # fun size
    b"\x83p\x00\x00\x00\x30" + bytes(21) + b"\xff\xff\xff\xff" + bytes(30),  # fun free vars
    b"\x83P\xff\xff\xff\xff" + zlib.compress(b"j"),  # compressed size
]


@pytest.mark.parametrize("data", HUGE)
def test_huge_length_prefixes_fail_fast_without_allocating(data: bytes) -> None:
    tracemalloc.start()
    try:
        with pytest.raises(CodecError):
            decode(data)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 64 << 10


def test_deep_nesting() -> None:
    deep = b"\x83" + b"\x68\x01" * 100_000 + b"\x6a"
    with pytest.raises(CodecError):
        decode(deep)
    with pytest.raises(CodecError):
        decode(deep, max_depth=1_000_000)  # Python's own recursion limit, as a CodecError
    nested = b"\x83" + b"\x6c\x00\x00\x00\x01" * 10 + b"\x6a" * 11
    assert decode(nested, max_depth=10) == functools.reduce(lambda x, _: [x], range(10), [])
    with pytest.raises(CodecError):
        decode(nested, max_depth=9)
    assert decode(encode_bytes(functools.reduce(lambda x, _: (x,), range(64), 1)))


def compressed(inner: bytes, size: int | None = None) -> bytes:
    declared = len(inner) if size is None else size
    return b"\x83P" + struct.pack(">I", declared) + zlib.compress(inner)


def test_compressed() -> None:
    inner = encode_bytes([b"abc"] * 100)[1:]
    assert normalize(decode(compressed(inner))) == [b"abc"] * 100
    with pytest.raises(CodecError):
        decode(compressed(inner) + b"\x00")  # trailing bytes
    with pytest.raises(CodecError):
        decode(compressed(inner, len(inner) + 1))  # declared larger than it is
    with pytest.raises(CodecError):
        decode(compressed(inner, len(inner) - 1))  # declared smaller than it is


@pytest.mark.parametrize(
    "bomb",
    [
        compressed(b"\x6d" + struct.pack(">I", 50 << 20) + bytes(50 << 20), 100),  # size lies
        compressed(b"\x6a", 2**31),  # size beyond deflate's ratio
    ],
)
def test_compression_bombs(bomb: bytes) -> None:
    tracemalloc.start()
    try:
        with pytest.raises(CodecError):
            decode(bomb)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20


def decode_or_codec_error(data: bytes) -> None:
    try:
        decode(data)
    except CodecError:
        pass


@given(st.binary(max_size=200))
def test_arbitrary_bytes(data: bytes) -> None:
    decode_or_codec_error(data)
    decode_or_codec_error(b"\x83" + data)


@st.composite
def mutated(draw: st.DrawFn) -> bytes:
    data = bytearray(encode_bytes(draw(terms)))
    for _ in range(draw(st.integers(1, 4))):
        at = draw(st.integers(0, len(data)))
        match draw(st.sampled_from(["flip", "set", "insert", "delete"])):
            case "flip" if at < len(data):
                data[at] ^= 1 << draw(st.integers(0, 7))
            case "set" if at < len(data):
                data[at] = draw(st.integers(0, 255))
            case "insert":
                data[at:at] = draw(st.binary(min_size=1, max_size=4))
            case "delete":
                del data[at : at + draw(st.integers(1, 4))]
    return bytes(data)


@given(mutated())
def test_mutated_encodings(data: bytes) -> None:
    decode_or_codec_error(data)


# --------------------------------------------------------------------------------------------
# what a decoded term may cost


def list_of(item: bytes, n: int) -> bytes:
    return b"\x83l" + struct.pack(">I", n) + item * n + b"j"


def peak_while_refused(data: bytes) -> int:
    """The most memory Python held while ``decode`` refused ``data`` as too costly."""
    tracemalloc.start()
    try:
        with pytest.raises(CodecError, match="too much memory"):
            decode(data)
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_a_list_of_empty_lists_is_refused_at_once() -> None:
    # 67 MB of [] decoded to 4.7 GB: each byte a 56-byte list and its 8-byte slot.
    assert peak_while_refused(list_of(b"j", 67_000_000)) < 2 * DECODE_COST_BASE


@pytest.mark.parametrize(
    "data",
    [
        list_of(b"t\x00\x00\x00\x00", 200_000),  # empty maps: 232 bytes for 5
        list_of(b"m\x00\x00\x00\x00", 200_000),  # empty binaries: a memoryview each
        list_of(b"h\x01j", 300_000),  # {[]}: 112 bytes for 3
        b"\x83h\x02" + list_of(b"j", 200_000)[1:] * 2,  # in a tuple, two of them
    ],
    ids=["maps", "binaries", "tuples", "nested"],
)
def test_terms_that_cost_far_more_than_their_bytes_are_refused(data: bytes) -> None:
    peak = peak_while_refused(data)
    # The model is approximate (lists over-allocate as they grow): a quarter of slack.
    assert peak < 1.25 * (DECODE_COST_FACTOR * len(data) + DECODE_COST_BASE)


def test_what_erlcuda_carries_is_within_the_budget() -> None:
    rng = np.random.default_rng(5)
    a, b = rng.standard_normal((2, 10_000_000), dtype=np.float32)
    launch = (Atom("M"), (Atom("launch"), 1, PID, 0, Atom("vector_add"), [a, b],
                          {Atom("format"): Atom("binary"), Atom("trace"): False}))
    term = decode(encode_bytes(launch))
    assert bytes(term[1][5][1][-4:]) == b[-1:].tobytes()
    floats = rng.standard_normal(1_000_000).tolist()
    assert decode(encode_bytes(floats)) == floats
    ints = list(range(-(2**31), -(2**31) + 1_000_000))  # INTEGER_EXT: 5 bytes, 36 in Python
    assert decode(encode_bytes(ints)) == ints
    small = [i % 256 for i in range(200_000)]  # STRING_EXT chunks of lists of small ints
    assert decode(encode_bytes(small)) == small
    assert decode(encode_bytes([[1.5, 2.5]] * 50_000)) == [[1.5, 2.5]] * 50_000


def test_the_budget_can_be_set() -> None:
    data = encode_bytes([1.0] * 1000)
    assert decode(data, max_cost=33_000) == [1.0] * 1000
    with pytest.raises(CodecError, match="too much memory"):
        decode(data, max_cost=30_000)


@given(st.lists(st.floats(width=32, allow_nan=False, allow_infinity=False), min_size=1))
def test_a_float_list_is_the_encoding_of_its_floats(values: list[float]) -> None:
    array = np.asarray(values, np.float32)
    assert bytes(float_list(array)) == encode_bytes([float(x) for x in array])


@pytest.mark.parametrize("n", [0, 1, 1 << 14, (1 << 14) + 1])
def test_float_lists_of_any_length(n: int) -> None:
    # A blank is kept for the shorter lists and made for the longer ones; an empty one is a
    # LIST_EXT of no items (binary_to_term reads it as []), and a list is written whole each
    # time, whatever an earlier one of its length held.
    array = np.arange(n, dtype=np.float32) - 3
    for _ in range(2):
        data = bytes(float_list(array))
        assert decode(data) == [float(x) for x in array]
        array = array[::-1].copy()
    assert bytes(float_list(np.zeros(0, np.float32))) == bytes([131, 108, 0, 0, 0, 0, 106])


def test_a_float_list_writes_an_infinity_as_its_bits() -> None:
    # Erlang's binary_to_term refuses them: the caller answers non_finite.
    data = bytes(float_list(np.array([np.inf, 1], np.float32)))
    assert data[6:15] == bytes([70]) + struct.pack(">d", np.inf)
