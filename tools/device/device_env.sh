# Sourced by tools/device/device_check.sh and tools/device/device_job.sh on a GPU/TPU machine without a network: installs
# the carried wheels (.device/whl) into a temporary directory on PYTHONPATH beside the machine's JAX (nothing of
# lsjax is pip-installed there), joins the GGUF parts and sets $gguf to the joined file ("" without parts).
site=$(mktemp -d)
if ls .device/whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target "$site" .device/whl/*.whl
fi
export PYTHONPATH="$site:$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
gguf=""
if ls .device/gguf.part-* >/dev/null 2>&1; then
  # The shipped drafts are filed under the model's file name (SmolLM2-135M-Instruct.Q4_1.gguf), so keep it.
  gguf=".device/$(cat .device/gguf.name 2>/dev/null || echo SmolLM2-135M-Instruct.Q4_1.gguf)"
  cat .device/gguf.part-* > "$gguf"
fi
nvidia-smi --query-gpu=name,driver_version,memory.used,memory.total --format=csv,noheader 2>/dev/null || true
