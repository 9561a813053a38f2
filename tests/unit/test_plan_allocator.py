"""The CUDA caching allocator replay: rounding, pools, splitting, merging, best fit, the OOM retry."""

from __future__ import annotations

import pytest

from ditbench.plan.allocator import (
    CachingAllocator,
    live_at,
    raw_peak,
    replay,
    round_size,
    segment_size,
)

KiB, MiB = 1 << 10, 1 << 20
SMALL = 1 << 20  # the largest small-pool request


def test_round_size_is_512_byte_granular():
    assert [round_size(n) for n in (1, 511, 512, 513, 1024, 1025)] == [512, 512, 512, 1024, 1024, 1536]


def test_segment_sizes_per_pool():
    assert segment_size(512) == 2 * MiB  # small pool
    assert segment_size(1 * MiB) == 2 * MiB
    assert segment_size(1 * MiB + 512) == 20 * MiB  # large, under 10 MiB
    assert segment_size(10 * MiB - 512) == 20 * MiB
    assert segment_size(10 * MiB) == 10 * MiB  # rounded up to 2 MiB
    assert segment_size(11 * MiB + 512) == 12 * MiB


def test_small_requests_share_one_segment():
    a = CachingAllocator()
    blocks = [a.malloc(100) for _ in range(3)]
    assert [b.size for b in blocks] == [512, 512, 512]
    assert a.allocated == 1536 and a.reserved == 2 * MiB


def test_large_pool_splits_only_when_more_than_1_mib_remains():
    a = CachingAllocator()
    first = a.malloc(int(1.5 * MiB))  # 20 MiB segment, 18.5 MiB left: split
    assert first.size == int(1.5 * MiB) and a.reserved == 20 * MiB
    second = a.malloc(18 * MiB)  # from the remainder; 0.5 MiB left is not worth a block
    assert a.reserved == 20 * MiB
    assert second.size == int(18.5 * MiB)  # counted whole in "allocated"
    assert a.allocated == 20 * MiB


def test_freed_neighbours_merge_and_serve_a_larger_request():
    a = CachingAllocator()
    x, y, z = (a.malloc(4 * MiB) for _ in range(3))  # one 20 MiB segment
    assert a.reserved == 20 * MiB
    a.free(x)
    a.free(y)
    big = a.malloc(7 * MiB)  # fits only in the merged 8 MiB hole
    assert a.reserved == 20 * MiB and big.addr == x.addr
    a.free(z)
    a.free(big)
    assert a.allocated == 0


def test_best_fit_takes_the_smallest_block_that_fits():
    a = CachingAllocator()
    big = a.malloc(12 * MiB)  # own 12 MiB segment
    small = a.malloc(3 * MiB)  # 20 MiB segment, 17 MiB rest
    a.free(big)
    got = a.malloc(11 * MiB)  # the 12 MiB block beats the 17 MiB rest
    assert got.addr == big.addr
    assert small.used


def test_capacity_releases_free_segments_then_ooms():
    a = CachingAllocator(capacity=40 * MiB)
    p, q = a.malloc(20 * MiB), a.malloc(20 * MiB)
    assert a.reserved == 40 * MiB
    a.free(p)
    a.free(q)
    r = a.malloc(30 * MiB)  # cached 20 MiB blocks are too small: release them and retry
    assert r is not None and a.retries == 1 and a.reserved == 30 * MiB
    assert a.malloc(12 * MiB) is None  # 30 + 12 > 40 with nothing free to release


def test_a_block_split_after_a_release_stays_in_the_free_pool():
    """Releasing the cached segments replaced the pools under a malloc in flight: the split-off tail
    of the new segment went to a dropped list, was never reused, and freeing its neighbour crashed."""
    a = CachingAllocator(capacity=21 * MiB)
    a.free(a.malloc(2 * MiB))  # a cached, free 20 MiB large segment
    s = a.malloc(512)  # a small segment does not fit beside it: release it, then split the new one
    assert a.retries == 1 and a.reserved == 2 * MiB
    t = a.malloc(512)  # served by the tail
    assert a.reserved == 2 * MiB and t.addr == s.addr + 512
    a.free(s)
    a.free(t)  # merges the whole segment back
    assert a.allocated == 0 and a.malloc(SMALL) is not None and a.reserved == 2 * MiB


def test_replay_peaks_restart_at_the_window():
    # Allocation sizes; events: +k+1 allocates k, -(k+1) frees it.
    sizes = [30 * MiB, 2 * MiB, 4 * MiB]
    events = [1, -1, 2, 3, -3, -2]
    r = replay(events, sizes, window=(2, len(events)))
    assert r.peak_allocated == 6 * MiB  # the 30 MiB before the window does not count
    assert r.max_allocated == 30 * MiB
    assert r.peak_reserved == 30 * MiB  # both later requests are carved out of the cached 30 MiB block
    assert r.block_sizes == [30 * MiB, 2 * MiB, 4 * MiB]
    assert r.peak_event == 3


def test_replay_reports_the_oom_request():
    sizes = [30 * MiB, 20 * MiB]
    r = replay([1, 2], sizes, window=(0, 2), capacity=40 * MiB)
    assert r.oom and r.oom_event == 1 and r.oom_request == 20 * MiB


def test_raw_peak_and_live_set():
    sizes = [100, 200, 300]
    events = [1, 2, -1, 3, -2, -3]
    assert raw_peak(events, sizes, (0, 6)) == (500, 3)
    assert live_at(events, 3) == {1, 2}


@pytest.mark.gpu
def test_replay_matches_the_real_cuda_allocator():
    """A random alloc/free sequence through torch's caching allocator and through the replay."""
    import random

    import torch

    # cuBLAS keeps its workspaces in the caching allocator, where empty_cache() cannot free them
    # (a matmul earlier in this process leaves 32 MiB per thread): clear them, where torch can, first.
    getattr(torch._C, "_cuda_clearCublasWorkspaces", lambda: None)()
    torch.cuda.empty_cache()
    rng = random.Random(0)
    sizes, events, live = [], [], []
    for _ in range(400):
        if live and rng.random() < 0.45:
            k = live.pop(rng.randrange(len(live)))
            events.append(-(k + 1))
        else:
            sizes.append(
                rng.choice(
                    [
                        rng.randrange(1, 4 * KiB),
                        rng.randrange(4 * KiB, 2 * MiB),
                        rng.randrange(2 * MiB, 40 * MiB),
                    ]
                )
            )
            events.append(len(sizes))
            live.append(len(sizes) - 1)
    base_alloc, base_res = torch.cuda.memory_allocated(), torch.cuda.memory_reserved()
    assert base_res == 0, "needs a fresh allocator (run the GPU tests in their own process)"
    torch.cuda.reset_peak_memory_stats()
    tensors = {}
    for e in events:
        if e > 0:
            tensors[e - 1] = torch.empty(sizes[e - 1], dtype=torch.uint8, device="cuda")
        else:
            del tensors[-e - 1]
    real_alloc = torch.cuda.max_memory_allocated() - base_alloc
    real_res = torch.cuda.max_memory_reserved()
    r = replay(events, sizes, (0, len(events)))
    assert r.peak_allocated == real_alloc
    assert r.peak_reserved == real_res
