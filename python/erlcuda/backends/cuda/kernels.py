"""The CUDA backend's kernels: their launch constants, the functions each kernel file
declares, and the files compiled through the one nvcc cache (``compile.py``)."""

from __future__ import annotations

import struct
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from ... import compile as nvcc_cache
from ... import contract
from ...elements import ELEMENTS
from ..base import BackendUnavailable
from ..sources import kernel_sources

#: Threads per block of the 1-D kernels; kernels/common.cuh's kBlock1D must agree.
BLOCK_1D = 256
#: Most blocks per multiprocessor of vector_add's grid-stride loop: on large vectors more
#: blocks read faster (bench/gpu_kernels.py), so the cap only bounds the grid for huge
#: vectors; up to 2048 * SMs * 1024 elements each thread adds one float4.
VECTOR_ADD_BLOCKS_PER_SM = 2048
#: Blocks per multiprocessor of reduction pass 1 (from 4 to 32 read alike: a middle one).
REDUCE_BLOCKS_PER_SM = 8
#: Elements each thread of reduce pass 1 handles at least: fewer blocks for small vectors.
REDUCE_ELEMENTS_PER_THREAD = 8
#: A reduce/dot batch whose largest job is bigger than this runs job by job through the
#: two-pass kernels; smaller jobs share one launch of the segmented kernel (a block each).
SEGMENT_MAX = 1 << 20
#: matmul's tile and K step, and its threads per block (kernels/matmul.cu).
MATMUL_TILE = 128
MATMUL_BK = 8
MATMUL_THREADS = 256
#: matmul_f64's tile (kernels/matmul.cu: 64 x 64, 256 threads).
MATMUL_F64_TILE = 64
MAX_GRID_X = 2**31 - 1
MAX_GRID_Z = 65535
#: Smallest staging allocation, in elements; staging grows geometrically beyond it.
MIN_STAGING = 1 << 20
#: Packed operands start on multiples of this many elements (256 bytes), so that each one
#: is 16-byte aligned for the kernels' float4 paths.
PACK_ALIGN = 64
#: Bytes per pinned chunk of the general path's host transfers (two of them per device).
TRANSFER_CHUNK = 32 << 20

#: The functions of each kernel file (by stem) with their PyCUDA argument formats:
#: P pointer, q int64, i int32.
_FILES: Mapping[str, Mapping[str, str]] = {
    "vector_add": {"vector_add": "PPPq", "vector_add_f64": "PPPq"},
    "reduce": {"reduce_partial": "PPqP", "dot_partial": "PPqP", "reduce_final": "PiP",
               "reduce_segments": "PPPiP", "dot_segments": "PPPiP",
               "reduce_partial_f64": "PPqP", "dot_partial_f64": "PPqP",
               "reduce_final_f64": "PiP"},
    "matmul": {"matmul_aligned": "PPPiii", "matmul_checked": "PPPiii", "matmul_f64": "PPPiii"},
}
#: Kernel file (stem) and PyCUDA argument format of each function.
FUNCTIONS: Mapping[str, tuple[str, str]] = {
    name: (stem, signature) for stem, functions in _FILES.items()
    for name, signature in functions.items()}
NVCC_OPTIONS = ("-O3",)  # IEEE f32 arithmetic: no --use_fast_math

#: PyCUDA argument format of each element type passed by value to a user kernel.
#: (keyed by the dtype's code without its byte order: ``f4``)
SCALAR_FORMATS = {e.dtype.str[1:]: e.struct for e in ELEMENTS.values()}
F64 = np.dtype("<f8")


#: The catalogue kernels ``_run_bound`` runs on device arrays, and their params' count.
BUILTIN_ARITY = {name: len(contract.KERNELS[name].params)
                  for name in ("copy", "vector_add", "reduce", "dot_product", "matmul")}


class Kernel:
    """A built-in kernel, launched with one driver call (``cuLaunchKernel``, through
    PyCUDA's ``Function._launch_kernel``) and its arguments packed by a ``struct`` made
    once: PyCUDA's ``prepared_async_call`` also sets the legacy block shape with a driver
    call of its own and imports its packer, at every launch, which a lone small job pays
    for as much as for the copies."""

    __slots__ = ("_args", "_fn")

    def __init__(self, fn: Any, signature: str) -> None:
        self._fn = fn
        # PyCUDA packs a prepared signature with struct's native layout: the same here.
        self._args = struct.Struct(signature)

    def __call__(self, grid: tuple[int, int, int], block: tuple[int, int, int],
                 stream: Any, *args: int) -> None:
        self._fn._launch_kernel(grid, block, self._args.pack(*args), 0, stream)


def compile_kernels(kernel_dir: Path, capability: tuple[int, int]) -> dict[str, bytes]:
    """Each kernel file compiled to a cubin for ``capability``, by file stem, through the
    one nvcc cache (``compile.cubin``, as user code is)."""
    arch = nvcc_cache.arch_of(capability)
    cubins: dict[str, bytes] = {}
    for path in kernel_sources(kernel_dir):
        try:
            cubins[path.stem] = nvcc_cache.cubin(path.read_text(), NVCC_OPTIONS, arch,
                                                 include_dirs=[kernel_dir])
        except nvcc_cache.CompileError as exc:  # the log carries nvcc's messages
            raise BackendUnavailable(f"nvcc failed on {path.name} for {arch}: {exc.log}") from exc
        except Exception as exc:  # nvcc missing, unreadable source, ...
            raise BackendUnavailable(
                f"cannot compile {path.name} for {arch}: {type(exc).__name__}: {exc}"
            ) from exc
    return cubins
