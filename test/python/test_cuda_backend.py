"""The CUDA backend against float64 numpy references (needs a GPU and PyCUDA).

Tolerances, for f32 results against the exact (float64) value of the same f32 inputs:
- vector_add: exact. One f32 addition rounds the same on the GPU and in numpy.
- reduce / dot_product: |ours - ref| <= 1e-5 * sum(|x_i * y_i|) + 1e-6. The kernels add
  in f32 along short chains (eight accumulators per thread: about n / 2M terms each for one
  vector, whose pass 1 has ~1000 blocks, and n / 2048 for a segment, one block) and then as
  trees, so the rounding error stays near sqrt(chain) * 2^-24 * sum|t|, far under the bound
  for these sizes; the 1e-6 absorbs the tiny sums.
- matmul: every element within the classical bound for a K-term f32 dot product,
  |c - ref| <= K * 2^-23 * (|A| @ |B|) (twice gamma_K); it holds for any order of
  accumulation, so it is a bound, not a guess.
"""

from __future__ import annotations

import mmap
import os
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pytest

from erlcuda.backends.base import BackendError
from erlcuda.kernels import Plan, batch_plan, parse

if TYPE_CHECKING:
    from erlcuda.backends.cuda import CudaDevice

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parents[2]
SIZES = [0, 1, 31, 1000, 1023, 4097, (1 << 20) + 3]
PAGE = mmap.PAGESIZE
MATMUL_SHAPES = [  # (m, n, k)
    (1, 1, 1),
    (3, 5, 7),
    (64, 64, 64),
    (127, 129, 65),
    (256, 256, 256),  # the aligned kernel
    (384, 128, 24),  # aligned, K smaller than a tile
    (130, 257, 1),
    (5, 3, 0),  # K == 0: zeros
    (0, 4, 3),  # M == 0: empty
    (4, 0, 3),  # N == 0: empty
]


@pytest.fixture(scope="module")
def device() -> Iterator[CudaDevice]:
    from erlcuda.backends.cuda import CudaBackend

    backend = CudaBackend()
    dev = backend.open(0)
    yield dev
    dev.close()
    backend.close()


def rng(seed: int) -> np.random.Generator:
    return np.random.default_rng(seed)


def vec(gen: np.random.Generator, n: int) -> np.ndarray:
    return gen.standard_normal(n).astype(np.float32)


def check_sum(got: object, terms: np.ndarray) -> None:
    assert isinstance(got, float)
    ref = float(np.sum(terms, dtype=np.float64))
    tol = 1e-5 * float(np.sum(np.abs(terms), dtype=np.float64)) + 1e-6
    assert abs(got - ref) <= tol, (got, ref, tol)


def check_matmul(got: object, a: np.ndarray, b: np.ndarray, m: int, n: int, k: int) -> None:
    assert isinstance(got, np.ndarray)
    assert got.dtype == np.float32 and got.shape == (m * n,)
    a64 = a.astype(np.float64).reshape(m, k)
    b64 = b.astype(np.float64).reshape(k, n)
    ref = a64 @ b64
    bound = k * 2.0**-23 * (np.abs(a64) @ np.abs(b64))
    err = np.abs(got.reshape(m, n) - ref)
    assert np.all(err <= bound), float(np.max(err - bound))


# -- one job at a time -----------------------------------------------------------------------


@pytest.mark.parametrize("n", SIZES)
def test_vector_add(device: CudaDevice, n: int) -> None:
    gen = rng(n)
    a, b = vec(gen, n), vec(gen, n)
    [out] = device.execute([parse("vector_add", [a, b])])
    assert isinstance(out, np.ndarray) and out.dtype == np.float32
    np.testing.assert_array_equal(out, a + b)


@pytest.mark.parametrize("n", SIZES)
def test_reduce(device: CudaDevice, n: int) -> None:
    x = vec(rng(n + 1), n)
    [out] = device.execute([parse("reduce", [x])])
    check_sum(out, x.astype(np.float64))
    if n == 0:
        assert out == 0.0


