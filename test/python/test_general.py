"""The general path's pieces: the new wire kinds (decoded and encoded), the checks of a
general launch against its kernel, the buffer store and the CPU backend's device arrays."""

from __future__ import annotations

import re
import struct
from typing import Any

import numpy as np
import pytest

from erlcuda import contract, general, protocol
from erlcuda.backends.base import BackendError
from erlcuda.backends.cpu import CpuDevice
from erlcuda.general import Refused, Registry, UserKernel
from erlcuda.kernels import DTYPES, Plan
from erlcuda.lanes import BufferStore
from erlcuda.protocol import Empty, Handle, Kept, Launch, Listed, Scalar
from erlcuda.shm import FileArg
from erlcuda.templates import Templates
from workerpipe import (
    ETYPE,
    Buffer,
    FileVector,
    Number,
    W,
    Zeroed,
    launch_frame,
    parse_results,
    typed,
)


def bound(device: Any, kernel: str, operands: list[Any], out: Any) -> Any:
    """A catalogue kernel on device arrays, as a lane runs a plan alone."""
    return device.execute([Plan(kernel, "builtin")], operands, out)[0]



def f32(values: list[float]) -> bytes:
    return np.asarray(values, dtype="<f4").tobytes()


def decoded(frame: bytes) -> Launch:
    launch = protocol.decode(frame)
    assert isinstance(launch, Launch)
    return launch


def joined(chunks: list[Any]) -> bytes:
    return b"".join(bytes(c) for c in chunks)


# -- decoding --------------------------------------------------------------------------------


def test_the_new_argument_kinds_decode_to_what_they_say() -> None:
    launch = decoded(launch_frame(
        9, "k", [Buffer(2**64 - 1), Number(-7, ETYPE["i32"]), Number(2.5, ETYPE["f32"]),
                 Number(2**63 - 1, ETYPE["i64"]), Number(255, ETYPE["u8"]),
                 Zeroed(12, ETYPE["u32"]), typed([1.5, -2], "f64"), 3], device=2))
    assert launch.error is None and launch.general
    assert (launch.job_id, launch.device, launch.kernel) == (9, 2, "k")
    handle, i32, f32_, i64, u8, empty, vector, dim = launch.args
    assert handle == Handle(2**64 - 1)
    assert i32 == Scalar("i32", np.int32(-7)) and i32.value.dtype == np.int32
    assert f32_.value == np.float32(2.5) and f32_.value.dtype == np.float32
    assert i64.value == 2**63 - 1 and u8.value == 255 and u8.value.dtype == np.uint8
    assert empty == Empty("u32", 12)
    assert vector.dtype == np.dtype("<f8") and vector.tolist() == [1.5, -2.0]
    assert dim == 3
    assert launch.keep is None and launch.geometry is None


def test_keep_ids_and_geometry_follow_the_arguments() -> None:
    launch = decoded(launch_frame(1, "k", [f32([1])], keep=[5, 2**64 - 1],
                                  geometry=((4, 2, 1), (128, 1, 1), 1024), trace=True))
    assert launch.error is None and launch.general and launch.trace
    assert launch.keep == (5, 2**64 - 1)
    assert launch.geometry == ((4, 2, 1), (128, 1, 1), 1024)
    only_geometry = decoded(launch_frame(1, "k", [], geometry=((1, 1, 1), (1, 1, 1), 0)))
    assert only_geometry.keep is None and only_geometry.geometry is not None
    no_ids = decoded(launch_frame(1, "reduce", [f32([1])], keep=[]))
    assert no_ids.keep == () and no_ids.general


def test_only_plain_f32_launches_stay_off_the_general_path() -> None:
    plain = decoded(launch_frame(1, "matmul", [f32([1]), f32([1]), 1, 1, 1]))
    assert not plain.general
    for args in ([typed([1], "f64")], [typed([1], "u8")], [Buffer(1)], [Zeroed(1)],
                 [Number(1.0)], [FileVector("x", 8, etype=ETYPE["i64"])]):
        assert decoded(launch_frame(1, "reduce", args)).general, args
    assert not decoded(launch_frame(1, "reduce", [FileVector("x", 8)])).general


