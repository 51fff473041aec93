"""User kernels on the CPU: a module built for the host (``usercode.compile_host``) loaded
with ctypes and launched over the CPU device's arrays, which are numpy arrays.

Each device loads its own copy of a module's library (from an anonymous memory file, so
that nothing is left on disk), so that a module's globals are the device's own, as on a
GPU, where each context has its own. Loading checks what the GPU's driver checks: every
declared function is a kernel the library exports (an ``extern "C" __global__`` function
of the source), and takes the declared params (the library says so: ``hostcode``'s
``erlcuda_found_<name>``). A launch checks
the geometry against a GPU's limits (those of compute capability 9.0), and the arguments
against the declared params: a numpy array of the declared element type for a pointer (C
order; written ones writable; an empty one passes as a null pointer, as on a GPU) and a
numpy scalar of the declared type for a scalar, passed by value. The kernel runs on the
calling thread (ctypes lets go of the GIL meanwhile) and the launch returns once it is
done. A kernel that writes outside its arrays writes into the worker's memory: the host
has no fault to stop it, where a GPU would report an illegal address.

Errors are ``BackendError``: ``invalid_value`` (a library, function, geometry or argument
the launch cannot take, as the CUDA backend says them), ``launch_failed`` (the kernel
threw a C++ exception).
"""

from __future__ import annotations

import _ctypes
import contextlib
import ctypes
import os
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .. import elements
from ..hostcode import FOUND, LAUNCH, SIGNATURE, Param, parse_signature
from .base import BackendError

#: A GPU's limits (compute capability 9.0): threads per block along x, y, z and in all;
#: blocks along x, y, z; dynamic shared memory per block (what a launch may ask for).
MAX_BLOCK = (1024, 1024, 64)
MAX_THREADS = 1024
MAX_GRID = ((1 << 31) - 1, 65535, 65535)
MAX_SHARED = 227 * 1024

_Dims = ctypes.c_uint * 3


@dataclass(frozen=True, slots=True)
class _Kernel:
    launcher: Any  # the library's erlcuda_launch_<name>, typed
    params: tuple[Param, ...]


class HostModule:
    """One module's library, loaded for one device, and its declared functions."""

    def __init__(self, name: str, image: bytes, functions: Sequence[str]) -> None:
        self.name = name
        self.library, self._fd = _open(name, image)
        try:
            self.kernels = {f: self._kernel(f) for f in functions}
        except BaseException:
            self.close()
            raise

    def _kernel(self, function: str) -> _Kernel:
        library = self.library
        try:
            launcher = library[LAUNCH + function]  # by name, not as an attribute of CDLL's
            kernel = library[function]
        except AttributeError:
            kernel = None
        # The loader looks a name up in the libraries this one needs too (the C library's
        # free, exit, ...): a kernel is one this library defines.
        if kernel is None or not _same_library(kernel, launcher):
            raise BackendError("invalid_value", f"cannot load module {self.name}: it has no "
                               f'extern "C" kernel {function}')
        try:
            params = parse_signature(
                ctypes.c_char_p.in_dll(library, SIGNATURE + function).value.decode())
            found = ctypes.c_int.in_dll(library, FOUND + function).value
        except (AttributeError, ValueError, UnicodeDecodeError) as exc:
            raise BackendError("invalid_value", f"cannot load module {self.name}: no "
                               f"launcher for {function} ({exc})") from exc
        if not found:
            raise BackendError("invalid_value", f"cannot load module {self.name}: its "
                               f"kernel {function} does not take the declared params "
                               f"({', '.join(_c_param(p) for p in params)})")
        launcher.argtypes = [ctypes.POINTER(ctypes.c_void_p), _Dims, _Dims]
        launcher.restype = ctypes.c_int
        return _Kernel(launcher, tuple(params))

    def launch(self, function: str, args: Sequence[Any], grid: tuple[int, int, int],
               block: tuple[int, int, int], shared: int) -> None:
        """Run ``function`` over ``grid`` x ``block`` with ``args``; returns once done."""
        kernel = self.kernels.get(function)
        if kernel is None:
            raise BackendError("invalid_value", f"module {self.name!r:.60} has no function "
                               f"{function!r:.60}")
        _check_geometry(function, grid, block, shared)
        # the scalars' copies (_held) live on until the kernel is done
        pointers, _held = _arguments(function, kernel.params, args)
        status = kernel.launcher(pointers, _Dims(*grid), _Dims(*block))
        if status != 0:
            raise BackendError("launch_failed", f"{function}: the kernel threw a C++ exception")

    def close(self) -> None:
        """Unload the library (once its functions are no longer called)."""
        self.kernels = {}
        _close(self.library, self._fd)


class _DlInfo(ctypes.Structure):
    _fields_ = (("dli_fname", ctypes.c_char_p), ("dli_fbase", ctypes.c_void_p),
                ("dli_sname", ctypes.c_char_p), ("dli_saddr", ctypes.c_void_p))


