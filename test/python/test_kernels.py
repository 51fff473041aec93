"""Argument checking shared by every backend: each bad job is a BadArgs with a reason."""

from __future__ import annotations

import numpy as np
import pytest

from erlcuda import kernels
from erlcuda.kernels import BadArgs, parse

ONE = np.ones(1, np.float32).tobytes()
TWO = np.ones(2, np.float32).tobytes()


def test_binaries_are_viewed_not_copied() -> None:
    buf = bytearray(np.arange(4, dtype="<f4").tobytes())
    request = parse("reduce", [memoryview(buf)])
    buf[0:4] = np.float32(9).tobytes()
    assert request.a[0] == 9.0


def test_lists_of_numbers_are_accepted() -> None:
    request = parse("vector_add", [[1, 2.5], [3, 4]])
    assert request.a.dtype == np.float32 and list(request.b) == [3.0, 4.0]


@pytest.mark.parametrize(
    ("kernel", "args", "match"),
    [
        ("fft", [ONE], "unknown kernel"),
        ("reduce", ONE, "must be a list"),
        ("reduce", [ONE, ONE], "takes 1 arguments"),
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
