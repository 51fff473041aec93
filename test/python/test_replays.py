"""Small staged batches replayed as graphs (``backends.replays``), against a recording
double of a stream's graphs: when a key is captured, replayed, captured again and dropped;
and the lone jobs' entries kept beside them (``backends.quick``), while they hold."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from erlcuda.backends import quick, replays
from erlcuda.backends.quick import Quicks
from erlcuda.backends.replays import Replays


class FakeGraphs:
    """Records what the replays ask of a stream's graphs; ``fail`` makes captures fail."""

    def __init__(self) -> None:
        self.log: list[tuple[str, Any]] = []
        self.fail = False
        self.made = 0

    def capture(self, queue: Callable[[], None]) -> int:
        if self.fail:
            raise RuntimeError("capture refused")
        queue()  # queued into the graph, not run: the log tells the two apart
        self.made += 1
        self.log.append(("capture", self.made))
        return self.made

    def launch(self, handle: int) -> None:
        self.log.append(("launch", handle))

    def release(self, handle: int) -> None:
        self.log.append(("release", handle))


def queue_for(graphs: FakeGraphs, name: str) -> Callable[[], None]:
    return lambda: graphs.log.append(("queue", name))


def test_a_key_is_captured_on_its_second_run_and_replayed_after() -> None:
    graphs = FakeGraphs()
    r = Replays(graphs)
    for _ in range(4):
        r.run(("add", 1000), (1, 2, 3, 4), queue_for(graphs, "add"))
    assert graphs.log == [("queue", "add"),  # first run: as it is
                          ("queue", "add"), ("capture", 1), ("launch", 1),  # captured
                          ("launch", 1), ("launch", 1)]  # replayed
    assert r.captures == 1 and len(r) == 1


def test_a_key_over_other_addresses_is_captured_again() -> None:
    graphs = FakeGraphs()
    r = Replays(graphs)
    for _ in range(2):
        r.run("k", (1,), queue_for(graphs, "k"))
    graphs.log.clear()
    r.run("k", (2,), queue_for(graphs, "k"))  # the staging moved: the old graph is stale
    assert graphs.log == [("release", 1), ("queue", "k"), ("capture", 2), ("launch", 2)]


def test_without_graphs_or_when_a_capture_fails_the_work_runs_as_it_is() -> None:
    ran: list[str] = []
    r = Replays(None)
    for _ in range(3):
        r.run("k", (1,), lambda: ran.append("k"))
    assert ran == ["k"] * 3 and len(r) == 0
    graphs = FakeGraphs()
    graphs.fail = True
    r = Replays(graphs)
    for _ in range(3):
        r.run("k", (1,), queue_for(graphs, "k"))
    assert graphs.log == [("queue", "k")] * 3 and len(r) == 0


def test_the_least_recently_used_graph_goes_past_the_bound_and_all_go_at_close(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(replays, "MAX_REPLAYS", 2)
    graphs = FakeGraphs()
    r = Replays(graphs)
    for key in ("a", "b", "a", "c"):  # c's capture drops b, used least recently
        for _ in range(2):
            r.run(key, (1,), queue_for(graphs, key))
    assert ("release", 2) in graphs.log and ("release", 1) not in graphs.log
    assert len(r) == 2
    graphs.log.clear()
    r.close()
    assert sorted(graphs.log) == [("release", 1), ("release", 3)] and len(r) == 0


def test_run_answers_the_graph_it_replayed_and_releases_count_as_generations() -> None:
    graphs = FakeGraphs()
    r = Replays(graphs)
    assert r.run("k", (1,), queue_for(graphs, "k")) is None  # first run: as it is
    assert r.run("k", (1,), queue_for(graphs, "k")) == 1  # captured and replayed
    assert r.run("k", (1,), queue_for(graphs, "k")) == 1 and r.generation == 0
    graphs.log.clear()
    r.launch(1)
    assert graphs.log == [("launch", 1)]
    assert r.run("k", (2,), queue_for(graphs, "k")) == 2  # the staging moved
    assert r.generation == 1
    r.close()
    assert r.generation == 2


def test_a_quick_entry_holds_while_its_staging_and_graph_do() -> None:
    graphs = FakeGraphs()
    r = Replays(graphs)
    quicks = Quicks(r)
    staging = np.zeros(8, np.float32)
    for _ in range(2):
        handle = r.run("k", (1,), queue_for(graphs, "k"))
    quicks.keep(("add", 4), (1,), (staging[:4],), staging[4:], handle)
    found = quicks.find(("add", 4), (1,))
    assert found is not None and found.handle == handle and not found.scalar
    assert quicks.find(("add", 5), (1,)) is None
    assert quicks.find(("add", 4), (2,)) is None  # the staging moved: dropped
    assert len(quicks) == 0
    quicks.keep(("add", 4), (1,), (staging[:4],), staging[4:], handle)
    r.run("k", (2,), queue_for(graphs, "k"))  # its graph released
    assert quicks.find(("add", 4), (1,)) is None


def test_quick_entries_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(quick, "MAX_REPLAYS", 2)
    quicks = Quicks(Replays(FakeGraphs()))
    staging = np.zeros(4, np.float32)
    for n in range(3):
        quicks.keep(("add", n), (1,), (staging,), staging, n)
    assert len(quicks) == 2
    assert quicks.find(("add", 0), (1,)) is None  # the first kept went first
    assert quicks.find(("add", 2), (1,)) is not None
