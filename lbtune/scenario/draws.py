"""Counter-based random numbers: every draw is a pure function of (seed, key).

The workload must give request ``i`` identically in every process and on every
run (distributed Locust workers each take indices), so it cannot use a stateful
generator that has to be advanced through requests ``0..i-1``. Instead each draw
hashes its key with BLAKE2b and turns the digest into uniforms in (0, 1). The
result depends neither on the Python nor on the numpy version.
"""

from __future__ import annotations

import hashlib
import struct

_SCALE = 1.0 / 9007199254740992.0  # 2**-53
_MASK = (1 << 63) - 1

# Stream tags: keep the draws of different purposes independent.
SINGLE = 1
SESSION = 2
PREFIX = 3
LAYOUT = 4
TEXT = 5
AGENT = 6


def uniforms(seed: int, *key: int, n: int = 1) -> list[float]:
    """``n`` independent uniforms in the open interval (0, 1) for ``(seed, *key)``."""
    ints = [seed & _MASK, *(k & _MASK for k in key)]
    base = struct.pack(f"<{len(ints)}q", *ints)
    out: list[float] = []
    block = 0
    while len(out) < n:
        want = min(8, n - len(out))
        digest = hashlib.blake2b(
            base, digest_size=8 * want, person=struct.pack("<q", block)
        ).digest()
        for (x,) in struct.iter_unpack("<Q", digest):
            out.append(((x >> 11) + 0.5) * _SCALE)
        block += 1
    return out


def uniform(seed: int, *key: int) -> float:
    """One uniform in (0, 1) for ``(seed, *key)``."""
    return uniforms(seed, *key, n=1)[0]


def choose(u: float, cumulative: list[float]) -> int:
    """Index picked by uniform ``u`` from cumulative weights (last entry = total)."""
    target = u * cumulative[-1]
    for idx, c in enumerate(cumulative):
        if target < c:
            return idx
    return len(cumulative) - 1
