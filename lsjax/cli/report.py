"""What decode.py says when a run is done: one JSON object (`--json`), or a line of timings after the streamed
text, with AR's speed and equality under `--compare ar`."""

from __future__ import annotations

import json
import sys

from lsjax.cli.console import programs_json, programs_said, rate


def summary(run, result, model, mesh, text: str, generator, baseline, split, times: dict) -> dict:
    """The run's JSON object: what ran, its timings (seconds since launch where a user waits), its programs."""
    from lsjax import mesh as mesh_lib
    from lsjax.engine.host import first_difference
    from lsjax.methods import registry

    store = generator.startup.store
    launched = times["launched"]
    out = {
        "method": run.method,
        "model": str(model.path),
        "dtype": model.config.dtype,
        "invariant_rows": model.config.invariant_rows,
        "mesh": str(mesh_lib.shape_of(mesh)) if mesh is not None else None,
        "prompt_tokens": result.prompt_tokens,
        "new_tokens": result.new_tokens,
        "stop_reason": result.stop_reason,
        "load_s": round(times["load_s"], 3),
        "compile_s": round(result.compile_s, 3),
        "prefill_s": round(result.prefill_s, 3),
        "prefill_alongside_compile": result.prefill_alongside_compile,
        "bridged_steps": result.bridged_steps,
        # A first start at this prompt width decoded with AR's own programs (`Generator.stands_in`).
        "ar_stand_in": result.ar_stand_in,
        "declined_loads": result.declined_loads,
        # How each program this run used was made ready, and when the method's own decode program took over.
        "programs": programs_json(generator.program_log),
        "programs_compiled": sum(p.how == "compiled" for p in generator.program_log),
        "programs_loaded": sum(p.how != "compiled" for p in generator.program_log),
        # Of those, read from disk while the model loaded (the programs the last such start fetched first).
        "programs_read_ahead": store.read_ahead_hits if store is not None else 0,
        # Seconds since launch (the process's start for `python decode.py`): what a user waits.
        "first_token_s": round(result.first_token_at - launched, 3),
        # (None: a first start that decoded with AR's programs, `ar_stand_in`: the method's never ran.)
        "decode_program_in_use_s": round(result.decode_program_at - launched, 3) if result.decode_program_at else None,
        "last_token_s": round(times["done_at"] - launched, 3),
        "decode_s": round(result.decode_s, 3),
        "tokens_per_s": round(result.tokens_per_s, 2),
        "target_forwards": result.target_forwards,
        "mean_accepted": round(result.mean_accepted, 3),
    }
    if split:
        out.update(split)
    entry = registry.get(run.method)
    if entry.describe_draft:  # which draft ran, and the layout read from its directory
        out["draft"] = registry.load(entry.describe_draft)(entry.make_options(**dict(run.options)))
    if result.drafter_stats:
        out.update(result.drafter_stats)
    if baseline is not None:
        speedup = result.tokens_per_s / baseline.tokens_per_s if baseline.tokens_per_s else 0.0
        out.update(
            ar_tokens_per_s=round(baseline.tokens_per_s, 2),
            speedup_vs_ar=round(speedup, 3),
            identical_to_ar=baseline.tokens == result.tokens,
        )
        if baseline.tokens != result.tokens:
            out["first_difference_vs_ar"] = first_difference(baseline.tokens, result.tokens)
    out["text"] = text
    return out


def report(run, result, model, mesh, tok, chat: bool, generator, baseline, split, times: dict) -> None:
    """Prints the run's JSON object (`--json`) or its lines on stderr."""
    text = tok.decode(result.tokens, skip_special_tokens=True)
    out = summary(run, result, model, mesh, text, generator, baseline, split, times)
    if result.stop_reason == "eos" and not text.strip() and not chat:
        # An instruct model given bare text often ends at once (e.g. SmolLM2-Instruct after a full sentence).
        print("[lsjax] the model ended without writing anything; for an instruct model add --chat", file=sys.stderr)
    if run.json:
        print(json.dumps(out))
        return
    if baseline is not None:
        _compared(out, baseline, result)
    # A one-token prompt's prefill rate says nothing (its time is the latency of one padded chunk).
    prefill_rate = (
        f" ({rate(result.prompt_tokens / result.prefill_s)} tok/s)"
        if result.prompt_tokens > 1 and result.prefill_s > 0
        else ""
    )
    if result.prefill_alongside_compile:
        prefill_rate += " while loading" if generator.loading_decode else " while compiling"
    how = (
        " (decoded as AR: this prompt width's first start)"
        if result.ar_stand_in
        else f" ({result.bridged_steps} steps restricted to the loaded programs)"
        if result.bridged_steps
        else ""
    )
    print(
        f"[lsjax] {result.new_tokens} tokens ({result.stop_reason}); prefill {result.prefill_s:.2f}s"
        f"{prefill_rate}, decode {result.tokens_per_s:.1f} tok/s, "
        f"{result.target_forwards} target forwards (tau {result.mean_accepted:.2f}), "
        f"compile {result.compile_s:.1f}s{how}; programs: {programs_said(generator.program_log)}",
        file=sys.stderr,
    )


def _compared(out: dict, baseline, result) -> None:
    same = "identical" if out["identical_to_ar"] else "DIFFERENT"
    print(
        f"[lsjax] vs AR: {baseline.tokens_per_s:.1f} tok/s -> {result.tokens_per_s:.1f} tok/s "
        f"({out['speedup_vs_ar']:.2f}x), outputs {same}",
        file=sys.stderr,
    )
    if out["identical_to_ar"]:
        return
    import jax

    why = (
        " (bf16 on an accelerator: a near-tied choice can round apart between AR and verification,"
        " docs/hardware/README.md; --invariant-rows 128 makes bf16 exact)"
        if out["dtype"] == "bfloat16" and jax.default_backend() != "cpu" and not out["invariant_rows"]
        else " (a bug: please report it with this command)"
    )
    print(f"[lsjax] first difference at new token {out['first_difference_vs_ar']}{why}", file=sys.stderr)
