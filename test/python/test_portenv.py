"""The worker's process set-up: how much freed memory it keeps, and its heap frozen once
open (``portenv``)."""

from __future__ import annotations

import gc
import subprocess
import sys
import textwrap
import threading
import weakref

import pytest

from erlcuda.portenv import HeapTrim, settle_heap
from test_cli import ENV


def test_the_heap_is_trimmed_at_most_once_a_period_to_its_slack() -> None:
    now = [100.0]
    calls: list[int] = []
    trim = HeapTrim(every_s=10.0, slack=1234, trim=calls.append, clock=lambda: now[0])
    assert [trim() for _ in range(3)] == [False, False, False]  # not before a period
    now[0] = 110.0
    assert trim() is True and calls == [1234]
    now[0] = 119.9
    assert trim() is False
    now[0] = 125.0
    assert trim() is True and calls == [1234, 1234]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc_trim")
def test_freed_memory_is_kept_until_trimmed_then_given_back() -> None:
    # As the worker sets it up: freed blocks stay mapped (no page faults on the next
    # batch) until HeapTrim gives them back, but its slack.
    code = textwrap.dedent("""
        import ctypes, numpy as np
        from erlcuda import portenv
        def rss():
            with open("/proc/self/statm") as f:
                return int(f.read().split()[1]) * 4096 >> 20
        assert portenv.keep_freed_memory()
        base = rss()
        blocks = [np.ones(1 << 20) for _ in range(25)]  # 25 blocks of 8 MiB, from the heap
        grown = rss()
        del blocks
        kept = rss()
        trim = portenv.HeapTrim(every_s=0.0, slack=16 << 20)
        assert trim()
        print(base, grown, kept, rss())
    """)
    done = subprocess.run([sys.executable, "-c", code], env=ENV, capture_output=True,
                          text=True, timeout=60, check=True)
    base, grown, kept, trimmed = map(int, done.stdout.split())
    assert grown - base >= 190
    assert kept - base >= 190, "freed blocks are kept for reuse"
    assert trimmed - base <= 40, "trimmed down to the slack"


def test_the_heap_is_trimmed_from_a_thread_of_its_own_even_when_idle() -> None:
    calls: list[int] = []
    done = threading.Event()

    def trim(slack: int) -> None:
        calls.append(slack)
        if len(calls) >= 3:
            done.set()

    thread = HeapTrim(every_s=0.02, slack=0, trim=trim).start()
    assert thread is not None and thread.daemon
    assert done.wait(10), "no trim while nothing else ran"
    assert calls[:3] == [0, 0, 0]


class _Node:
    me: _Node | None = None


def _tracked_ids() -> set[int]:
    return {id(o) for generation in range(3) for o in gc.get_objects(generation)}


def test_settling_the_heap_collects_its_garbage_and_freezes_the_rest() -> None:
    garbage, kept = _Node(), _Node()
    garbage.me, kept.me = garbage, kept  # cycles: only the collector frees them
    dead = weakref.ref(garbage)
    del garbage
    gc.unfreeze()
    try:
        settle_heap()
        assert dead() is None
        assert gc.get_freeze_count() > 0
        # frozen: in no generation, so that no collection walks it again
        assert id(kept) not in _tracked_ids() and gc.is_tracked(kept)
        young = _Node()
        assert id(young) in _tracked_ids()
    finally:
        gc.unfreeze()
