"""GPU and model profiles: the calibrated figures behind the simulated replicas.

Every number here is explained, with its source, in ``docs/simulator.md``. In short:

* hardware figures (memory, bandwidth, dense BF16 FLOP/s) are the vendors' data-sheet values;
* ``bw_efficiency`` and ``flop_efficiency`` are fitted so that the linear layers of an
  8B BF16 model take ~5.6 ms (H100) / ~9.5 ms (A100) for a one-token decode step and
  ~21 ms / ~70 ms for a 1024-token step;
* ``step_overhead_s`` (scheduler, sampling, kernel launches, non-GEMM kernels) is fitted to the
  batch-1 inter-token latency, ``request_overhead_s`` (API server, tokenisation,
  detokenisation) to the batch-1 time to first token;
* the L4 reuses the A100's efficiencies and overheads with its own bandwidth and FLOP/s;
* model sizes follow from the architecture (parameter count, layers, KV heads, bit width).
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
    """Fraction of ``mem_bandwidth`` reached when streaming weights and KV (fitted)."""
    flop_efficiency: float
    """Fraction of ``peak_bf16_tflops`` reached by the linear layers (GEMMs) (fitted)."""
    attn_efficiency: float
    """Fraction of peak reached by the attention kernels (FlashAttention-class)."""
    step_overhead_s: float
    """Fixed time of every engine step: scheduling, sampling, launches, small kernels."""
    request_overhead_s: float
    """Fixed front-end time per request, added by the server to TTFT (HTTP, tokenisation)."""
    description: str = ""

    @property
    def memory_bytes(self) -> int:
        return int(self.memory_gib * GIB)

    @property
    def effective_bandwidth(self) -> float:
        """Bytes per second actually streamed."""
        return self.mem_bandwidth * 1e9 * self.bw_efficiency

    @property
    def effective_flops(self) -> float:
        """FLOP/s actually reached by the linear layers."""
        return self.peak_bf16_tflops * 1e12 * self.flop_efficiency

    @property
    def effective_attn_flops(self) -> float:
        """FLOP/s actually reached by the attention kernels."""
        return self.peak_bf16_tflops * 1e12 * self.attn_efficiency


@dataclass(frozen=True)
class ModelProfile:
    """One served model as the cost model and the KV cache see it."""

    name: str
    """Served model name (the ``model`` field of API requests)."""
    params: float
    """Parameter count."""
    weight_bytes: int
    """Bytes of weights resident on the GPU (and streamed once per step)."""
    kv_bytes_per_token: int
    """KV-cache bytes per token: 2 (K, V) x layers x KV heads x head dim x 2 bytes (BF16)."""
    context_length: int
    """Maximum model length (prompt + output) the model supports."""
    n_layers: int
    hidden_size: int
    """Model width; attention costs 4 x layers x hidden FLOPs per (query, key) pair."""
    quantization: str = "bf16"
    hf_id: str = ""
    """The public checkpoint this profile stands for (informational)."""

    @property
    def attn_flops_per_pair(self) -> float:
        """FLOPs of QK^T and AV for one query token attending one key token, all layers."""
        return 4.0 * self.n_layers * self.hidden_size


# Figures are justified in docs/simulator.md ("Parameters").
_H100_BW_EFF = 16.06e9 / (3350e9 * 0.0056)  # 8B weights streamed in 5.6 ms -> 0.856
_H100_FLOP_EFF = 2 * 8.03e9 * 1024 / (989.4e12 * 0.021)  # 1024 tokens in 21 ms -> 0.791
_A100_BW_EFF = 16.06e9 / (2039e9 * 0.0095)  # 9.5 ms -> 0.829
_A100_FLOP_EFF = 2 * 8.03e9 * 1024 / (312e12 * 0.070)  # 70 ms -> 0.753

GPU_PROFILES: dict[str, GpuProfile] = {
    "h100-80g": GpuProfile(
        name="h100-80g",
        memory_gib=81559 / 1024,
        mem_bandwidth=3350.0,
        peak_bf16_tflops=989.4,
        bw_efficiency=round(_H100_BW_EFF, 4),
        flop_efficiency=round(_H100_FLOP_EFF, 4),
        attn_efficiency=0.5,
        step_overhead_s=0.0069,
        request_overhead_s=0.055,
        description="NVIDIA H100 SXM5 80GB (HBM3)",
    ),
    "a100-80g": GpuProfile(
        name="a100-80g",
        memory_gib=81920 / 1024,
        mem_bandwidth=2039.0,
        peak_bf16_tflops=312.0,
        bw_efficiency=round(_A100_BW_EFF, 4),
        flop_efficiency=round(_A100_FLOP_EFF, 4),
        attn_efficiency=0.5,
        step_overhead_s=0.0105,
        request_overhead_s=0.090,
        description="NVIDIA A100 SXM4 80GB (HBM2e)",
    ),
    "l4-24g": GpuProfile(
        name="l4-24g",
        memory_gib=23034 / 1024,
        mem_bandwidth=300.0,
        peak_bf16_tflops=121.0,
        # Derived, not fitted: the A100's efficiencies and overheads (see the docs).
        bw_efficiency=round(_A100_BW_EFF, 4),
        flop_efficiency=round(_A100_FLOP_EFF, 4),
        attn_efficiency=0.5,
        step_overhead_s=0.0105,
        request_overhead_s=0.090,
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
