"""A lone small job of a kernel and size that came before, with the least Python.

The batched path (``CudaDevice._add``, ``CudaDevice._sums``) lays a batch out in the
staging and, for a small one, replays its copies and launches as a graph (``replays``).
For a batch of one job it keeps what it did here (a ``Quick``: where each operand went in
the input staging, where the result lands in the output staging, the graph), so that the
next job of that kernel and size is its operands copied there, the graph replayed and the
result read: no layout, no key, no lookup among the replays. An entry holds while the
staging is where it was (the graph holds its addresses) and the graph is still kept
(``Replays.generation``): otherwise it is dropped, and the job takes the batched path.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass
from typing import Any

import numpy as np

from .replays import MAX_REPLAYS, Replays


@dataclass(frozen=True, slots=True)
class Quick:
    """One kernel and size's replay: ``ins`` (views of the input staging) take the job's
    operands in order, the graph ``handle`` runs, ``out`` (a view of the output staging)
    holds the result; ``scalar``: it is one value, answered as a float."""

    addresses: tuple[int, ...]
    generation: int
    ins: tuple[np.ndarray, ...]
    out: np.ndarray
    handle: Any
    scalar: bool


class Quicks:
    """One device's ``Quick`` entries, by kernel and size (at most ``MAX_REPLAYS``)."""

    def __init__(self, replays: Replays) -> None:
        self._replays = replays
        self._entries: dict[Hashable, Quick] = {}

    def __len__(self) -> int:
        return len(self._entries)

    def find(self, key: Hashable, addresses: tuple[int, ...]) -> Quick | None:
        """The entry of ``key`` where it still holds over the staging at ``addresses``."""
        quick = self._entries.get(key)
        if quick is None:
            return None
        if quick.addresses != addresses or quick.generation != self._replays.generation:
            del self._entries[key]
            return None
        return quick

    def keep(self, key: Hashable, addresses: tuple[int, ...], ins: tuple[np.ndarray, ...],
             out: np.ndarray, handle: Any, *, scalar: bool = False) -> None:
        """Keep what a batch of one of ``key`` did, its graph ``handle`` just replayed."""
        if key not in self._entries and len(self._entries) >= MAX_REPLAYS:
            del self._entries[next(iter(self._entries))]
        self._entries[key] = Quick(addresses, self._replays.generation, ins, out, handle,
                                   scalar)

    def clear(self) -> None:
        self._entries.clear()
