"""The chunked copy pipeline (``backends/pipeline.py``) against a driver double that runs
queued work as late as a GPU may (``cudadouble.py``): results are right whatever mix of
staged, pinned and per-job registered memory a job has, every chunk buffer is reused only
once its copy has run, and a registration made for one job is undone however it ends."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import numpy as np
import pytest

import cudadouble
from erlcuda.backends import pipeline
from erlcuda.backends.pipeline import (
    NEVER,
    Chunks,
    Download,
    FreshFile,
    Pipeline,
    Timing,
    Upload,
    choose_register_min,
)
from erlcuda.hostmem import Budget, Pinning


@pytest.fixture(autouse=True)
def small_chunks(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    # 4 KiB chunks: a few thousand elements make many chunks, each buffer reused often.
    monkeypatch.setattr(pipeline, "CHUNK_BYTES", 4096)
    yield


def make(pinner: cudadouble.Pinner | None = None, limit: int = 1 << 40
         ) -> tuple[cudadouble.Driver, Pipeline, Pinning | None]:
    driver = cudadouble.Driver()
    pinning = Pinning(pinner, Budget(limit)) if pinner is not None else None
    chunks = Chunks(lambda n: np.zeros(n, np.uint8))
    pipe = Pipeline(driver, [driver.Stream(), driver.Stream()], chunks, pinning,
                    lambda dst, src: np.copyto(dst, src))
    return driver, pipe, pinning


def add(driver: cudadouble.Driver, pipe: Pipeline, a: np.ndarray, b: np.ndarray,
        out: np.ndarray, out_pinned: bool | None = None) -> None:
    n = a.size
    d_a, d_b, d_c = (driver.memory.alloc(4 * n) for _ in range(3))
    pipe.run(n, [Upload(d_a, a), Upload(d_b, b)], cudadouble.vector_add(driver, d_a, d_b, d_c),
             Download(d_c, out, pinned=out_pinned))


def page_aligned(n: int, seed: int) -> np.ndarray:
    """``n`` f32 values in memory of their own, starting a page (as a mapping does)."""
    file = FreshFile(4 * n)
    view = file.map().view(np.float32)
    view[:] = np.random.default_rng(seed).standard_normal(n, dtype=np.float32)
    return view


@pytest.mark.parametrize("n", [1, 1023, 1024, 1025, 10_000])
def test_staged_operands_and_result_add_up(n: int) -> None:
    driver, pipe, _ = make()
    rng = np.random.default_rng(n)
    a, b = rng.standard_normal((2, n), dtype=np.float32)
    out = np.full(n, np.nan, np.float32)
    add(driver, pipe, a, b, out)
    np.testing.assert_array_equal(out, a + b)
    assert pipe.direct == 0 and pipe.staged == 3 * -(-n // 1024)
    assert not any(s.ops for s in pipe._streams)  # all of it ran before run returned


def test_pinned_operands_and_result_are_copied_straight() -> None:
    pinner = cudadouble.Pinner()
    driver, pipe, pinning = make(pinner)
    assert pinning is not None
    n = 5000
    a, b, out = page_aligned(n, 1), page_aligned(n, 2), page_aligned(n, 3)
    for array in (a, b, out):
        assert pinning.pin(array.view(np.uint8))
    add(driver, pipe, a, b, out)
    np.testing.assert_array_equal(out, a + b)
    assert pipe.staged == 0 and pipe.direct == 3 * -(-n // 1024)
    assert pinner.pinned == 3 and pinner.unpinned == 0  # the job registered nothing itself


def test_staged_and_pinned_mixed() -> None:
    driver, pipe, pinning = make(cudadouble.Pinner())
    assert pinning is not None
    n = 4097
    a, b = page_aligned(n, 4), np.arange(n, dtype=np.float32)
    assert pinning.pin(a.view(np.uint8))
    out = np.zeros(n, np.float32)
    add(driver, pipe, a, b, out)
    np.testing.assert_array_equal(out, a + b)
    chunks = -(-n // 1024)
    assert (pipe.direct, pipe.staged) == (chunks, 2 * chunks)


def test_the_device_s_own_pinned_staging_is_written_straight() -> None:
    driver, pipe, _ = make()
    n = 3000
    a, b = np.ones(n, np.float32), np.full(n, 2.0, np.float32)
    out = np.zeros(n, np.float32)
    add(driver, pipe, a, b, out, out_pinned=True)
    np.testing.assert_array_equal(out, 3.0)
    assert pipe.direct == 3  # the three result chunks


def test_a_fresh_mapping_is_registered_for_its_job_alone() -> None:
    pinner = cudadouble.Pinner()
    driver, pipe, pinning = make(pinner)
    assert pinning is not None
    pipe.register_min = 8192
    n = 4096  # 16 KiB operands: registered; the 400-byte one is not
    a, b = page_aligned(n, 5), page_aligned(n, 6)
    out = np.zeros(n, np.float32)
    add(driver, pipe, a, b, out)
    np.testing.assert_array_equal(out, a + b)
    assert (pinner.pinned, pinner.unpinned, pinner.live, pinning.count) == (2, 2, {}, 0)
    small = page_aligned(100, 7)
    add(driver, pipe, small, small, np.zeros(100, np.float32))
    assert pinner.pinned == 2
    heap = np.ones(8192, np.float32)  # no mapping's: never registered, however large
    add(driver, pipe, heap, heap, np.zeros(8192, np.float32))
    assert pinner.pinned == 2


def test_a_registration_made_for_a_job_goes_when_the_job_fails() -> None:
    pinner = cudadouble.Pinner()
    driver, pipe, pinning = make(pinner)
    assert pinning is not None
    pipe.register_min = 0
    a = page_aligned(2048, 8)

    def boom(start: int, count: int, stream: object) -> None:
        raise RuntimeError("a launch failed")

    d = driver.memory.alloc(a.nbytes)
    with pytest.raises(RuntimeError):
        pipe.run(a.size, [Upload(d, a)], boom, None)
    assert pinner.pinned == 1 and pinner.live == {} and pinning.count == 0


def test_over_the_budget_nothing_is_registered_and_the_copy_is_staged() -> None:
    pinner = cudadouble.Pinner()
    driver, pipe, _ = make(pinner, limit=4096)
    pipe.register_min = 0
    n = 4096
    a, b = page_aligned(n, 9), page_aligned(n, 10)
    out = np.zeros(n, np.float32)
    add(driver, pipe, a, b, out)
    np.testing.assert_array_equal(out, a + b)
    assert pinner.pinned == 0 and pipe.direct == 0


def test_a_refused_registration_is_staged() -> None:
    pinner = cudadouble.Pinner(refuse=True)
    driver, pipe, pinning = make(pinner)
    assert pinning is not None
    pipe.register_min = 0
    a = page_aligned(2048, 11)
    out = np.zeros(2048, np.float32)
    add(driver, pipe, a, a, out)
    np.testing.assert_array_equal(out, 2 * a)
    assert pinning.failures == 2 and pinning.count == 0


def test_a_chunk_buffer_is_refilled_only_after_its_copy_ran() -> None:
    # The double runs copies only when waited for: packing chunk i + 2 into the buffer of
    # chunk i before chunk i's copy ran would send chunk i + 2's bytes twice.
    driver, pipe, _ = make()
    n = 1024 * 9
    a = np.arange(n, dtype=np.float32)
    d = driver.memory.alloc(4 * n)
    pipe.run(n, [Upload(d, a)], None, None)
    np.testing.assert_array_equal(driver.f32(d, n), a)


@pytest.mark.parametrize(("timings", "expected"), [
    ([Timing(4, 2.0, 1.0), Timing(32, 9.0, 4.0)], 4),
    ([Timing(4, 1.0, 2.0), Timing(32, 9.0, 4.0)], 32),
    ([Timing(4, 1.0, 2.0), Timing(32, 4.0, 9.0)], NEVER),
    ([Timing(4, 2.0, 1.0), Timing(32, 4.0, 9.0)], NEVER),  # lost at the larger size
    ([], NEVER),
])
def test_register_min_is_where_registering_won_from_there_on(timings: list[Timing],
                                                             expected: int) -> None:
    assert choose_register_min(timings) == expected


def test_calibration_times_both_ways_and_leaves_nothing_registered() -> None:
    pinner = cudadouble.Pinner()
    driver, pipe, pinning = make(pinner)
    assert pinning is not None
    ticks = iter(range(100))
    timings = pipe.calibrate(driver.memory.alloc(1 << 16), sizes=(4096, 1 << 16),
                             clock=lambda: float(next(ticks)))
    assert [t.nbytes for t in timings] == [4096, 1 << 16]
    assert all(t.staged_s > 0 and t.registered_s > 0 and t.pinned_s > 0
               and t.staged_out_s > 0 and t.pinned_out_s > 0 for t in timings)
    # registered for one copy in, and beforehand for a copy in and one out, at each size
    assert pinner.pinned == 6 and pinner.live == {} and pinning.count == 0
    assert pipe.register_min == choose_register_min(timings)


def test_a_read_only_mapping_is_registered_read_only() -> None:
    seen: list[bool] = []

    class Recording(cudadouble.Pinner):
        def pin(self, view: np.ndarray) -> Callable[[], None]:
            seen.append(view.flags.writeable)
            return super().pin(view)

    pinner = Recording()
    driver, pipe, _ = make(pinner)
    pipe.register_min = 0
    a = page_aligned(2048, 12)
    a.flags.writeable = False  # as a job's own operand file is mapped
    out = np.zeros(2048, np.float32)
    add(driver, pipe, a, page_aligned(2048, 13), out)
    assert seen == [False, True] and pinner.live == {}
