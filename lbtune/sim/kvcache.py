"""Paged KV cache with prefix caching, after vLLM v1's ``BlockPool`` and ``KVCacheManager``.

The cache is a byte budget shared by every model the replica serves. A block holds
``block_size`` tokens of one model, so its size in bytes depends on the model
(``block_size x kv_bytes_per_token``): an 8B block is 2 MiB, a 70B block 5 MiB. Accounting
in bytes lets one pool serve several models without fixing a split between them.

* A block in use has ``ref_cnt > 0``; its bytes are *used*.
* A full block whose KV is computed gets a hash (a chain over the token ids of every block
  up to it, and the model) and is registered in the prefix cache. When its last user frees it,
  it stays cached and joins the free LRU queue: its bytes count as *free* (as in vLLM's
  ``kv_cache_usage_perc``) but its content can still be hit.
* Allocation evicts cached free blocks from the LRU head until enough bytes are unallocated.
  A request's blocks are freed tail first, so its last blocks are evicted first.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence


class Block:
    """One KV block. ``block_hash`` is set once the block is full and cached."""

    __slots__ = ("block_hash", "block_id", "model", "ref_cnt")

    def __init__(self, block_id: int, model: int) -> None:
        self.block_id = block_id
        self.model = model
        self.ref_cnt = 1
        self.block_hash: int | None = None

    def __repr__(self) -> str:
        return f"Block({self.block_id}, model={self.model}, ref={self.ref_cnt})"


def hash_block(parent: int | None, model: int, tokens: Sequence[int]) -> int:
    """Hash of a full block: chained over its parent's hash, the model and its token ids.

    Python hashes ints and tuples of ints identically in every process (no hash seed), so the
    result is deterministic across runs.
    """
    return hash((parent, model, tuple(tokens)))


class KVCache:
    """Byte-budgeted block pool with an LRU prefix cache."""

    def __init__(
        self,
        capacity_bytes: int,
        block_bytes: Sequence[int],
        enable_prefix_caching: bool = True,
    ) -> None:
        if capacity_bytes <= 0:
            raise ValueError("KV cache capacity must be positive")
        self.capacity_bytes = capacity_bytes
        self.block_bytes = tuple(block_bytes)
        self.enable_prefix_caching = enable_prefix_caching
        self.used_bytes = 0
        """Bytes of blocks with ``ref_cnt > 0``."""
        self.cached_free_bytes = 0
        """Bytes of cached blocks nobody uses (evictable)."""
        self._next_id = 0
        self._cached: dict[int, Block] = {}  # hash -> block
        self._lru: OrderedDict[int, Block] = OrderedDict()  # block_id -> free cached block
        self.num_used_blocks = 0
        self.num_evictions = 0

    # --- queries ---------------------------------------------------------------------------

    @property
    def usage(self) -> float:
        """Fraction of the cache in use, 0..1 (cached free blocks count as free)."""
        return self.used_bytes / self.capacity_bytes

    @property
    def free_bytes(self) -> int:
        """Bytes available to new blocks (unallocated + evictable)."""
        return self.capacity_bytes - self.used_bytes

    @property
    def num_cached_blocks(self) -> int:
        return len(self._cached)

    def find_hit(self, hashes: Sequence[int]) -> list[Block]:
        """The longest chain of cached blocks matching ``hashes`` from the start."""
        hit: list[Block] = []
        if not self.enable_prefix_caching:
            return hit
        cached = self._cached
        for h in hashes:
            block = cached.get(h)
            if block is None:
                break
            hit.append(block)
        return hit

    def can_allocate(self, model: int, num_blocks: int, hit: Sequence[Block] = ()) -> bool:
        """Whether ``num_blocks`` new blocks fit after the free blocks of ``hit`` are reused."""
        reused_free = sum(self.block_bytes[b.model] for b in hit if b.ref_cnt == 0)
        need = num_blocks * self.block_bytes[model]
        return need <= self.capacity_bytes - self.used_bytes - reused_free

    # --- changes ---------------------------------------------------------------------------

    def touch(self, blocks: Sequence[Block]) -> None:
        """Take a reference on cached blocks hit by a new request."""
        for block in blocks:
            if block.ref_cnt == 0:
                del self._lru[block.block_id]
                size = self.block_bytes[block.model]
                self.cached_free_bytes -= size
                self.used_bytes += size
                self.num_used_blocks += 1
            block.ref_cnt += 1

    def allocate(self, model: int, num_blocks: int) -> list[Block]:
        """``num_blocks`` fresh blocks for ``model``, evicting LRU cached blocks as needed."""
        size = self.block_bytes[model]
        need = num_blocks * size
        if need > self.capacity_bytes - self.used_bytes:
            raise MemoryError(f"{num_blocks} blocks do not fit in the KV cache")
        while self.capacity_bytes - self.used_bytes - self.cached_free_bytes < need:
            _, victim = self._lru.popitem(last=False)
            self.cached_free_bytes -= self.block_bytes[victim.model]
            assert victim.block_hash is not None
            del self._cached[victim.block_hash]
            victim.block_hash = None
            self.num_evictions += 1
        blocks = []
        for _ in range(num_blocks):
            blocks.append(Block(self._next_id, model))
            self._next_id += 1
        self.used_bytes += need
        self.num_used_blocks += num_blocks
        return blocks

    def free(self, blocks: Sequence[Block]) -> None:
        """Drop one reference on each block, tail first (the tail is evicted first)."""
        for block in reversed(blocks):
            block.ref_cnt -= 1
            if block.ref_cnt > 0:
                continue
            size = self.block_bytes[block.model]
            self.used_bytes -= size
            self.num_used_blocks -= 1
            if block.block_hash is not None:
                self._lru[block.block_id] = block
                self.cached_free_bytes += size

    def cache_block(self, block: Block, block_hash: int) -> None:
        """Register a full, computed block under ``block_hash`` (first copy wins)."""
        if not self.enable_prefix_caching or block.block_hash is not None:
            return
        if block_hash not in self._cached:
            block.block_hash = block_hash
            self._cached[block_hash] = block

    def check(self) -> None:
        """Assert the accounting invariants (O(cached blocks); for tests)."""
        assert 0 <= self.used_bytes <= self.capacity_bytes, self.used_bytes
        assert self.cached_free_bytes >= 0, self.cached_free_bytes
        assert self.used_bytes + self.cached_free_bytes <= self.capacity_bytes
        assert self.num_used_blocks >= 0
        lru_bytes = sum(self.block_bytes[b.model] for b in self._lru.values())
        assert lru_bytes == self.cached_free_bytes, (lru_bytes, self.cached_free_bytes)
        for block in self._lru.values():
            assert block.ref_cnt == 0 and block.block_hash is not None
            assert self._cached[block.block_hash] is block