@pytest.mark.parametrize("n", SIZES)
def test_dot_product(device: CudaDevice, n: int) -> None:
    gen = rng(n + 2)
    x, y = vec(gen, n), vec(gen, n)
    [out] = device.execute([parse("dot_product", [x, y])])
    check_sum(out, x.astype(np.float64) * y.astype(np.float64))
    if n == 0:
        assert out == 0.0


def test_reduce_of_ones_is_exact(device: CudaDevice) -> None:
    n = (1 << 20) + 3  # every partial sum is an integer below 2^24: no rounding at all
    [out] = device.execute([parse("reduce", [np.ones(n, np.float32)])])
    assert out == float(n)


@pytest.mark.parametrize(("m", "n", "k"), MATMUL_SHAPES)
def test_matmul(device: CudaDevice, m: int, n: int, k: int) -> None:
    gen = rng(m * 10007 + n * 101 + k)
    a, b = vec(gen, m * k), vec(gen, k * n)
    [out] = device.execute([parse("matmul", [a, b, m, n, k])])
    check_matmul(out, a, b, m, n, k)
    if k == 0:
        assert not np.any(out)


# -- batches ---------------------------------------------------------------------------------


def test_vector_add_batch(device: CudaDevice) -> None:
    gen = rng(10)
    pairs = [(vec(gen, n), vec(gen, n)) for n in (1, 31, 0, 1000, 4097, 5)]
    outs = device.execute([parse("vector_add", [a, b]) for a, b in pairs])
    assert len(outs) == len(pairs)
    for out, (a, b) in zip(outs, pairs, strict=True):
        np.testing.assert_array_equal(out, a + b)


@pytest.mark.parametrize(
    "sizes",
    [
        [5, 0, 1000, 31, 4097, 1, 3],  # segmented kernel, with an empty segment
        [0, 0, 0],  # nothing at all
        [7, (1 << 20) + 3, 0, 2],  # a big job: two passes per job
    ],
)
@pytest.mark.parametrize("kernel", ["reduce", "dot_product"])
def test_reduce_batches(device: CudaDevice, kernel: str, sizes: list[int]) -> None:
    gen = rng(sum(sizes) + len(kernel))
    jobs = [(vec(gen, n), vec(gen, n)) for n in sizes]
    if kernel == "reduce":
        requests = [parse(kernel, [x]) for x, _ in jobs]
    else:
        requests = [parse(kernel, [x, y]) for x, y in jobs]
    outs = device.execute(requests)
    assert len(outs) == len(jobs)
    for out, (x, y) in zip(outs, jobs, strict=True):
        terms = x.astype(np.float64)
        if kernel == "dot_product":
            terms = terms * y.astype(np.float64)
        check_sum(out, terms)


@pytest.mark.parametrize(
    ("m", "n", "k", "count"), [(3, 5, 7, 4), (128, 128, 128, 3), (127, 129, 65, 3), (2, 2, 0, 2)]
)
def test_matmul_batch(device: CudaDevice, m: int, n: int, k: int, count: int) -> None:
    gen = rng(m + n + k + count)
    jobs = [(vec(gen, m * k), vec(gen, k * n)) for _ in range(count)]
    outs = device.execute([parse("matmul", [a, b, m, n, k]) for a, b in jobs])
    assert len(outs) == count
    for out, (a, b) in zip(outs, jobs, strict=True):
        check_matmul(out, a, b, m, n, k)


def test_batch_must_share_a_key(device: CudaDevice) -> None:
    one = np.ones(4, np.float32)
    mixed = [parse("matmul", [one, one, 2, 2, 2]), parse("matmul", [one, one, 1, 1, 4])]
    with pytest.raises(BackendError) as info:
        device.execute(mixed)
    assert info.value.code == "invalid_value" and not info.value.fatal


# -- staging ---------------------------------------------------------------------------------


def test_buffers_grow_and_are_reused(device: CudaDevice) -> None:
    gen = rng(20)
    for n in (10, (1 << 24) + 5, 10):
        a, b = vec(gen, n), vec(gen, n)
        [out] = device.execute([parse("vector_add", [a, b])])
        np.testing.assert_array_equal(out, a + b)
    assert device._dev_in.capacity >= 2 * ((1 << 24) + 5)
    assert device._host_out.array.size >= (1 << 24) + 5


