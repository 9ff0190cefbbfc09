"""The simulator's step-time model against published figures, point by point.

Prints each target point (a prefill of 1..8192 tokens, decodes at batch 1..128 and context
512/2048, a mixed chunked-prefill step, TTFT and ITL at batch 1) beside the model's value,
their ratio and the source; then how step time grows with batch against the source's growth.
Points without a public figure are printed with the model only and say so. Exit status 1 when
a sourced point is outside +-15 %. Pure arithmetic: no GPU, no server, deterministic.

    .venv/bin/python benchmarks/sim_calibration.py

Sources (full citations in docs/simulator.md, "Calibration"):

* VIDUR: Microsoft Vidur's per-operator profile of Meta-Llama-3-8B on one A100 80GB
  (github.com/microsoft/vidur, data/profiling/compute/a100/meta-llama/Meta-Llama-3-8B/mlp.csv,
  TP 1, median of each operator, ms per layer). Covers the decoder GEMMs, the elementwise
  kernels and the embedding; not attention, not the LM head.
* VIDUR-ATTN: the same repository's attention profile on the A100
  (data/profiling/a100/attention.csv, FlashAttention backend): the only decode shape we read is
  Llama-70B-class at TP 2 (per GPU one layer: 32 query heads, 4 KV heads of 128, i.e. 2 KiB of
  KV per token); ``kv_cache_size`` read as each decode's context. Medians: 0.015 ms for one
  decode over 32 tokens; 0.029 / 0.036 / 0.059 / 0.070 ms for 32 / 48 / 64 / 96 decodes over
  384 tokens; 0.138 ms for 32 decodes and 0.281 ms for 64 over 2688 tokens (adjacent batch
  sizes step by up to 30 %: 27 -> 28 decodes over 384 go from 0.019 to 0.027 ms);
  prefill (``attn_prefill``) of one 4096-token chunk 2.314 ms, of 3584 tokens after 512
  cached 1.942 ms (these two fit the two attention efficiencies), of 3648 tokens 1.883 ms
  (held out).
* YOBITEL: InferenceBench concurrency-sweep recipe, Llama-3.1-8B-Instruct FP16 on one
  H100-80GB-HBM3, vLLM 0.21.0 (yobitelcomm.github.io/bench/recipes/concurrency-sweep/):
  TPOT p50 6.48 ms at concurrency 1, 6.59 ms at 4; TTFT p50 13.98 ms at 1 (prompt length
  not stated: compared at 128 tokens).
* MUSGRAVE: J. Musgrave, "vLLM throughput-latency sweep on NVIDIA A100"
  (johnmusgrave.com/p/vllm-throughput-latency-sweep-on): Llama-3.1-8B-Instruct BF16, one A100
  40GB, vLLM 0.23.0, 1024-token prompts, ~75 tokens/s at concurrency 1 (13.3 ms per token).
"""

from __future__ import annotations

import dataclasses
import sys
from dataclasses import dataclass

from lbtune.sim import costmodel as cm
from lbtune.sim.profiles import GpuProfile, get_gpu, get_model

TOLERANCE = 0.15

M8 = get_model("llama-3.1-8b-instruct")
A100 = get_gpu("a100-80g")
H100 = get_gpu("h100-80g")
# The A100 40GB of MUSGRAVE: the 80GB card's efficiencies on its own bandwidth (1555 GB/s,
# NVIDIA A100 data sheet). Derived for this check only; not a served profile.
A100_40G = dataclasses.replace(A100, name="a100-40g", memory_gib=40.0, mem_bandwidth=1555.0)