def _head(flags: int = 0, kernel: bytes = b"k") -> bytes:
    return struct.pack(">BQHBB", W.launch, 77, 0, flags, len(kernel)) + kernel


KEEP = launch_frame(77, "k", [f32([1])], keep=[1, 2])
GEOMETRY = launch_frame(77, "k", [], geometry=((1, 1, 1), (1, 1, 1), 0))
MALFORMED = {
    "cut handle": _head() + b"\x01" + struct.pack(">BQ", W.arg_handle, 1)[:-1],
    "cut scalar": _head() + b"\x01" + struct.pack(">BB", W.arg_scalar, 0) + bytes(7),
    "scalar type": _head() + b"\x01" + struct.pack(">BB", W.arg_scalar, 6) + bytes(8),
    "scalar padding": launch_frame(77, "k", [Number(0, ETYPE["f32"],
                                                    raw=struct.pack("<d", 1.0))]),
    "i32 sign-extended": launch_frame(77, "k", [Number(0, ETYPE["i32"],
                                                       raw=struct.pack("<q", -1))]),
    "cut empty": _head() + b"\x01" + struct.pack(">BBQ", W.arg_empty, 0, 1)[:-2],
    "empty type": _head() + b"\x01" + struct.pack(">BBQ", W.arg_empty, 9, 1),
    "vector type": launch_frame(77, "k", [typed([1], "f64")])[:-1],
    "no NKeep": launch_frame(77, "k", [f32([1])], flags=W.flag_keep),
    "cut kept ids": KEEP[:-1],
    "kept twice": launch_frame(77, "k", [f32([1])], keep=[3, 3]),
    "cut geometry": GEOMETRY[:-1],
    "after the geometry": GEOMETRY + b"\0",
    "geometry, no keep block": launch_frame(77, "k", [], flags=W.flag_keep | W.flag_geometry,
                                            geometry=((1, 1, 1), (1, 1, 1), 0)),
}


@pytest.mark.parametrize("frame", MALFORMED.values(), ids=MALFORMED.keys())
def test_a_malformed_general_launch_is_an_error_for_its_job(frame: bytes) -> None:
    launch = decoded(frame)
    assert launch.job_id == 77 and launch.error and launch.args == []


def test_templates_and_uniform_tables_never_learn_a_general_frame() -> None:
    # lone.py and uniform.py read layouts from vector_spans: a general launch has none.
    for frame in (launch_frame(1, "vector_add", [typed([1], "f64"), typed([2], "f64")]),
                  launch_frame(1, "vector_add", [f32([1]), f32([2])], keep=[4]),
                  launch_frame(1, "reduce", [Buffer(1)])):
        launch = decoded(frame)
        assert protocol.vector_spans(launch) is None
    templates = Templates()
    frame = launch_frame(1, "vector_add", [f32([1]), f32([2])], keep=[4])
    from erlcuda import kernels

    templates.learn(frame, decoded(frame), kernels.parse("vector_add", [f32([1]), f32([2])]))
    assert templates.find(frame) is None


# -- encoding --------------------------------------------------------------------------------


@pytest.mark.parametrize("etype", [t for t in contract.ELEMENT_TYPES if t != "f32"])
def test_a_vector_of_another_type_travels_typed(etype: str) -> None:
    info = np.iinfo(DTYPES[etype]) if DTYPES[etype].kind in "iu" else np.finfo(DTYPES[etype])
    values = np.array([info.min, 0, 1, info.max], DTYPES[etype])
    (frame,) = protocol.encode_results([(3, values, None)]).frames
    (reply,) = parse_results(joined(frame))
    assert reply.tag == W.tag_typed and reply.payload[0] == ETYPE[etype]
    assert reply.payload[1:] == values.tobytes()
    assert reply.result == ("ok", values.tolist())


