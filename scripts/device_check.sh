#!/usr/bin/env bash
# The device check from a checkout on a GPU/TPU machine without a network, beside the JAX it has (nothing of
# lsjax is pip-installed there). `make device-bundle` (on a machine with a network) first puts the gguf wheel and
# the default model's GGUF, in parts, into .device/. Usage: scripts/device_check.sh OUT_DIR [device-check flags]
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:?usage: scripts/device_check.sh OUT_DIR [flags of python -m lsjax.bench.device]}
shift
site=$(mktemp -d)
if ls .device/whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target "$site" .device/whl/*.whl
fi
export PYTHONPATH="$site:$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
model=()
if ls .device/gguf.part-* >/dev/null 2>&1; then
  # The shipped drafts are filed under the model's file name (SmolLM2-135M-Instruct.Q4_1.gguf), so keep it.
  name=$(cat .device/gguf.name 2>/dev/null || echo SmolLM2-135M-Instruct.Q4_1.gguf)
  cat .device/gguf.part-* > ".device/$name"
  model=(--model ".device/$name")
fi
nvidia-smi --query-gpu=name,driver_version,memory.used,memory.total --format=csv,noheader 2>/dev/null || true
python3 -m lsjax.bench.device "${model[@]}" --out "$out" "$@" 2>&1 | tee "$out/device-check.log"
