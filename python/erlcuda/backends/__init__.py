"""Backends and how one is chosen (``auto``: cuda where PyCUDA sees a GPU, else cpu)."""

from __future__ import annotations

from .base import Backend, BackendError, BackendUnavailable, Device

__all__ = ["Backend", "BackendError", "BackendUnavailable", "Device", "select"]


def select(kind: str, *, cpu_devices: int = 1) -> tuple[Backend, str]:
    """The backend for ``kind`` (auto | cpu | cuda) and a sentence saying why it was chosen.

    ``cuda`` asked for explicitly raises ``BackendUnavailable`` when it cannot start;
    ``auto`` falls back to cpu and says why.
    """
    if kind not in ("auto", "cpu", "cuda"):
        raise BackendUnavailable(f"unknown backend {kind!r}")
    if kind == "cpu":
        from .cpu import CpuBackend

        return CpuBackend(cpu_devices), "cpu backend requested"
    try:
        try:
            from .cuda import CudaBackend
        except ImportError as exc:
            raise BackendUnavailable(f"PyCUDA is not installed ({exc})") from exc
        except Exception as exc:  # pycuda raises its own errors at import without a driver
            raise BackendUnavailable(f"PyCUDA failed to load: {exc}") from exc
        backend = CudaBackend()
        return backend, f"cuda backend: {backend.device_count()} GPU(s)"
    except BackendUnavailable as exc:
        if kind == "cuda":
            raise
        from .cpu import CpuBackend

        return CpuBackend(cpu_devices), f"cpu backend chosen: cuda unavailable: {exc.message}"
