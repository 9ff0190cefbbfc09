"""GPU and model profiles: the calibrated figures behind the simulated replicas.

Every number here is explained, with its source, in ``docs/simulator.md`` ("Parameters") and
checked by ``benchmarks/sim_calibration.py``. In short:

* hardware figures (memory, bandwidth, dense BF16 FLOP/s) are the vendors' data-sheet values;
* the A100's efficiencies and small-kernel floors are fitted to a public per-operator profile of
  Llama-3-8B on an A100 80GB (Microsoft Vidur, ``data/profiling/compute/a100/meta-llama/
  Meta-Llama-3-8B/mlp.csv``): weight streaming at batch 1, GEMMs at 8192 tokens, elementwise
  kernels at 1 and 8192 tokens;
* the H100 has no such public profile that we found: its bandwidth efficiency is fitted to a
  published batch-1 vLLM time per output token, its GEMM efficiency is the A100's, its
  small-kernel floors are the A100's scaled by the boost clocks;
* ``step_overhead_s`` is the host time per step that current vLLM (CUDA graphs, async scheduling)
  does not hide; ``request_overhead_s`` (HTTP, tokenisation) is fitted to a batch-1 TTFT;
* the L4 reuses the A100's efficiencies, floors and overheads with its own bandwidth and FLOP/s;
* model sizes follow from the architecture (layers, widths, vocabulary, bit width).
"""

from __future__ import annotations

from dataclasses import dataclass

from lbtune.errors import ConfigError

GIB = 1 << 30


@dataclass(frozen=True)
class GpuProfile:
    """One accelerator as the cost model sees it."""

    name: str
    memory_gib: float
    """Total device memory as reported by ``nvidia-smi`` (GiB)."""
    mem_bandwidth: float
    """Peak HBM/GDDR bandwidth, GB/s (10^9 bytes per second)."""
    peak_bf16_tflops: float
    """Peak dense BF16 tensor-core throughput, TFLOP/s (no sparsity)."""
    bw_efficiency: float
    """Fraction of ``mem_bandwidth`` reached when GEMMs stream weights and attention streams KV."""
    flop_efficiency: float
    """Fraction of ``peak_bf16_tflops`` reached by large GEMMs (the compute roof)."""
    attn_efficiency: float
    """Fraction of peak reached by a prefill chunk's attention against earlier tokens."""
    attn_causal_efficiency: float
    """Fraction of peak reached inside a chunk's causal triangle (masked tiles)."""
    attn_bw_efficiency: float
    """Fraction of ``mem_bandwidth`` the attention kernel reaches reading KV (decodes)."""
    elementwise_efficiency: float
    """Fraction of ``mem_bandwidth`` reached by the elementwise kernels (norms, RoPE, SiLU, add)."""
    elementwise_floor_s: float
    """Per-layer time of the elementwise kernels at one token (their launch/latency floor)."""
    attn_floor_s: float
    """Per-layer time of the attention kernel at one short decode (its latency floor)."""
    attn_seq_tokens: float
    """Fixed attention work per request, in KV tokens' worth of streaming: the kernel's
    per-sequence cost (query load, block table, softmax epilogue, output write)."""
    step_overhead_s: float
    """Host time of every engine step that the GPU does not hide (scheduling, sampling)."""
    request_overhead_s: float
    """Fixed front-end time per request, added by the server to TTFT (HTTP, tokenisation)."""
    description: str = ""

    @property
    def memory_bytes(self) -> int:
        return int(self.memory_gib * GIB)

    @property
    def effective_bandwidth(self) -> float:
        """Bytes per second GEMMs and attention actually stream."""
        return self.mem_bandwidth * 1e9 * self.bw_efficiency

    @property
    def effective_flops(self) -> float:
        """FLOP/s large GEMMs actually reach."""
        return self.peak_bf16_tflops * 1e12 * self.flop_efficiency

    @property
    def effective_attn_flops(self) -> float:
        """FLOP/s the prefill attention kernels actually reach."""
        return self.peak_bf16_tflops * 1e12 * self.attn_efficiency

    @property
    def effective_causal_flops(self) -> float:
        """FLOP/s the attention kernels actually reach inside causal triangles."""
        return self.peak_bf16_tflops * 1e12 * self.attn_causal_efficiency

    @property
    def effective_attn_bandwidth(self) -> float:
        """Bytes per second the attention kernel actually reads from the KV cache."""
        return self.mem_bandwidth * 1e9 * self.attn_bw_efficiency

    @property
    def elementwise_bandwidth(self) -> float:
        """Bytes per second the elementwise kernels actually move."""
        return self.mem_bandwidth * 1e9 * self.elementwise_efficiency


