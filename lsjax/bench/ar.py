"""AR decoding: lsjax vs HF transformers, measured in the same run.

    python -m lsjax.bench.ar                      # ~1K and ~4K-token stdlib prompts, 128 greedy tokens
    python -m lsjax.bench.ar --lengths 1024 --new-tokens 64 --repeats 1

Both systems decode the same prompt greedily on the CPU (HF: torch fp32, sdpa,
2 threads). Runs alternate lsjax / HF so machine noise hits both; each cell
reports the best of `--repeats`. Also prints the memory-bandwidth roofline:
bytes read per token (weights + KV cache at that context) / measured bandwidth.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from lsjax.prompts import stdlib_code_prompt


def measure_bandwidth(num_bytes: int = 512 * 2**20, repeats: int = 5) -> float:
    """Bytes/s of a large fp32 copy (read + write) on this machine."""
    a = np.ones(num_bytes // 4, np.float32)
    b = np.empty_like(a)
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        np.copyto(b, a)
        best = min(best, time.perf_counter() - t)
    return 2 * num_bytes / best


def bytes_per_token(config, context: int) -> int:
    """Weights (fp32) plus the K and V of every layer at this context length."""
    weights = config.num_params() * 4
    kv = 2 * config.num_layers * config.num_kv_heads * config.head_dim * context * 4
    return weights + kv


def run_hf(model, ids: list[int], new_tokens: int) -> tuple[float, list[int]]:
    """HF `generate` (greedy, its own KV cache); decode time = time(n tokens) - time(1 token) (the prefill)."""
    import torch

    inp = torch.tensor([ids])
    kw = dict(do_sample=False, min_new_tokens=new_tokens, pad_token_id=0)
    with torch.no_grad():
        t0 = time.perf_counter()
        model.generate(inp, max_new_tokens=1, **{**kw, "min_new_tokens": 1})
        t1 = time.perf_counter()
        out = model.generate(inp, max_new_tokens=new_tokens, **kw)
        t2 = time.perf_counter()
    decode_s = (t2 - t1) - (t1 - t0)
    return (new_tokens - 1) / decode_s, out[0, len(ids) :].tolist()


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--lengths", type=int, nargs="+", default=[1024, 4096], help="prompt lengths in tokens")
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--threads", type=int, default=2, help="torch threads for the HF peer")
    p.add_argument("--json-out", type=Path, help="also write the results here as JSON")
    args = p.parse_args(argv)

    import torch
    import transformers

    from lsjax.config import GenerateConfig
    from lsjax.engine.host import Generator
    from lsjax.loading import load_model

    torch.set_num_threads(args.threads)
    model = load_model()
    hf = transformers.AutoModelForCausalLM.from_pretrained(
        model.path.parent, gguf_file=model.path.name, dtype=torch.float32, attn_implementation="sdpa"
    ).eval()
    gen_ar = Generator(model.config, model.params)
    gen = GenerateConfig(max_new_tokens=args.new_tokens, ignore_eos=True)
    bandwidth = measure_bandwidth()

    rows = []
    for length in args.lengths:
        prompt = stdlib_code_prompt(model.tokenizer, length)
        ids = model.tokenizer.encode(prompt.text)
        gen_ar.run(ids, gen)  # compile + warm up
        ours, theirs, same = [], [], True
        for _ in range(args.repeats):
            r = gen_ar.run(ids, gen)
            ours.append(r.tokens_per_s)
            tps, hf_tokens = run_hf(hf, ids, args.new_tokens)
            theirs.append(tps)
            same &= hf_tokens == r.tokens
        roof = bandwidth / bytes_per_token(model.config, len(ids) + args.new_tokens // 2)
        rows.append(
            dict(
                prompt_tokens=len(ids),
                lsjax_tok_s=max(ours),
                hf_tok_s=max(theirs),
                ratio=max(ours) / max(theirs),
                roofline_tok_s=roof,
                identical_tokens=same,
            )
        )

    print(f"AR decoding, {args.new_tokens} greedy tokens, best of {args.repeats}; bandwidth {bandwidth / 1e9:.1f} GB/s")
    print(f"{'prompt':>8} {'lsjax tok/s':>12} {'HF tok/s':>10} {'ratio':>7} {'roofline':>9} {'same tokens':>12}")
    for r in rows:
        print(
            f"{r['prompt_tokens']:>8} {r['lsjax_tok_s']:>12.1f} {r['hf_tok_s']:>10.1f} {r['ratio']:>6.2f}x "
            f"{r['roofline_tok_s']:>9.1f} {str(r['identical_tokens']):>12}"
        )
    if args.json_out:
        args.json_out.parent.mkdir(parents=True, exist_ok=True)
        args.json_out.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
