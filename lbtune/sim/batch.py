"""What one engine step computes, per model: the load the cost model prices.

:class:`BatchLoad` accumulates the scheduled requests of a step (each ``n`` new tokens on
top of ``computed`` ones) into one :class:`~lbtune.sim.costmodel.ModelLoad` per model.
"""

from __future__ import annotations

from collections.abc import Sequence

from lbtune.sim import costmodel
from lbtune.sim.profiles import ModelProfile

__all__ = ["BatchLoad"]


class BatchLoad:
    """Per-model token, KV-read and attention-pair counts of one step."""

    __slots__ = (
        "causal_pairs",
        "decode_pairs",
        "decode_tokens",
        "kv_read",
        "pairs",
        "prefill_tokens",
        "rows",
        "tokens",
    )

    def __init__(self, n_models: int) -> None:
        self.tokens = [0] * n_models
        self.kv_read = [0] * n_models
        self.pairs = [0.0] * n_models
        self.rows = [0] * n_models
        self.decode_pairs = [0.0] * n_models
        self.causal_pairs = [0.0] * n_models
        self.prefill_tokens = 0
        self.decode_tokens = 0

    def add(self, model: int, computed: int, n: int, *, decode: bool) -> None:
        """One request's ``n`` new tokens after ``computed`` ones (``decode``: its next
        output token, as opposed to prompt or recomputed tokens)."""
        self.tokens[model] += n
        self.kv_read[model] += computed + n
        self.pairs[model] += n * computed + n * (n + 1) / 2
        self.rows[model] += 1
        if n == 1:  # a one-token query: its attention is bound by its KV reads
            self.decode_pairs[model] += computed + 1
        else:  # a chunk: its causal triangle runs slower than its pairs with earlier tokens
            self.causal_pairs[model] += n * (n + 1) / 2
        if decode:
            self.decode_tokens += 1
        else:
            self.prefill_tokens += n

    def shares(
        self, models: Sequence[ModelProfile]
    ) -> list[tuple[ModelProfile, costmodel.ModelLoad]]:
        """``(model, its load)`` for every model of the engine, as the cost model takes them."""
        return [
            (
                models[m],
                costmodel.ModelLoad(
                    tokens=self.tokens[m],
                    kv_read_tokens=self.kv_read[m],
                    attn_pairs=self.pairs[m],
                    decode_pairs=self.decode_pairs[m],
                    causal_pairs=self.causal_pairs[m],
                    rows=self.rows[m],
                ),
            )
            for m in range(len(models))
        ]
