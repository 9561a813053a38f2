"""The CUDA caching allocator, replayed: what `max_memory_allocated` and `max_memory_reserved` report.

As PyTorch's allocator (c10/cuda/CUDACachingAllocator.cpp; no expandable segments, one stream) does:
a request is rounded up to 512 bytes; up to 1 MiB it comes from the small pool (2 MiB segments),
else the large pool (20 MiB segments under 10 MiB, else the request rounded to 2 MiB). It takes the
smallest free block that fits (lowest address on ties), split when the rest is worth keeping (>= 512
bytes small, > 1 MiB large). A freed block merges with free neighbours; segments are kept until a new
one does not fit: then every free segment is released and the request retried once, else OOM.
"Allocated" is the sum of blocks in use, "reserved" the sum of segments.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from dataclasses import dataclass

MIN_BLOCK = 512
SMALL_SIZE = 1 << 20  # requests up to this size use the small pool
SMALL_BUFFER = 2 << 20  # small-pool segment size
LARGE_BUFFER = 20 << 20  # segment for large requests under MIN_LARGE_ALLOC
MIN_LARGE_ALLOC = 10 << 20
ROUND_LARGE = 2 << 20


def round_size(nbytes: int) -> int:
    return MIN_BLOCK if nbytes < MIN_BLOCK else -(-nbytes // MIN_BLOCK) * MIN_BLOCK


def segment_size(size: int) -> int:
    if size <= SMALL_SIZE:
        return SMALL_BUFFER
    if size < MIN_LARGE_ALLOC:
        return LARGE_BUFFER
    return -(-size // ROUND_LARGE) * ROUND_LARGE


class _Block:
    __slots__ = ("addr", "size", "used", "prev", "next", "small")

    def __init__(self, addr: int, size: int, small: bool):
        self.addr, self.size, self.small = addr, size, small
        self.used = False
        self.prev: _Block | None = None
        self.next: _Block | None = None


class CachingAllocator:
    """One device's caching allocator; `capacity` is what cudaMalloc may take in all (None: unlimited)."""

    def __init__(self, capacity: int | None = None):
        self.capacity = capacity
        self.allocated = 0
        self.reserved = 0
        self.retries = 0
        self._free: dict[bool, list[tuple[int, int]]] = {True: [], False: []}  # (size, addr), sorted
        self._by_addr: dict[int, _Block] = {}
        self._next_addr = 0

    def malloc(self, nbytes: int) -> _Block | None:
        """The block serving a request of `nbytes`, or None when the card is out of memory."""
        size = round_size(nbytes)
        small = size <= SMALL_SIZE
        pool = self._free[small]
        i = bisect_left(pool, (size, -1))
        if i < len(pool):
            _, addr = pool.pop(i)
            block = self._by_addr[addr]
        else:
            block = self._new_segment(segment_size(size), small)
            if block is None:
                return None
        rest = block.size - size
        if rest >= MIN_BLOCK if small else rest > SMALL_SIZE:
            tail = _Block(block.addr + size, rest, small)
            tail.prev, tail.next = block, block.next
            if block.next is not None:
                block.next.prev = tail
            block.next = tail
            block.size = size
            self._by_addr[tail.addr] = tail
            insort(pool, (rest, tail.addr))
        block.used = True
        self.allocated += block.size
        return block

    def free(self, block: _Block) -> None:
        block.used = False
        self.allocated -= block.size
        pool = self._free[block.small]
        prev, nxt = block.prev, block.next
        if prev is not None and not prev.used:
            self._unlist(prev)
            self._merge(prev, block)
            block = prev
        if nxt is not None and not nxt.used:
            self._unlist(nxt)
            self._merge(block, nxt)
        insort(pool, (block.size, block.addr))

    def _unlist(self, block: _Block) -> None:
        pool = self._free[block.small]
        del pool[bisect_left(pool, (block.size, block.addr))]

    def _merge(self, left: _Block, right: _Block) -> None:
        """`right` becomes part of `left`, its neighbour below."""
        left.size += right.size
        left.next = right.next
        if right.next is not None:
            right.next.prev = left
        del self._by_addr[right.addr]

    def _new_segment(self, size: int, small: bool) -> _Block | None:
        if self.capacity is not None and self.reserved + size > self.capacity:
            self.retries += 1
            self._release_free_segments()
            if self.reserved + size > self.capacity:
                return None
        block = _Block(self._next_addr, size, small)
        self._next_addr += size
        self._by_addr[block.addr] = block
        self.reserved += size
        return block

    def _release_free_segments(self) -> None:
        for pool in self._free.values():
            keep = []
            for size, addr in pool:
                block = self._by_addr[addr]
                if block.prev is None and block.next is None:
                    del self._by_addr[addr]
                    self.reserved -= size
                else:
                    keep.append((size, addr))
            pool[:] = keep  # in place: a malloc in flight holds this list