# VIDUR rows, per layer (ms): decoder GEMMs (attn_pre_proj + attn_post_proj + mlp_up_proj +
# mlp_down_proj), elementwise (input_layernorm + attn_rope + post_attention_layernorm + mlp_act
# + add), and the embedding lookup (once per step).
VIDUR_A100_8B: dict[int, tuple[float, float, float]] = {
    1: (0.033 + 0.025 + 0.142 + 0.076, 0.005 + 0.004 + 0.005 + 0.011 + 0.002, 0.003),
    8: (0.034 + 0.025 + 0.149 + 0.078, 0.004 + 0.004 + 0.004 + 0.012 + 0.002, 0.008),
    16: (0.034 + 0.026 + 0.1515 + 0.079, 0.004 + 0.004 + 0.004 + 0.012 + 0.002, 0.014),
    32: (0.039 + 0.027 + 0.163 + 0.086, 0.004 + 0.004 + 0.005 + 0.011 + 0.002, 0.005),
    64: (0.036 + 0.027 + 0.173 + 0.088, 0.004 + 0.004 + 0.005 + 0.011 + 0.003, 0.006),
    128: (0.043 + 0.032 + 0.191 + 0.111, 0.005 + 0.005 + 0.005 + 0.017 + 0.003, 0.009),
    256: (0.075 + 0.053 + 0.291 + 0.135, 0.008 + 0.007 + 0.009 + 0.027 + 0.004, 0.015),
    512: (0.130 + 0.085 + 0.516 + 0.263, 0.012 + 0.012 + 0.012 + 0.046 + 0.0065, 0.027),
    536: (0.154 + 0.0985 + 0.601 + 0.322, 0.013 + 0.014 + 0.0125 + 0.049 + 0.007, 0.030),
    1024: (0.246 + 0.181 + 1.172 + 0.576, 0.023 + 0.023 + 0.023 + 0.091 + 0.013, 0.063),
    2048: (0.467 + 0.308 + 2.2485 + 1.049, 0.0545 + 0.048 + 0.056 + 0.174 + 0.026, 0.121),
    4096: (1.013 + 0.625 + 4.127 + 2.052, 0.107 + 0.099 + 0.107 + 0.343 + 0.056, 0.241),
    8192: (1.986 + 1.252 + 8.161 + 4.152, 0.2095 + 0.196 + 0.209 + 0.679 + 0.112, 0.486),
}
VIDUR = "Vidur A100-80GB Llama-3-8B mlp.csv (GEMMs + elementwise + embedding)"
VIDUR_ATTN = "Vidur A100 attention.csv, 70B-TP2 shape, one layer"
# One layer of VIDUR-ATTN's shape, as the cost model sees it.
ATTN_SHAPE = dataclasses.replace(M8, name="vidur-attn-shape", n_layers=1, kv_bytes_per_token=2048)
VIDUR_ATTN_DECODE: dict[tuple[int, int], float] = {
    (1, 32): 0.015,
    (32, 384): 0.029,
    (48, 384): 0.036,
    (64, 384): 0.059,
    (96, 384): 0.070,
    (32, 2688): 0.138,
    (64, 2688): 0.281,
}
VIDUR_ATTN_PREFILL: dict[tuple[int, int], float] = {
    (4096, 0): 2.314,
    (3584, 512): 1.942,
    (3648, 0): 1.883,
}
YOBITEL = "InferenceBench H100 vLLM 0.21.0, conc 1"
MUSGRAVE = "Musgrave A100-40GB vLLM 0.23.0, conc 1"
NONE = "no public figure found (model only)"


def vidur_ms(tokens: int) -> float:
    """VIDUR's GEMM + elementwise + embedding time of one step of ``tokens`` tokens (ms)."""
    gemm, elem, emb = VIDUR_A100_8B[tokens]
    return M8.n_layers * (gemm + elem) + emb


def attn_ms(batch: int, context: int) -> float:
    """The model's decode attention for VIDUR-ATTN's shape: ``batch`` decodes over ``context``."""
    return 1000.0 * cm.attention_time(A100, ATTN_SHAPE, batch * (context + 1), 0.0, seqs=batch)


