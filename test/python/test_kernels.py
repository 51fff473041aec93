"""Argument checking shared by every backend: each bad job is a BadArgs with a reason."""

from __future__ import annotations

import numpy as np
import pytest

from erlcuda import contract, kernels
from erlcuda.contract import KernelSpec, Param
from erlcuda.kernels import BadArgs, parse

ONE = np.ones(1, np.float32).tobytes()
TWO = np.ones(2, np.float32).tobytes()


def test_binaries_are_viewed_not_copied() -> None:
    buf = bytearray(np.arange(4, dtype="<f4").tobytes())
    request = parse("reduce", [memoryview(buf)])
    buf[0:4] = np.float32(9).tobytes()
    assert request.a[0] == 9.0


def test_contiguous_arrays_are_taken_as_they_are_and_strided_ones_copied() -> None:
    # The backends read a vector's bytes from its first on (a copy's source, a kernel run
    # in place on pinned memory): a strided view must not reach them as it is.
    whole = np.arange(8, dtype=np.float32)
    request = parse("vector_add", [whole[:4], whole[::2]])
    assert request.a.base is whole  # a view, not a copy
    assert request.b is not None and request.b.flags.c_contiguous
    assert list(request.b) == [0.0, 2.0, 4.0, 6.0]


def test_lists_of_numbers_are_accepted() -> None:
    request = parse("vector_add", [[1, 2.5], [3, 4]])
    assert request.a.dtype == np.float32 and list(request.b) == [3.0, 4.0]


@pytest.mark.parametrize(
    ("kernel", "args", "match"),
    [
        ("fft", [ONE], "unknown kernel"),
        ("reduce", ONE, "must be a list"),
        ("reduce", [ONE, ONE], "takes 1 argument,"),
        ("vector_add", [ONE, TWO], "length mismatch"),
        ("dot_product", [ONE, b"\x00\x00"], "not a multiple of 4"),
        ("vector_add", [[1.0, "x"], [1.0, 2.0]], "not a number"),
        ("vector_add", [[True], [1.0]], "not a number"),
        ("reduce", [{"a": 1}], "expected a list"),
        ("reduce", [[1e300]], "out of range"),
        ("matmul", [ONE, ONE, 1, 1], "takes 5 arguments"),
        ("matmul", [ONE, ONE, 1, 1, 2], "M\\*K"),
        ("matmul", [TWO, ONE, 1, 1, 2], "K\\*N"),
        ("matmul", [ONE, ONE, -1, 1, 1], "out of range"),
        ("matmul", [ONE, ONE, 1.0, 1, 1], "non-negative integer"),
        ("matmul", [ONE, ONE, 2**62, 2**62, 0], "out of range"),
        ("matmul", [b"", b"", 2**31 - 1, 2**31 - 1, 0], "too large"),
    ],
)
def test_bad_args_are_refused(kernel: str, args: object, match: str) -> None:
    with pytest.raises(BadArgs, match=match):
        parse(kernel, args)  # type: ignore[arg-type]


def test_batch_keys() -> None:
    assert parse("reduce", [ONE]).key == parse("reduce", [TWO]).key
    assert parse("matmul", [ONE, ONE, 1, 1, 1]).key != parse("matmul", [TWO, ONE, 2, 1, 1]).key
    assert kernels.KERNELS == ("vector_add", "reduce", "dot_product", "matmul")


def test_a_plan_knows_its_sizes_however_it_was_made() -> None:
    a, b = np.ones(6, np.float32), np.ones(12, np.float32)
    parsed = parse("matmul", [a, b, 2, 4, 3])
    made = kernels.batch_plan("matmul", a, b, 2, 4, 3)
    for request in (parsed, made):
        assert (request.elements, request.out_elements) == (18, 8)
        assert request.device_bytes == 4 * 26 and request.key == ("matmul", 2, 4, 3)
    assert parse("dot_product", [a, a]).out_elements == 1
    assert parse("reduce", [a]).b is None and parse("reduce", [a]).a is a  # no copy


def test_the_catalogue_is_the_contracts() -> None:
    # The batched f32 path takes the contract's kernels but its general ones (the buffer
    # operations copy, zeros and empty), which only the general path runs.
    assert kernels.KERNELS == tuple(k for k, spec in contract.KERNELS.items()
                                    if not spec.general)
    assert {k for k, spec in contract.KERNELS.items() if spec.general} == {
        "copy", "zeros", "empty"}
    for spec in contract.KERNELS.values():
        if spec.general:
            with pytest.raises(BadArgs, match=f"{spec.name} is not a kernel of the batched"):
                parse(spec.name, [ONE] * spec.arity)
            continue
        arity = kernels.counted(spec.arity, "argument")
        with pytest.raises(BadArgs, match=f"{spec.name} takes {arity},"):
            parse(spec.name, [ONE] * (spec.arity + 1))


def test_every_element_type_has_its_dtype() -> None:
    assert list(kernels.DTYPES) == list(contract.ELEMENT_TYPES)
    assert [kernels.DTYPES[t].itemsize for t in contract.ELEMENT_TYPES] == [4, 8, 4, 4, 8, 1]
    assert all(kernels.DTYPES[t].byteorder in "<|=" for t in contract.ELEMENT_TYPES)


def test_a_kernel_declared_in_the_contract_is_checked_without_code(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # y = A * s for a vector A of N elements tied to a dim, and a result of N*R elements.
    spec = KernelSpec(
        "scale", "test", (Param("A", "vector", "f32", ("N",)), Param("X", "vector", "f32", ("A",)),
                          Param("N", "dim"), Param("R", "dim")),
        Param("result", "vector", "f32", ("N", "R")))
    monkeypatch.setitem(contract.KERNELS, "scale", spec)
    request = parse("scale", [TWO, TWO, 2, 3])
    assert request.a.size == 2 and request.b is not None and request.b.size == 2
    assert (request.m, request.n, request.k) == (2, 3, 0)
    assert request.out_elements == 6 and request.device_bytes == 4 * (4 + 6)
    with pytest.raises(BadArgs, match=r"A has 1 element, N = 2"):
        parse("scale", [ONE, ONE, 2, 3])
    with pytest.raises(BadArgs, match="length mismatch: A has 2 elements, X has 1"):
        parse("scale", [TWO, ONE, 2, 3])
    with pytest.raises(BadArgs, match="R: expected a non-negative integer"):
        parse("scale", [TWO, TWO, 2, "3"])


def test_the_result_is_bounded_by_max_elements(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kernels, "MAX_ELEMENTS", 100)
    assert parse("matmul", [b"", b"", 10, 10, 0]).out_elements == 100
    with pytest.raises(BadArgs, match=r"result M\*N = 110 is too large"):
        parse("matmul", [b"", b"", 10, 11, 0])
    with pytest.raises(BadArgs, match="A: 101 elements, over the 100 limit"):
        parse("reduce", [np.ones(101, np.float32)])
