#!/usr/bin/env bash
# The nightly tuning job, one step per argument (docs/ci.md, "Nightly tuning"):
#   .github/workflows/nightly-tune.yml runs each step as its own workflow step,
#   ci/gitlab-nightly.yml and a plain cron line run `scripts/nightly.sh all`.
#
#   up        start the cluster: the embedded one, or staging when LBTUNE_STAGING_CLUSTER is
#             set; put the last accepted config back on a freshly started cluster
#   tune      lbtune optimize --ci --junit (report, JUnit XML, step summary)
#   gate      lbtune compare <last accepted study> <tonight's study> --fail-on ...: exit 1 on
#             a significant regression of what tonight leaves live against the last accepted
#   drift     lbtune history --check-drift: exit 1 when tonight's baseline (the live config,
#             trial 0) is significantly worse than the last accepted config
#   refit     lbtune twin fit against the running cluster, --baseline the profile the last
#             passing refit kept: exit 1 when a replica got slower by more than
#             LBTUNE_NIGHTLY_FAIL_ON_DRIFT beyond the fits' noise (it is named); a passing
#             fit is kept as the next night's baseline, a failing one is not
#   remember  an accepted winner becomes the reference for the next nights; prune old reports
#   down      stop the cluster
#   all       every step in that order (down always); exit status: the first failure's
#
# Environment [default]:
#   LBTUNE_NIGHTLY_SCENARIO [mixed]   LBTUNE_NIGHTLY_BUDGET [30]   LBTUNE_NIGHTLY_TRIAL_S [25]
#   LBTUNE_NIGHTLY_CONFIRM_RUNS [2]   LBTUNE_NIGHTLY_SCREEN [optimize's default: 100 configs
#       screened in the twin where the embedded cluster's balancer is tuned]
#   LBTUNE_NIGHTLY_CLUSTER [hetero4] (embedded preset;
#       hetero4-envoy / hetero4-nginx / hetero4-router put another balancer in front: every
#       step tunes, applies and shows the cluster's own balancer)
#   LBTUNE_NIGHTLY_FAIL_ON [p99=+10%,ttft=+10%,goodput=-5%,errors=+1%]
#   LBTUNE_NIGHTLY_FAIL_ON_DRIFT [10%] (off: name the replicas that got slower, never fail,
#       so tonight's fit becomes the baseline: how to accept a slower replica)
#   LBTUNE_NIGHTLY_REFIT [validate]: validate (fit, then two live validation runs), fit
#       (--no-validate: the fit's probes only) or off (no refit)
#   LBTUNE_NIGHTLY_REFIT_SCENARIO [chat]  LBTUNE_NIGHTLY_REFIT_S [30]: the validation runs'
#       scenario (models the replicas serve first) and seconds
#   LBTUNE_NIGHTLY_DIR [nightly]: what one night leaves the next (studies.db, the accepted
#       study's report, its params, the kept twin profile); keep it between runs (CI cache,
#       or a plain directory)
#   LBTUNE_NIGHTLY_REPORT [$LBTUNE_NIGHTLY_DIR/reports/<UTC date-time>]: tonight's report
#   LBTUNE_STATE_DIR [~/.local/state/lbtune/nightly]: the cluster's state dir
#   LBTUNE_STAGING_CLUSTER: the *contents* of a cluster YAML whose `external:` replicas are
#       the staging servers (a CI secret); when set, the job tunes staging, not the embedded
#       cluster. LBTUNE_STAGING_INVENTORY: the contents of the Ansible inventory the winner
#       is rolled out with (optional).
#   LBTUNE_BIN [.venv/bin/lbtune]: how to run lbtune.
set -euo pipefail
shopt -s nullglob
cd "$(dirname "$0")/.."

read -r -a LB <<<"${LBTUNE_BIN:-.venv/bin/lbtune}"
SCENARIO=${LBTUNE_NIGHTLY_SCENARIO:-mixed}
NIGHTLY=${LBTUNE_NIGHTLY_DIR:-nightly}
FAIL_ON=${LBTUNE_NIGHTLY_FAIL_ON:-p99=+10%,ttft=+10%,goodput=-5%,errors=+1%}
FAIL_ON_DRIFT=${LBTUNE_NIGHTLY_FAIL_ON_DRIFT:-10%}
REFIT=${LBTUNE_NIGHTLY_REFIT:-validate}
REFIT_SCENARIO=${LBTUNE_NIGHTLY_REFIT_SCENARIO:-chat}
KEPT_PROFILE=$NIGHTLY/twin-profile.json
export LBTUNE_STATE_DIR=${LBTUNE_STATE_DIR:-$HOME/.local/state/lbtune/nightly}
# The history goes next to the studies in $NIGHTLY, whatever the caller's environment says.
unset LBTUNE_HISTORY_DB
mkdir -p "$NIGHTLY"
STORAGE="sqlite:///$(cd "$NIGHTLY" && pwd)/studies.db"
if [ -z "${LBTUNE_NIGHTLY_REPORT:-}" ]; then
  # Shared by the steps of one night: fixed by `up`, read by the others.
  [ -f "$NIGHTLY/tonight" ] || [ "${1:-}" != up ] || date -u +%Y%m%d-%H%M%S >"$NIGHTLY/tonight"
  LBTUNE_NIGHTLY_REPORT="$NIGHTLY/reports/$(cat "$NIGHTLY/tonight" 2>/dev/null || echo unknown)"
