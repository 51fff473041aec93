"""The one nvcc cache (``compile.py``): the built-in kernels go through it as user code does."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from erlcuda import compile as compiler

KERNELS = Path(__file__).resolve().parents[2] / "kernels"
needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")


@needs_nvcc
def test_a_builtin_kernel_is_compiled_once_then_read_from_the_cache(
        tmp_path: Path, forbid_compiling: Callable[[], None]) -> None:
    kernels = tmp_path / "kernels"
    shutil.copytree(KERNELS, kernels)
    cache = tmp_path / "cache"
    source = (kernels / "vector_add.cu").read_text()
    first = compiler.cubin(source, ["-O3"], "sm_90", include_dirs=[kernels], cache=cache)
    assert first and len(list(cache.iterdir())) == 1
    forbid_compiling()
    assert compiler.cubin(source, ["-O3"], "sm_90", include_dirs=[kernels], cache=cache) == first
    # A header it includes changed (not only in a comment): another key, compiled again.
    header = kernels / "common.cuh"
    header.write_text(header.read_text() + "\nnamespace erlcuda { constexpr int kChanged = 1; }\n")
    with pytest.raises(AssertionError, match="nvcc ran"):
        compiler.cubin(source, ["-O3"], "sm_90", include_dirs=[kernels], cache=cache)


def test_a_bad_architecture_or_a_nul_byte_is_refused_before_nvcc_runs(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(compiler, "find_nvcc", lambda: pytest.fail("nvcc was looked for"))
    with pytest.raises(ValueError, match="bad architecture"):
        compiler.cubin("", [], "compute_90")
    with pytest.raises(ValueError, match="NUL byte"):
        compiler.cubin("\0", [], "sm_90")