def test_a_big_endian_or_strided_typed_vector_is_sent_little_endian() -> None:
    values = np.arange(6, dtype=">i8")[::2]
    (frame,) = protocol.encode_results([(1, values, None)]).frames
    (reply,) = parse_results(joined(frame))
    assert reply.result == ("ok", [0, 2, 4]) and reply.payload[0] == ETYPE["i64"]


def test_handle_and_list_records_byte_for_byte() -> None:
    kept = Kept(2**64 - 1, "u8", 2**40)
    (frame,) = protocol.encode_results([(5, kept, None)]).frames
    assert joined(frame) == (b"R\0\0\0\x01" + (5).to_bytes(8, "big") + b"h\0\0\0\x11"
                             + b"\xff" * 8 + bytes((ETYPE["u8"],)) + (2**40).to_bytes(8, "big"))
    items = (np.array([1.5], np.float32), np.array([7], np.int32), Kept(3, "f64", 2))
    (frame,) = protocol.encode_results([(6, Listed(items), None)]).frames
    body = (b"\0\0\0\x03" + b"v\0\0\0\x04" + f32([1.5])
            + b"t\0\0\0\x05" + bytes((ETYPE["i32"],)) + np.int32(7).tobytes()
            + b"h\0\0\0\x11" + (3).to_bytes(8, "big") + bytes((ETYPE["f64"],))
            + (2).to_bytes(8, "big"))
    assert joined(frame) == (b"R\0\0\0\x01" + (6).to_bytes(8, "big") + b"l"
                             + len(body).to_bytes(4, "big") + body)
    (reply,) = parse_results(joined(frame))
    assert reply.result == ("ok", [[1.5], [7], ("buffer", 3, "f64", 2)])
    empty = protocol.encode_results([(7, Listed(()), {"recv": 1})]).frames[0]
    (reply,) = parse_results(joined(empty))
    assert reply.result == ("ok", []) and reply.stamps == {b"recv": 1}


def test_large_typed_and_listed_vectors_are_sent_from_their_own_memory() -> None:
    big = np.arange(10_000, dtype=np.float64)
    listed = np.arange(10_000, dtype=np.uint32)
    (frame,) = protocol.encode_results([(1, big, None), (2, Listed((listed, big)), None),
                                        (3, 1.0, None)]).frames
    assert sum(isinstance(c, memoryview) and np.shares_memory(c, big) for c in frame) == 2
    assert any(isinstance(c, memoryview) and np.shares_memory(c, listed) for c in frame)
    one, two, three = parse_results(joined(frame))
    assert one.result == ("ok", big.tolist())
    assert two.result == ("ok", [listed.tolist(), big.tolist()])
    assert three.result == ("ok", 1.0)


def test_new_records_that_cannot_travel_are_their_jobs_alone() -> None:
    encoded = protocol.encode_results([
        (1, Listed((np.array([object()]),)), None), (2, Listed(("1.0",)), None),  # type: ignore[arg-type]
        (3, Kept(1, "f16", 1), None), (4, Listed((np.ones(300, np.float32),)), None)],
        max_frame=5 + 13 + 4 + 5 + 1199)
    replies = [r for f in encoded.frames for r in parse_results(joined(f))]
    assert [r.job_id for r in replies] == [1, 2, 3, 4]
    assert [r.result[1][0] for r in replies[:3]] == ["internal"] * 3
    assert replies[3].result == ("error", "too_large")
    assert encoded.errors == 4


def test_the_new_reasons() -> None:
    assert protocol.buffer_lost(2**64 - 1).term == ("buffer_lost", 2**64 - 1)
    assert protocol.compile_error("kernel.cu(1): error").term == ("compile",
                                                                  "kernel.cu(1): error")
    assert protocol.bad_option("options", "-ccbin").term == ("bad_option",
                                                             ("options", "-ccbin"))


# -- checking a launch -----------------------------------------------------------------------


HELD = {1: ("f32", 4), 2: ("f32", 4), 3: ("f64", 4), 4: ("f32", 6), 5: ("i32", 3)}


