#!/usr/bin/env bash
# The two calls that carry the GGUF to a GPU machine (its halves, 49 MB each) fit their 64 MiB only when the
# tracked tree is ~12 MB: `scripts/device_trim.sh out` moves the drafts the device job and check do not read
# (22 MB) into .device/aside/ (ignored, so it does not travel); `scripts/device_trim.sh in` puts them back.
# Run `in` before any commit: git sees the moved drafts as deleted.
set -euo pipefail
cd "$(dirname "$0")/.."
drafts=lsjax/drafts/SmolLM2-135M-Instruct
unused="local-gru block-s8 tokenswift local-markov"
case "${1:-}" in
  out) mkdir -p .device/aside; for d in $unused; do [ -d "$drafts/$d" ] && mv "$drafts/$d" .device/aside/; done ;;
  in) for d in $unused; do [ -d ".device/aside/$d" ] && mv ".device/aside/$d" "$drafts/"; done ;;
  *) echo "usage: scripts/device_trim.sh out|in" >&2; exit 2 ;;
esac
{ git ls-files -z | xargs -0 du -cb 2>/dev/null || true; } | tail -1 | awk '{printf "tracked files present: %.1f MB\n", $1 / 1e6}'
