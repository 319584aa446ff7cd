#!/usr/bin/env bash
# The draft-at-scale job (tools/device/device_job.py) from a checkout on a GPU/TPU machine without a network, beside
# the JAX it has. `make device-bundle device-prompts` first puts the gguf wheel, the GGUF in parts and the prompt
# file into .device/. Usage: tools/device/device_job.sh OUT_DIR [device_job flags, e.g. --budget-minutes 8]
# OUT_DIR receives the draft (config.json, model.safetensors), job.json and the log: 4 files.
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${1:?usage: tools/device/device_job.sh OUT_DIR [flags of python -m tools.device.device_job]}
shift
source tools/device/device_env.sh
if [ -z "$gguf" ]; then echo "device job: error: no GGUF parts in .device/ (make device-bundle)" >&2; exit 2; fi
work=$(mktemp -d)
mkdir -p "$out"
status=0
python3 -m tools.device.device_job --prompts .device/prompts.npz --out "$work" --set "target.path=$gguf" "$@" \
  2>&1 | tee "$out/device-job.log" || status=$?
cp "$work"/job.json "$work"/draft/config.json "$work"/draft/model.safetensors "$out"/ 2>/dev/null || true
exit $status
