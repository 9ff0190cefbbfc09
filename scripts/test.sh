#!/usr/bin/env bash
# The README's test command: set up, then run the whole suite (integration tests included:
# they start HAProxy, Prometheus and simulated replicas on free loopback ports).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
# tests/conformance runs against a real vLLM CPU server too: install it (once, ~2.5 min,
# 3.4 GB in .venv-vllm) unless LBTUNE_SKIP_VLLM=1, which skips that half of the suite.
[ "${LBTUNE_SKIP_VLLM:-0}" = 1 ] || scripts/setup-vllm.sh
# The code's habits first (fast; a violation fails CI before the long suite starts).
if [ "${LBTUNE_SKIP_LINT:-0}" != 1 ]; then
  .venv/bin/ruff check lbtune tests benchmarks
  .venv/bin/ruff format --check lbtune tests benchmarks
  .venv/bin/mypy
  .venv/bin/lint-imports
fi
# Four pytest-xdist workers by default (LBTUNE_TEST_WORKERS=0 runs serially): most of the
# suite's time is integration tests waiting on load they drive against simulated replicas,
# so four workers share two cores (docs: README "Tests"; three took 17.7 min with a busy loop
# on one core, four 15.8, on 2026-12-06). Each test module, or group of modules sharing a
# server, runs whole on one worker, longest first (tests/workers.py); each worker picks
# loopback ports in its own range. The 25 slowest tests are listed at the end (where the
# suite's time goes). Extra arguments go to pytest.
exec .venv/bin/python -m pytest -n "${LBTUNE_TEST_WORKERS:-4}" --dist loadgroup --durations=25 "$@"