def check(kernel: str, args: list[Any], registry: Registry | None = None,
          **fields: Any) -> general.Plan:
    # The launches here are general ones, as the decoder marks a frame that is (a plain f32
    # launch of a batched kernel becomes a batched plan: test_kernels).
    launch = Launch(1, 0, kernel, args, **{"general": True, **fields})
    return general.check(launch, registry or Registry(), HELD.get)


def refused(kernel: str, args: list[Any], registry: Registry | None = None,
            **fields: Any) -> Any:
    with pytest.raises(Refused) as info:
        check(kernel, args, registry, **fields)
    return info.value.failure.term


def f64(values: list[float]) -> np.ndarray:
    return np.asarray(values, "<f8")


def test_a_builtin_runs_in_its_operands_type() -> None:
    plan = check("vector_add", [Handle(1), np.ones(4, np.float32)], keep=(9,))
    assert (plan.action, plan.out_type, plan.out_elements, plan.keep) == (
        "builtin", "f32", 4, (9,))
    assert [op.source for op in plan.operands] == ["buffer", "data"]
    assert plan.kept_bytes == 16 and plan.device_bytes == 32
    plan = check("matmul", [f64([1, 2]), Handle(3), 1, 2, 2])
    assert (plan.out_type, plan.out_elements, plan.keep) == ("f64", 2, None)
    assert check("reduce", [f64([1])]).scalar
    assert check("zeros", [5]).out_type == "f32"  # no vector: the kernel's first type
    plan = check("zeros", [Empty("u8", 7)], keep=(3,))
    assert (plan.action, plan.out_type, plan.out_elements, plan.kept_bytes) == (
        "fill", "u8", 7, 7)
    assert check("copy", [Handle(5)]).out_type == "i32"


@pytest.mark.parametrize(("kernel", "args", "fields", "match"), [
    ("vector_add", [Handle(1), Handle(3)], {}, "B is f64 but A is f32"),
    ("vector_add", [np.ones(3, np.int32)] * 2, {}, "vector_add takes f32 or f64, not i32"),
    ("vector_add", [Handle(1), Handle(4)], {}, "length mismatch: A has 4 elements, B has 6"),
    ("matmul", [Handle(1), Handle(4), 2, 3, 3], {}, "A has 4 elements, M\\*K = 6"),
    ("vector_add", [Handle(1), 3], {}, "B: expected a vector"),
    ("reduce", [Scalar("f32", np.float32(1))], {}, "A: expected a vector"),
    ("matmul", [Handle(1), Handle(1), 2, Empty("f32", 2), 2], {}, "N: expected a non-neg"),
    ("reduce", [Handle(1), Handle(1)], {}, "reduce takes 1 argument, got 2"),
    ("vector_add", [Handle(1), Handle(2)], {"keep": ()}, "makes 1 vector result but 0"),
    ("reduce", [Handle(1)], {"keep": (4,)}, "makes 0 vector results but 1"),
    ("copy", [Handle(1)], {"geometry": ((1, 1, 1), (1, 1, 1), 0)}, "geometry is for user"),
    ("zeros", [2**31], {}, "out of range"),
    ("empty", [Empty("f64", 2**31)], {}, "over the 2147483647 limit"),
    ("matmul", [np.ones(0, np.float32)] * 2, {}, "takes 5"),
])
def test_a_builtin_launch_that_breaks_a_rule_is_bad_args(
        kernel: str, args: list[Any], fields: dict[str, Any], match: str) -> None:
    reason, text = refused(kernel, args, **fields)
    assert reason == "bad_args"
    assert re.search(match, text), text


def test_a_buffer_the_lane_does_not_hold_is_lost() -> None:
    assert refused("vector_add", [Handle(1), Handle(99)]) == ("buffer_lost", 99)


def test_files_count_with_their_elements() -> None:
    arg = FileArg("x", np.dtype("<f8"), 64, 1 << 20)
    plan = check("reduce", [arg])
    assert plan.operands[0].source == "file" and plan.operands[0].elements == 8
    assert plan.operands[0].type == "f64"


