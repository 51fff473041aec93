"""The CPU backend against a float64 reference, one job and batches, with f32 tolerances.

Tolerances: an f32 sum of n terms carries a relative error of at most about n·2^-24 of the
sum of magnitudes (the CPU backend accumulates in f64, so it is far inside that); vector_add
must equal numpy's own f32 add exactly.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from erlcuda import kernels
from erlcuda.backends.cpu import CpuBackend

EPS32 = 2.0**-24
device = CpuBackend(1).open(0)


def vec(rng: np.random.Generator, n: int) -> np.ndarray:
    return rng.standard_normal(n, dtype=np.float32)


def sum_bound(terms: np.ndarray) -> float:
    return float(np.abs(terms).sum()) * EPS32 * max(len(terms), 1) + 1e-30


@pytest.mark.parametrize("n", [0, 1, 7, 1000, 4097, 1 << 18])
def test_each_kernel_matches_the_reference(n: int) -> None:
    rng = np.random.default_rng(n)
    a, b = vec(rng, n), vec(rng, n)
    (c,) = device.execute([kernels.parse("vector_add", [a, b])])
    np.testing.assert_array_equal(c, a + b)
    (s,) = device.execute([kernels.parse("reduce", [a])])
    assert abs(s - a.astype(np.float64).sum()) <= sum_bound(a) + abs(s) * EPS32
    (d,) = device.execute([kernels.parse("dot_product", [a, b])])
    prods = a.astype(np.float64) * b
    assert abs(d - prods.sum()) <= sum_bound(prods) + abs(d) * EPS32


@pytest.mark.parametrize(("m", "n", "k"), [(1, 1, 1), (3, 5, 7), (64, 64, 64), (5, 3, 0),
                                           (0, 4, 3), (4, 0, 3)])
def test_matmul_matches_the_reference(m: int, n: int, k: int) -> None:
    rng = np.random.default_rng(m * 100 + n * 10 + k)
    a, b = vec(rng, m * k), vec(rng, k * n)
    (c,) = device.execute([kernels.parse("matmul", [a, b, m, n, k])])
    ref = a.reshape(m, k).astype(np.float64) @ b.reshape(k, n)
    bound = (np.abs(a.reshape(m, k)).astype(np.float64) @ np.abs(b.reshape(k, n))) * EPS32 * (k + 1)
    assert c.shape == (m * n,)
    assert np.all(np.abs(c.reshape(m, n) - ref) <= bound + 1e-30)


@given(st.lists(st.integers(0, 300), min_size=1, max_size=40), st.integers(0, 2**32 - 1))
def test_a_batch_equals_its_jobs_run_alone(sizes: list[int], seed: int) -> None:
    rng = np.random.default_rng(seed)
    for kernel in ("vector_add", "reduce", "dot_product"):
        jobs = []
        for n in sizes:
            a, b = vec(rng, n), vec(rng, n)
            jobs.append(kernels.parse(kernel, [a] if kernel == "reduce" else [a, b]))
        batched = device.execute(jobs)
        alone = [device.execute([job])[0] for job in jobs]
        assert len(batched) == len(jobs)
        for x, y in zip(batched, alone, strict=True):
            np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def test_matmul_batch_of_equal_shapes() -> None:
    rng = np.random.default_rng(9)
    jobs = [kernels.parse("matmul", [vec(rng, 6), vec(rng, 12), 2, 4, 3]) for _ in range(5)]
    for job, c in zip(jobs, device.execute(jobs), strict=True):
        np.testing.assert_allclose(c, (job.a.reshape(2, 3) @ job.b.reshape(3, 4)).ravel(),
                                   rtol=1e-6)


def test_reduce_batch_with_empty_segments() -> None:
    jobs = [kernels.parse("reduce", [np.ones(n, np.float32)]) for n in (0, 3, 0, 0, 5, 0)]
    assert device.execute(jobs) == [0.0, 3.0, 0.0, 0.0, 5.0, 0.0]


def test_device_arrays_past_the_machines_memory_are_out_of_memory() -> None:
    # numpy's zeros are lazy pages: without a count the worker would be killed later, when
    # a kernel touched them, instead of answering out_of_memory.
    from erlcuda.backends.base import BackendError
    from erlcuda.backends.cpu import CpuDevice

    device = CpuDevice(0, capacity=1000)
    a = device.alloc(np.dtype("<f8"), 100, zero=True)  # 800 bytes
    with pytest.raises(BackendError) as exc:
        device.alloc(np.dtype("<f8"), 30, zero=True)  # 240 more: over
    assert exc.value.code == "out_of_memory" and not exc.value.fatal
    device.free(a)
    b = device.upload(np.arange(120, dtype="<f8"))  # 960 bytes fit again
    assert device.held == 960 and b.sum() == sum(range(120))
    assert CpuDevice(0).capacity > 0