fi
REPORT=$LBTUNE_NIGHTLY_REPORT

log() { echo "nightly: $*" >&2; }

summary() { # append Markdown to the CI step summary when there is one
  if [ -n "${GITHUB_STEP_SUMMARY:-}" ]; then cat >>"$GITHUB_STEP_SUMMARY"; else cat >/dev/null; fi
}

staging() { [ -n "${LBTUNE_STAGING_CLUSTER:-}" ]; }

cluster_file() {
  if staging; then
    printf '%s\n' "$LBTUNE_STAGING_CLUSTER" >"$LBTUNE_STATE_DIR.staging-cluster.yaml"
    echo "$LBTUNE_STATE_DIR.staging-cluster.yaml"
  else
    echo "${LBTUNE_NIGHTLY_CLUSTER:-hetero4}"
  fi
}

inventory_args() {
  if staging && [ -n "${LBTUNE_STAGING_INVENTORY:-}" ]; then
    printf '%s\n' "$LBTUNE_STAGING_INVENTORY" >"$LBTUNE_STATE_DIR.staging-inventory.yml"
    echo "--inventory $LBTUNE_STATE_DIR.staging-inventory.yml"
  fi
}

step_up() {
  mkdir -p "$(dirname "$LBTUNE_STATE_DIR")"
  local fresh=1
  "${LB[@]}" cluster status >/dev/null 2>&1 && fresh=0
  if staging; then log "target: staging (LBTUNE_STAGING_CLUSTER)"; else
    log "target: embedded ($(cluster_file))"; fi
  "${LB[@]}" cluster up --config "$(cluster_file)" || return
  log "balancer: $("${LB[@]}" cluster status --json | python3 -c \
    'import json, sys; print(json.load(sys.stdin)["endpoints"]["balancer"])')"
  if [ "$fresh" = 1 ] && [ -f "$NIGHTLY/accepted-params.yaml" ]; then
    log "a fresh cluster: putting the last accepted config back"
    "${LB[@]}" apply --params "$NIGHTLY/accepted-params.yaml" --direct || return
  fi
}

step_tune() {
  mkdir -p "$REPORT"
  # shellcheck disable=SC2046 # inventory_args is empty or two words
  "${LB[@]}" optimize --ci --junit "$REPORT/junit.xml" --scenario "$SCENARIO" \
    --budget "${LBTUNE_NIGHTLY_BUDGET:-30}" --trial-duration "${LBTUNE_NIGHTLY_TRIAL_S:-25}" \
    --confirm-runs "${LBTUNE_NIGHTLY_CONFIRM_RUNS:-2}" --storage "$STORAGE" --out "$REPORT" \
    ${LBTUNE_NIGHTLY_SCREEN:+--screen "$LBTUNE_NIGHTLY_SCREEN"} $(inventory_args)
}

accepted_dir() { # the last accepted study's report, if it is still there
  local dir
  dir=$(cat "$NIGHTLY/accepted" 2>/dev/null) || return 1
  [ -f "$dir/study.json" ] && echo "$dir"
}

have_report() {
  [ -f "$REPORT/study.json" ] && return 0
  log "no study report in $REPORT (the tune step failed): skipping $1"
  return 1
}

step_gate() {
  local ref
  have_report gate || return 0
  if ! ref=$(accepted_dir); then
    log "no accepted study yet: nothing to gate against"
    echo "No accepted study yet: the regression gate starts once a winner is accepted." | summary
    return 0
  fi
  log "gate: $REPORT against the last accepted $ref"
  "${LB[@]}" compare "$ref" "$REPORT" --ci --fail-on "$FAIL_ON" \
    --junit "$REPORT/compare-junit.xml"
}

step_drift() {
  local rc=0
  have_report drift || return 0
  "${LB[@]}" history --storage "$STORAGE" --scenario "$SCENARIO" --last 30 --check-drift \
    --html "$REPORT/history.html" >"$REPORT/history.txt" || rc=$?
  cat "$REPORT/history.txt"
  { echo "### History and drift ($SCENARIO)"; echo '```'; tail -n 40 "$REPORT/history.txt"
    echo '```'; } | summary
  return "$rc"
}

