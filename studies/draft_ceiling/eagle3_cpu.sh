#!/usr/bin/env bash
# Issue 92, item 1 at the arms' budget: EAGLE-3 and LongSpec drafts trained from scratch on the same rows and
# steps on this CPU, then measured with draft_accept on dev (held-out reported beside). Every stage resumes:
# rerun the script after an interruption. Results: runs/draft_ceiling/eagle3/{eagle3,longspec,eagle3-head,dflash}-{dev,heldout}.json
set -euo pipefail
cd "$(dirname "$0")/../.."
py=${PYTHON:-python}
out=runs/draft_ceiling/eagle3
set_=e3-sharegpt-1k
# 256 sequences x 1024 tokens of sharegpt's train split, the target's features with aux layers 2, 15, 27
built=$(ls -d $out/features/$set_/shard-* 2>/dev/null | wc -l)
if [ "$built" -lt 16 ]; then  # shards of 16 sequences; an interrupted build resumes
  $py -m lsjax.train.feature_cache --root $out/features --set $set_ --sources sharegpt --chat --seq-len 1024 \
    --max-sequences 640 --aux-layers 2 15 27 --max-shards $(( 16 - built ))
fi
train() {  # config, run dir, export dir
  if [ ! -f "$3/config.json" ]; then
    resume=$([ -d "$2/checkpoints" ] && echo --resume || true)
    $py train.py --config "$1" --no-progress $resume
    $py train.py --config "$1" --export "$3"
  fi
}
train studies/draft_ceiling/eagle3-cpu.yaml $out/run $out/eagle3-draft
train studies/draft_ceiling/longspec-cpu.yaml $out/longspec-run $out/longspec-draft
# the same EAGLE-3 run with its LM head and final norm starting as the target's (draft.head_init: target)
train studies/draft_ceiling/eagle3-cpu-head.yaml $out/run-head $out/eagle3-head-draft
# a DFlash draft on the same source, split and budget (its trainer runs the target live: ~45 min here)
train studies/draft_ceiling/dflash-cpu.yaml $out/dflash-run $out/dflash-draft
for suite in dev heldout; do
  [ -f $out/eagle3-$suite.json ] || $py -m lsjax.bench.draft_accept --method eagle3 --draft $out/eagle3-draft \
    --suite $suite --json $out/eagle3-$suite.json
  [ -f $out/longspec-$suite.json ] || $py -m lsjax.bench.draft_accept --draft $out/longspec-draft \
    --suite $suite --json $out/longspec-$suite.json
  [ -f $out/eagle3-head-$suite.json ] || $py -m lsjax.bench.draft_accept --method eagle3 \
    --draft $out/eagle3-head-draft --suite $suite --json $out/eagle3-head-$suite.json
  [ -f $out/dflash-$suite.json ] || $py -m lsjax.bench.draft_accept --method dflash --draft $out/dflash-draft \
    --suite $suite --json $out/dflash-$suite.json
done
