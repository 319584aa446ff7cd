"""Generate text with lsjax.

    python decode.py                                  # default model, bundled long prompt, streamed
    python decode.py --prompt-file doc.txt --chat --max-new-tokens 200
    python decode.py --model path/to/model.gguf --prompt "def fib(n):" --json

Errors in the input (missing file, empty prompt, a prompt longer than the
context window, a bad flag value) print one line and exit with status 2.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import warnings
from pathlib import Path

DEFAULT_PROMPT = Path(__file__).resolve().parent / "lsjax" / "assets" / "default_prompt.txt"


def parse_args(argv=None) -> argparse.Namespace:
    # The method names come from the drafter registry: a drafter registered anywhere is a --method choice.
    from lsjax.drafters import registry

    methods = [registry.get(n) for n in registry.names()]
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", help="a .gguf file or an HF safetensors directory (default: SmolLM2-135M-Instruct)")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--prompt", help="the prompt text")
    src.add_argument("--prompt-file", help="read the prompt from this file")
    p.add_argument("--chat", action="store_true", help="wrap the prompt as a user turn in the model's chat template")
    p.add_argument("--max-new-tokens", type=int, default=256, help="stop after this many new tokens (default 256)")
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default); > 0 samples")
    p.add_argument("--top-k", type=int, default=0, help="sample among the k most likely tokens (0 = off)")
    p.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling mass (1 = off)")
    p.add_argument("--min-p", type=float, default=0.0, help="drop tokens below min_p x the top probability (0 = off)")
    p.add_argument(
        "--penalty",
        type=float,
        default=1.0,
        help="contextual penalty theta on the tokens of the last --penalty-window generated ones "
        "(TokenSwift; 1 = off, the paper uses 1.2 with min-p 0.1 at T=1); every method samples the same "
        "penalized distribution",
    )
    p.add_argument("--penalty-window", type=int, default=1024, help="the penalty's window W (default 1024)")
    p.add_argument("--seed", type=int, default=0, help="RNG seed for sampling")
    p.add_argument(
        "--draft-sampling",
        choices=("auto", "greedy", "sample"),
        default="auto",
        help="at T > 0, how drafters build trees: sample children from the draft (verified by recursive "
        "rejection sampling), or keep the deterministic top-k tree (sample-and-match). Both lossless; "
        "auto = sample (default)",
    )
    p.add_argument(
        "--method",
        choices=[m.name for m in methods],
        default=None,
        help="decoding method: "
        + "; ".join(f"{m.name} ({m.help})" if m.help else m.name for m in methods)
        + ". Default: auto (the draft's trees when a draft for the target is found, else AR and prompt lookup)",
    )
    p.add_argument(
        "--cost-profile",
        choices=("cached", "measure", "prior"),
        default="cached",
        help="auto: per-candidate step costs of this device; cached = measured once per prompt bucket (~15 s, "
        "in $LSJAX_PROFILE_DIR or ~/.cache/lsjax/profiles) then reused; measure = measure again; prior = the "
        "built-in estimate, never measure",
    )
    p.add_argument(
        "--draft",
        help="a draft checkpoint (directory) for --method auto|longspec|hybrid, or a stream checkpoint for streams "
        "('random': untrained)",
    )
    p.add_argument(
        "--block-draft",
        help="block|dels: a block draft (directory; default: the shipped one), or 'longspec' (the LongSpec draft "
        "with an untrained mask embedding)",
    )
    p.add_argument(
        "--tree",
        default=None,
        help="speculation tree for longspec: a preset (paper, gpu, cpu, cpu-small, chain4, chain8) or "
        "comma-separated widths per depth, e.g. 2,2,2 (default: the draft's tree for this device, one node on a "
        "CPU; hybrid and auto: 2,1,1); streams: widths, or proposed:kept widths for early-exit pruning, "
        "e.g. 3,4,4:2,2,2",
    )
    p.add_argument("--streams", type=int, default=None, help="streams: speculative streams gamma (<= the checkpoint's)")
    p.add_argument("--msa-layers", type=int, default=None, help="streams: MSA layers N_s (the checkpoint's)")
    p.add_argument(
        "--pld-tokens",
        type=int,
        default=None,
        help=f"pld|hybrid: tokens per lookup chain ({registry.PLD_TOKENS} | {registry.HYBRID_PLD_TOKENS})",
    )
    p.add_argument(
        "--pld-ngram",
        type=int,
        default=registry.PLD_NGRAM,
        help=f"pld|hybrid: longest n-gram matched (default {registry.PLD_NGRAM})",
    )
    p.add_argument(
        "--heads",
        help="tokenswift: a heads checkpoint (directory), or 'zero' for untrained heads (default: the shipped "
        "heads, else zero)",
    )
    p.add_argument(
        "--ts-preset",
        choices=("paper", "cpu"),
        default=None,
        help="tokenswift: paper = partial-cache draft pass, 1,3,3,3 tree, 20 n-grams; cpu = no draft pass, 1,1,1 "
        "heads + one 8-gram chain (default: cpu on a CPU, else paper); the flags below override it",
    )
    p.add_argument("--kv-budget", type=int, default=None, help="tokenswift: partial KV cache entries (1024)")
    p.add_argument("--ngram-topk", type=int, default=None, help="tokenswift: n-gram chains per step")
    p.add_argument("--ngram-n", type=int, default=None, help="tokenswift: n-gram length (gamma = 4 in the paper)")
    p.add_argument(
        "--ts-draft-pass",
        choices=("partial", "full", "verified"),
        default=None,
        help="tokenswift: the heads' hidden state from a draft pass over the partial cache (default), over "
        "the full cache, or from verification itself (no draft pass)",
    )
    p.add_argument(
        "--ts-topk",
        default=None,
        help="tokenswift: candidates per logit set, comma-separated (the preset's by default)",
    )
    p.add_argument("--block-size", type=int, default=None, help="block|dels: tokens per block (default: the draft's)")
    p.add_argument("--alpha", type=float, default=1.0, help="dels: weight of the local head's logits (default 1.0)")
    p.add_argument("--beta", type=float, default=1.0, help="dels: weight of the unigram prior (default 1.0)")
    p.add_argument(
        "--local-head", default=None, help="dels: gru (default) | markov (the shipped heads) or a local-head directory"
    )
    p.add_argument("--branches", type=int, default=1, help="block|dels: parallel chains from the top first tokens")
    p.add_argument("--compare", choices=("ar",), help="also run AR on the same prompt; print speedup and equality")
    p.add_argument("--ignore-eos", action="store_true", help="keep generating past the end-of-sequence token")
    p.add_argument(
        "--backend",
        choices=("auto", "xla", "pallas", "reference"),
        default="auto",
        help="attention backend (default: xla on CPU, pallas on TPU/GPU)",
    )
    p.add_argument(
        "--dtype",
        default="auto",
        help="weights and K/V cache: bf16 | fp32 (default auto: fp32 on a CPU, bf16 on TPU/GPU; accumulation and "
        "softmax statistics are fp32 either way, and AR and verification share the dtype)",
    )
    p.add_argument("--json", action="store_true", help="no streaming; print one JSON object with the text and timings")
    return p.parse_args(argv)


def fail(msg: str) -> None:
    print(f"decode.py: error: {msg}", file=sys.stderr)
    sys.exit(2)


def read_prompt(args) -> tuple[str, bool]:
    """The prompt text and whether to apply the chat template."""
    if args.prompt is not None:
        return args.prompt, args.chat
    path = Path(args.prompt_file) if args.prompt_file else DEFAULT_PROMPT
    if not path.is_file():
        fail(f"prompt file not found: {path}")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        fail(f"prompt file is not UTF-8 text: {path}")
    # The bundled prompt is an instruction (summarize the speech): it is meant for the chat template.
    return text, args.chat or args.prompt_file is None


def main(argv=None) -> int:
    args = parse_args(argv)
    if (args.pld_tokens is not None and args.pld_tokens < 1) or args.pld_ngram < 1:
        fail("--pld-tokens and --pld-ngram must be >= 1")
    if any(x is not None and x < 1 for x in (args.streams, args.msa_layers)):
        fail("--streams and --msa-layers must be >= 1")
    ts_topk = None
    if args.ts_topk is not None:
        try:
            ts_topk = tuple(int(k) for k in args.ts_topk.split(","))
        except ValueError:
            fail(f"--ts-topk: expected comma-separated integers, got {args.ts_topk!r}")
    if args.dtype not in ("auto", "bf16", "fp32"):
        fail(f"--dtype must be bf16, fp32 or auto, got {args.dtype!r}")
    if (args.block_size is not None and not 1 <= args.block_size <= 64) or args.branches < 1:
        fail("--block-size must be in [1, 64] and --branches >= 1")
    # A warning (a kernel falling back to XLA, say) is one line on stderr, not a file:line and a source line.
    warnings.formatwarning = lambda message, category, *_a, **_k: f"decode.py: warning: {message}\n"
    # The engine's imports come after argument parsing, so `--help` and flag errors stay quick.
    from lsjax.config import ConfigError, GenerateConfig, SamplingConfig
    from lsjax.drafters import registry
    from lsjax.errors import LsjaxError
    from lsjax.generation import Generator, check_prompt
    from lsjax.loading import load_model

    try:
        gen = GenerateConfig(
            max_new_tokens=args.max_new_tokens,
            sampling=SamplingConfig(
                temperature=args.temperature,
                top_k=args.top_k,
                top_p=args.top_p,
                min_p=args.min_p,
                draft_sampling=args.draft_sampling,
                penalty=args.penalty,
                penalty_window=args.penalty_window,
            ),
            ignore_eos=args.ignore_eos,
        )
    except ConfigError as e:
        fail(str(e))
    text, chat = read_prompt(args)
    if not text.strip():
        fail("the prompt is empty")

    try:
        t0 = time.perf_counter()
        model = load_model(args.model, dtype=args.dtype)
        load_s = time.perf_counter() - t0
        tok = model.tokenizer
        if chat:
            rendered = tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True)
            ids = tok.encode(rendered, add_special_tokens=False)  # the template already holds the special tokens
        else:
            ids = tok.encode(text)
        check_prompt(model.config, ids, gen.max_new_tokens)
        # auto: on the held-out split it beat every fixed method on average (README, "Never slower").
        method = args.method or "auto"
        drafter, draft_params = registry.build(
            method,
            model,
            draft=args.draft,
            tree=args.tree,
            pld_tokens=args.pld_tokens,
            pld_ngram=args.pld_ngram,
            streams=args.streams,
            msa_layers=args.msa_layers,
            heads=args.heads,
            ts_preset=args.ts_preset,
            kv_budget=args.kv_budget,
            ngram_topk=args.ngram_topk,
            ngram_n=args.ngram_n,
            draft_pass=args.ts_draft_pass,
            ts_topk=ts_topk,
            block_draft=args.block_draft,
            block_size=args.block_size,
            alpha=args.alpha,
            beta=args.beta,
            local_head=args.local_head,
            branches=args.branches,
        )
        generator = Generator(
            model.config, model.params, drafter, draft_params, backend=args.backend, cost_profile=args.cost_profile
        )
        if not args.json:
            print(
                f"[lsjax] {model.path.name} ({model.config.dtype}): {len(ids)} prompt tokens, method {method}, "
                f"loaded in {load_s:.1f}s; compiling...",
                file=sys.stderr,
            )
        stream = tok.stream_decoder(skip_special_tokens=True)
        on_tokens = None if args.json else (lambda new: print(stream.push(new), end="", flush=True))
        result = generator.run(ids, gen, seed=args.seed, on_tokens=on_tokens)
        if not args.json:
            print(stream.flush())
        baseline = split = None
        if args.compare == "ar":
            baseline = Generator(model.config, model.params, backend=args.backend).run(ids, gen, seed=args.seed)
        if args.json and method != "ar":
            from lsjax.bench.profiling import time_split

            split = time_split(generator, ids, gen, seed=args.seed)
    except (LsjaxError, FileNotFoundError) as e:
        fail(str(e))

    out_text = tok.decode(result.tokens, skip_special_tokens=True)
    summary = {
        "method": method,
        "model": str(model.path),
        "dtype": model.config.dtype,
        "prompt_tokens": result.prompt_tokens,
        "new_tokens": result.new_tokens,
        "stop_reason": result.stop_reason,
        "load_s": round(load_s, 3),
        "compile_s": round(result.compile_s, 3),
        "prefill_s": round(result.prefill_s, 3),
        "decode_s": round(result.decode_s, 3),
        "tokens_per_s": round(result.tokens_per_s, 2),
        "target_forwards": result.target_forwards,
        "mean_accepted": round(result.mean_accepted, 3),
    }
    if split:
        summary.update(split)
    if result.drafter_stats:
        summary.update(result.drafter_stats)
    if baseline is not None:
        speedup = result.tokens_per_s / baseline.tokens_per_s if baseline.tokens_per_s else 0.0
        summary.update(
            ar_tokens_per_s=round(baseline.tokens_per_s, 2),
            speedup_vs_ar=round(speedup, 3),
            identical_to_ar=baseline.tokens == result.tokens,
        )
    summary["text"] = out_text
    if result.stop_reason == "eos" and not out_text.strip() and not chat:
        # An instruct model given bare text often ends at once (e.g. SmolLM2-Instruct after a full sentence).
        print("[lsjax] the model ended without writing anything; for an instruct model add --chat", file=sys.stderr)
    if args.json:
        print(json.dumps(summary))
    else:
        if baseline is not None:
            same = "identical" if summary["identical_to_ar"] else "DIFFERENT"
            print(
                f"[lsjax] vs AR: {baseline.tokens_per_s:.1f} tok/s -> {result.tokens_per_s:.1f} tok/s "
                f"({summary['speedup_vs_ar']:.2f}x), outputs {same}",
                file=sys.stderr,
            )
        print(
            f"[lsjax] {result.new_tokens} tokens ({result.stop_reason}); prefill {result.prefill_s:.2f}s "
            f"({result.prompt_tokens / max(result.prefill_s, 1e-9):.0f} tok/s), "
            f"decode {result.tokens_per_s:.1f} tok/s, "
            f"{result.target_forwards} target forwards (tau {result.mean_accepted:.2f}), "
            f"compile {result.compile_s:.1f}s",
            file=sys.stderr,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
