"""Whether small jobs run in place on pinned host memory: measured as a device opens.

Where the device takes host pointers, a kernel can read a job's operands from pinned host
memory over the bus and write its result back there, with no copy queued around it. On the
H200s that cost less than the copies at every size up to ``IN_PLACE_MAX``
(bench/zero_copy.py), but it depends on the host: a GPU that reads host memory slower than
its copy engines move it (an IOMMU in the way, an older bus) loses by it, and only a
measurement tells. So each device times both ways at a few sizes as it opens (the cuda
backend's ``CudaDevice``: this module needs no GPU), checks that the kernel in place
computed what the copies did, and runs in place up to the largest size before the first
one where it was clearly slower.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

__all__ = ["IN_PLACE_MAX", "IN_PLACE_SIZES", "ROUNDS", "SLOWER", "InPlaceTiming",
           "choose_in_place_max", "time_both"]

#: Most operand elements of a job that may run in place on pinned host memory (a batch of
#: vector_adds in the staging, a lone one in registered slots, a lone reduce or dot_product
#: in the staging): beyond it the copies run in chunks on two streams at the bus's speed.
IN_PLACE_MAX = 1 << 19
#: The operand elements timed, ascending: from a lone small job to the most run in place.
IN_PLACE_SIZES = (1 << 10, 1 << 13, 1 << 16, IN_PLACE_MAX)
#: In place counts as slower only past this ratio to the copies: where both cost about the
#: same, a noisy start must not take the gain away from the sizes below.
SLOWER = 1.1
#: Calls of each way timed at each size, in turn.
ROUNDS = 15


@dataclass(frozen=True, slots=True)
class InPlaceTiming:
    """One size's medians, in seconds: copies in, the kernel and the copy out, against the
    kernel alone on the host memory."""

    elements: int
    copies_s: float
    in_place_s: float


def choose_in_place_max(timings: Sequence[InPlaceTiming], slower: float = SLOWER) -> int:
    """The most operand elements a job runs in place with: the largest size timed before
    the first where in place took more than ``slower`` times the copies; 0 where even the
    smallest did (or nothing was timed)."""
    limit = 0
    for t in sorted(timings, key=lambda t: t.elements):
        if t.in_place_s > t.copies_s * slower:
            break
        limit = t.elements
    return limit


def time_both(copies: Callable[[], None], in_place: Callable[[], None], rounds: int = ROUNDS,
              clock: Callable[[], float] = time.perf_counter) -> tuple[float, float]:
    """The median seconds of ``copies`` and of ``in_place``, called in turn ``rounds``
    times each after one untimed call of each (which makes what the first calls make)."""
    copies()
    in_place()
    spent: tuple[list[float], list[float]] = ([], [])
    for _ in range(rounds):
        for call, into in ((copies, spent[0]), (in_place, spent[1])):
            t0 = clock()
            call()
            into.append(clock() - t0)
    return statistics.median(spent[0]), statistics.median(spent[1])
