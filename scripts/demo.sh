#!/usr/bin/env bash
# The README's main-job command: set up, bring the embedded cluster up, show one
# streamed completion through the balancer, run a short load test and point at its report.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
LB=.venv/bin/lbtune

$LB cluster up
balancer=$($LB cluster status --json | .venv/bin/python -c 'import json,sys; print(json.load(sys.stdin)["endpoints"]["balancer_url"])')

echo
echo "== one streamed chat completion through the balancer ($balancer) =="
curl -sN -D - "$balancer/v1/chat/completions" -H 'Content-Type: application/json' \
  -d '{"model":"llama-3.1-8b-instruct","messages":[{"role":"user","content":"Say hello"}],"max_tokens":8,"stream":true}' \
  | grep -iE '^(HTTP|x-lbtune-replica)|^data:' | head -n 14

echo
echo "== a 30 s load test with the mixed scenario =="
$LB stress --scenario mixed --duration 30
$LB cluster status