def test_out_of_memory_is_reported_and_survived(device: CudaDevice) -> None:
    before = device._dev_in.capacity
    # The staging a batch of 2^40 input elements (4 TiB) would need: asked of the internal
    # helper directly, so that the test needs no host arrays of that size. Device memory is
    # grown first, so this fails at once, before any pinned host allocation is tried.
    with pytest.raises(BackendError) as info:
        device._ensure_capacity(1 << 40, 0)
    assert info.value.code == "out_of_memory" and not info.value.fatal
    assert device._dev_in.capacity == before  # the old buffer is kept
    a = vec(rng(21), 1000)
    [out] = device.execute([parse("vector_add", [a, a])])
    np.testing.assert_array_equal(out, a + a)


def test_info(device: CudaDevice) -> None:
    info = device.info()
    assert isinstance(info["name"], str) and info["name"]
    assert isinstance(info["total_memory"], int) and info["total_memory"] > 0
    assert isinstance(info["free_memory"], int)
    assert 0 < info["free_memory"] <= info["total_memory"]
    major, minor = info["compute_capability"]
    assert isinstance(major, int) and isinstance(minor, int) and major >= 3


def test_request_views_are_independent_of_inputs(device: CudaDevice) -> None:
    a = np.arange(8, dtype=np.float32)
    req = batch_plan("vector_add", a, a.copy())
    [out] = device.execute([req])
    a[:] = 0  # the job was copied to staging: changing the input afterwards changes nothing
    np.testing.assert_array_equal(out, 2 * np.arange(8, dtype=np.float32))


# -- a sticky fault, in a process of its own ---------------------------------------------------


def test_injected_fault_is_fatal_illegal_address() -> None:
    script = textwrap.dedent(
        """
        from erlcuda import usercode
        from erlcuda.backends.base import BackendError
        from erlcuda.backends.cuda import CudaBackend
        from erlcuda_testworker import fault_image, inject_fault

        backend = CudaBackend()
        dev = backend.open(0)
        image = fault_image(usercode.arch_of(dev.info()["compute_capability"]))
        try:
            inject_fault(dev, image)
        except BackendError as exc:
            print("CODE", exc.code, exc.fatal)
        dev.close()
        backend.close()
        print("CLOSED")
        """
    )
    proc = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=300,
        env={
            **os.environ,
            "PYTHONPATH": os.pathsep.join(
                filter(None, [str(ROOT / "test" / "worker"), str(ROOT / "python"),
                              os.environ.get("PYTHONPATH")])
            ),
        },
        check=False,
    )
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log
    assert "CODE illegal_address True" in proc.stdout, log
    assert "CLOSED" in proc.stdout, log


def test_a_kernel_that_does_not_compile_is_backend_unavailable_with_nvccs_message(
        tmp_path: Path) -> None:
    from erlcuda.backends.base import BackendUnavailable
    from erlcuda.backends.cuda import CudaBackend

    (tmp_path / "broken.cu").write_text(
        'extern "C" __global__ void broken(float* p) { p[0] = undeclared_name; }\n')
    with pytest.raises(BackendUnavailable) as info:
        CudaBackend(kernel_dir=tmp_path)
    assert "undeclared_name" in info.value.message


def test_a_kernel_packs_its_arguments_as_pycuda_does() -> None:
    """The built-in kernels' launches pack their arguments themselves (``Kernel``): the
    bytes must be those PyCUDA's prepared call would have packed, for every signature."""
    from pycuda._pvt_struct import pack

    from erlcuda.backends.cuda.kernels import FUNCTIONS, Kernel

    class Recorder:
        def _launch_kernel(self, *call: object) -> None:
            self.call = call

    values = {"P": 0x7F00_1234_5678, "q": -(1 << 40) - 3, "i": -7}
    for _, signature in FUNCTIONS.values():
        recorder = Recorder()
        args = [values[c] for c in signature]
        Kernel(recorder, signature)((2, 1, 1), (256, 1, 1), None, *args)
        assert recorder.call == ((2, 1, 1), (256, 1, 1), pack(signature, *args), 0, None)


