"""CUDA graphs on a device's stream, through NVIDIA's ``cuda-bindings`` (the ``graphs`` extra).

PyCUDA has no graph API, but its stream and context are the driver's own: the work PyCUDA
queues on a stream being captured (``cuStreamBeginCapture``) becomes a graph's nodes, and
the graph, once instantiated, replays that work with one launch. ``cuda-bindings`` is
NVIDIA's maintained binding of the driver API, used here on PyCUDA's stream handle rather
than calling ``libcuda`` through ctypes by hand. Where it is not installed, ``graphs_for``
answers ``None`` and programs run their steps as ordinary launches.

Capture is in thread-local mode: only the capturing thread (the device's) is barred from
calls that cannot be captured, so the other devices' threads work on meanwhile.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pycuda.driver as cuda

from ..base import BackendError

try:
    from cuda.bindings import driver as _cu
except ImportError:  # the graphs extra is not installed
    _cu = None


def available() -> bool:
    return _cu is not None


def _check(result: Any, what: str) -> Any:
    """The value of a driver call's ``(CUresult, value...)``; ``BackendError`` on an error."""
    err = result[0]
    if err != _cu.CUresult.CUDA_SUCCESS:
        found, text = _cu.cuGetErrorString(err)
        message = text.decode() if found == _cu.CUresult.CUDA_SUCCESS and text else str(err)
        raise BackendError("unknown", f"{what}: {message}")
    return result[1] if len(result) > 1 else None


class Graphs:
    """Capture, replay and release graphs of the work queued on one stream."""

    def __init__(self, stream: cuda.Stream) -> None:
        self._stream = _cu.CUstream(stream.handle)

    def capture(self, queue: Callable[[], None]) -> tuple[Any, Any]:
        """The graph of what ``queue()`` queues on the stream (nothing of it runs now),
        instantiated: a handle for ``launch`` and ``release``."""
        mode = _cu.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL
        _check(_cu.cuStreamBeginCapture(self._stream, mode), "cuStreamBeginCapture")
        try:
            queue()
        except BaseException:
            graph = _cu.cuStreamEndCapture(self._stream)
            if graph[0] == _cu.CUresult.CUDA_SUCCESS and graph[1]:
                _cu.cuGraphDestroy(graph[1])
            raise
        graph = _check(_cu.cuStreamEndCapture(self._stream), "cuStreamEndCapture")
        try:
            executable = _check(_cu.cuGraphInstantiate(graph, 0), "cuGraphInstantiate")
        except BackendError:
            _cu.cuGraphDestroy(graph)
            raise
        return graph, executable

    def launch(self, handle: tuple[Any, Any]) -> None:
        _check(_cu.cuGraphLaunch(handle[1], self._stream), "cuGraphLaunch")

    def release(self, handle: tuple[Any, Any]) -> None:
        _cu.cuGraphExecDestroy(handle[1])
        _cu.cuGraphDestroy(handle[0])


def graphs_for(stream: cuda.Stream) -> Graphs | None:
    """The graphs of ``stream``, or ``None`` without ``cuda-bindings``."""
    return Graphs(stream) if _cu is not None else None
