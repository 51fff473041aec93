"""Shared pytest set-up: the Hypothesis profiles and the ``gpu`` marker's skip rule."""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "python"))
# The worker's test double and the benchmarks' worker, whose helpers tests use too.
sys.path[1:1] = [str(ROOT / "test" / "worker"), str(ROOT / "bench" / "worker")]

settings.register_profile("ci", max_examples=200, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("dev", max_examples=50, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


@functools.cache
def gpu_count() -> int:
    """GPUs PyCUDA sees; 0 where PyCUDA or a driver is missing."""
    try:
        import pycuda.driver as drv

        drv.init()
        return int(drv.Device.count())
    except Exception:
        return 0


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # A test of a module that starts worker processes is an integration test: `make
    # test-fast` leaves them out (`-m "not process"`).
    process = pytest.mark.process
    for item in items:
        module = getattr(item, "module", None)
        if module is not None and hasattr(module, "WorkerPipe"):
            item.add_marker(process)
    if gpu_count() > 0:
        return
    skip = pytest.mark.skip(reason="no CUDA GPU (PyCUDA missing or no driver)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def forbid_compiling(monkeypatch: pytest.MonkeyPatch) -> Callable[[], None]:
    """Call it once an image is cached: from then on nvcc and g++ may only preprocess (what
    a cache hit runs to find its key), and a compile fails the test."""
    from erlcuda import compile as compiler

    def preprocess_only(real: Callable[..., bytes], tool: str) -> Callable[..., bytes]:
        def no_compile(*args: Any, preprocess: bool = False, **kwargs: Any) -> bytes:
            if not preprocess:
                raise AssertionError(f"{tool} ran on a cache hit")
            return real(*args, preprocess=True, **kwargs)

        return no_compile

    def forbid() -> None:
        monkeypatch.setattr(compiler, "_nvcc", preprocess_only(compiler._nvcc, "nvcc"))
        monkeypatch.setattr(compiler, "_cxx", preprocess_only(compiler._cxx, "g++"))

    return forbid
