"""Where the CUDA kernel sources are. Imports no PyCUDA, so an install can be checked anywhere.

``pip install .`` puts ``kernels/*.cu`` and ``*.cuh`` in the package as ``erlcuda/kernels_cu``;
a release's priv/ and the source checkout have them in ``kernels/`` beside ``python/``.
"""

from __future__ import annotations

import os
from pathlib import Path

from .base import BackendUnavailable

__all__ = ["find_kernel_dir", "kernel_sources"]


def find_kernel_dir() -> Path:
    """Where the ``.cu`` files are: ``$ERLCUDA_KERNELS``, else ``erlcuda/kernels_cu`` inside
    the installed package, else the source checkout's ``kernels/``."""
    here = Path(__file__).resolve()
    candidates: list[Path] = []
    env = os.environ.get("ERLCUDA_KERNELS")
    if env:
        candidates.append(Path(env))
    candidates.append(here.parents[1] / "kernels_cu")
    candidates.append(here.parents[3] / "kernels")
    for candidate in candidates:
        if (candidate / "vector_add.cu").is_file():
            return candidate
    raise BackendUnavailable(
        "CUDA kernel sources not found; looked in " + ", ".join(str(c) for c in candidates)
    )


def kernel_sources(kernel_dir: Path) -> list[Path]:
    """The ``.cu`` files to compile, sorted."""
    return sorted(kernel_dir.glob("*.cu"))