def prefill_attn_ms(chunk: int, cached: int) -> float:
    """The model's attention for one ``chunk``-token chunk after ``cached`` tokens, one layer."""
    load = cm.request_load(cached, chunk)
    prefix = load.attn_pairs - load.causal_pairs
    return 1000.0 * cm.attention_time(
        A100, ATTN_SHAPE, load.kv_read_tokens, prefix, load.causal_pairs, seqs=1
    )


def ops_ms(gpu: GpuProfile, tokens: int) -> float:
    """The model's counterpart of :func:`vidur_ms`: decoder GEMMs + elementwise terms (ms)."""
    return 1000.0 * (cm.linear_time(gpu, M8, tokens) + cm.elementwise_time(gpu, M8, tokens))


@dataclass(frozen=True)
class Point:
    name: str
    model_ms: float
    source_ms: float | None
    source: str

    @property
    def ratio(self) -> float | None:
        return None if self.source_ms is None else self.model_ms / self.source_ms

    @property
    def within(self) -> bool:
        r = self.ratio
        return r is None or abs(r - 1.0) <= TOLERANCE


def points() -> list[Point]:
    """Every calibration point, in the order printed."""
    out: list[Point] = []
    # prefill / token-count sweep of the operators Vidur profiles
    for t in (1, 128, 256, 512, 1024, 2048, 4096, 8192):
        out.append(Point(f"A100 GEMM+elementwise, {t} tokens", ops_ms(A100, t), vidur_ms(t), VIDUR))
    # decodes: the operators at batch b (b tokens), then the whole step at context 512 / 2048
    for b in (1, 8, 16, 32, 64, 128):
        out.append(
            Point(f"A100 decode x{b}: GEMM+elementwise", ops_ms(A100, b), vidur_ms(b), VIDUR)
        )
    for (b, ctx), ms in VIDUR_ATTN_DECODE.items():
        out.append(Point(f"A100 decode attention x{b} @ctx {ctx}", attn_ms(b, ctx), ms, VIDUR_ATTN))
    for (chunk, cached), ms in VIDUR_ATTN_PREFILL.items():
        name = f"A100 prefill attention {chunk} after {cached}"
        out.append(Point(name, prefill_attn_ms(chunk, cached), ms, VIDUR_ATTN))
    for ctx in (512, 2048):
        for b in (1, 8, 32, 128):
            for gpu in (A100, H100):
                step = 1000.0 * cm.decode_step_time(gpu, M8, ctx, b)
                out.append(Point(f"{gpu.name} decode step x{b} @ctx {ctx}", step, None, NONE))
    # mixed chunked-prefill step: a 512-token chunk + 24 decodes = 536 tokens
    out.append(
        Point(
            "A100 mixed 512+24 decodes: GEMM+elementwise", ops_ms(A100, 536), vidur_ms(536), VIDUR
        )
    )
    for gpu in (A100, H100):
        mixed = 1000.0 * cm.step_time(gpu, [(M8, cm.mixed_load(512, 32, 2048))])
        out.append(Point(f"{gpu.name} mixed 512 + 32 decodes @ctx 2048", mixed, None, NONE))
    # end to end at batch 1
    out.append(
        Point(
            "H100 ITL batch 1 (ctx 256)", 1000.0 * cm.decode_step_time(H100, M8, 256), 6.48, YOBITEL
        )
    )
    out.append(
        Point(
            "H100 TTFT batch 1 (128-token prompt)",
            1000.0 * cm.ttft_batch1(H100, M8, 128),
            13.98,
            YOBITEL,
        )
    )
    itl40 = 1000.0 * cm.decode_step_time(A100_40G, M8, 1024 + 64)
    out.append(Point("A100-40GB ITL batch 1 (ctx 1088)", itl40, 1000.0 / 75.0, MUSGRAVE))
    out.append(
        Point(
            "A100 TTFT batch 1 (1024-token prompt)",
            1000.0 * cm.ttft_batch1(A100, M8, 1024),
            None,
            NONE,
        )
    )
    return out


