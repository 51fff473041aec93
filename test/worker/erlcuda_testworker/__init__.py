"""The test double of the erlcuda worker: the real worker with the calls that tests need.

    PYTHONPATH=test/worker:python python -m erlcuda_testworker serve <the args of erlcuda serve>

It runs ``erlcuda.cli.main`` with these calls added (``erlcuda.worker.Extension``):

- ``fault(Device)``: a kernel that stores to an unmapped address runs on ``Device``: the
  sticky CUDA error poisons the context and the worker exits for Erlang to restart it.
- ``print(Out, Err)``: ``Out`` written to fd 1 and ``Err`` to fd 2, as native code would.
- ``stall(Device, Ms)`` or ``stall(Device, Ms, Marker)``: ``Device``'s thread kept busy for
  ``Ms`` ms; the file ``Marker`` made as it begins (the stall reaches the device thread
  through the worker's control thread, behind anything it does: a test waits for the
  marker, not a guessed time, before it counts on the device being busy).
- ``frozen()``: how many objects the collector no longer walks (``gc.get_freeze_count``):
  what the worker froze once its devices were open (``erlcuda.portenv.settle_heap``).

Also the helpers GPU tests use on a device directly: ``inject_fault``, ``pool_stats``;
with ``ERLCUDA_TEST_PIN`` set, a double of the registration of host memory (``pin_double``);
and with ``ERLCUDA_TEST_SHM_FULL`` set, a shared-memory dir with no room for the folder's
lock (``full_shm_double``).
"""

from __future__ import annotations

import errno
import gc
import os
import time
from pathlib import Path
from typing import Any

import numpy as np

from erlcuda import protocol
from erlcuda.backends.base import BackendError, BackendUnavailable, Device
from erlcuda.worker import Extension, Worker

#: The faulting kernel's source; loaded as a user module, compiled through the worker's cache.
FAULT_SOURCE = Path(__file__).resolve().with_name("testing.cu")
FAULT_MODULE = "erlcuda_testing"
FAULT_KERNEL = "erlcuda_fault"


def fault_image(arch: str) -> bytes:
    """The cubin of ``testing.cu`` for ``arch`` (``sm_90``)."""
    from erlcuda import usercode

    return usercode.compile_module(FAULT_SOURCE.read_text(), [], arch)


def inject_fault(device: Device | None, image: bytes) -> None:
    """Load ``image`` (``fault_image``) into ``device`` and launch its faulting kernel: raises
    the fatal ``BackendError`` of an illegal address."""
    if device is None:
        raise BackendUnavailable("the device is unavailable")
    device.load_module(FAULT_MODULE, image, [FAULT_KERNEL])
    target = device.alloc(np.dtype("<f4"), 1, zero=True)
    device.launch_user(FAULT_MODULE, FAULT_KERNEL, [target], (1, 1, 1), (1, 1, 1), 0)
    raise BackendError("unknown", f"{FAULT_KERNEL} ran without faulting")


def pool_stats(device: Any) -> dict[str, int]:
    """A CUDA device's pool counters: cached and live blocks and bytes, hits, misses,
    evictions, flushes and the bound."""
    pool = device.pool
    return {"cached_bytes": pool.cached_bytes, "cached_blocks": pool.cached_blocks,
            "live_bytes": pool.live_bytes, "live_blocks": pool.live_blocks,
            "hits": pool.hits, "misses": pool.misses, "evictions": pool.evictions,
            "flushes": pool.flushes, "limit": pool.limit}


def fault(worker: Worker, args: list[Any]) -> Any:
    from erlcuda import usercode

    [index] = args
    lane = worker.lanes[index]
    lane.ready.wait()
    capability = lane.device_info.get("compute_capability")
    arch = usercode.arch_of(tuple(capability)) if capability else usercode.default_arch()
    image = fault_image(arch)
    return worker.on_device(index, lambda device: inject_fault(device, image))


def print_call(worker: Worker, args: list[Any]) -> Any:
    out, err = args
    os.write(1, bytes(out) + b"\n")
    os.write(2, bytes(err) + b"\n")
    return protocol.OK


def stall(worker: Worker, args: list[Any]) -> Any:
    index, ms, *marker = args

    def busy(_device: Any) -> None:
        if marker:
            Path(bytes(marker[0]).decode()).touch()
        time.sleep(ms / 1000)

    worker.on_device(index, busy)
    return protocol.OK


def frozen(worker: Worker, args: list[Any]) -> Any:
    return gc.get_freeze_count()


CALLS: dict[str, Extension] = {"fault": fault, "print": print_call, "stall": stall,
                               "frozen": frozen}


class NullPinner:
    """A ``hostmem.Pinner`` that registers nothing: the ``Pinning`` over it keeps the count
    of what the worker holds registered."""

    def pin(self, view: np.ndarray) -> Any:
        return lambda: None


def pin_double() -> None:
    """Give the CPU backend's devices a ``Pinning`` through ``NullPinner``, and their
    info the bytes registered now (``pinned_bytes``, as a GPU's says): the worker's
    registrations of shared-memory files, followed on a machine without a GPU. Set by
    ``ERLCUDA_TEST_PIN`` in the worker's environment."""
    from erlcuda.backends import cpu
    from erlcuda.hostmem import Pinning

    opened = cpu.CpuDevice.__init__
    described = cpu.CpuDevice.info

    def init(self: Any, *args: Any, **kwargs: Any) -> None:
        opened(self, *args, **kwargs)
        self.pinning = Pinning(NullPinner())

    def info(self: Any) -> dict[str, Any]:
        return {**described(self), "pinned_bytes": self.pinning.bytes}

    cpu.CpuDevice.__init__ = init  # type: ignore[method-assign]
    cpu.CpuDevice.info = info  # type: ignore[method-assign]


def full_shm_double() -> None:
    """The worker cannot take its shared-memory folder's lock: opening ``.lock`` (which
    Erlang made) fails with ENOSPC, as creating it would in a tmpfs out of inodes. Set by
    ``ERLCUDA_TEST_SHM_FULL`` in the worker's environment."""
    from erlcuda import shm

    opened = shm.open_regular

    def open_regular(path: str, flags: int) -> tuple[int, os.stat_result]:
        if flags & os.O_CREAT and os.path.basename(path) == shm.LOCK:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), path)
        return opened(path, flags)

    shm.open_regular = open_regular


if os.environ.get("ERLCUDA_TEST_PIN"):
    pin_double()
if os.environ.get("ERLCUDA_TEST_SHM_FULL"):
    full_shm_double()
