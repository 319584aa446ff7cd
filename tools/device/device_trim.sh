#!/usr/bin/env bash
# The two calls that carry the GGUF to a GPU machine (its halves, 49 MB each, and the 4.6 MB of wheels with the
# first) fit their 64 MiB only when the tracked tree is under ~10 MB: `tools/device/device_trim.sh out` moves
# what the device job and check do not read (22 MB of drafts, docs/, tests/fixtures/, studies/) into
# .device/aside/ (ignored, so it does not travel); `tools/device/device_trim.sh in` puts them back. Run `in`
# before any commit: git sees the moved files as deleted.
set -euo pipefail
cd "$(dirname "$0")/../.."
drafts=lsjax/drafts/SmolLM2-135M-Instruct
unused="$drafts/local-gru $drafts/block-s8 $drafts/tokenswift $drafts/local-markov docs tests/fixtures studies"
case "${1:-}" in
  out) for p in $unused; do
         if [ -e "$p" ]; then mkdir -p ".device/aside/$(dirname "$p")"; mv "$p" ".device/aside/$p"; fi
       done ;;
  in) for p in $unused; do
        if [ -e ".device/aside/$p" ]; then mkdir -p "$(dirname "$p")"; mv ".device/aside/$p" "$p"; fi
      done ;;
  *) echo "usage: tools/device/device_trim.sh out|in" >&2; exit 2 ;;
esac
{ git ls-files -z | xargs -0 du -cb 2>/dev/null || true; } | tail -1 | awk '{printf "tracked files present: %.1f MB\n", $1 / 1e6}'
