"""What a PyCUDA error means for a device's context: a ``BackendError``, fatal where the
error is sticky (the context is lost and the worker must restart)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pycuda.driver as cuda

from ..base import BackendError

#: Words in a CUDA error message that mean the context is unusable (a sticky error).
_STICKY_MARKERS = (
    "illegal",
    "misaligned",
    "launch failed",
    "launch failure",
    "hardware stack",
    "program counter",
    "ecc",
    "uncorrectable",
    "context is destroyed",
    "exception",
    "device-side assert",
)


# -- errors --------------------------------------------------------------------------------


def to_backend_error(exc: BaseException) -> BackendError:
    """The ``BackendError`` for a PyCUDA (or allocation) exception."""
    message = str(exc) or type(exc).__name__
    low = message.lower()
    if isinstance(exc, (cuda.MemoryError, MemoryError)) or "out of memory" in low:
        return BackendError("out_of_memory", message)
    # An illegal address reaches PyCUDA as LogicError ("an illegal memory access was
    # encountered"), usually at the next synchronize.
    if "illegal address" in low or "illegal memory access" in low:
        return BackendError("illegal_address", message, fatal=True)
    if "too many resources" in low:  # a launch refused before it ran: nothing is poisoned
        return BackendError("launch_failed", message)
    if isinstance(exc, cuda.LaunchError):
        return BackendError("launch_failed", message, fatal=True)
    if isinstance(exc, cuda.LogicError) and ("invalid value" in low or "invalid argument" in low):
        return BackendError("invalid_value", message)
    return BackendError("unknown", message, fatal=any(m in low for m in _STICKY_MARKERS))


def is_oom(exc: BaseException) -> bool:
    """Whether ``exc`` (of an allocation) means the device has no room."""
    return isinstance(exc, (cuda.MemoryError, MemoryError)) or "out of memory" in str(exc).lower()


@contextmanager
def cuda_errors() -> Iterator[None]:
    try:
        yield
    except BackendError:
        raise
    except (cuda.Error, MemoryError) as exc:
        raise to_backend_error(exc) from exc
