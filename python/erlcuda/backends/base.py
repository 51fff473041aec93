"""The backend seam: a ``Backend`` names its devices and opens one ``Device`` per device thread.

A ``Device`` is created, used and closed by one thread only (a CUDA context belongs to the
thread that made it). ``run`` takes jobs that share one batch key (``Request.key``) and
returns one result per job, in order: an f32 array for vector_add and matmul, a float for
reduce and dot_product. Arrays returned may be views into the device's staging memory: they
stay valid until the next ``run`` on that device, so the caller encodes them before that.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any

import numpy as np

from .. import contract
from ..kernels import Request, UniformRequest

Result = np.ndarray | float

#: Error codes a backend may report: the contract's, which Erlang knows as atoms
#: (``erlcuda_contract:cuda_codes/0``); anything else travels as ``unknown``.
ERROR_CODES = contract.CUDA_CODES


class BackendError(Exception):
    """A device failed to run a batch.

    ``code`` is one of ``ERROR_CODES``; ``fatal`` means the device's context is poisoned
    (a sticky CUDA error) and the worker must be restarted to use that device again.
    """

    def __init__(self, code: str, message: str, *, fatal: bool = False) -> None:
        super().__init__(message)
        self.code = code if code in ERROR_CODES else "unknown"
        self.message = message
        self.fatal = fatal


class BackendUnavailable(BackendError):
    """The backend could not start at all (no GPU, no PyCUDA, kernels that do not compile)."""

    def __init__(self, message: str) -> None:
        super().__init__("not_supported", message)


class Device(ABC):
    """One compute device, owned by one thread."""

    @abstractmethod
    def run(self, kernel: str, requests: Sequence[Request]) -> list[Result]:
        """Run a batch of jobs of one kernel and one batch key."""

    def run_uniform(self, batch: UniformRequest) -> np.ndarray:
        """Run a uniform batch: ``count x result_elements`` f32 for vector results, or
        ``count`` floats for scalars (possibly staging memory, as for ``run``). This one
        runs it through ``run``; a backend may do it in one step."""
        values = self.run(batch.kernel, [batch.row(i) for i in range(batch.count)])
        if batch.scalar:
            return np.array(values, dtype=np.float64)
        if not values:
            return np.empty((0, batch.result_elements), np.float32)
        return np.stack(values).astype(np.float32, copy=False)

    @abstractmethod
    def info(self) -> dict[str, Any]:
        """Static facts about the device (name, memory, ...), safe to call from its thread."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release the device's resources; called once, from its thread."""


class Backend(ABC):
    """A kind of device: ``cpu`` or ``cuda``."""

    name: str

    @abstractmethod
    def device_count(self) -> int:
        """How many devices this backend offers."""

    @abstractmethod
    def open(self, index: int) -> Device:
        """Open device ``index``; called inside the thread that will own it."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release process-wide resources after every device is closed."""
