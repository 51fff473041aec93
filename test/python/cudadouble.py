"""A double of the parts of ``pycuda.driver`` that ``backends/pipeline.py`` uses: device
memory, streams and events, and asynchronous copies, on the CPU.

Work queued on a stream runs only when something waits for it (``Stream.synchronize``,
``Event.synchronize`` up to where the event was recorded): the latest a real device may run
it. A copy reads its host source and writes its host destination when it runs, not when
it is queued, so code that reuses a host buffer before the copy that reads it has run, or
reads a result before the copy that writes it, gets wrong bytes here, as it may on a GPU.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

BASE = 1 << 20  # device addresses start here: 0 is never one


class Memory:
    """Device memory: one byte array, handed out from the start."""

    def __init__(self, nbytes: int) -> None:
        self.bytes = np.zeros(nbytes, np.uint8)
        self._next = 0

    def alloc(self, nbytes: int) -> int:
        at = self._next
        self._next += -(-nbytes // 256) * 256
        assert self._next <= self.bytes.size, "device memory exhausted"
        return BASE + at

    def view(self, ptr: int, nbytes: int) -> np.ndarray:
        at = ptr - BASE
        assert 0 <= at and at + nbytes <= self.bytes.size, "outside device memory"
        return self.bytes[at : at + nbytes]


@dataclass
class Stream:
    driver: Driver
    ops: list[Callable[[], None]] = field(default_factory=list)

    def enqueue(self, op: Callable[[], None]) -> None:
        self.ops.append(op)

    def run_to(self, count: int) -> None:
        """Run the first ``count`` ops still queued."""
        for _ in range(count):
            op = self.ops.pop(0)
            op()
            self.driver.ran += 1

    def synchronize(self) -> None:
        self.run_to(len(self.ops))

    def wait_for_event(self, event: Event) -> None:
        self.enqueue(event.synchronize)


class Event:
    def __init__(self) -> None:
        self._stream: Stream | None = None
        self._marker: object | None = None

    def record(self, stream: Stream) -> None:
        marker = object()
        self._stream, self._marker = stream, marker
        stream.enqueue(lambda: None)
        stream.ops[-1].marker = marker  # type: ignore[attr-defined]

    def synchronize(self) -> None:
        stream, marker = self._stream, self._marker
        if stream is None:
            return  # never recorded: nothing to wait for
        for i, op in enumerate(stream.ops):
            if getattr(op, "marker", None) is marker:
                stream.run_to(i + 1)
                return


class Driver:
    """The double: ``Stream``, ``Event``, ``memcpy_htod_async``, ``memcpy_dtoh_async``."""

    def __init__(self, nbytes: int = 64 << 20) -> None:
        self.memory = Memory(nbytes)
        self.ran = 0  # ops run
        self.copies: list[tuple[str, int]] = []  # (direction, bytes), as queued

    def Stream(self) -> Stream:
        return Stream(self)

    def Event(self) -> Event:
        return Event()

    def memcpy_htod_async(self, ptr: int, src: np.ndarray, stream: Stream) -> None:
        data = np.asarray(src).view(np.uint8).reshape(-1)
        self.copies.append(("htod", data.nbytes))
        stream.enqueue(lambda: np.copyto(self.memory.view(ptr, data.nbytes), data))

    def memcpy_dtoh_async(self, dst: np.ndarray, ptr: int, stream: Stream) -> None:
        out = dst.view(np.uint8).reshape(-1)
        self.copies.append(("dtoh", out.nbytes))
        stream.enqueue(lambda: np.copyto(out, self.memory.view(ptr, out.nbytes)))

    def f32(self, ptr: int, count: int) -> np.ndarray:
        return self.memory.view(ptr, 4 * count).view(np.float32)


class Pinner:
    """A ``hostmem.Pinner`` that records what is registered now."""

    def __init__(self, refuse: bool = False) -> None:
        self.live: dict[int, int] = {}  # address -> bytes
        self.pinned = 0
        self.unpinned = 0
        self.refuse = refuse

    def pin(self, view: np.ndarray) -> Callable[[], None]:
        from erlcuda.hostmem import PinError

        if self.refuse:
            raise PinError("refused by the double")
        start = view.ctypes.data
        assert start not in self.live, "registered twice"
        self.live[start] = view.nbytes
        self.pinned += 1

        def unpin() -> None:
            assert start in self.live, "unregistered twice"
            del self.live[start]
            self.unpinned += 1

        return unpin


def vector_add(driver: Driver, a: int, b: int, c: int) -> Callable[[int, int, Any], None]:
    """A ``pipeline.Compute`` that queues c = a + b over f32 device arrays."""

    def compute(start: int, count: int, stream: Stream) -> None:
        def op() -> None:
            x = driver.f32(a + 4 * start, count)
            y = driver.f32(b + 4 * start, count)
            driver.f32(c + 4 * start, count)[:] = x + y
        stream.enqueue(op)

    return compute
