"""Small staged batches replayed as CUDA graphs: their copies and launches, one launch.

A small job's own GPU work is a few microseconds; what it costs the worker is the driver
calls that queue it (the upload, one or two kernels, the download), each a trip through
PyCUDA and the driver. The work of a small batch depends only on its kind, its size and
where the device's staging lies, so the second time a key comes its calls are captured
(``backends.cuda.graphs``) and from then on replayed by one ``cuGraphLaunch``. A replay is valid
only while the staging is where it was captured (the graph holds its addresses): a key
captured over other addresses is captured again. Kept per device, the most recent
``MAX_REPLAYS``; none where the graphs extra is not installed. ``generation`` counts the
graphs released, so that what holds a handle (``run``'s answer) can tell it is gone.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Any, Protocol


class Graphs(Protocol):
    """What replays need of a stream's graphs (``backends.cuda.graphs.Graphs``)."""

    def capture(self, queue: Callable[[], None]) -> Any: ...

    def launch(self, handle: Any) -> None: ...

    def release(self, handle: Any) -> None: ...


#: A batch up to this many elements is replayed: above it the copies outweigh the calls.
REPLAY_MAX_ELEMENTS = 1 << 16
#: Graphs kept per device, the least recently used dropped first.
MAX_REPLAYS = 32
#: Runs of a key before its capture: a size seen once is not worth a graph.
CAPTURE_AFTER = 1


class Replays:
    """The replays of one device's stream."""

    def __init__(self, graphs: Graphs | None) -> None:
        self._graphs = graphs
        self._kept: OrderedDict[Hashable, tuple[tuple[int, ...], Any]] = OrderedDict()
        self._seen: OrderedDict[Hashable, int] = OrderedDict()
        self.captures = 0
        self.generation = 0

    def __len__(self) -> int:
        return len(self._kept)

    def run(self, key: Hashable, addresses: tuple[int, ...],
            queue: Callable[[], None]) -> Any:
        """Queue ``queue``'s work on the stream: its graph's replay where ``key`` was
        captured over these ``addresses``, a new capture on its second run, else as it is.
        The graph's handle where it was replayed (``launch`` replays it again while
        ``generation`` stays), else ``None``."""
        graphs = self._graphs
        if graphs is None:
            queue()
            return None
        kept = self._kept.get(key)
        if kept is not None:
            if kept[0] == addresses:
                self._kept.move_to_end(key)
                graphs.launch(kept[1])
                return kept[1]
            del self._kept[key]
            self._release(kept[1])
        elif self._count(key) <= CAPTURE_AFTER:
            queue()
            return None
        try:
            handle = graphs.capture(queue)
        except Exception:  # the capture queued nothing: the work runs as it is
            queue()
            return None
        self.captures += 1
        self._kept[key] = (addresses, handle)
        if len(self._kept) > MAX_REPLAYS:
            self._release(self._kept.popitem(last=False)[1][1])
        graphs.launch(handle)
        return handle

    def launch(self, handle: Any) -> None:
        """Replay a graph ``run`` answered, while ``generation`` is what it was then."""
        assert self._graphs is not None
        self._graphs.launch(handle)

    def _release(self, handle: Any) -> None:
        assert self._graphs is not None
        self.generation += 1
        self._graphs.release(handle)

    def _count(self, key: Hashable) -> int:
        """How often ``key`` has come, this time included."""
        seen = self._seen.pop(key, 0) + 1
        self._seen[key] = seen
        if len(self._seen) > 4 * MAX_REPLAYS:
            self._seen.popitem(last=False)
        return seen

    def close(self) -> None:
        """Release every graph (while the device's context is current)."""
        if self._graphs is not None:
            for _, handle in self._kept.values():
                self._release(handle)
        self._kept.clear()
        self._seen.clear()