@dataclass
class Replay:
    """What the allocator reported over a window of events (peaks are over the window only)."""

    peak_allocated: int
    peak_reserved: int
    peak_event: int  # index of the event at which allocated peaked (-1: at the window's start)
    block_sizes: list[int]  # bytes each allocation held as a block (0 when never made)
    oom_event: int | None = None  # index of the allocation that did not fit
    oom_request: int = 0
    retries: int = 0
    max_allocated: int = 0  # over every event replayed, window or not
    max_reserved: int = 0

    @property
    def oom(self) -> bool:
        return self.oom_event is not None


def replay(
    events: list[int], sizes: list[int], window: tuple[int, int], capacity: int | None = None
) -> Replay:
    """Run `events` (see trace.Trace) through the allocator; peaks as seen after a reset at window[0]."""
    alloc = CachingAllocator(capacity)
    blocks: list[_Block | None] = [None] * len(sizes)
    block_sizes = [0] * len(sizes)
    start, end = window
    peak = peak_reserved = max_allocated = max_reserved = 0
    peak_event = -1
    for i, e in enumerate(events[:end]):
        if i == start:  # torch.cuda.reset_peak_memory_stats(): the peak restarts at the current value
            peak, peak_reserved, peak_event = alloc.allocated, alloc.reserved, i - 1
        if e > 0:
            aid = e - 1
            block = alloc.malloc(sizes[aid])
            if block is None:
                return Replay(
                    peak, peak_reserved, peak_event, block_sizes, i, sizes[aid], alloc.retries,
                    max_allocated, max_reserved,
                )  # fmt: skip
            blocks[aid] = block
            block_sizes[aid] = block.size
            if alloc.allocated > max_allocated:
                max_allocated = alloc.allocated
                if i >= start:
                    peak, peak_event = max_allocated, i
            elif i >= start and alloc.allocated > peak:
                peak, peak_event = alloc.allocated, i
            if alloc.reserved > max_reserved:
                max_reserved = alloc.reserved
            if i >= start and alloc.reserved > peak_reserved:
                peak_reserved = alloc.reserved
        else:
            alloc.free(blocks[-e - 1])
            blocks[-e - 1] = None
    return Replay(
        peak, peak_reserved, peak_event, block_sizes, None, 0, alloc.retries, max_allocated, max_reserved
    )


def raw_peak(events: list[int], sizes: list[int], window: tuple[int, int]) -> tuple[int, int]:
    """(peak bytes, event index) of live requested bytes in the window: an allocator without rounding."""
    live = peak = 0
    peak_event = -1
    start, end = window
    for i, e in enumerate(events[:end]):
        if i == start:
            peak, peak_event = live, i - 1
        if e > 0:
            live += sizes[e - 1]
            if i >= start and live > peak:
                peak, peak_event = live, i
        else:
            live -= sizes[-e - 1]
    return peak, peak_event


def live_at(events: list[int], index: int) -> set[int]:
    """Allocation ids alive just after event `index` (-1: before any)."""
    live: set[int] = set()
    for e in events[: index + 1]:
        if e > 0:
            live.add(e - 1)
        else:
            live.discard(-e - 1)
    return live
