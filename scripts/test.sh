#!/usr/bin/env bash
# The README's test command: set up, then run the whole suite (integration tests included:
# they start HAProxy, Prometheus and simulated replicas on free loopback ports).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
exec .venv/bin/python -m pytest "$@"
