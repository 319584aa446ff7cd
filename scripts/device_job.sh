#!/usr/bin/env bash
# The draft-at-scale job (lsjax.train.device_job) from a checkout on a GPU/TPU machine without a network, beside
# the JAX it has. `make device-bundle device-prompts` first puts the gguf wheel, the GGUF in parts and the prompt
# file into .device/. Usage: scripts/device_job.sh OUT_DIR [device_job flags, e.g. --budget-minutes 8]
# OUT_DIR receives the draft (config.json, model.safetensors), job.json and the log: 4 files.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:?usage: scripts/device_job.sh OUT_DIR [flags of python -m lsjax.train.device_job]}
shift
site=$(mktemp -d)
if ls .device/whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target "$site" .device/whl/*.whl
fi
export PYTHONPATH="$site:$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
name=$(cat .device/gguf.name 2>/dev/null || echo SmolLM2-135M-Instruct.Q4_1.gguf)
if ls .device/gguf.part-* >/dev/null 2>&1; then
  cat .device/gguf.part-* > ".device/$name"
fi
work=$(mktemp -d)
mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version,memory.used,memory.total --format=csv,noheader 2>/dev/null || true
status=0
python3 -m lsjax.train.device_job --prompts .device/prompts.npz --out "$work" --set "target.path=.device/$name" "$@" \
  2>&1 | tee "$out/device-job.log" || status=$?
cp "$work"/job.json "$work"/draft/config.json "$work"/draft/model.safetensors "$out"/ 2>/dev/null || true
exit $status
