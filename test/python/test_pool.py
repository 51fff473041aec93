"""The caching device allocator (backends/pool.py) on a fake raw allocator: no GPU needed."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from erlcuda.backends import pool as pool_mod
from erlcuda.backends.pool import (
    LARGE_STEP,
    SMALL_MAX,
    SMALL_STEP,
    Block,
    DevicePool,
    PoolClosed,
    default_limit,
    size_class,
)

MiB = 1 << 20
GiB = 1 << 30


class Handle:
    """A fake device allocation: an address and a size, and whether it was freed."""

    __slots__ = ("freed", "ptr", "size")

    def __init__(self, ptr: int, size: int) -> None:
        self.ptr = ptr
        self.size = size
        self.freed = False

    def __int__(self) -> int:
        return self.ptr


class FakeMemory:
    """A raw allocator with ``capacity`` bytes that hands freed addresses out again (lowest
    first, as a driver may), and records every call."""

    def __init__(self, capacity: int | None = None, *, reuse_addresses: bool = True) -> None:
        self.capacity = capacity
        self.reuse_addresses = reuse_addresses
        self.used = 0
        self.live: dict[int, Handle] = {}
        self.holes: dict[int, list[int]] = {}  # freed addresses by size
        self.next = 0x10000
        self.allocs: list[int] = []  # sizes asked for
        self.frees: list[int] = []  # addresses freed
        self.fail_next: list[BaseException] = []  # raised by the next alloc calls, in order

    def alloc(self, size: int) -> Handle:
        self.allocs.append(size)
        if self.fail_next:
            raise self.fail_next.pop(0)
        assert size > 0, "the driver makes no zero-byte blocks"
        if self.capacity is not None and self.used + size > self.capacity:
            raise MemoryError(f"out of memory: {size} bytes, {self.used} used")
        holes = self.holes.get(size)
        if self.reuse_addresses and holes:
            ptr = min(holes)
            holes.remove(ptr)
        else:
            ptr = self.next
            self.next += size + 4096
        handle = Handle(ptr, size)
        self.live[ptr] = handle
        self.used += size
        return handle

    def free(self, handle: Handle) -> None:
        assert not handle.freed, f"{handle.ptr:#x} freed twice"
        assert self.live.get(handle.ptr) is handle, f"{handle.ptr:#x} is not allocated"
        handle.freed = True
        del self.live[handle.ptr]
        self.used -= handle.size
        self.frees.append(handle.ptr)
        self.holes.setdefault(handle.size, []).append(handle.ptr)

    def pool(self, limit: int = GiB) -> DevicePool:
        return DevicePool(self.alloc, self.free, limit=limit)


def check(pool: DevicePool, memory: FakeMemory, held: list[Block]) -> None:
    """The pool's invariants, with ``held`` the blocks handed out and not freed."""
    cached = list(pool._cached.values())
    ptrs = [b.ptr for b in held] + [b.ptr for b in cached]
    assert len(set(ptrs)) == len(ptrs), "a block is live twice, or live and cached"
    assert all(pool.is_live(b) for b in held)
    assert not any(pool.is_live(b) for b in cached)
    assert pool.live_blocks == len(held)
    assert pool.live_bytes == sum(b.size for b in held)
    assert pool.cached_blocks == len(cached)
    assert pool.cached_bytes == sum(b.size for b in cached) <= max(pool.limit, 0)
    by_class = sorted(p for blocks in pool._classes.values() for p in blocks)
    assert by_class == sorted(b.ptr for b in cached)
    assert all(blocks for blocks in pool._classes.values()), "an empty class is left"
    for size, blocks in pool._classes.items():
        assert all(b.size == size for b in blocks.values())
    # Every block the pool knows is allocated, and nothing else is.
    assert sorted(memory.live) == sorted(ptrs)
    assert memory.used == pool.live_bytes + pool.cached_bytes


# -- size classes and the bound -------------------------------------------------------------


@pytest.mark.parametrize(("nbytes", "size"), [
    (1, 512), (511, 512), (512, 512), (513, 1024), (100_003, 100_352),
    (SMALL_MAX - 1, SMALL_MAX), (SMALL_MAX, SMALL_MAX), (SMALL_MAX + 1, 2 * MiB),
    (2 * MiB, 2 * MiB), (2 * MiB + 1, 4 * MiB), (64_000_000, 31 * 2 * MiB),
    (GiB, GiB), ((1 << 63) - 1, 1 << 63),
])
def test_size_classes(nbytes: int, size: int) -> None:
    assert size_class(nbytes) == size
    assert size >= nbytes
    assert size % (SMALL_STEP if nbytes <= SMALL_MAX else LARGE_STEP) == 0


