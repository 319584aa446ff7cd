#!/usr/bin/env bash
# The device check from a checkout on a GPU/TPU machine without a network, beside the JAX it has (nothing of
# lsjax is pip-installed there). `make device-bundle` (on a machine with a network) first puts the gguf wheel and
# the default model's GGUF, in parts, into .device/. Usage: tools/device/device_check.sh OUT_DIR [device-check flags]
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${1:?usage: tools/device/device_check.sh OUT_DIR [flags of python -m lsjax.bench.device]}
shift
source tools/device/device_env.sh
model=()
if [ -n "$gguf" ]; then model=(--model "$gguf"); fi
python3 -m lsjax.bench.device "${model[@]}" --out "$out" "$@" 2>&1 | tee "$out/device-check.log"