def registry_with(*kernels: UserKernel) -> Registry:
    registry = Registry()
    by_module: dict[str, list[UserKernel]] = {}
    for k in kernels:
        by_module.setdefault(k.module, []).append(k)
    for module, found in by_module.items():
        registry.install(module, found)
    return registry


SAXPY = UserKernel("saxpy", "m", (("scalar", "f32"), ("in", "f32"), ("inout", "f32"),
                                  ("out", "i32"), ("scalar", "i64")))


def test_a_raw_kernel_takes_data_buffers_and_counts_in_its_param_types() -> None:
    registry = registry_with(SAXPY)
    plan = check("saxpy", [Scalar("f32", np.float32(2)), Handle(1), np.ones(6, np.float32),
                           Empty("i32", 9), 5], registry)
    assert plan.action == "user" and plan.user is SAXPY
    assert [op.source for op in plan.operands] == ["value", "buffer", "data", "zeros", "value"]
    assert plan.results == [2, 3]  # the inout data and the out count, in param order
    assert plan.operands[4].value == np.int64(5) and plan.operands[4].value.dtype == np.int64
    assert plan.geometry == ((1, 1, 1), (256, 1, 1), 0)  # the largest vector: 9 elements
    # a buffer for an out param is written in place: no result of its own
    plan = check("saxpy", [Scalar("f32", np.float32(2)), Handle(1), Handle(2), 600, 0],
                 registry, keep=(7,), geometry=((3, 1, 1), (32, 2, 1), 64))
    assert plan.results == [3] and plan.operands[3].elements == 600
    assert plan.geometry == ((3, 1, 1), (32, 2, 1), 64) and plan.kept_bytes == 2400


@pytest.mark.parametrize(("args", "fields", "match"), [
    ([Scalar("f64", np.float64(2)), Handle(1), Handle(2), 1, 0], {}, "a f64 scalar for a f32"),
    ([1.5, Handle(1), Handle(2), 1, 0], {}, "expected a f32 scalar"),
    ([Scalar("f32", np.float32(2)), Handle(3), Handle(2), 1, 0], {}, "a f64 vector for a f32"),
    ([Scalar("f32", np.float32(2)), 5, Handle(2), 1, 0], {}, "expected a vector"),
    ([Scalar("f32", np.float32(2)), Empty("f32", 2), Handle(2), 1, 0], {}, "not an in one"),
    ([Scalar("f32", np.float32(2)), Handle(1), Handle(2), Empty("f32", 1), 0], {},
     "a f32 vector for a i32"),
    ([Scalar("f32", np.float32(2)), Handle(1), Handle(2), 1, 2**63], {}, "out of range"),
    ([Scalar("f32", np.float32(2)), Handle(1), Handle(2), 1], {}, "takes 5 arguments"),
    ([Scalar("f32", np.float32(2)), Handle(1), Handle(2), 1, 0], {"keep": ()},
     "makes 1 vector result but 0"),
    ([Scalar("f32", np.float32(2)), Handle(1), Handle(2), 1, 0],
     {"geometry": ((0, 1, 1), (1, 1, 1), 0)}, "must be positive"),
])
def test_a_raw_kernel_launch_that_breaks_a_rule_is_bad_args(
        args: list[Any], fields: dict[str, Any], match: str) -> None:
    reason, text = refused("saxpy", args, registry_with(SAXPY), **fields)
    assert reason == "bad_args" and match in text, text


def test_nothing_to_run_over_is_no_launch() -> None:
    plan = check("saxpy", [Scalar("f32", np.float32(2)), np.ones(0, np.float32),
                           np.ones(0, np.float32), 0, 0], registry_with(SAXPY))
    assert plan.geometry is None and plan.results == [2, 3]


