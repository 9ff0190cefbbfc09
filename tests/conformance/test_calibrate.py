"""``lbtune cluster calibrate`` on a replica lbtune did not build (the real vLLM CPU server)
and on the simulator, the same check: the measured rates predict the TTFT of prompts the
calibration never sent.

The prediction is the ``llm`` scheduler's model of a lone request, ``overhead +
sqrt(step² + (prompt tokens / prefill rate)²)``; the check compares it with the least of
four fresh one-token requests at two prompt lengths (one between the probes, one about
half again past the longest: the model is linear in the prompt and a CPU's attention is
not, so 3700 tokens, 2.8× past, ran 1.5-1.8× slow on an idle machine and 2.3× in CI).
The bound is a factor of two each way: this machine's two cores are shared with the
rest of the suite, and the least of four is what a busy host leaves of a replica's
own time. Default rates (4000 prompt tokens/s, a 30 ms step) miss vLLM's by 5-10×."""

from __future__ import annotations

import json
import math
import time

import pytest

from lbtune.cluster.calibrate import measure_replica
from lbtune.cluster.probing import ProbePlan
from lbtune.records.calibration import ReplicaRates
from lbtune.records.endpoints import ReplicaEndpoint
from lbtune.scenario import prompts
from tests.conformance.conftest import VLLM_MAX_NUM_SEQS, Server

pytestmark = [pytest.mark.integration, pytest.mark.vllm]


HOST_SLACK_S = 0.015
"""What a busy host may add to a one-token request beside the factor of two: on the
simulator a 150-token prompt is predicted at ~5 ms, and in CI all four tries of one took
15-24 ms (the lower bound, which default rates fail, has no slack)."""


def _predicted(r: ReplicaRates, prompt_tokens: int) -> float:
    return r.overhead_s + math.sqrt(r.step_s**2 + (prompt_tokens / r.prefill_tokens_per_s) ** 2)


def _least_ttft(server: Server, tokens: int, key: int) -> tuple[int, float]:
    """``(prompt tokens as the server counted them, least time of four)`` of one-token
    completions on fresh text (a new key each: nothing from the prefix cache)."""
    best, counted = math.inf, 0
    for i in range(4):
        prompt = prompts.synth(7, (key, i), tokens)
        t0 = time.perf_counter()
        resp = server.complete(prompt, max_tokens=1)
        took = time.perf_counter() - t0
        assert resp.status_code == 200, resp.text
        counted = json.loads(resp.text)["usage"]["prompt_tokens"]
        best = min(best, took)
    return counted, best


def _attempt(server: Server, seed: int) -> tuple[bool, str]:
    """One calibration and its check: ``(held, what was seen)``."""
    rep = ReplicaEndpoint(name=server.kind, url=server.url, models=[server.model])
    rates = measure_replica(rep, ProbePlan(batch=VLLM_MAX_NUM_SEQS, seed=seed))
    assert rates.model == server.model and rates.probes >= 25
    seen = [f"fit error {rates.fit_error:.2f}"]
    held = rates.fit_error < 0.5
    for key, tokens in ((1, 150), (2, 1300)):
        counted, took = _least_ttft(server, tokens, 10 * seed + key)
        predicted = _predicted(rates, counted)
        ratio = took / predicted
        seen.append(f"{counted} tokens {took * 1e3:.1f} ms, {ratio:.2f}x predicted")
        held = held and ratio >= 0.5 and took <= 2.0 * predicted + HOST_SLACK_S
    return held, f"{rates}: {'; '.join(seen)}"


def test_calibrated_rates_predict_prompts_it_never_sent(server: Server) -> None:
    """Up to three calibrations, each with its check; one must hold. A busy host only adds
    time, to a probe or to a check, so a calibration and check the suite's other workers
    left alone show what the rates are worth (in CI one of ~30 probes caught a stall and
    the fit's error went to 0.53; an idle machine fits to 0.01-0.16). Default rates fail
    every attempt."""
    seen = []
    for seed in range(3):
        held, what = _attempt(server, seed)
        if held:
            return
        seen.append(what)
    pytest.fail("no calibration predicted the held-out prompts:\n" + "\n".join(seen))