def _same_library(one: Any, other: Any) -> bool:
    """Whether two functions are of one library (where the C library can say)."""
    dladdr = getattr(ctypes.CDLL(None), "dladdr", None)
    if dladdr is None:
        return True
    dladdr.argtypes = [ctypes.c_void_p, ctypes.POINTER(_DlInfo)]
    bases = []
    for function in (one, other):
        info = _DlInfo()
        if not dladdr(ctypes.cast(function, ctypes.c_void_p), ctypes.byref(info)):
            return False
        bases.append(info.dli_fbase)
    return bases[0] == bases[1]


def _open(name: str, image: bytes) -> tuple[ctypes.CDLL, int | None]:
    """``image`` loaded as a library of its own (another copy is another library), and the
    memory file it was loaded from, where it was."""
    try:
        if hasattr(os, "memfd_create"):
            fd = os.memfd_create(f"erlcuda-{name}", os.MFD_CLOEXEC)
            try:
                with os.fdopen(os.dup(fd), "wb") as f:
                    f.write(image)
                # The loader knows a library by its path: this one's is unique while the
                # file is open, so the file stays open as long as the library is loaded.
                return ctypes.CDLL(f"/proc/self/fd/{fd}", mode=os.RTLD_LOCAL), fd
            except BaseException:
                os.close(fd)
                raise
        with tempfile.TemporaryDirectory(prefix="erlcuda-module-") as folder:
            path = os.path.join(folder, "module.so")  # a new folder: a new path
            with open(path, "wb") as f:
                f.write(image)
            return ctypes.CDLL(path, mode=os.RTLD_LOCAL), None
    except OSError as exc:
        raise BackendError("invalid_value", f"cannot load module {name}: {exc}") from exc


def _close(library: ctypes.CDLL, fd: int | None) -> None:
    """Unload ``library``; close its memory file once it is gone. A library the loader
    keeps (one that asked never to be unloaded) keeps its file, and with it its path, so
    that no later library is taken for it."""
    dlclose = getattr(_ctypes, "dlclose", None)  # POSIX's
    if dlclose is None:
        return
    with contextlib.suppress(OSError):
        dlclose(library._handle)
    if fd is None:
        return
    try:
        still = _ctypes.dlopen(f"/proc/self/fd/{fd}", os.RTLD_LOCAL | os.RTLD_NOLOAD)
    except OSError:
        os.close(fd)  # unloaded
        return
    dlclose(still)


def _c_param(param: Param) -> str:
    access, etype = param
    c_type = elements.C_TYPES[etype]
    return c_type if access == "scalar" else f"{c_type}*"


def _check_geometry(function: str, grid: tuple[int, int, int], block: tuple[int, int, int],
                    shared: int) -> None:
    if not all(type(v) is int or isinstance(v, np.integer) for v in (*grid, *block, shared)):
        raise BackendError("invalid_value", f"cannot launch {function}: the grid, block and "
                           "shared memory are integers")
    threads = int(block[0]) * int(block[1]) * int(block[2])
    if min(*block) < 1 or any(b > m for b, m in zip(block, MAX_BLOCK, strict=True)) or (
            threads > MAX_THREADS):
        raise BackendError("invalid_value", f"cannot launch {function}: a block of "
                           f"{tuple(block)} threads (at most {MAX_BLOCK}, {MAX_THREADS} in "
                           "all, as on a GPU)")
    if min(*grid) < 1 or any(g > m for g, m in zip(grid, MAX_GRID, strict=True)):
        raise BackendError("invalid_value", f"cannot launch {function}: a grid of "
                           f"{tuple(grid)} blocks (at most {MAX_GRID}, as on a GPU)")
    if not 0 <= shared <= MAX_SHARED:
        raise BackendError("invalid_value", f"cannot launch {function}: {shared} bytes of "
                           f"shared memory (at most {MAX_SHARED}, as on a GPU)")


def _arguments(function: str, params: Sequence[Param],
               args: Sequence[Any]) -> tuple[Any, list[np.ndarray]]:
    """The launcher's argument array: a pointer to each array's elements, and to a copy of
    each scalar (the copies are returned too, to be kept until the launch is done)."""
    if len(args) != len(params):
        raise BackendError("invalid_value", f"{function} takes {len(params)} arguments, "
                           f"got {len(args)}")
    pointers = (ctypes.c_void_p * max(1, len(args)))()
    keep: list[np.ndarray] = []
    for i, ((access, etype), arg) in enumerate(zip(params, args, strict=True)):
        dtype = elements.DTYPES[etype]
        if access == "scalar":
            if not isinstance(arg, np.generic) or arg.dtype != dtype:
                raise BackendError("invalid_value", f"{function} argument {i + 1}: expected "
                                   f"a {etype} scalar, got {type(arg).__name__}")
            value = np.array(arg)
            keep.append(value)
            pointers[i] = value.ctypes.data
            continue
        if type(arg) is not np.ndarray or arg.dtype != dtype or not arg.flags.c_contiguous or (
                access != "in" and not arg.flags.writeable):
            raise BackendError("invalid_value", f"{function} argument {i + 1}: expected a "
                               f"{'writable ' if access != 'in' else ''}{etype} device array")
        pointers[i] = arg.ctypes.data if arg.size else None
    return pointers, keep
