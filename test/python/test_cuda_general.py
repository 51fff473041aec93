"""The CUDA backend's general path: device arrays of every element type, the catalogue
kernels on them (f32 and f64), and what of user modules only a GPU runs (shared memory,
launch bounds, a kernel that faults; the rest is test_user_kernels.py, on each backend).
Needs a GPU, PyCUDA and nvcc.

Tolerances: vector_add and copy are exact. Sums of n terms t_i: f32 within
1e-5 * sum|t| + 1e-6 (as test_cuda_backend.py), f64 within 1e-12 * sum|t| + 1e-300 (the
f64 kernels add along chains of at most a few thousand terms, then trees: their error is
near 2^-53 * chain * sum|t|, far below the bound). matmul: the classical bound of a K-term
dot product, K * 2u * (|A| @ |B|) with u = 2^-24 (f32) or 2^-53 (f64).
"""

from __future__ import annotations

import math
import mmap
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pytest

from erlcuda import usercode
from erlcuda.backends.base import BackendError
from erlcuda.kernels import Plan
from erlcuda_testworker import pool_stats

if TYPE_CHECKING:
    from erlcuda.backends.cuda import CudaArray, CudaDevice


def bound(device: Any, kernel: str, operands: list[Any], out: Any) -> Any:
    """A catalogue kernel on device arrays, as a lane runs a plan alone."""
    return device.execute([Plan(kernel, "builtin")], operands, out)[0]

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parents[2]
DTYPES = {"f32": np.dtype("<f4"), "f64": np.dtype("<f8"), "i32": np.dtype("<i4"),
          "u32": np.dtype("<u4"), "i64": np.dtype("<i8"), "u8": np.dtype("u1")}
F32, F64 = DTYPES["f32"], DTYPES["f64"]
#: Sizes of the round trips; the last ones span several transfer chunks (32 MiB each).
SIZES = [0, 1, 3, 1000, 4097, (1 << 20) + 3]
CHUNKED_BYTES = [(32 << 20) - 8, (32 << 20) + 8, 3 * (32 << 20) + 40]
MATMUL_SHAPES = [(1, 1, 1), (3, 5, 7), (64, 64, 64), (65, 63, 17), (127, 129, 65),
                 (256, 256, 256), (384, 128, 24), (130, 257, 1), (5, 3, 0), (0, 4, 3),
                 (4, 0, 3), (1, 300, 1000)]


@pytest.fixture(scope="module")
def device() -> Iterator[CudaDevice]:
    from erlcuda.backends.cuda import CudaBackend

    backend = CudaBackend()
    dev = backend.open(0)
    yield dev
    dev.close()
    backend.close()


class Arrays:
    """Makes device arrays and frees every one of them at the end of the test."""

    def __init__(self, device: CudaDevice) -> None:
        self.device = device
        self.made: list[CudaArray] = []

    def up(self, host: np.ndarray) -> CudaArray:
        array = self.device.upload(host)
        self.made.append(array)
        return array

    def new(self, dtype: np.dtype[Any], count: int, *, zero: bool = False) -> CudaArray:
        array = self.device.alloc(dtype, count, zero=zero)
        self.made.append(array)
        return array

    def down(self, array: CudaArray) -> np.ndarray:
        return self.device.download(array)


@pytest.fixture
def arrays(device: CudaDevice) -> Iterator[Arrays]:
    made = Arrays(device)
    yield made
    for array in made.made:
        device.free(array)


@pytest.fixture(scope="module")
def arch(device: CudaDevice) -> str:
    return usercode.arch_of(device.info()["compute_capability"])


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("cubins")


def rng(seed: int) -> np.random.Generator:
    return np.random.default_rng(seed)


def random_of(dtype: np.dtype[Any], n: int, seed: int) -> np.ndarray:
    gen = rng(seed)
    if dtype.kind == "f":
        values = gen.standard_normal(n).astype(dtype)
        if n >= 8:  # the bytes travel as they are: specials too
            values[:4] = [np.nan, np.inf, -np.inf, -0.0]
        return values
    info = np.iinfo(dtype)
    return gen.integers(info.min, info.max, size=n, dtype=dtype, endpoint=True)