def test_an_elementwise_kernel_makes_its_outputs_and_passes_n() -> None:
    kernel, inputs, outputs = general.elementwise_kernel(
        b"axpy", [(b"a", "f64", "scalar"), (b"x", "f64", "vector"), (b"y", "i32", "vector")],
        [(b"z", "f64"), (b"w", "u8")])
    assert inputs == [("a", "f64", "scalar"), ("x", "f64", "vector"), ("y", "i32", "vector")]
    assert outputs == [("z", "f64"), ("w", "u8")]
    assert (kernel.module, kernel.kind, kernel.inputs) == ("axpy", "elementwise", 3)
    registry = registry_with(kernel)
    plan = check("axpy", [Scalar("f64", np.float64(2)), Handle(3), np.arange(4, dtype="<i4")],
                 registry, keep=(1, 2))
    assert [op.source for op in plan.operands] == ["value", "buffer", "data", "zeros",
                                                   "zeros", "value"]
    assert [(op.type, op.elements) for op in plan.operands[3:5]] == [("f64", 4), ("u8", 4)]
    assert plan.operands[5].value == 4 and plan.results == [3, 4]
    assert plan.kept_bytes == 4 * 8 + 4
    reason, text = refused("axpy", [Scalar("f64", np.float64(2)), Handle(3),
                                    np.arange(3, dtype="<i4")], registry)
    assert reason == "bad_args" and "length mismatch" in text
    reason, text = refused("axpy", [Scalar("f64", np.float64(2)), Handle(3),
                                    np.arange(4, dtype="<i4")], registry, keep=(1,))
    assert "makes 2 vector results but 1" in text


@pytest.mark.parametrize(("inputs", "outputs", "match"), [
    ([(b"a", "f32", "scalar")], [(b"z", "f32")], "needs a vector input"),
    ([(b"x", "f32", "vector")], [], "needs an output"),
    ([(b"x", "f32", "vector")], [(b"x", "f32")], "named twice"),
    ([(b"i", "f32", "vector")], [(b"z", "f32")], "is taken"),
    ([(b"x", "f16", "vector")], [(b"z", "f32")], "not one of"),
    ([(b"x", "f32", "matrix")], [(b"z", "f32")], "is not {Var, Type, vector | scalar}"),
    ([(b"1x", "f32", "vector")], [(b"z", "f32")], "not a C identifier"),
])
def test_an_elementwise_declaration_that_breaks_a_rule_is_bad_args(
        inputs: list[Any], outputs: list[Any], match: str) -> None:
    with pytest.raises(Refused) as info:
        general.elementwise_kernel(b"ew", inputs, outputs)
    assert info.value.failure.reason == "bad_args" and match in info.value.failure.detail[0]


def test_load_declarations_and_the_registry() -> None:
    found = general.user_kernels("m", [(b"k1", [("in", "f32"), ("scalar", "u8")]),
                                       (b"k2", [])])
    assert [(k.name, k.params) for k in found] == [("k1", (("in", "f32"), ("scalar", "u8"))),
                                                   ("k2", ())]
    for bad in ([], [(b"k", [("sideways", "f32")])], [(b"k", [("in", "f16")])],
                [(b"k", []), (b"k", [])], [b"k"], [(b"a b", [])]):
        with pytest.raises(Refused):
            general.user_kernels("m", bad)
    registry = Registry()
    registry.install("m", found)
    assert registry.get("k1") is found[0] and registry.modules == {"m": ("k1", "k2")}
    assert registry.owner("k1", "other") == "module m" and registry.owner("k1", "m") is None
    assert registry.owner("reduce", "m") == "a built-in kernel"
    registry.install("m", found[:1])  # a reload replaces the module's kernels
    assert registry.get("k2") is None and registry.modules == {"m": ("k1",)}
    assert registry.remove("m") and not registry.remove("m") and registry.get("k1") is None


def test_an_unknown_kernel_here_is_unknown() -> None:
    assert refused("gone", [])[0] == "unknown_kernel"


# -- the buffer store and the CPU backend ----------------------------------------------------