@pytest.mark.parametrize("nbytes", [0, -1, -512])
def test_no_size_class_below_one_byte(nbytes: int) -> None:
    with pytest.raises(ValueError):
        size_class(nbytes)


@given(st.integers(1, 1 << 40))
def test_size_classes_are_tight_and_monotone(nbytes: int) -> None:
    size = size_class(nbytes)
    step = SMALL_STEP if nbytes <= SMALL_MAX else LARGE_STEP
    assert nbytes <= size < nbytes + step
    assert size_class(size) == size  # a class serves itself
    assert size_class(nbytes + 1) >= size


@pytest.mark.parametrize(("total", "limit"), [
    (141 * GiB, GiB), (16 * GiB, GiB), (8 * GiB, GiB // 2), (GiB, 64 * MiB), (15, 0),
    (0, 0),
])
def test_default_limit(total: int, limit: int) -> None:
    assert default_limit(total) == limit


# -- reuse -----------------------------------------------------------------------------------


def test_a_freed_block_serves_the_next_request_of_its_class() -> None:
    memory = FakeMemory()
    pool = memory.pool()
    a = pool.alloc(1000)
    assert (a.size, memory.allocs) == (1024, [1024])
    pool.free(a)
    assert (pool.cached_bytes, pool.cached_blocks, pool.live_bytes) == (1024, 1, 0)
    assert memory.frees == []  # kept, not freed
    b = pool.alloc(600)  # another request of the same class
    assert b is a and memory.allocs == [1024]
    assert (pool.hits, pool.misses) == (1, 1)
    assert (pool.cached_bytes, pool.live_bytes) == (0, 1024)
    check(pool, memory, [b])


def test_other_classes_are_not_served_by_a_cached_block() -> None:
    memory = FakeMemory()
    pool = memory.pool()
    a = pool.alloc(1000)
    pool.free(a)
    b = pool.alloc(1025)  # class 1536
    assert b is not a and b.size == 1536 and memory.allocs == [1024, 1536]
    large = pool.alloc(3 * MiB)
    pool.free(large)
    c = pool.alloc(5 * MiB)  # class 6 MiB, not 4 MiB: a new block
    assert c is not large and memory.allocs[-1] == 6 * MiB
    check(pool, memory, [b, c])


def test_the_most_recently_freed_block_of_a_class_comes_first() -> None:
    memory = FakeMemory()
    pool = memory.pool()
    a, b, c = pool.alloc(100), pool.alloc(200), pool.alloc(300)
    for block in (a, c, b):
        pool.free(block)
    assert [pool.alloc(512) for _ in range(3)] == [b, c, a]
    check(pool, memory, [a, b, c])


def test_a_chain_of_steps_allocates_twice_only() -> None:
    # The benchmark's pattern: each step makes its result, then frees the previous one.
    memory = FakeMemory()
    pool = memory.pool()
    n = 64_000_000
    x = pool.alloc(n)
    for _ in range(10):
        out = pool.alloc(n)
        pool.free(x)
        x = out
    assert len(memory.allocs) == 2 and memory.frees == []
    assert (pool.hits, pool.misses) == (9, 2)
    check(pool, memory, [x])


# -- the bound and eviction ------------------------------------------------------------------


def test_the_cache_stays_under_its_bound_freeing_the_oldest_first() -> None:
    memory = FakeMemory()
    pool = memory.pool(limit=4096)
    a, b, c, d = (pool.alloc(2048) for _ in range(4))
    pool.free(a)
    pool.free(b)
    assert memory.frees == [] and pool.cached_bytes == 4096
    pool.free(c)  # 6144 > 4096: a, the oldest, really goes
    assert memory.frees == [a.ptr] and pool.cached_bytes == 4096
    pool.free(d)
    assert memory.frees == [a.ptr, b.ptr]
    assert pool.evictions == 2
    check(pool, memory, [])
    assert sorted(pool._cached) == sorted([c.ptr, d.ptr])


def test_eviction_order_is_across_classes_and_follows_reuse() -> None:
    memory = FakeMemory()
    pool = memory.pool(limit=4096)
    a, b, c = pool.alloc(1024), pool.alloc(2048), pool.alloc(1024)
    pool.free(a)
    pool.free(b)  # cached: a (oldest), b
    again = pool.alloc(1000)  # takes a out of the cache
    assert again is a
    pool.free(c)  # cached: b, c = 3072
    pool.free(a)  # cached: b, c, a = 4096
    assert memory.frees == []
    d = pool.alloc(2048 + 512)  # a new block: class 2560
    pool.free(d)  # 6656 > 4096: b, then c, the oldest ones, go
    assert memory.frees == [b.ptr, c.ptr]
    assert list(pool._cached) == [a.ptr, d.ptr]
    check(pool, memory, [])


def test_a_block_larger_than_the_bound_is_freed_at_once() -> None:
    memory = FakeMemory()
    pool = memory.pool(limit=4 * MiB)
    small = pool.alloc(1000)
    pool.free(small)
    big = pool.alloc(5 * MiB)
    pool.free(big)
    assert memory.frees == [big.ptr]  # the cached small block stays
    assert pool.cached_bytes == 1024
    fits = pool.alloc(4 * MiB)  # exactly the bound: cached, the small one evicted
    pool.free(fits)
    assert memory.frees == [big.ptr, small.ptr] and pool.cached_bytes == 4 * MiB
    check(pool, memory, [])


def test_a_zero_bound_caches_nothing() -> None:
    memory = FakeMemory()
    pool = memory.pool(limit=0)
    for _ in range(3):
        block = pool.alloc(100)
        pool.free(block)
    assert len(memory.allocs) == len(memory.frees) == 3
    assert pool.cached_bytes == 0 and pool.hits == 0
    check(pool, memory, [])


def test_trim_and_flush() -> None:
    memory = FakeMemory()
    pool = memory.pool()
    blocks = [pool.alloc(512 * (i + 1)) for i in range(4)]  # 512, 1024, 1536, 2048
    for block in blocks:
        pool.free(block)
    assert pool.trim(3584) == 1536  # the two oldest go: 512 + 1024
    assert memory.frees == [blocks[0].ptr, blocks[1].ptr]
    assert pool.trim(1 << 40) == 0
    assert pool.flush() == 3584
    assert pool.flush() == 0
    assert memory.used == 0 and pool.cached_bytes == 0
    check(pool, memory, [])


def test_a_lowered_bound_applies_at_the_next_free() -> None:
    memory = FakeMemory()
    pool = memory.pool()
    blocks = [pool.alloc(MiB) for _ in range(4)]
    for block in blocks[:3]:
        pool.free(block)
    pool.limit = MiB
    pool.free(blocks[3])
    assert memory.frees == [b.ptr for b in blocks[:3]] and pool.cached_bytes == MiB
    check(pool, memory, [])


# -- out of memory ---------------------------------------------------------------------------


def test_out_of_memory_flushes_the_cache_and_retries_once() -> None:
    memory = FakeMemory(capacity=8192)
    pool = memory.pool()
    a, b = pool.alloc(2048), pool.alloc(4096)
    pool.free(a)
    pool.free(b)
    live = pool.alloc(1024)  # a new block: 7168 bytes in use
    big = pool.alloc(6000)  # class 6144: refused, the cache emptied, then granted
    assert memory.allocs == [2048, 4096, 1024, 6144, 6144]
    assert sorted(memory.frees) == sorted([a.ptr, b.ptr])
    assert (pool.flushes, pool.cached_bytes) == (1, 0)
    check(pool, memory, [live, big])


def test_a_second_refusal_propagates_and_leaks_nothing() -> None:
    memory = FakeMemory(capacity=8192)
    pool = memory.pool()
    keep = pool.alloc(4096)
    cached = pool.alloc(2048)
    pool.free(cached)
    with pytest.raises(MemoryError):
        pool.alloc(6000)  # 4096 live + 6144 > 8192 even with the cache emptied
    assert memory.allocs == [4096, 2048, 6144, 6144]  # one retry only
    assert memory.frees == [cached.ptr] and pool.flushes == 1
    assert (pool.cached_bytes, pool.live_bytes, pool.misses) == (0, 4096, 2)
    check(pool, memory, [keep])
    again = pool.alloc(2048)  # still usable
    check(pool, memory, [keep, again])


def test_out_of_memory_with_an_empty_cache_is_not_retried() -> None:
    memory = FakeMemory(capacity=4096)
    pool = memory.pool()
    with pytest.raises(MemoryError):
        pool.alloc(8192)
    assert memory.allocs == [8192] and pool.flushes == 0
    check(pool, memory, [])


def test_other_errors_do_not_flush_the_cache() -> None:
    memory = FakeMemory()
    pool = memory.pool()
    cached = pool.alloc(100)
    pool.free(cached)
    memory.fail_next = [RuntimeError("invalid context")]
    with pytest.raises(RuntimeError):
        pool.alloc(5000)
    assert memory.allocs == [512, 5120] and memory.frees == []
    assert pool.cached_bytes == 512 and pool.flushes == 0
    check(pool, memory, [])


def test_the_out_of_memory_test_is_injected() -> None:
    class DriverOOM(Exception):
        pass

    memory = FakeMemory()
    pool = DevicePool(memory.alloc, memory.free, limit=GiB,
                      is_oom=lambda exc: isinstance(exc, DriverOOM))
    cached = pool.alloc(100)
    pool.free(cached)
    memory.fail_next = [DriverOOM("cuMemAlloc failed: out of memory")]
    block = pool.alloc(5000)  # refused once, granted after the flush
    assert pool.flushes == 1 and memory.frees == [cached.ptr]
    check(pool, memory, [block])
    pool.free(block)
    memory.fail_next = [MemoryError("not ours")]  # not an OOM for this pool: no flush
    with pytest.raises(MemoryError):
        pool.alloc(100)
    assert pool.flushes == 1 and pool.cached_bytes == 5120
    check(pool, memory, [])


def test_an_address_reused_by_a_really_freed_block_is_fine() -> None:
    # The driver hands an address out again once it is freed: the pool must not mistake
    # the new block for the old one.
    memory = FakeMemory()
    pool = memory.pool(limit=0)
    a = pool.alloc(1000)
    ptr = a.ptr
    pool.free(a)  # really freed (bound 0)
    b = pool.alloc(1000)
    assert b.ptr == ptr and b is not a
    assert not pool.is_live(a) and pool.is_live(b)
    with pytest.raises(ValueError):
        pool.free(a)  # the old block object is stale
    pool.free(b)
    check(pool, memory, [])


# -- zero sizes, double hand-out, foreign blocks ---------------------------------------------


@pytest.mark.parametrize("nbytes", [0, -1])
def test_no_zero_size_blocks(nbytes: int) -> None:
    memory = FakeMemory()
    pool = memory.pool()
    with pytest.raises(ValueError):
        pool.alloc(nbytes)
    assert memory.allocs == [] and pool.misses == 0
    check(pool, memory, [])


def test_freeing_twice_is_refused_and_changes_nothing() -> None:
    memory = FakeMemory()
    pool = memory.pool()
    a = pool.alloc(100)
    pool.free(a)
    with pytest.raises(ValueError):
        pool.free(a)
    assert pool.cached_blocks == 1  # not cached twice
    b = pool.alloc(100)
    c = pool.alloc(100)
    assert b is a and c is not a and c.ptr != a.ptr
    check(pool, memory, [b, c])


def test_a_foreign_block_is_refused() -> None:
    memory = FakeMemory()
    pool = memory.pool()
    other = FakeMemory().pool()
    stranger = other.alloc(100)
    mine = pool.alloc(100)
    for block in (stranger, Block(Handle(mine.ptr, 512), mine.ptr, 512)):
        with pytest.raises(ValueError):
            pool.free(block)
    check(pool, memory, [mine])


def test_an_address_in_use_from_the_allocator_is_refused() -> None:
    memory = FakeMemory()
    pool = memory.pool()
    a = pool.alloc(100)
    pool.free(a)  # cached
    twin = Handle(a.ptr, 1024)
    pool_alloc = pool._raw_alloc
    pool._raw_alloc = lambda size: twin
    with pytest.raises(RuntimeError):
        pool.alloc(1000)
    pool._raw_alloc = pool_alloc
    assert pool.cached_blocks == 1 and pool.live_blocks == 0


def test_many_live_blocks_of_one_class_are_distinct() -> None:
    memory = FakeMemory()
    pool = memory.pool()
    blocks = [pool.alloc(3000) for _ in range(50)]
    for block in blocks[::2]:
        pool.free(block)
    more = [pool.alloc(2600) for _ in range(50)]  # 25 cached, 25 new
    held = blocks[1::2] + more
    assert len({b.ptr for b in held}) == len(held) == 75
    assert pool.hits == 25 and pool.misses == 75
    check(pool, memory, held)


OPS = st.lists(
    st.one_of(
        st.tuples(st.just("alloc"), st.integers(1, 6 * MiB)),
        st.tuples(st.just("alloc"), st.sampled_from([1, 512, 513, 4000, 2 * MiB, 3 * MiB])),
        st.tuples(st.just("free"), st.integers(0, 1 << 30)),
        st.tuples(st.just("flush"), st.just(0)),
        st.tuples(st.just("limit"), st.sampled_from([0, 4096, MiB, 8 * MiB, 64 * MiB])),
    ),
    max_size=80,
)


@given(ops=OPS, capacity=st.sampled_from([None, 16 * MiB, 40 * MiB]),
       reuse=st.booleans())
def test_random_sequences_keep_every_invariant(ops: list[tuple[str, int]],
                                               capacity: int | None, reuse: bool) -> None:
    memory = FakeMemory(capacity, reuse_addresses=reuse)
    pool = memory.pool(limit=8 * MiB)
    held: list[Block] = []
    for op, value in ops:
        if op == "alloc":
            try:
                block = pool.alloc(value)
            except MemoryError:
                # Refused only with the cache emptied, for a block that does not fit.
                assert pool.cached_bytes == 0
                assert capacity is not None
                assert memory.used + size_class(value) > capacity
            else:
                assert block.size == size_class(value)
                held.append(block)
        elif op == "free" and held:
            pool.free(held.pop(value % len(held)))
        elif op == "flush":
            pool.flush()
        elif op == "limit":
            pool.limit = value
            pool.trim(value)
        check(pool, memory, held)
    pool.close()
    assert memory.used == 0 and memory.live == {}


# -- close -----------------------------------------------------------------------------------


def test_close_frees_every_block_cached_or_live() -> None:
    memory = FakeMemory()
    pool = memory.pool()
    cached, live = pool.alloc(100), pool.alloc(5 * MiB)
    pool.free(cached)
    pool.close()
    assert sorted(memory.frees) == sorted([cached.ptr, live.ptr])
    assert memory.used == 0 and pool.closed
    assert (pool.cached_bytes, pool.live_bytes, pool.cached_blocks, pool.live_blocks) == (
        0, 0, 0, 0)
    pool.free(live)  # after close: ignored (close freed it)
    pool.close()  # twice: nothing happens
    assert len(memory.frees) == 2
    with pytest.raises(PoolClosed):
        pool.alloc(100)


def test_close_tries_every_block_and_raises_the_first_error() -> None:
    memory = FakeMemory()
    failures: list[int] = []

    def free(handle: Handle) -> None:
        if handle.size == 1024:
            failures.append(handle.ptr)
            raise RuntimeError("context lost")
        memory.free(handle)

    pool = DevicePool(memory.alloc, free, limit=GiB)
    blocks = [pool.alloc(n) for n in (100, 1000, 3000, 1000)]
    pool.free(blocks[0])
    pool.free(blocks[1])
    with pytest.raises(RuntimeError, match="context lost"):
        pool.close()
    assert len(failures) == 2
    assert sorted(memory.live) == sorted(failures)  # the fake kept those two
    assert pool.closed and pool.cached_blocks == pool.live_blocks == 0


def test_an_error_while_evicting_leaves_the_pool_consistent() -> None:
    memory = FakeMemory()
    calls: list[int] = []

    def free(handle: Handle) -> None:
        calls.append(handle.ptr)
        if len(calls) == 1:
            raise RuntimeError("busy")
        memory.free(handle)

    pool = DevicePool(memory.alloc, free, limit=2048)
    a, b, c = pool.alloc(1024), pool.alloc(1024), pool.alloc(1024)
    pool.free(a)
    pool.free(b)
    with pytest.raises(RuntimeError):
        pool.free(c)  # a's eviction fails: a is out of the pool all the same
    assert list(pool._cached) == [b.ptr, c.ptr] and pool.cached_bytes == 2048
    assert not pool.is_live(a) and not pool.is_live(c)
    d = pool.alloc(1024)
    assert d is c


def test_the_module_is_free_of_numpy_and_pycuda() -> None:
    import ast
    from pathlib import Path

    tree = ast.parse(Path(pool_mod.__file__).read_text())
    imported = {alias.name.split(".")[0] for node in ast.walk(tree)
                if isinstance(node, ast.Import) for alias in node.names}
    imported |= {(node.module or "").split(".")[0] for node in ast.walk(tree)
                 if isinstance(node, ast.ImportFrom) and node.level == 0}
    assert imported <= {"__future__", "collections", "typing"}, imported