def floats(dtype: np.dtype[Any], n: int, seed: int) -> np.ndarray:
    return rng(seed).standard_normal(n).astype(dtype)


def same_bytes(got: np.ndarray, want: np.ndarray) -> None:
    assert got.dtype == want.dtype and got.shape == want.shape
    assert got.tobytes() == want.tobytes()


def check_sum(got: object, terms: np.ndarray, dtype: np.dtype[Any]) -> None:
    assert isinstance(got, float)
    ref = math.fsum(terms.tolist())
    scale = float(np.sum(np.abs(terms)))
    tol = 1e-5 * scale + 1e-6 if dtype == F32 else 1e-12 * scale + 1e-300
    assert abs(got - ref) <= tol, (got, ref, tol)


def check_matmul(got: np.ndarray, a: np.ndarray, b: np.ndarray, m: int, n: int, k: int) -> None:
    assert got.dtype == a.dtype and got.shape == (m * n,)
    a64 = a.astype(np.float64).reshape(m, k)
    b64 = b.astype(np.float64).reshape(k, n)
    ref = a64 @ b64
    u = 2.0**-24 if a.dtype == F32 else 2.0**-53
    bound = k * 2 * u * (np.abs(a64) @ np.abs(b64))
    err = np.abs(got.astype(np.float64).reshape(m, n) - ref)
    assert np.all(err <= bound), float(np.max(err - bound))


# -- device arrays ---------------------------------------------------------------------------


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("type_", list(DTYPES))
def test_round_trip(arrays: Arrays, type_: str, n: int) -> None:
    host = random_of(DTYPES[type_], n, n)
    array = arrays.up(host)
    assert array.dtype == DTYPES[type_] and array.size == n and array.nbytes == host.nbytes
    host_copy = host.copy()
    got = arrays.down(array)
    same_bytes(got, host)
    same_bytes(host, host_copy)  # the source is untouched
    if n:
        got[:] = 0  # the download is the caller's own copy
        same_bytes(arrays.down(array), host)


@pytest.mark.parametrize("nbytes", CHUNKED_BYTES)
@pytest.mark.parametrize("type_", ["u8", "f64"])
def test_round_trip_over_several_chunks(arrays: Arrays, type_: str, nbytes: int) -> None:
    dtype = DTYPES[type_]
    n = nbytes // dtype.itemsize
    host = rng(nbytes).integers(0, 256, size=n * dtype.itemsize, dtype=np.uint8).view(dtype)
    array = arrays.up(host)
    same_bytes(arrays.down(array), host)


@pytest.mark.parametrize("nbytes", [4096, (32 << 20) + 4096])
def test_an_upload_from_registered_memory_is_copied_where_it_lies(
        arrays: Arrays, device: CudaDevice, nbytes: int) -> None:
    mapped = np.frombuffer(mmap.mmap(-1, nbytes), np.uint8)
    mapped[:] = rng(nbytes).integers(0, 256, size=nbytes, dtype=np.uint8)
    assert device.pinning.pin(mapped)
    try:
        assert device.pinning.covers(mapped)
        same_bytes(arrays.down(arrays.up(mapped.view(F32))), mapped.view(F32))
    finally:
        device.pinning.unpin(mapped)


def test_upload_takes_any_contiguity(arrays: Arrays) -> None:
    host = np.arange(20, dtype=np.int64)[::2]  # strided
    same_bytes(arrays.down(arrays.up(host)), np.ascontiguousarray(host))