comparable() { # the kept profile's fit time when it is of tonight's cluster; else why not
  [ -f "$KEPT_PROFILE" ] || { echo "no twin profile kept yet"; return 1; }
  "${LB[@]}" cluster status --json | python3 -c '
import json, sys
ep = json.load(sys.stdin)["endpoints"]
now = (ep["config_name"], float(ep["time_scale"]))
try:
    with open(sys.argv[1]) as f:
        old = json.load(f)
    was = (old["cluster"], float(old["time_scale"]))
except (OSError, ValueError, KeyError, TypeError) as exc:
    print(f"the kept profile {sys.argv[1]} cannot be read ({type(exc).__name__})")
    sys.exit(1)
if was != now:  # wall times at another time scale, or other replicas: not comparable
    print(f"the kept profile is of {was[0]} at time scale {was[1]:g}, "
          f"tonight the cluster is {now[0]} at {now[1]:g}")
    sys.exit(1)
print(old.get("measured_at", "an earlier night"))
' "$KEPT_PROFILE"
}

step_refit() {
  local rc=0 against args=()
  case $REFIT in
    validate) ;;
    fit) args+=(--no-validate) ;;
    off) log "LBTUNE_NIGHTLY_REFIT=off: no twin refit"; return 0 ;;
    *) log "LBTUNE_NIGHTLY_REFIT=$REFIT: expected validate, fit or off"; return 2 ;;
  esac
  if ! "${LB[@]}" cluster status >/dev/null 2>&1; then
    log "no cluster running (the up step failed): skipping refit"
    return 0
  fi
  if against=$(comparable); then
    args+=(--baseline "$KEPT_PROFILE")
    [ "$FAIL_ON_DRIFT" = off ] || args+=(--fail-on-drift "$FAIL_ON_DRIFT")
    against="against the profile fitted $against"
  else
    log "refit: no comparison tonight: $against"
    against="no comparison: $against"
  fi
  mkdir -p "$REPORT"
  # stdout (the fitted rates, a drift line per replica) to a file; progress and the verdict
  # to the log as they come and to a file for the summary
  "${LB[@]}" twin fit -s "$REFIT_SCENARIO" -d "${LBTUNE_NIGHTLY_REFIT_S:-30}" \
    --save "$REPORT/twin-profile.json" "${args[@]}" 2>&1 >"$REPORT/twin-fit.txt" |
    tee "$REPORT/twin-fit.log" >&2 || rc=$?
  cat "$REPORT/twin-fit.txt"
  { echo "### Twin refit ($against)"; echo '```'; cat "$REPORT/twin-fit.txt"
    sed -nE '/^(drift|error): /,$p' "$REPORT/twin-fit.log"; echo '```'; } | summary
  if [ "$rc" = 0 ]; then
    cp "$REPORT/twin-profile.json" "$KEPT_PROFILE.new" && mv "$KEPT_PROFILE.new" "$KEPT_PROFILE"
    log "refit: tonight's twin profile is the baseline from now on"
  else
    log "refit: exit $rc: the kept twin profile stays the baseline"
  fi
  return "$rc"
}

step_remember() {
  have_report remember || return 0
  if python3 - "$REPORT/study.json" <<'EOF'
import json, sys
r = (json.load(open(sys.argv[1])).get("rollout") or {})
sys.exit(0 if r.get("applied") and r.get("verified") and not r.get("rolled_back") else 1)
EOF
  then
    log "tonight's winner was accepted: it is the reference from now on"
    echo "$REPORT" >"$NIGHTLY/accepted"
    "${LB[@]}" apply --show >"$NIGHTLY/accepted-params.yaml"
  fi
  local keep ref
  keep=$(cd "$REPORT" && pwd)
  ref=$(accepted_dir || true)
  [ -z "$ref" ] || ref=$(cd "$ref" && pwd)
  for d in "$NIGHTLY"/reports/*/; do
    d=$(cd "$d" && pwd)
    [ "$d" = "$keep" ] || [ "$d" = "$ref" ] || rm -rf "$d"
  done
  rm -f "$NIGHTLY/tonight"
}

step_down() { "${LB[@]}" cluster down; }

step_all() {
  local rc=0
  step_up || rc=$?
  if [ "$rc" = 0 ]; then
    step_tune || rc=$?
    step_gate || { r=$?; [ "$rc" != 0 ] || rc=$r; }
    step_drift || { r=$?; [ "$rc" != 0 ] || rc=$r; }
    step_refit || { r=$?; [ "$rc" != 0 ] || rc=$r; }
    step_remember || true
  fi
  step_down || true
  return "$rc"
}

case "${1:-}" in
  up | tune | gate | drift | refit | remember | down | all) "step_$1" ;;
  *) echo "usage: $0 up|tune|gate|drift|refit|remember|down|all" >&2; exit 2 ;;
esac
