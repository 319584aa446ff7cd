"""`decode.py --precompile`: generate nothing; make a method's programs (and auto's cost profile) for each prompt
width, ready in the compile cache, so later runs start without compiling."""

from __future__ import annotations

import dataclasses
import json
import sys
import time

from lsjax.cli.console import Ticker, programs_json, programs_said
from lsjax.cli.flags import fail


def precompile_widths(text: str, max_position: int) -> list[int]:
    """The prompt widths `--precompile` makes programs for: the ones given, else every width a prompt that fits
    the context window can have."""
    from lsjax.engine.loop import PROMPT_BUCKETS

    if text == "auto":
        return [b for b in PROMPT_BUCKETS if b < max_position] or [PROMPT_BUCKETS[0]]
    try:
        widths = [int(w) for w in text.split(",")]
    except ValueError:
        fail(f"--precompile: expected prompt widths like 1024,4096, got {text!r}")
    bad = [w for w in widths if w not in PROMPT_BUCKETS or w >= max_position]
    if bad:
        fits = [b for b in PROMPT_BUCKETS if b < max_position]
        fail(f"--precompile: {bad[0]} is not a prompt width below the context window; choose from {fits}")
    return widths


def precompile(generator, ids: list[int], run) -> int:
    """For each prompt width, a prompt of that width (the given one's tokens repeated) prefilled and decoded for
    a few tokens with the programs `--max-new-tokens` compiles: every program is compiled (or found) and
    stored in the compile cache, and auto measures its cost profile for the width."""
    from lsjax.engine.loop import PROMPT_BUCKETS

    widths = precompile_widths(run.precompile, generator.config.max_position)
    rows = []
    t0 = time.perf_counter()
    generator.warming_up = True  # auto measures each width's own cost profile
    for i, width in enumerate(widths):
        lower = max([b for b in PROMPT_BUCKETS if b < width], default=0)
        n = min(width - 8, generator.config.max_position - 2)
        prompt = (ids * (n // len(ids) + 1))[: max(n, lower + 1)]
        fit = dataclasses.replace(
            run.gen, max_new_tokens=min(run.gen.max_new_tokens, generator.config.max_position - n - 1)
        )
        before = len(generator.program_log)
        with Ticker(f"precompiling {i + 1}/{len(widths)}: prompt width {width}"):
            generator.run(prompt, fit, seed=run.seed, max_new=64)
        made = generator.program_log[before:]
        print(f"[lsjax] width {width}: {programs_said(made) or 'already in this process'}", file=sys.stderr)
        rows.append({"width": width, "programs": programs_json(made)})
    summary = {"method": run.method, "precompiled": rows, "seconds": round(time.perf_counter() - t0, 1)}
    print(
        json.dumps(summary)
        if run.json
        else f"[lsjax] precompiled {len(widths)} prompt widths in {summary['seconds']:.0f}s"
    )
    return 0