@dataclass(frozen=True)
class ModelProfile:
    """One served model as the cost model and the KV cache see it."""

    name: str
    """Served model name (the ``model`` field of API requests)."""
    params: float
    """Parameter count (embedding and LM head included)."""
    weight_bytes: int
    """Bytes of weights resident on the GPU."""
    kv_bytes_per_token: int
    """KV-cache bytes per token: 2 (K, V) x layers x KV heads x head dim x 2 bytes (BF16)."""
    context_length: int
    """Maximum model length (prompt + output) the model supports."""
    n_layers: int
    hidden_size: int
    """Model width; attention costs 4 x layers x hidden FLOPs per (query, key) pair."""
    intermediate_size: int
    """MLP width (the elementwise SiLU-and-multiply runs over it)."""
    vocab_size: int
    """Rows of the input embedding and of the (untied) LM head."""
    quantization: str = "bf16"
    hf_id: str = ""
    """The public checkpoint this profile stands for (informational)."""

    @property
    def attn_flops_per_pair(self) -> float:
        """FLOPs of QK^T and AV for one query token attending one key token, all layers."""
        return 4.0 * self.n_layers * self.hidden_size

    @property
    def lm_head_params(self) -> float:
        """Parameters of the LM head (vocab x hidden, untied from the embedding)."""
        return float(self.vocab_size * self.hidden_size)

    @property
    def lm_head_bytes(self) -> int:
        """The LM head stays in 16 bits (also in the AWQ checkpoint)."""
        return self.vocab_size * self.hidden_size * 2

    @property
    def embedding_bytes(self) -> int:
        """The input embedding table (16 bits); a lookup reads one row per token, no GEMM."""
        return self.vocab_size * self.hidden_size * 2

    @property
    def linear_params(self) -> float:
        """Parameters of the decoder layers' GEMMs (QKV, O, gate/up, down): all but the
        embedding and the LM head (norm weights are negligible)."""
        return self.params - 2.0 * self.vocab_size * self.hidden_size

    @property
    def linear_bytes(self) -> int:
        """Bytes the decoder layers' GEMMs stream once per step."""
        return self.weight_bytes - self.embedding_bytes - self.lm_head_bytes

    @property
    def elementwise_bytes_per_token(self) -> float:
        """Activation bytes the elementwise kernels move per token, all layers: per layer two
        RMSNorms (read + write ``hidden``), RoPE on Q and K, two residual adds, SiLU-and-multiply
        (read 2 x ``intermediate``, write ``intermediate``): ~(10 hidden + 3 intermediate) x 2 B;
        plus the embedding row read and written once."""
        per_layer = (10 * self.hidden_size + 3 * self.intermediate_size) * 2
        return float(self.n_layers * per_layer + 4 * self.hidden_size)


