"""Byte accounting, prefix-cache hits and LRU eviction of the KV block pool."""

from __future__ import annotations

import pytest

from lbtune.sim.kvcache import KVCache, hash_block

SMALL, BIG = 10, 25  # bytes per block of model 0 and model 1


def chain(model: int, n: int, start: int = 0) -> list[int]:
    hashes: list[int] = []
    for i in range(n):
        hashes.append(hash_block(hashes[-1] if hashes else None, model, [start + i] * 4))
    return hashes


def test_allocate_and_free_account_bytes() -> None:
    kv = KVCache(100, [SMALL, BIG])
    a = kv.allocate(0, 3)
    b = kv.allocate(1, 2)
    assert (kv.used_bytes, kv.num_used_blocks, kv.usage) == (80, 5, 0.8)
    assert kv.can_allocate(0, 2) and not kv.can_allocate(0, 3) and not kv.can_allocate(1, 1)
    with pytest.raises(MemoryError):
        kv.allocate(1, 1)
    kv.free(a)
    kv.free(b)
    assert (kv.used_bytes, kv.cached_free_bytes, kv.num_used_blocks) == (0, 0, 0)
    kv.check()


def test_cached_blocks_are_free_but_hit() -> None:
    kv = KVCache(100, [SMALL, BIG])
    hashes = chain(0, 3)
    blocks = kv.allocate(0, 3)
    for block, h in zip(blocks, hashes, strict=True):
        kv.cache_block(block, h)
    kv.free(blocks)
    assert kv.used_bytes == 0 and kv.cached_free_bytes == 30 and kv.usage == 0.0
    hit = kv.find_hit([*hashes[:2], 12345])
    assert hit == blocks[:2]
    # reusing two free cached blocks leaves 80 bytes for new ones
    assert kv.can_allocate(0, 8, hit) and not kv.can_allocate(0, 9, hit)
    kv.touch(hit)
    assert kv.used_bytes == 20 and kv.cached_free_bytes == 10
    kv.check()


def test_hash_chain_depends_on_parent_and_model() -> None:
    assert chain(0, 2) != chain(1, 2)
    assert chain(0, 2)[1] != chain(0, 2, start=1)[1]
    assert hash_block(None, 0, [1, 2]) == hash_block(None, 0, (1, 2))


def test_lru_evicts_oldest_free_block_and_tail_first() -> None:
    kv = KVCache(40, [SMALL])
    hashes = chain(0, 4)
    blocks = kv.allocate(0, 4)
    for block, h in zip(blocks, hashes, strict=True):
        kv.cache_block(block, h)
    kv.free(blocks)  # freed tail first: LRU order is 3, 2, 1, 0
    kv.allocate(0, 1)
    assert kv.num_evictions == 1
    assert kv.find_hit(hashes) == blocks[:3]  # block 3 (the tail) went first
    kv.allocate(0, 1)
    assert kv.find_hit(hashes) == blocks[:2]
    kv.check()


def test_multi_model_eviction_frees_enough_bytes() -> None:
    kv = KVCache(50, [SMALL, BIG])
    small = kv.allocate(0, 5)
    for block, h in zip(small, chain(0, 5), strict=True):
        kv.cache_block(block, h)
    kv.free(small)
    big = kv.allocate(1, 2)  # 50 bytes: every small block must go
    assert kv.num_evictions == 5 and kv.used_bytes == 50 and kv.num_cached_blocks == 0
    kv.free(big)
    kv.check()


def test_shared_block_stays_used_until_last_user_frees_it() -> None:
    kv = KVCache(100, [SMALL])
    (block,) = kv.allocate(0, 1)
    kv.cache_block(block, 7)
    kv.touch([block])  # a second request hits it
    kv.free([block])
    assert kv.used_bytes == 10 and block.ref_cnt == 1
    kv.free([block])
    assert kv.used_bytes == 0 and kv.cached_free_bytes == 10
    kv.check()


def test_prefix_caching_disabled_never_hits() -> None:
    kv = KVCache(100, [SMALL], enable_prefix_caching=False)
    (block,) = kv.allocate(0, 1)
    kv.cache_block(block, 7)
    kv.free([block])
    assert kv.find_hit([7]) == [] and kv.cached_free_bytes == 0