@pytest.mark.parametrize("kernel", ["vector_add", "reduce", "dot_product"])
def test_a_small_job_that_comes_again_is_replayed_right(device: CudaDevice,
                                                         kernel: str) -> None:
    """The second run of a size captures its staged work as a graph and later runs replay
    it (where the graphs extra is installed), a lone job by its size's quick entry
    (``backends.quick``): each on its own data, and again right once a larger job has
    moved the staging."""
    gen = rng(7)
    n = 3001
    captures = device._replays.captures

    def once(size: int) -> None:
        a, b = vec(gen, size), vec(gen, size)
        [out] = device.execute([parse(kernel, [a] if kernel == "reduce" else [a, b])])
        if kernel == "vector_add":
            np.testing.assert_array_equal(out, a + b)
        else:
            terms = a.astype(np.float64) * (1 if kernel == "reduce" else b.astype(np.float64))
            check_sum(out, terms)

    for _ in range(4):
        once(n)
    # a batch beyond every staging so far: it grows, and moves
    big = [vec(gen, 1 << 21) for _ in range(4)]
    device.execute([parse(kernel, [x] if kernel == "reduce" else [x, y])
                    for x, y in (big[:2], big[2:])])
    for _ in range(3):
        once(n)
    if device.graphs is not None:
        assert device._replays.captures >= captures + 1
        staging = device._staging()
        assert device._quicks.find((kernel, n), staging) is not None


def staging_after(device: CudaDevice, job: Callable[[], None], n: int) -> np.ndarray:
    """What the device's output staging holds after ``job`` (its first ``n`` f32s), a
    sentinel written there before it."""
    import pycuda.driver as cuda

    device._dev_out.ensure(n)
    cuda.memset_d32(device._dev_out.ptr, 0x7FC00001, n)  # a NaN no sum of these gives
    job()
    seen = np.empty(n, np.float32)
    cuda.memcpy_dtoh(seen, device._dev_out.ptr)
    return seen