# Figures are justified in docs/simulator.md ("Parameters").
# Vidur, A100 80GB, Meta-Llama-3-8B, TP 1, per-layer medians (ms):
#   1 token: GEMMs 0.033 + 0.025 + 0.142 + 0.076 = 0.276 -> 32 layers stream 13.96 GB in 8.83 ms
#   8192 tokens: GEMMs 1.986 + 1.252 + 8.161 + 4.152 = 15.551 -> 229.8 TFLOP/s
#   elementwise 0.027 ms at 1 token, 1.4055 ms at 8192 tokens
_LLAMA3_8B_LINEAR_BYTES = 2 * 32 * (4096 * 6144 + 4096 * 4096 + 4096 * 28672 + 14336 * 4096)
_A100_BW_EFF = _LLAMA3_8B_LINEAR_BYTES / (2039e9 * 32 * 0.276e-3)  # -> 0.7753
_A100_FLOP_EFF = 0.735  # least-squares over 128..8192 tokens of the sqrt roofline (see docs)
_A100_ELEM_FLOOR = 0.027e-3
_A100_ELEM_EFF = (32 * (10 * 4096 + 3 * 14336) * 2) / (2039e9 * 32 * (1.4055 - 0.027) / 8191 * 1e-3)
# Vidur a100/attention.csv, decodes (1 over 32 tokens; 32, 48, 64, 96 over 384; 32, 64 over
# 2688): floor, KV bandwidth and the per-sequence work fitted together on the smooth roofline.
# The profile's growth from 384 to 2688 tokens is ~4.8x at every batch (28..64), not the 7x of
# the KV bytes: each sequence pays ~140 tokens' worth whatever its context.
_A100_ATTN_FLOOR = 0.015e-3
_A100_ATTN_BW_EFF = round(1376e9 / 2039e9, 3)  # -> 0.675
_A100_ATTN_SEQ_TOKENS = 140.0
# Vidur a100/attention.csv, one layer of 32 query heads of 128: a fresh 4096-token prefill takes
# 2.314 ms (8.39M causal pairs), 3584 tokens after 512 cached 1.942 ms (6.42M causal + 1.84M
# against the prefix): causal pairs at 19 % of peak, pairs against earlier tokens at ~56 %.
_A100_ATTN_CAUSAL_EFF = 4 * 4096 * (4096 * 4097 / 2) / (312e12 * 2.314e-3)  # -> 0.1905
_A100_ATTN_EFF = (4 * 4096 * 3584 * 512) / (
    312e12 * 1.942e-3 - 4 * 4096 * (3584 * 3585 / 2) / _A100_ATTN_CAUSAL_EFF
)  # -> ~0.56
_H100_CLOCK = 1410.0 / 1980.0  # A100 / H100 SXM boost clocks: small kernels are latency-bound
_H100_BW_EFF = 0.88  # fitted to a published batch-1 TPOT of 6.48 ms (see docs)

GPU_PROFILES: dict[str, GpuProfile] = {
    "h100-80g": GpuProfile(
        name="h100-80g",
        memory_gib=81559 / 1024,
        mem_bandwidth=3350.0,
        peak_bf16_tflops=989.4,
        bw_efficiency=_H100_BW_EFF,
        flop_efficiency=_A100_FLOP_EFF,
        attn_efficiency=round(_A100_ATTN_EFF, 3),
        attn_causal_efficiency=round(_A100_ATTN_CAUSAL_EFF, 4),
        attn_bw_efficiency=_A100_ATTN_BW_EFF,
        elementwise_efficiency=round(_A100_ELEM_EFF, 4),
        elementwise_floor_s=round(_A100_ELEM_FLOOR * _H100_CLOCK, 7),
        attn_floor_s=round(_A100_ATTN_FLOOR * _H100_CLOCK, 7),
        attn_seq_tokens=_A100_ATTN_SEQ_TOKENS,
        step_overhead_s=0.0003,
        request_overhead_s=0.007,
        description="NVIDIA H100 SXM5 80GB (HBM3)",
    ),
    "a100-80g": GpuProfile(
        name="a100-80g",
        memory_gib=81920 / 1024,
        mem_bandwidth=2039.0,
        peak_bf16_tflops=312.0,
        bw_efficiency=round(_A100_BW_EFF, 4),
        flop_efficiency=_A100_FLOP_EFF,
        attn_efficiency=round(_A100_ATTN_EFF, 3),
        attn_causal_efficiency=round(_A100_ATTN_CAUSAL_EFF, 4),
        attn_bw_efficiency=_A100_ATTN_BW_EFF,
        elementwise_efficiency=round(_A100_ELEM_EFF, 4),
        elementwise_floor_s=_A100_ELEM_FLOOR,
        attn_floor_s=_A100_ATTN_FLOOR,
        attn_seq_tokens=_A100_ATTN_SEQ_TOKENS,
        step_overhead_s=0.0003,
        request_overhead_s=0.007,
        description="NVIDIA A100 SXM4 80GB (HBM2e)",
    ),
    "l4-24g": GpuProfile(
        name="l4-24g",
        memory_gib=23034 / 1024,
        mem_bandwidth=300.0,
        peak_bf16_tflops=121.0,
        # Derived, not fitted: the A100's efficiencies, floors and overheads (see the docs).
        bw_efficiency=round(_A100_BW_EFF, 4),
        flop_efficiency=_A100_FLOP_EFF,
        attn_efficiency=round(_A100_ATTN_EFF, 3),
        attn_causal_efficiency=round(_A100_ATTN_CAUSAL_EFF, 4),
        attn_bw_efficiency=_A100_ATTN_BW_EFF,
        elementwise_efficiency=round(_A100_ELEM_EFF, 4),
        elementwise_floor_s=_A100_ELEM_FLOOR,
        attn_floor_s=_A100_ATTN_FLOOR,
        attn_seq_tokens=_A100_ATTN_SEQ_TOKENS,
        step_overhead_s=0.0003,
        request_overhead_s=0.007,
        description="NVIDIA L4 24GB (GDDR6)",
    ),
}


