"""A caching allocator for a device's memory (pure Python: no GPU, no numpy).

Allocating and freeing device memory through the driver (``cuMemAlloc``/``cuMemFree``) costs
a fraction of a millisecond per large block, which dominates short kernels on fresh buffers
(a chain of ``launch_sync(..., [{keep, true}])`` steps makes and frees one result per step).
``DevicePool`` keeps freed blocks and hands them out again:

* sizes are rounded up to size classes (``size_class``: 512 bytes up to 1 MiB, 2 MiB above,
  as CuPy's pool does), and a request is served by a cached block of exactly its class, the
  most recently freed one first;
* the cache is bounded (``limit`` bytes): after a free, the blocks over the bound are really
  freed, the oldest (least recently freed) first; a block larger than the bound is freed at
  once;
* an allocation refused for lack of memory frees every cached block and tries once more;
  the second refusal propagates (the caller turns it into its own error);
* ``close`` frees every block, cached or handed out.

The raw allocator is injected: ``raw_alloc(nbytes)`` returns a handle (anything),
``address(handle)`` its device address (distinct for live blocks), ``raw_free(handle)`` gives
it back, and ``is_oom(exc)`` tells an out-of-memory refusal from other errors. The pool is
not thread-safe: a device's pool is used by the device's own thread only.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from typing import Any

#: Requests up to this many bytes are rounded up to ``SMALL_STEP``, larger ones to
#: ``LARGE_STEP``.
SMALL_MAX = 1 << 20
SMALL_STEP = 512
LARGE_STEP = 2 << 20
#: The default bound of a device's cache: this many bytes, or ``1 / LIMIT_FRACTION`` of its
#: memory, whichever is smaller.
LIMIT_BYTES = 1 << 30
LIMIT_FRACTION = 16


def size_class(nbytes: int) -> int:
    """The bytes a block serving ``nbytes`` holds (``nbytes`` >= 1)."""
    if nbytes < 1:
        raise ValueError(f"no size class for {nbytes} bytes")
    step = SMALL_STEP if nbytes <= SMALL_MAX else LARGE_STEP
    return -(-nbytes // step) * step


def default_limit(total_memory: int) -> int:
    """The cache's bound on a device of ``total_memory`` bytes."""
    return max(0, min(LIMIT_BYTES, total_memory // LIMIT_FRACTION))


def _is_memory_error(exc: BaseException) -> bool:
    return isinstance(exc, MemoryError)


class Block:
    """A block of device memory: ``size`` bytes (its size class) at address ``ptr``."""

    __slots__ = ("handle", "ptr", "size")

    def __init__(self, handle: Any, ptr: int, size: int) -> None:
        self.handle = handle
        self.ptr = ptr
        self.size = size

    def __repr__(self) -> str:
        return f"<Block {self.size} bytes at {self.ptr:#x}>"


class PoolClosed(Exception):
    """An allocation from a closed pool."""


class DevicePool:
    """Freed blocks of device memory, kept by size class for reuse (see the module doc)."""

    def __init__(
        self,
        raw_alloc: Callable[[int], Any],
        raw_free: Callable[[Any], None],
        *,
        limit: int,
        address: Callable[[Any], int] = int,
        is_oom: Callable[[BaseException], bool] = _is_memory_error,
    ) -> None:
        self._raw_alloc = raw_alloc
        self._raw_free = raw_free
        self._address = address
        self._is_oom = is_oom
        self.limit = limit
        #: Cached blocks, oldest first (the eviction order), by address.
        self._cached: OrderedDict[int, Block] = OrderedDict()
        #: Cached blocks by size class, oldest first, by address.
        self._classes: dict[int, OrderedDict[int, Block]] = {}
        #: Blocks handed out and not yet freed, by address.
        self._live: dict[int, Block] = {}
        self.cached_bytes = 0
        self.live_bytes = 0
        self.closed = False
        # What the pool has done, read through CudaDevice.pool.
        self.hits = 0  # allocations served from the cache
        self.misses = 0  # allocations that went to the raw allocator
        self.evictions = 0  # cached blocks really freed (over the bound, or flushed)
        self.flushes = 0  # times the whole cache was freed for a refused allocation

    # -- queries ---------------------------------------------------------------------------

    @property
    def cached_blocks(self) -> int:
        return len(self._cached)

    @property
    def live_blocks(self) -> int:
        return len(self._live)

    def is_live(self, block: Block) -> bool:
        """Whether ``block`` is handed out (by this pool, and not freed since)."""
        return self._live.get(block.ptr) is block

    # -- allocation ------------------------------------------------------------------------

    def alloc(self, nbytes: int) -> Block:
        """A block of at least ``nbytes`` bytes (``nbytes`` >= 1), cached or new.

        An out-of-memory refusal of the raw allocator frees the whole cache and tries once
        more; a second refusal, or any other error, propagates (nothing is leaked).
        """
        if self.closed:
            raise PoolClosed("the device's memory pool is closed")
        size = size_class(nbytes)
        same = self._classes.get(size)
        if same:
            ptr, block = same.popitem(last=True)  # the most recently freed: warmest
            if not same:
                del self._classes[size]
            del self._cached[ptr]
            self.cached_bytes -= size
            self.hits += 1
            return self._hand_out(block)
        try:
            handle = self._raw_alloc(size)
        except Exception as exc:
            if not self._is_oom(exc) or not self._cached:
                raise
            self.flushes += 1
            self.flush()
            handle = self._raw_alloc(size)  # a second refusal propagates
        self.misses += 1
        ptr = int(self._address(handle))
        if ptr in self._live or ptr in self._cached:  # the raw allocator's bug: refuse it
            raise RuntimeError(f"the raw allocator returned the address {ptr:#x} in use")
        return self._hand_out(Block(handle, ptr, size))

    def _hand_out(self, block: Block) -> Block:
        self._live[block.ptr] = block
        self.live_bytes += block.size
        return block

    def free(self, block: Block) -> None:
        """Give ``block`` back: cached (the oldest cached blocks freed while over the bound),
        or freed at once if it is larger than the bound. Raises ``ValueError`` for a block
        this pool has not handed out or that was freed already; nothing happens after
        ``close`` (which freed it)."""
        if self.closed:
            return
        if not self.is_live(block):
            raise ValueError(f"{block!r} is not handed out by this pool (freed twice?)")
        del self._live[block.ptr]
        self.live_bytes -= block.size
        if block.size > self.limit:
            self._raw_free(block.handle)
            return
        self._cached[block.ptr] = block
        self._classes.setdefault(block.size, OrderedDict())[block.ptr] = block
        self.cached_bytes += block.size
        self.trim(self.limit)

    # -- releasing -------------------------------------------------------------------------

    def trim(self, bound: int) -> int:
        """Free cached blocks, oldest first, until at most ``bound`` bytes are cached; the
        bytes freed. Every block is taken out of the cache before it is freed, so an error
        of ``raw_free`` (which propagates) leaves the pool consistent."""
        freed = 0
        while self.cached_bytes > bound:
            ptr, block = self._cached.popitem(last=False)
            same = self._classes[block.size]
            del same[ptr]
            if not same:
                del self._classes[block.size]
            self.cached_bytes -= block.size
            self.evictions += 1
            freed += block.size
            self._raw_free(block.handle)
        return freed

    def flush(self) -> int:
        """Free every cached block; the bytes freed."""
        return self.trim(0)

    def close(self) -> None:
        """Free every block, cached or handed out; later frees are ignored and allocations
        raise ``PoolClosed``. The first error of ``raw_free`` propagates, after every block
        was tried."""
        if self.closed:
            return
        self.closed = True
        blocks = [*self._cached.values(), *self._live.values()]
        self._cached.clear()
        self._classes.clear()
        self._live.clear()
        self.cached_bytes = self.live_bytes = 0
        error: Exception | None = None
        for block in blocks:
            try:
                self._raw_free(block.handle)
            except Exception as exc:
                error = error or exc
        if error is not None:
            raise error
