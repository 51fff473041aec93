"""The backend seam: a ``Backend`` names its devices and opens one ``Device`` per device thread.

A ``Device`` is created, used and closed by one thread only (a CUDA context belongs to the
thread that made it). Its one entry point for running a plan (``kernels.Plan``) is
``execute``: batched plans that share one key run as one batched call, with one result per
plan, in order (an f32 array for vector_add and matmul, a float for reduce and
dot_product); any other plan runs alone on the device arrays its lane bound. Arrays
returned may be views into the device's staging memory: they stay valid until the next
call on that device, so the caller encodes them before that. A backend implements the
steps ``execute`` chooses between: ``_run_batch``, ``_run_bound`` and ``launch_user``,
and what a user module takes: ``load_module`` (``Backend.user_code`` says what image).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any

import numpy as np

from .. import contract
from ..hostmem import Pinning
from ..kernels import Plan, UniformPlans

Result = np.ndarray | float

#: Error codes a backend may report: the contract's, which Erlang knows as atoms
#: (``erlcuda_contract:cuda_codes/0``); anything else travels as ``unknown``.
ERROR_CODES = contract.CUDA_CODES

#: Host data copied to or from a device at once through its staging, at most (bytes):
#: larger data goes in chunks (or in place from registered memory), so a staging never
#: grows to a large job's size.
STAGE_MAX = 8 << 20
#: Where each array starts in a staging buffer that holds several: as cudaMalloc aligns.
STAGE_ALIGN = 256


def stage_layout(sizes: Sequence[int]) -> tuple[list[int], int]:
    """Each array's byte offset in a staging buffer that holds them all, and its size."""
    at, total = [], 0
    for size in sizes:
        at.append(total)
        total += -(-int(size) // STAGE_ALIGN) * STAGE_ALIGN
    return at, total


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

    #: The host memory this device copies straight from and into (``hostmem.Pinning``):
    #: ``None`` where it makes no copies (the CPU backend computes on host memory).
    pinning: Pinning | None = None

    def execute(self, plans: Sequence[Plan], bound: Sequence[Any] | None = None,
                out: Any | None = None,
                into: Sequence[np.ndarray | None] | None = None,
                registered: bool = False) -> list[Result | None]:
        """Run ``plans``: without ``bound``, batched plans of one key, on their host
        operands, as one call, answering a result per plan; with it, one plan on the device
        arrays (and dims, scalars) its lane bound to its operands, in order: a built-in's
        vector result is written into ``out`` (``[None]``), a scalar one answered
        (``[float]``); a user kernel is launched in the plan's geometry (``[None]``).

        ``into`` (batched plans only): for each plan, a writable host array of its vector
        result's length and type (a result file's mapping) or ``None``; a result with one
        is written there, and that very array answered. ``registered``: the caller knows
        that every host array of the plans and ``into`` lies in registered host memory (a
        job in slots), which a device would otherwise look up by address."""
        if bound is None:
            if into is not None:
                return self._run_batch_into(plans[0].kernel, plans, into,  # type: ignore
                                            registered)
            return self._run_batch(plans[0].kernel, plans)  # type: ignore[return-value]
        (plan,) = plans
        user = plan.user
        if user is None:
            return [self._run_bound(plan.kernel, bound, out)]
        grid, block, shared = plan.geometry
        self.launch_user(user.module, user.name, bound, grid, block, shared)
        return [None]

    @abstractmethod
    def _run_batch(self, kernel: str, plans: Sequence[Plan]) -> list[Result]:
        """Run batched plans of one kernel and one key."""

    def _run_batch_into(self, kernel: str, plans: Sequence[Plan],
                        into: Sequence[np.ndarray | None],
                        registered: bool = False) -> list[Result]:
        """``_run_batch``, each vector result that has an ``into`` array copied there and
        that array answered. A backend may write there directly instead."""
        values = self._run_batch(kernel, plans)
        return [_written(value, target) for value, target in zip(values, into, strict=True)]

    def execute_uniform(self, batch: UniformPlans) -> np.ndarray:
        """Run a table of batched plans: ``count x out_elements`` f32 for vector
        results, or ``count`` floats for scalars (possibly staging memory, as for
        ``execute``). This one runs it plan by plan in one batch; a backend may do it in
        one step."""
        values = self._run_batch(batch.kernel, [batch.row(i) for i in range(batch.count)])
        if batch.scalar:
            return np.array(values, dtype=np.float64)
        if not values:
            return np.empty((0, batch.out_elements), np.float32)
        return np.stack(values).astype(np.float32, copy=False)

    # -- the general path: device arrays, buffers and user kernels ---------------------------
    # A device array is whatever the backend holds on its device (a numpy array on the CPU
    # backend, a device allocation on CUDA); it has ``dtype`` (numpy), ``size`` (elements)
    # and ``nbytes``. The lane owns every one of them (buffers and temporaries alike) and
    # frees each exactly once with ``free``.

    def alloc(self, dtype: np.dtype[Any], count: int, *, zero: bool) -> Any:
        """A new device array of ``count`` elements, zeroed if ``zero``. Raises
        ``BackendError("out_of_memory", ...)`` (not fatal) where the device has no room."""
        raise BackendUnavailable(f"{type(self).__name__} has no device arrays")

    def upload(self, host: np.ndarray) -> Any:
        """A new device array holding the 1-D ``host`` array's elements, of its dtype."""
        raise BackendUnavailable(f"{type(self).__name__} has no device arrays")

    def download(self, array: Any) -> np.ndarray:
        """A host copy of ``array``: a 1-D numpy array of its dtype, owned by the caller."""
        raise BackendUnavailable(f"{type(self).__name__} has no device arrays")

    def free(self, array: Any) -> None:
        """Give ``array``'s memory back to the device."""
        raise BackendUnavailable(f"{type(self).__name__} has no device arrays")

    def _run_bound(self, kernel: str, operands: Sequence[Any], out: Any | None) -> float | None:
        """Run a catalogue kernel (``vector_add``, ``reduce``, ``dot_product``, ``matmul``,
        ``copy``) on device arrays: ``operands`` in param order, vectors as device arrays of
        one dtype (f32 or f64; ``copy`` any element type) and dims as ints. A vector result
        is written into ``out`` (a device array of the result's length and dtype) and
        ``None`` returned; a scalar result is returned as a float (``out`` is ``None``)."""
        raise BackendUnavailable(f"{type(self).__name__} has no device arrays")

    # -- programs: work queued on device arrays, waited for once ---------------------------
    #: The backend's CUDA graphs (``capture``, ``launch``, ``release``), where it has them.
    graphs: Any = None
    #: The architecture generated kernels are compiled for (``sm_90``); ``None``: the device
    #: runs none (a program's steps then run one by one, unfused).
    arch: str | None = None

    def enqueue(self, plan: Plan, bound: Sequence[Any], out: Any | None = None,
                count: int = 1) -> None:
        """Queue ``plan`` on device arrays, as ``execute`` with ``bound`` runs it, without
        waiting for it: a built-in's result, vector or scalar, goes into ``out``, a user
        kernel's into its operands. ``count`` runs of one shape laid end to end run as one:
        a reduction then writes one sum per run, a matmul one product per run. What the
        work itself does wrong may surface only at the next wait (``synchronize``,
        ``download``)."""
        raise BackendUnavailable(f"{type(self).__name__} has no device arrays")

    def synchronize(self) -> None:  # noqa: B027 - optional hook
        """Wait for the work queued on the device; raises what it did wrong."""

    def stage_in(self, hosts: Sequence[np.ndarray]) -> list[Any]:
        """Device arrays holding the 1-D ``hosts``, for one run: freed with ``free`` once
        it is over (a backend may hand out arrays in its own staging, which ``free`` leaves
        be, valid until its next run)."""
        return [self.upload(host) for host in hosts]

    def stage_into(self, arrays: Sequence[Any], hosts: Sequence[np.ndarray]) -> None:
        """Copy each 1-D host array into the device array beside it (same dtype and size),
        in queue order; the hosts may be read until the next wait."""
        raise BackendUnavailable(f"{type(self).__name__} has no device arrays")

    def stage_out(self, arrays: Sequence[Any]) -> list[np.ndarray]:
        """Host copies of ``arrays``, after the work queued before (one wait for all)."""
        return [self.download(array) for array in arrays]

    def host_buffer(self, nbytes: int) -> np.ndarray:
        """``nbytes`` of host memory (``uint8``) the device copies from and to at its best
        (pinned, on a GPU), for ``copy_in`` and ``copy_out``; given back by
        ``release_host`` on this device's thread."""
        return np.empty(nbytes, np.uint8)

    def release_host(self, host: np.ndarray) -> None:  # noqa: B027 - optional hook
        """Give back what ``host_buffer`` made."""

    def copy_in(self, array: Any, host: np.ndarray) -> None:
        """Queue the copy of ``host`` (a view of a ``host_buffer``, of ``array``'s dtype and
        size) into ``array``."""
        raise BackendUnavailable(f"{type(self).__name__} has no device arrays")

    def copy_out(self, host: np.ndarray, array: Any) -> None:
        """Queue the copy of ``array`` into ``host`` (a view of a ``host_buffer``)."""
        raise BackendUnavailable(f"{type(self).__name__} has no device arrays")

    def copy_into(self, array: Any, source: Any) -> None:
        """Queue a copy of device array ``source`` into ``array`` (same dtype and size)."""
        raise BackendUnavailable(f"{type(self).__name__} has no device arrays")

    def zero(self, array: Any) -> None:
        """Queue the zeroing of ``array``."""
        raise BackendUnavailable(f"{type(self).__name__} has no device arrays")

    def load_module(self, name: str, image: bytes, functions: Sequence[str]) -> None:
        """Load compiled code (what its backend's ``user_code`` names: a cubin, or a host
        library) as module ``name`` into this device, with its ``functions`` (extern "C"
        names) ready to launch; replaces a module of that name (a load that fails leaves
        it). Raises ``BackendUnavailable`` where the backend runs no user code."""
        raise BackendUnavailable(f"the {type(self).__name__} backend runs no user kernels: "
                                 "they need the cuda backend and a GPU")

    def unload_module(self, name: str) -> None:  # noqa: B027 - optional hook
        """Forget module ``name`` (nothing if it is not loaded)."""

    def launch_user(self, module: str, function: str, args: Sequence[Any],
                    grid: tuple[int, int, int], block: tuple[int, int, int],
                    shared: int) -> None:
        """Launch ``function`` of ``module`` with ``args`` in order: device arrays (passed
        as pointers) and numpy scalars of the declared types (passed by value); returns
        once it finished (a fault raises ``BackendError``, ``fatal`` when the context is
        lost)."""
        raise BackendUnavailable(f"the {type(self).__name__} backend runs no user kernels: "
                                 "they need the cuda backend and a GPU")

    @abstractmethod
    def info(self) -> dict[str, Any]:
        """Static facts about the device (name, memory, ...), safe to call from its thread."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release the device's resources; called once, from its thread."""


def _written(value: Result, target: np.ndarray | None) -> Result:
    """``value`` copied into ``target`` (where there is one and it fits), and ``target``."""
    if target is None or not isinstance(value, np.ndarray) or value.size != target.size:
        return value
    np.copyto(target, value.reshape(-1), casting="same_kind")
    return target


class Backend(ABC):
    """A kind of device: ``cpu`` or ``cuda``. ``user_code`` says what its devices load
    as user code: ``cubin`` (compiled by nvcc for each device's architecture) or ``host``
    (a shared library of the host, ``usercode.compile_host``)."""

    name: str
    user_code: str = "cubin"

    @abstractmethod
    def device_count(self) -> int:
        """How many devices this backend offers."""

    @abstractmethod
    def open(self, index: int) -> Device:
        """Open device ``index``; called inside the thread that will own it."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release process-wide resources after every device is closed."""