def _awq_int4_bytes(params: float, embed_params: float, group_size: int = 128) -> int:
    """Weights of an AWQ int4 checkpoint: 4-bit linear weights + per-group FP16 scale and
    4-bit zero point; the input embedding and the LM head stay in 16 bits."""
    bits_per_weight = 4 + (16 + 4) / group_size
    return int((params - embed_params) * bits_per_weight / 8 + embed_params * 2)


_LLAMA3_VOCAB = 128256

MODEL_PROFILES: dict[str, ModelProfile] = {
    "llama-3.1-8b-instruct": ModelProfile(
        name="llama-3.1-8b-instruct",
        params=8.03e9,
        weight_bytes=int(8.03e9 * 2),
        kv_bytes_per_token=2 * 32 * 8 * 128 * 2,  # 131072 B = 128 KiB
        context_length=131072,
        n_layers=32,
        hidden_size=4096,
        intermediate_size=14336,
        vocab_size=_LLAMA3_VOCAB,
        quantization="bf16",
        hf_id="meta-llama/Llama-3.1-8B-Instruct",
    ),
    "llama-3.1-70b-instruct-awq": ModelProfile(
        name="llama-3.1-70b-instruct-awq",
        params=70.6e9,
        # untied embedding + LM head: 2 x 128256 x 8192 parameters kept in FP16
        weight_bytes=_awq_int4_bytes(70.6e9, 2 * _LLAMA3_VOCAB * 8192),  # ~39.8 GB
        kv_bytes_per_token=2 * 80 * 8 * 128 * 2,  # 327680 B = 320 KiB (KV stays BF16)
        context_length=131072,
        n_layers=80,
        hidden_size=8192,
        intermediate_size=28672,
        vocab_size=_LLAMA3_VOCAB,
        quantization="awq-int4",
        hf_id="hugging-quants/Meta-Llama-3.1-70B-Instruct-AWQ-INT4",
    ),
}


def get_gpu(name: str) -> GpuProfile:
    """The GPU profile called ``name``; :class:`ConfigError` listing the choices otherwise."""
    try:
        return GPU_PROFILES[name]
    except KeyError:
        raise ConfigError(
            f"Unknown GPU profile {name!r}. Available: {', '.join(sorted(GPU_PROFILES))}"
        ) from None


def get_model(name: str) -> ModelProfile:
    """The model profile called ``name``; :class:`ConfigError` listing the choices otherwise."""
    try:
        return MODEL_PROFILES[name]
    except KeyError:
        raise ConfigError(
            f"Unknown model profile {name!r}. Available: {', '.join(sorted(MODEL_PROFILES))}"
        ) from None
