#!/usr/bin/env bash
# Install everything lbtune needs on a fresh Debian/Ubuntu machine, idempotently:
#   - system packages: haproxy, prometheus (promtool), nginx + prometheus-nginx-exporter
#     (the nginx target), chromium (report screenshot test), openssh-server (the sshd of
#     the fleet test's namespaced hosts, tests/robustness/test_fleet.py; its system service
#     is stopped: the test runs its own)
#   - a virtualenv in .venv with lbtune and its dev extras (editable)
# Prerequisites checked first: Python >= 3.11 ($PYTHON, default python3) with its venv module
# (Debian: python3.X-venv, installed when missing) and curl (installed when missing).
# Re-running is cheap: each step is skipped when already done.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
VENV=${VENV:-.venv}
APT_PACKAGES=(haproxy prometheus nginx prometheus-nginx-exporter openssh-server lua5.3)
[ "${LBTUNE_SKIP_BROWSER:-0}" = 1 ] || APT_PACKAGES+=(chromium)

if ! command -v "$PYTHON" >/dev/null 2>&1; then
  echo "setup: $PYTHON not found: lbtune needs Python >= 3.11 (Debian/Ubuntu: apt-get install" \
    "python3), or set PYTHON=/path/to/python3.11" >&2
  exit 1
fi
if ! "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
  echo "setup: lbtune needs Python >= 3.11; $PYTHON is" \
    "$("$PYTHON" -c 'import platform; print(platform.python_version())')." \
    "Set PYTHON=/path/to/python3.11 (or newer)" >&2
  exit 1
fi
PY_VERSION=$("$PYTHON" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
have_venv() { "$PYTHON" -c 'import ensurepip, venv' >/dev/null 2>&1; }

need=()
command -v haproxy >/dev/null 2>&1 || need+=(haproxy)
command -v prometheus >/dev/null 2>&1 || need+=(prometheus)
command -v nginx >/dev/null 2>&1 || [ -x /usr/sbin/nginx ] || need+=(nginx)
command -v prometheus-nginx-exporter >/dev/null 2>&1 || need+=(prometheus-nginx-exporter)
[ -x /usr/sbin/sshd ] || need+=(openssh-server)
command -v curl >/dev/null 2>&1 || need+=(curl)
# the llm scheduler's Lua run outside HAProxy (tests/targets/haproxy/test_llm_conformance.py)
command -v lua5.3 >/dev/null 2>&1 || need+=(lua5.3)
# `python3 -m venv` needs ensurepip, which Debian ships apart (python3-venv = python3.X-venv).
[ -x "$VENV/bin/python" ] || have_venv || need+=("python$PY_VERSION-venv")
if [[ " ${APT_PACKAGES[*]} " == *" chromium "* ]] && ! command -v chromium >/dev/null 2>&1; then
  need+=(chromium)
fi
if [ ${#need[@]} -gt 0 ]; then
  SUDO=""
  [ "$(id -u)" = 0 ] || SUDO="sudo"
  echo "setup: installing system packages: ${need[*]}" >&2
  if ! command -v apt-get >/dev/null 2>&1; then
    echo "setup: no apt-get here: install ${need[*]} with your package manager, then re-run" >&2
    exit 1
  fi
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
  if ! have_venv; then
    echo "setup: $PYTHON cannot create a virtualenv (no ensurepip): install" \
      "python$PY_VERSION-venv (Debian/Ubuntu), then re-run" >&2
    exit 1
  fi
  echo "setup: creating $VENV" >&2
  "$PYTHON" -m venv "$VENV"
fi
stamp="$VENV/.lbtune-installed"
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  echo "setup: installing lbtune and its dependencies into $VENV" >&2
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check -e ".[dev]"
  touch "$stamp"
fi