def test_the_store_counts_bytes_peak_and_limit() -> None:
    store = BufferStore(limit=100)
    store.room((1,), 100)
    store.put(1, np.zeros(10, np.float64), "f64")
    store.put(2, np.zeros(5, np.uint8), "u8")
    assert (len(store), store.bytes, store.peak) == (2, 85, 85)
    assert store.held(1) == ("f64", 10) and store.held(3) is None
    with pytest.raises(BackendError) as info:
        store.room((3,), 16)
    assert info.value.code == "out_of_memory" and not info.value.fatal
    with pytest.raises(Refused, match="buffer id 2 is in use"):
        store.room((2,), 0)
    assert store.pop(1) is not None and store.pop(1) is None
    assert (len(store), store.bytes, store.peak) == (1, 5, 85)
    assert BufferStore(limit=-5).limit == 0


@pytest.mark.parametrize("etype", ["f32", "f64"])
def test_the_cpu_builtins_in_both_float_types(etype: str) -> None:
    device = CpuDevice(0)
    rng = np.random.default_rng(4)
    dtype = DTYPES[etype]
    a, b = (device.upload(rng.standard_normal(6).astype(dtype)) for _ in range(2))
    out = device.alloc(dtype, 6, zero=False)
    assert bound(device, "vector_add", [a, b], out) is None
    np.testing.assert_array_equal(device.download(out), a + b)
    assert device.download(out).dtype == dtype
    mm = device.alloc(dtype, 4, zero=True)
    bound(device, "matmul", [a, b, 2, 2, 3], mm)
    np.testing.assert_allclose(device.download(mm),
                               (a.reshape(2, 3) @ b.reshape(3, 2)).ravel(), rtol=1e-6)
    total = bound(device, "reduce", [a], None)
    dot = bound(device, "dot_product", [a, b], None)
    assert type(total) is float and type(dot) is float
    want = float(np.sum(a.astype(np.float64)))
    assert total == (float(np.float32(want)) if etype == "f32" else pytest.approx(want, 1e-15))
    copy = device.alloc(dtype, 6, zero=False)
    bound(device, "copy", [a], copy)
    assert device.download(copy).tobytes() == device.download(a).tobytes()
    assert bound(device, "reduce", [device.alloc(dtype, 0, zero=True)], None) == 0.0


def test_an_f32_sum_on_the_general_path_has_the_batched_paths_bits() -> None:
    from erlcuda import kernels

    device = CpuDevice(0)
    values = np.random.default_rng(5).standard_normal(1001).astype(np.float32)
    (batched,) = device.execute([kernels.parse("reduce", [values])])
    assert bound(device, "reduce", [device.upload(values)], None) == batched


def test_cpu_arrays_are_owned_copies_and_an_image_that_is_no_library_is_refused() -> None:
    device = CpuDevice(0)
    host = np.arange(3, dtype=np.uint8)
    array = device.upload(host)
    host[0] = 9
    assert device.download(array).tolist() == [0, 1, 2]
    assert device.alloc(np.dtype("<i8"), 3, zero=True).tolist() == [0, 0, 0]
    device.free(array)
    with pytest.raises(BackendError) as info:
        device.load_module("m", b"", ["k"])
    assert info.value.code == "invalid_value" and "cannot load module m" in info.value.message
    with pytest.raises(BackendError, match="not loaded"):
        device.launch_user("m", "k", [array], (1, 1, 1), (1, 1, 1), 0)
    with pytest.raises(BackendError, match="no built-in"):
        bound(device, "fft", [array], None)


def test_the_path_of_a_launch_is_decided_in_one_place() -> None:
    registry = Registry()
    registry.install("m", [UserKernel("mine", "m", (("in", "f32"),))])

    def launch(kernel: str, *, general: bool = False) -> Launch:
        return Launch(1, 0, kernel, [], general=general)

    assert general.route(launch("vector_add"), registry) == "batched"
    assert general.route(launch("vector_add", general=True), registry) == "general"
    assert general.route(launch("copy"), registry) == "general"
    assert general.route(launch("mine"), registry) == "general"
    assert general.route(launch("nothing"), registry) == "unknown"
    assert general.route(launch("nothing")) == "general"  # no registry to ask