@pytest.mark.parametrize("type_", list(DTYPES))
def test_zeroed_alloc(arrays: Arrays, device: CudaDevice, type_: str) -> None:
    dtype = DTYPES[type_]
    n = 100_003
    # Fill memory with ones and give it back, so that the next allocation likely reuses it.
    device.free(device.upload(np.full(n, 0xFF, np.uint8)))
    for count in (0, 1, n // dtype.itemsize):
        array = arrays.new(dtype, count, zero=True)
        assert array.size == count and array.dtype == dtype
        same_bytes(arrays.down(array), np.zeros(count, dtype))


def test_empty_alloc(arrays: Arrays) -> None:
    for count in (0, 5, 12345):
        array = arrays.new(F64, count)
        assert array.size == count and array.nbytes == 8 * count
        assert arrays.down(array).shape == (count,)


def test_alloc_refuses_negative_counts_and_odd_types(device: CudaDevice) -> None:
    for dtype, count in ((F32, -1), (np.dtype(object), 4), (np.dtype("U4"), 4)):
        with pytest.raises(BackendError) as info:
            device.alloc(dtype, count, zero=False)
        assert info.value.code == "invalid_value" and not info.value.fatal


@pytest.mark.parametrize("count", [1 << 40, 1 << 61])
def test_out_of_memory_is_reported_and_survived(arrays: Arrays, device: CudaDevice,
                                                count: int) -> None:
    free_before = device.info()["free_memory"]
    with pytest.raises(BackendError) as info:
        device.alloc(F64, count, zero=True)
    assert info.value.code == "out_of_memory" and not info.value.fatal
    with pytest.raises(BackendError) as info:
        device.alloc(np.dtype(np.uint8), count * 8, zero=False)
    assert info.value.code == "out_of_memory" and not info.value.fatal
    # Still usable, and nothing leaked.
    a = floats(F32, 1000, 1)
    b = floats(F32, 1000, 2)
    da, db, dc = arrays.up(a), arrays.up(b), arrays.new(F32, 1000)
    assert bound(device, "vector_add", [da, db], dc) is None
    same_bytes(arrays.down(dc), a + b)
    assert device.info()["free_memory"] >= free_before - (64 << 20)


def test_free_gives_memory_back(device: CudaDevice) -> None:
    size = 1 << 30
    device.pool.flush()
    before = device.info()["free_memory"]
    array = device.alloc(np.dtype(np.uint8), size, zero=False)
    assert device.info()["free_memory"] <= before - size
    device.free(array)
    device.free(array)  # twice: nothing happens (and the block is not cached twice)
    info = device.info()
    assert info["pool_bytes"] <= pool_stats(device)["limit"]
    assert info["free_memory"] + info["pool_bytes"] >= before - (16 << 20)
    device.pool.flush()  # the cache's memory goes back to the device
    info = device.info()
    assert info["pool_bytes"] == 0 and info["free_memory"] >= before - (16 << 20)
    with pytest.raises(BackendError) as info_:
        device.download(array)  # used after free
    assert info_.value.code == "invalid_value"


def test_info_keys(device: CudaDevice) -> None:
    from erlcuda import contract

    info = device.info()
    assert set(info) == {"name", "total_memory", "free_memory", "compute_capability",
                         "pool_bytes", "pinned_bytes", "register_min", "in_place_max"}
    assert set(info) <= contract.ATOMS  # Erlang knows every key
    for key in ("pool_bytes", "pinned_bytes", "register_min", "in_place_max"):
        assert isinstance(info[key], int) and info[key] >= 0, key


# -- the memory pool -------------------------------------------------------------------------


@pytest.fixture
def pool_limit(device: CudaDevice) -> Iterator[Any]:
    """Sets the pool's bound for one test (``pool_limit(bytes)``), then restores it."""
    pool = device._pool
    old = pool.limit
    pool.flush()
    yield lambda limit: setattr(pool, "limit", limit)
    pool.limit = old
    pool.trim(old)


def test_the_pool_bound_is_the_default(device: CudaDevice) -> None:
    from erlcuda.backends.pool import default_limit

    total = device.info()["total_memory"]
    assert pool_stats(device)["limit"] == default_limit(total) == min(1 << 30, total // 16)


@pytest.mark.parametrize("nbytes", [4, 1000, 100_003, (1 << 20) + 1, 64_000_000])
def test_a_freed_array_is_reused_by_the_next_one_of_its_class(device: CudaDevice,
                                                              nbytes: int) -> None:
    from erlcuda.backends.pool import size_class

    a = device.alloc(np.dtype(np.uint8), nbytes, zero=False)
    ptr = a.ptr
    stats = pool_stats(device)
    device.free(a)
    assert device.info()["pool_bytes"] >= size_class(nbytes)
    b = device.alloc(np.dtype(np.uint8), nbytes, zero=False)
    try:
        assert b.ptr == ptr
        assert pool_stats(device)["hits"] == stats["hits"] + 1
        assert pool_stats(device)["misses"] == stats["misses"]
    finally:
        device.free(b)


@pytest.mark.parametrize("type_", list(DTYPES))
def test_a_reused_block_is_zeroed_when_asked(device: CudaDevice, type_: str) -> None:
    dtype = DTYPES[type_]
    n = 100_000  # bytes: one size class for every element type
    dirty = device.upload(np.full(n, 0xA5, np.uint8))
    ptr = dirty.ptr
    device.free(dirty)
    array = device.alloc(dtype, n // dtype.itemsize, zero=True)
    try:
        assert array.ptr == ptr  # the dirty block, reused
        same_bytes(device.download(array), np.zeros(n // dtype.itemsize, dtype))
    finally:
        device.free(array)
    # And reused again (the most recently freed block of a class comes first).
    array = device.alloc(np.dtype(np.uint8), n, zero=False)
    try:
        assert array.ptr == ptr
    finally:
        device.free(array)


def test_live_arrays_never_share_a_block(arrays: Arrays, device: CudaDevice) -> None:
    n = 300_000
    first = [arrays.up(np.full(n, i, np.int32)) for i in range(8)]
    for array in first[::2]:
        device.free(array)
    live = first[1::2] + [arrays.up(np.full(n, 100 + i, np.int32)) for i in range(8)]
    ptrs = [a.ptr for a in live]
    assert len(set(ptrs)) == len(ptrs) == 12
    for array, value in zip(live, [1, 3, 5, 7, *range(100, 108)], strict=True):
        same_bytes(arrays.down(array), np.full(n, value, np.int32))


def test_a_keep_chain_reuses_its_blocks(arrays: Arrays, device: CudaDevice) -> None:
    # The chain benchmark's steps: each makes a result from the last one, which goes.
    n = 16_000_000
    b = arrays.up(np.ones(n, F32))
    x = device.upload(np.zeros(n, F32))
    before = pool_stats(device)
    for _ in range(10):
        out = device.alloc(F32, n, zero=False)
        bound(device, "vector_add", [x, b], out)
        device.free(x)
        x = out
    stats = pool_stats(device)
    assert stats["misses"] - before["misses"] <= 1  # one new block at most, then reuse
    assert stats["hits"] - before["hits"] >= 9
    arrays.made.append(x)
    same_bytes(arrays.down(x), np.full(n, 10, F32))


def test_the_cache_stays_under_its_bound(device: CudaDevice, pool_limit: Any) -> None:
    pool_limit(64 << 20)
    made = [device.alloc(np.dtype(np.uint8), 48 << 20, zero=False) for _ in range(4)]
    free_before = device.info()["free_memory"]
    for array in made:
        device.free(array)
    stats = pool_stats(device)
    assert stats["cached_bytes"] == 48 << 20 and stats["cached_blocks"] == 1
    assert device.info()["pool_bytes"] == 48 << 20
    # The three others were really freed.
    assert device.info()["free_memory"] >= free_before + (144 << 20) - (16 << 20)
    # A block larger than the bound is not kept at all.
    big = device.alloc(np.dtype(np.uint8), 65 << 20, zero=False)
    device.free(big)
    assert pool_stats(device)["cached_bytes"] == 48 << 20


def test_out_of_memory_empties_the_cache_first(device: CudaDevice, pool_limit: Any) -> None:
    pool_limit(1 << 30)
    cached = device.alloc(np.dtype(np.uint8), 256 << 20, zero=False)
    device.free(cached)
    assert device.info()["pool_bytes"] == 256 << 20
    flushes = pool_stats(device)["flushes"]
    with pytest.raises(BackendError) as info:
        device.alloc(np.dtype(np.uint8), 1 << 43, zero=False)
    assert info.value.code == "out_of_memory" and not info.value.fatal
    assert pool_stats(device)["flushes"] == flushes + 1
    assert device.info()["pool_bytes"] == 0
    # An allocation that fits only once the cache is gone: nearly all the free memory.
    free = device.info()["free_memory"]
    stash = device.alloc(np.dtype(np.uint8), 256 << 20, zero=False)
    device.free(stash)
    assert device.info()["pool_bytes"] == 256 << 20
    big = device.alloc(np.dtype(np.uint8), free - (128 << 20), zero=False)
    try:
        assert pool_stats(device)["flushes"] == flushes + 2
        assert device.info()["pool_bytes"] == 0
    finally:
        device.free(big)
    device.pool.flush()


def test_an_array_of_another_device_is_refused(device: CudaDevice) -> None:
    from erlcuda.backends.cuda import CudaArray
    from erlcuda.backends.pool import Block

    mine = device.alloc(F32, 10, zero=False)
    try:
        stranger = CudaArray(Block(None, mine.ptr, 512), F32, 10)
        with pytest.raises(BackendError) as info:
            device.free(stranger)
        assert info.value.code == "invalid_value"
    finally:
        device.free(mine)


def test_close_frees_every_block(device: CudaDevice) -> None:
    from erlcuda.backends.cuda import CudaBackend

    backend = CudaBackend()
    other = backend.open(0)  # a context of its own, current until closed
    try:
        freed: list[int] = []
        raw_free = other._raw_free
        other._pool._raw_free = lambda alloc: (freed.append(int(alloc)), raw_free(alloc))
        cached = other.alloc(F32, 1000, zero=True)
        live = other.upload(np.ones(5000, F64))
        ptrs = sorted([cached.ptr, live.ptr])
        other.free(cached)
        assert other.info()["pool_bytes"] == 4096
    finally:
        other.close()
        backend.close()
    assert sorted(freed) == ptrs
    other.free(live)  # after close: nothing happens
    with pytest.raises(BackendError):
        other.alloc(F32, 1, zero=False)
    # The module's device is current again, and works.
    x = device.upload(np.arange(10, dtype=F32))
    try:
        same_bytes(device.download(x), np.arange(10, dtype=F32))
    finally:
        device.free(x)


# -- catalogue kernels on device arrays ------------------------------------------------------


@pytest.mark.parametrize("n", [0, 1, 3, 1000, 4097, (1 << 20) + 3])
@pytest.mark.parametrize("type_", ["f32", "f64"])
def test_vector_add(arrays: Arrays, device: CudaDevice, type_: str, n: int) -> None:
    dtype = DTYPES[type_]
    a, b = floats(dtype, n, n), floats(dtype, n, n + 1)
    out = arrays.new(dtype, n)
    assert bound(device, "vector_add", [arrays.up(a), arrays.up(b)], out) is None
    same_bytes(arrays.down(out), a + b)


@pytest.mark.parametrize("n", [0, 1, 3, 1000, 4097, (1 << 20) + 3, (1 << 22) + 1])
@pytest.mark.parametrize("type_", ["f32", "f64"])
def test_reduce_and_dot(arrays: Arrays, device: CudaDevice, type_: str, n: int) -> None:
    dtype = DTYPES[type_]
    x, y = floats(dtype, n, 2 * n), floats(dtype, n, 2 * n + 1)
    dx, dy = arrays.up(x), arrays.up(y)
    got = bound(device, "reduce", [dx], None)
    check_sum(got, x.astype(np.float64), dtype)
    got = bound(device, "dot_product", [dx, dy], None)
    check_sum(got, x.astype(np.float64) * y.astype(np.float64), dtype)
    if n == 0:
        assert bound(device, "reduce", [dx], None) == 0.0


def test_f64_sums_keep_f64_precision(arrays: Arrays, device: CudaDevice) -> None:
    # 1 + 2^-40 repeated: f32 accumulation would lose the 2^-40s entirely; f64 keeps them
    # up to rounding errors of a few 2^-32 (the ulp of the final sums, near 2^20).
    n = (1 << 20) + 7
    x = np.full(n, 1.0 + 2.0**-40)
    got = bound(device, "reduce", [arrays.up(x)], None)
    assert isinstance(got, float)
    assert abs((got - n) - n * 2.0**-40) <= 0.01 * n * 2.0**-40
    ones = np.ones((1 << 24) + 3)  # every partial sum is an exact integer
    assert bound(device, "reduce", [arrays.up(ones)], None) == float(ones.size)


@pytest.mark.parametrize(("m", "n", "k"), MATMUL_SHAPES)
@pytest.mark.parametrize("type_", ["f32", "f64"])
def test_matmul(arrays: Arrays, device: CudaDevice, type_: str, m: int, n: int, k: int) -> None:
    dtype = DTYPES[type_]
    a, b = floats(dtype, m * k, m + n), floats(dtype, k * n, k + 1)
    out = arrays.new(dtype, m * n)
    if k == 0 and m * n:
        bound(device, "copy", [arrays.up(np.ones(m * n, dtype))], out)  # must be overwritten
    assert bound(device, "matmul", [arrays.up(a), arrays.up(b), m, n, k], out) is None
    got = arrays.down(out)
    check_matmul(got, a, b, m, n, k)
    if k == 0:
        assert not np.any(got)


def test_f64_matmul_is_f64(arrays: Arrays, device: CudaDevice) -> None:
    # Entries that f32 cannot hold: an f32 kernel would lose the 2^-40.
    a = np.array([1.0 + 2.0**-40, 1.0, 3.0, 2.0**-30])
    b = np.array([1.0, 1e-20, 1.0, 1.0])
    out = arrays.new(F64, 4)
    bound(device, "matmul", [arrays.up(a), arrays.up(b), 2, 2, 2], out)
    got = arrays.down(out)
    check_matmul(got, a, b, 2, 2, 2)
    assert got[0] == 2.0 + 2.0**-40  # exact: (1 + 2^-40) * 1 + 1 * 1


@pytest.mark.parametrize("type_", list(DTYPES))
@pytest.mark.parametrize("n", [0, 1, 4097])
def test_copy(arrays: Arrays, device: CudaDevice, type_: str, n: int) -> None:
    host = random_of(DTYPES[type_], n, n + 7)
    src = arrays.up(host)
    out = arrays.new(DTYPES[type_], n)
    assert bound(device, "copy", [src], out) is None
    same_bytes(arrays.down(out), host)
    same_bytes(arrays.down(src), host)


def test_builtin_refusals(arrays: Arrays, device: CudaDevice) -> None:
    f32 = arrays.up(np.ones(4, F32))
    f64 = arrays.up(np.ones(4, F64))
    i32 = arrays.up(np.ones(4, np.int32))
    short = arrays.up(np.ones(3, F32))
    out32 = arrays.new(F32, 4)
    cases: list[tuple[str, list[Any], Any, str]] = [
        ("vector_add", [f32, f64], out32, "invalid_value"),  # mixed types
        ("vector_add", [f32, short], out32, "invalid_value"),  # lengths differ
        ("vector_add", [f32, f32], short, "invalid_value"),  # result of the wrong length
        ("vector_add", [i32, i32], arrays.new(np.dtype(np.int32), 4), "invalid_value"),
        ("vector_add", [f32, f32], None, "invalid_value"),
        ("vector_add", [f32], out32, "invalid_value"),
        ("reduce", [i32], None, "invalid_value"),
        ("dot_product", [f32, short], None, "invalid_value"),
        ("matmul", [f32, f32, 2, 2, 3], out32, "invalid_value"),  # A is not 2 x 3
        ("matmul", [f32, f32, 2, 2, -2], out32, "invalid_value"),
        ("matmul", [f32, f32, 2, 2, 2], f64, "invalid_value"),
        ("copy", [f32], f64, "invalid_value"),
        ("copy", [f32], short, "invalid_value"),
        ("copy", [np.ones(4, F32)], out32, "invalid_value"),  # a host array
        ("no_such_kernel", [f32], out32, "not_supported"),
    ]
    for kernel, operands, out, code in cases:
        with pytest.raises(BackendError) as info:
            bound(device, kernel, operands, out)
        assert (info.value.code, info.value.fatal) == (code, False), (kernel, info.value)


def test_fast_path_still_works_after_general_work(arrays: Arrays, device: CudaDevice) -> None:
    from erlcuda.kernels import parse

    big = floats(F64, (1 << 22) + 1, 3)
    arrays.up(big)
    a = floats(F32, 5000, 4)
    [out] = device.execute([parse("vector_add", [a, a])])
    np.testing.assert_array_equal(out, a + a)
    [total] = device.execute([parse("reduce", [np.ones(1000, F32)])])
    assert total == 1000.0


# -- user modules: what only a GPU runs (the rest: test_user_kernels.py, on each backend) -----

SHARED = """
extern "C" __global__ void shared_sum(const float* x, float* out, int n) {
    extern __shared__ float buf[];
    for (int i = threadIdx.x; i < n; i += blockDim.x) buf[i] = x[i];
    __syncthreads();
    if (threadIdx.x == 0) {
        float s = 0.0f;
        for (int i = 0; i < n; ++i) s += buf[i];
        out[0] = s;
    }
}
"""

BOUNDED = """
extern "C" __global__ void __launch_bounds__(64) bounded(int* out) { out[threadIdx.x] = 1; }
"""


def load(device: CudaDevice, arch: str, cache: Path, module: str, source: str,
         functions: list[str]) -> None:
    device.load_module(module, usercode.compile_module(source, [], arch, cache=cache),
                       functions)


@pytest.mark.parametrize("count", [1000, 30_000])  # 4 KB, and 120 KB (over the 48 KB default)
def test_dynamic_shared_memory(arrays: Arrays, device: CudaDevice, arch: str, cache: Path,
                               count: int) -> None:
    load(device, arch, cache, "shared_mod", SHARED, ["shared_sum"])
    x = np.ones(count, F32)
    out = arrays.new(F32, 1)
    device.launch_user("shared_mod", "shared_sum", [arrays.up(x), out, np.int32(count)],
                       (1, 1, 1), (256, 1, 1), 4 * count)
    assert arrays.down(out)[0] == float(count)
    device.unload_module("shared_mod")


def test_launch_bounds_and_host_arrays_are_refused(arrays: Arrays, device: CudaDevice,
                                                   arch: str, cache: Path) -> None:
    load(device, arch, cache, "bounded_mod", BOUNDED, ["bounded"])
    out = arrays.new(np.dtype(np.int32), 1024, zero=True)
    bad: list[tuple[list[Any], tuple[int, int, int]]] = [
        ([out], (1024, 1, 1)),  # over its launch bounds
        ([np.ones(3, F32)], (32, 1, 1)),  # a host array
    ]
    for args, block in bad:
        with pytest.raises(BackendError) as info:
            device.launch_user("bounded_mod", "bounded", args, (1, 1, 1), block, 0)
        assert not info.value.fatal, (block, info.value)
        assert info.value.code in ("invalid_value", "launch_failed"), info.value
    device.launch_user("bounded_mod", "bounded", [out], (1, 1, 1), (64, 1, 1), 0)
    got = arrays.down(out)
    assert got[:64].tolist() == [1] * 64 and not got[64:].any()
    device.unload_module("bounded_mod")


# -- a faulting user kernel, in a process of its own (the fault poisons the context) ----------

FAULT_SCRIPT = """
import sys
from pathlib import Path

import numpy as np
from erlcuda import usercode
from erlcuda.backends.base import BackendError
from erlcuda.backends.cuda import CudaBackend

source = '''
extern "C" __global__ void far_write(float* p, long long n) {
    p[n + (1LL << 40)] = 1.0f;  // 4 TiB past the end: no memory is mapped there
}
'''
backend = CudaBackend()
dev = backend.open(0)
arch = usercode.arch_of(dev.info()["compute_capability"])
dev.load_module("fault", usercode.compile_module(source, [], arch, cache=Path(sys.argv[1])),
                ["far_write"])
array = dev.upload(np.ones(16, np.float32))
try:
    dev.launch_user("fault", "far_write", [array, np.int64(16)], (1, 1, 1), (1, 1, 1), 0)
except BackendError as exc:
    print("CODE", exc.code, exc.fatal, flush=True)
dev.free(array)
dev.close()
backend.close()
print("CLOSED", flush=True)
"""


def test_faulting_user_kernel_is_a_fatal_backend_error(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(FAULT_SCRIPT), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
        env={
            **os.environ,
            "PYTHONPATH": os.pathsep.join(
                filter(None, [str(ROOT / "python"), os.environ.get("PYTHONPATH")])
            ),
        },
        check=False,
    )
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log
    assert "CODE illegal_address True" in proc.stdout, log
    assert "CLOSED" in proc.stdout, log
