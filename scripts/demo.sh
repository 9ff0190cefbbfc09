#!/usr/bin/env bash
# The README's main-job command: set up, bring the embedded cluster up, show one
# streamed completion through the balancer, then run a short tuning study (a few minutes:
# configs screened in the twin first, the best measured live) that applies a confirmed
# winner, and show what is live.
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
echo "== a short tuning study on the mixed scenario (about 6-8 minutes) =="
echo "   first ${LBTUNE_DEMO_SCREEN:-60} configs screened in the virtual-time twin, the best few then measured live"
$LB optimize --budget ${LBTUNE_DEMO_BUDGET:-8} --trial-duration ${LBTUNE_DEMO_TRIAL_S:-20} --confirm-runs 1 \
  --screen ${LBTUNE_DEMO_SCREEN:-60}

echo
echo "== live balancer parameters now =="
$LB apply --show
$LB cluster status