def in_place_sizes(kernel: str, limit: int) -> dict[str, list[int]]:
    """Jobs' sizes by case, for a device that runs jobs of up to ``limit`` operand elements
    in place: replayed as graphs (then by quick entries), at the limit (never replayed; a
    lone vector_add's one under it, below the pipeline's size), and above it (for
    vector_add from the staging a batch: each job below the pipeline's size, their sum
    above the limit)."""
    from erlcuda.backends.cuda.kernels import PACK_ALIGN

    at = {"vector_add": limit - 1, "reduce": limit,
          "dot_product": limit // 2 - PACK_ALIGN}[kernel]
    above = {"vector_add": [limit // 2 + 32] * 2, "reduce": [limit + 64],
             "dot_product": [limit // 2 + 64]}[kernel]
    return {"graph": [min(3001, limit // 4)], "limit": [at], "above": above}


def in_place_limit(device: CudaDevice) -> tuple[int, bool]:
    """The limit the in-place tests take their sizes from (the device's measured one, else
    the most there is), and whether jobs within it run in place."""
    from erlcuda.backends.in_place import IN_PLACE_MAX

    return device.in_place_max or IN_PLACE_MAX, device.in_place_max > 0


def test_the_device_times_in_place_against_copies_as_it_opens(device: CudaDevice) -> None:
    """Where the device takes host pointers it timed vector_adds both ways at every size as
    it opened, each right (no infinite figure) on this GPU, and runs in place up to what
    those figures choose; ``info`` says so. Without host pointers nothing is timed and
    nothing runs in place."""
    from erlcuda.backends.in_place import IN_PLACE_SIZES, choose_in_place_max

    timings = device.in_place_timings
    assert device.info()["in_place_max"] == device.in_place_max
    if not device._host_pointers:
        assert device.in_place_max == 0 and not timings
        return
    assert device.in_place_error is None
    assert [t.elements for t in timings] == list(IN_PLACE_SIZES)
    assert all(0 < t.copies_s < 1 and 0 < t.in_place_s < 1 for t in timings)
    assert device.in_place_max == choose_in_place_max(timings)


@pytest.mark.parametrize("registered", [False, True])
@pytest.mark.parametrize("case", ["graph", "limit", "above"])
def test_a_small_vector_add_runs_in_place_on_pinned_memory(device: CudaDevice, case: str,
                                                           registered: bool) -> None:
    """Up to the device's ``in_place_max`` elements, vector_adds whose operands and result
    lie in pinned host memory (the staging, or a job's registered slots) run on it in place
    where the device measured that it pays: each run's sums are right and the device's
    output staging is not written; above it, the sums come back through the device's
    staging (a batch from the staging, the pipeline from slots). A job in registered memory
    at an address that is not 16-byte aligned is right too (the kernel's element path)."""
    from erlcuda.backends.in_place import IN_PLACE_MAX

    limit, in_place = in_place_limit(device)
    sizes = in_place_sizes("vector_add", limit)[case]
    if registered:
        sizes = [max(limit, IN_PLACE_MAX) + 64] if case == "above" else sizes[:1]
    n, total = sizes[0], sum(sizes)
    skew = 4 if registered and case != "above" else 0
    region = np.frombuffer(mmap.mmap(-1, 3 * PAGE * -(-(4 * n + skew) // PAGE)), np.uint8)
    span = region.size // 3
    sa, sb, out = (region[i * span + skew : i * span + skew + 4 * n].view(np.float32)
                   for i in range(3))
    gen = rng(13)
    if registered:
        assert device.pinning.pin(region)
    try:
        for _ in range(4):  # graph: captured, then replayed, then by its quick entry
            pairs = [(vec(gen, k), vec(gen, k)) for k in sizes]
            results: list[np.ndarray] = []
            device._host_out.ensure(total)[:total] = np.nan
            out[:] = np.nan
            if registered:
                sa[:], sb[:] = pairs[0]
                plans = [parse("vector_add", [sa, sb])]
            else:
                plans = [parse("vector_add", list(p)) for p in pairs]

            def job(plans: list[Plan] = plans, results: list[np.ndarray] = results) -> None:
                into = [out] if registered else None
                results.extend(device.execute(plans, into=into, registered=registered))

            seen = staging_after(device, job, total)
            sums = np.concatenate([a + b for a, b in pairs])
            np.testing.assert_array_equal(np.concatenate(results), sums)
            if case == "above" or not in_place:
                np.testing.assert_array_equal(seen, sums)
            else:
                assert np.isnan(seen).all()
    finally:
        if registered:
            device.pinning.unpin(region)


@pytest.mark.parametrize("kernel", ["reduce", "dot_product"])
@pytest.mark.parametrize("case", ["graph", "limit", "above"])
def test_a_small_reduce_runs_in_place_on_the_staging(device: CudaDevice, kernel: str,
                                                     case: str) -> None:
    """A lone reduce or dot_product whose operands fit the device's ``in_place_max`` reads
    them from the pinned staging in place and writes its sum there where the device measured
    that it pays: each run's sum is right and the device's output staging is not written;
    above it, the sum comes back through the staging."""
    limit, in_place = in_place_limit(device)
    [n] = in_place_sizes(kernel, limit)[case]
    gen = rng(17)
    for _ in range(4):  # graph: captured, then replayed, then by its quick entry
        a, b = vec(gen, n), vec(gen, n)
        plan = parse(kernel, [a] if kernel == "reduce" else [a, b])
        terms = a.astype(np.float64) * (1 if kernel == "reduce" else b.astype(np.float64))
        sums: list[float] = []
        device._host_out.ensure(1)[:1] = np.nan

        def job(plan: Plan = plan, sums: list[float] = sums) -> None:
            sums.append(device.execute([plan])[0])

        seen = staging_after(device, job, 1)
        check_sum(sums[-1], terms)
        if case == "above" or not in_place:
            assert seen[0] == np.float32(sums[-1])
        else:
            assert np.isnan(seen[0])


def test_where_in_place_does_not_pay_the_copies_run(device: CudaDevice,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """On a device that measured in place slower at every size (``in_place_max`` 0), a
    batch of vector_adds from the staging, a lone one in registered memory (the direct
    path's copies) and a lone reduce give right answers through the device's staging.
    Sizes of their own: a replay captured in place keeps its graph."""
    monkeypatch.setattr(device, "in_place_max", 0)
    gen = rng(23)
    pairs = [(vec(gen, 1777), vec(gen, 1777)), (vec(gen, 1778), vec(gen, 1778))]
    for _ in range(3):  # captured, then replayed: copies either way
        results: list[np.ndarray] = []
        plans = [parse("vector_add", list(p)) for p in pairs]
        seen = staging_after(
            device, lambda r=results, p=plans: r.extend(device.execute(p)), 3555)
        sums = np.concatenate([a + b for a, b in pairs])
        np.testing.assert_array_equal(np.concatenate(results), sums)
        np.testing.assert_array_equal(seen, sums)
    n = 4099
    region = np.frombuffer(mmap.mmap(-1, 3 * PAGE * -(-4 * n // PAGE)), np.uint8)
    span = region.size // 3
    sa, sb, out = (region[i * span : i * span + 4 * n].view(np.float32) for i in range(3))
    assert device.pinning.pin(region)
    try:
        sa[:], sb[:] = vec(gen, n), vec(gen, n)
        out[:] = np.nan
        plan = parse("vector_add", [sa, sb])
        seen = staging_after(
            device, lambda: device.execute([plan], into=[out], registered=True), n)
        np.testing.assert_array_equal(out, sa + sb)
        np.testing.assert_array_equal(seen, sa + sb)
    finally:
        device.pinning.unpin(region)
    a = vec(gen, 2221)
    sums: list[float] = []
    seen = staging_after(device, lambda: sums.append(device.execute([parse("reduce", [a])])[0]),
                         1)
    check_sum(sums[0], a.astype(np.float64))
    assert seen[0] == np.float32(sums[0])


def test_a_strided_job_in_registered_memory_is_right(device: CudaDevice) -> None:
    """Operands that lie in registered memory but not contiguously (every other f32 of a
    registered region) are not run as if their bytes were contiguous: the sums are right."""
    n = 5000
    region = np.frombuffer(mmap.mmap(-1, 3 * PAGE * -(-8 * n // PAGE)), np.uint8)
    span = region.size // 3
    a, b = (region[i * span : i * span + 8 * n].view(np.float32)[::2] for i in range(2))
    out = region[2 * span : 2 * span + 4 * n].view(np.float32)
    gen = rng(19)
    assert device.pinning.pin(region)
    try:
        a[:], b[:] = vec(gen, n), vec(gen, n)
        out[:] = np.nan
        [got] = device.execute([parse("vector_add", [a, b])], into=[out])
        np.testing.assert_array_equal(got, a + b)
    finally:
        device.pinning.unpin(region)


@pytest.mark.parametrize("registered", [False, True])
@pytest.mark.parametrize("n", [1000, 100_000, 1 << 20])
def test_a_lone_job_in_registered_memory_is_run_straight_and_right(device: CudaDevice,
                                                                      n: int,
                                                                      registered: bool) -> None:
    """A lone vector_add whose operands and result lie in registered host memory (a job in
    slots) runs straight on it (in place, or copied straight from and into it), found by
    address or vouched for by its lane (``registered``), below the pipeline's size and
    above: each run answers its own data, in the result memory it was given, and again
    right once a larger job has moved the staging."""
    region = np.frombuffer(mmap.mmap(-1, 3 * PAGE * -(-4 * n // PAGE)), np.uint8)
    span = region.size // 3
    a, b, out = (region[i * span : i * span + 4 * n].view(np.float32) for i in range(3))
    assert device.pinning.pin(region)
    gen = rng(11)
    try:
        for round_ in range(5):
            if round_ == 3:  # a batch beyond every staging so far: it grows, and moves
                big = [vec(gen, 1 << 21) for _ in range(2)]
                device.execute([parse("vector_add", big), parse("vector_add", big)])
            a[:], b[:] = vec(gen, n), vec(gen, n)
            [got] = device.execute([parse("vector_add", [a, b])], into=[out],
                                   registered=registered)
            assert got is out
            np.testing.assert_array_equal(out, a + b)
    finally:
        device.pinning.unpin(region)