@dataclass(frozen=True)
class Growth:
    name: str
    model: float
    source: float | None
    cite: str
    known: str = ""
    """Why a point is known to miss (printed; not counted as a failure)."""

    @property
    def ratio(self) -> float | None:
        return None if self.source is None else self.model / self.source

    @property
    def within(self) -> bool:
        r = self.ratio
        return r is None or abs(r - 1.0) <= TOLERANCE


def growths() -> list[Growth]:
    """How step time grows with batch and context, model against source."""
    d1 = cm.decode_step_time(H100, M8, 256)
    d4 = cm.decode_step_time(H100, M8, 256, 4)
    out = [
        Growth(
            "A100 GEMM+elementwise, 128 vs 1 tokens",
            ops_ms(A100, 128) / ops_ms(A100, 1),
            vidur_ms(128) / vidur_ms(1),
            VIDUR,
        ),
        Growth(
            "A100 GEMM+elementwise, 8192 vs 1024 tokens",
            ops_ms(A100, 8192) / ops_ms(A100, 1024),
            vidur_ms(8192) / vidur_ms(1024),
            VIDUR,
        ),
        Growth(
            "A100 decode attention, 64 vs 32 decodes @ctx 2688",
            attn_ms(64, 2688) / attn_ms(32, 2688),
            0.281 / 0.138,
            VIDUR_ATTN,
        ),
        Growth(
            "A100 decode attention x32, ctx 2688 vs 384",
            attn_ms(32, 2688) / attn_ms(32, 384),
            0.138 / 0.029,
            VIDUR_ATTN,
        ),
        Growth(
            "A100 decode attention x64, ctx 2688 vs 384",
            attn_ms(64, 2688) / attn_ms(64, 384),
            0.281 / 0.059,
            VIDUR_ATTN,
        ),
        Growth("H100 TPOT, concurrency 4 vs 1", d4 / d1, 6.59 / 6.48, YOBITEL),
    ]
    for gpu in (A100, H100):
        g = cm.decode_step_time(gpu, M8, 512, 128) / cm.decode_step_time(gpu, M8, 512, 1)
        out.append(Growth(f"{gpu.name} decode step, batch 128 vs 1 @ctx 512", g, None, NONE))
        c = cm.decode_step_time(gpu, M8, 2048, 32) / cm.decode_step_time(gpu, M8, 512, 32)
        out.append(Growth(f"{gpu.name} decode x32, ctx 2048 vs 512", c, None, NONE))
    return out


def _fmt(x: float | None, spec: str) -> str:
    return "-" if x is None else format(x, spec)


def main() -> int:
    pts, grs = points(), growths()
    print(f"{'point':<46} {'source ms':>10} {'model ms':>9} {'ratio':>6}  source")
    for p in pts:
        flag = "" if p.within else "  OUT OF +-15 %"
        print(
            f"{p.name:<46} {_fmt(p.source_ms, '10.3f'):>10} {p.model_ms:9.3f} "
            f"{_fmt(p.ratio, '6.3f'):>6}  {p.source}{flag}"
        )
    print()
    print(f"{'growth':<46} {'source':>10} {'model':>9} {'ratio':>6}  source")
    for g in grs:
        flag = (
            ""
            if g.within
            else f"  OUT OF +-15 % (known: {g.known})"
            if g.known
            else "  OUT OF +-15 %"
        )
        print(
            f"{g.name:<46} {_fmt(g.source, '10.3f'):>10} {g.model:9.3f} "
            f"{_fmt(g.ratio, '6.3f'):>6}  {g.cite}{flag}"
        )
    sourced = [p for p in pts if p.ratio is not None] + [g for g in grs if g.ratio is not None]
    out = [x for x in sourced if not x.within]
    bad = [x for x in out if not getattr(x, "known", "")]
    print()
    known = len(out) - len(bad)
    print(
        f"{len(sourced) - len(out)} of {len(sourced)} sourced points within +-15 %"
        f" ({known} known miss{'' if known == 1 else 'es'})"
    )
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
