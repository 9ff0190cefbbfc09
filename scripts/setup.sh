#!/usr/bin/env bash
# Install everything lbtune needs on a fresh Debian/Ubuntu machine, idempotently:
#   - system packages: haproxy, prometheus (promtool), nginx + prometheus-nginx-exporter
#     (the nginx target), chromium (report screenshot test), openssh-server (the sshd of
#     the fleet test's namespaced hosts, tests/robustness/test_fleet.py; its system service
#     is stopped: the test runs its own)
#   - a virtualenv in .venv with lbtune and its dev extras (editable)
# Re-running is cheap: each step is skipped when already done.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
VENV=${VENV:-.venv}
APT_PACKAGES=(haproxy prometheus nginx prometheus-nginx-exporter openssh-server)
[ "${LBTUNE_SKIP_BROWSER:-0}" = 1 ] || APT_PACKAGES+=(chromium)

need=()
command -v haproxy >/dev/null 2>&1 || need+=(haproxy)
command -v prometheus >/dev/null 2>&1 || need+=(prometheus)
command -v nginx >/dev/null 2>&1 || [ -x /usr/sbin/nginx ] || need+=(nginx)
command -v prometheus-nginx-exporter >/dev/null 2>&1 || need+=(prometheus-nginx-exporter)
[ -x /usr/sbin/sshd ] || need+=(openssh-server)
if [[ " ${APT_PACKAGES[*]} " == *" chromium "* ]] && ! command -v chromium >/dev/null 2>&1; then
  need+=(chromium)
fi
if [ ${#need[@]} -gt 0 ]; then
  SUDO=""
  [ "$(id -u)" = 0 ] || SUDO="sudo"
  echo "setup: installing system packages: ${need[*]}" >&2
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
  # lbtune runs its own nginx and exporter per cluster; the Debian packages start system
  # services (nginx on port 80, the exporter on 9113): stop the ones just installed.
  for svc in nginx prometheus-nginx-exporter ssh; do
    pkg=$svc; [ "$svc" = ssh ] && pkg=openssh-server
    [[ " ${need[*]} " == *" $pkg "* ]] || continue
    if command -v systemctl >/dev/null 2>&1 && [ -d /run/systemd/system ]; then
      $SUDO systemctl disable --now "$svc" >/dev/null 2>&1 || true
    else
      $SUDO service "$svc" stop >/dev/null 2>&1 || true
    fi
  done
fi

if [ ! -x "$VENV/bin/python" ]; then
  echo "setup: creating $VENV" >&2
  "$PYTHON" -m venv "$VENV"
fi
stamp="$VENV/.lbtune-installed"
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  echo "setup: installing lbtune and its dependencies into $VENV" >&2
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check -e ".[dev]"
  touch "$stamp"
fi
