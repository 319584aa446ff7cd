"""The methods the harness compares, behind one small interface, and AR against HF transformers.

A method turns (prompt ids, GenerateConfig, seed) into an `Outcome`. lsjax methods wrap a `Generator`
(AR, PLD and LongSpec share one engine, so they differ only in the drafter); HF methods wrap
`transformers.generate` on the same GGUF weights (torch fp32, sdpa). Methods with `lossless=True` must
reproduce lsjax AR token for token at T=0; the harness enforces it.

As a command, AR decoding of lsjax against HF's on the same prompts, with the memory-bandwidth roofline
(bytes read per token: weights + K/V cache at that context, over a measured copy bandwidth):

    python -m lsjax.bench.methods                      # ~1K and ~4K-token stdlib prompts, 128 greedy tokens
    python -m lsjax.bench.methods --lengths 1024 --new-tokens 64 --repeats 1

Both decode the same prompt greedily on the CPU (HF: 2 threads). Runs alternate lsjax / HF so machine noise
hits both; each cell reports the best of `--repeats`.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import time
from pathlib import Path
from typing import Protocol

import jax
import jax.numpy as jnp
import numpy as np

from lsjax import engine
from lsjax.config import GenerateConfig
from lsjax.engine.host import Generator
from lsjax.engine.profiling import time_split
from lsjax.prompts import stdlib_code_prompt


@dataclasses.dataclass
class Outcome:
    tokens: list[int]
    prefill_s: float
    decode_s: float
    compile_s: float = 0.0
    target_forwards: int | None = None  # prefill counts as one; None when the method does not expose it


class Method(Protocol):
    name: str
    lossless: bool  # held to T=0 equality with lsjax-ar
    speculative: bool  # has accepted lengths worth a histogram

    def run(self, ids: list[int], gen: GenerateConfig, seed: int) -> Outcome: ...


@dataclasses.dataclass
class LsjaxMethod:
    name: str
    generator: Generator
    speculative: bool
    lossless: bool = True
    # Overrides SamplingConfig.draft_sampling: "greedy" measures sample-and-match on the deterministic tree
    # against the default recursive rejection sampling on a sampled tree, same draft, same prompts.
    draft_sampling: str | None = None

    def _gen(self, gen: GenerateConfig) -> GenerateConfig:
        if self.draft_sampling is None:
            return gen
        sampling = dataclasses.replace(gen.sampling, draft_sampling=self.draft_sampling)
        return dataclasses.replace(gen, sampling=sampling)

    def run(self, ids, gen, seed):
        r = self.generator.run(ids, self._gen(gen), seed=seed)
        return Outcome(r.tokens, r.prefill_s, r.decode_s, r.compile_s, r.target_forwards)

    def step_tokens(self, ids, gen, seed) -> tuple[list[int], list[int]]:
        """Tokens emitted by each decode step (accepted + bonus), and the output, from a step-at-a-time rerun.

        Stepping from the host adds a sync per step, so this run is never the timed one; it reuses the
        compiled programs (the step limit is an argument), so it costs decode time but no compile.
        """
        chunks: list[list[int]] = []
        r = self.generator.run(ids, self._gen(gen), seed=seed, on_tokens=chunks.append, stream_every=1)
        return [len(c) for c in chunks[1:]], r.tokens  # chunks[0] is the token prefill emits

    def split(self, ids, gen, seed, steps: int) -> dict:
        return time_split(self.generator, ids, self._gen(gen), seed=seed, steps=steps)

    def state_nbytes(self, num_tokens: int, gen) -> dict[str, int]:
        return state_nbytes(self.generator, num_tokens, gen)


@dataclasses.dataclass
class HFMethod:
    """HF transformers `generate`; `lookup` > 0 turns on its prompt-lookup decoding with that many tokens."""

    name: str
    model: object
    lookup: int = 0
    speculative: bool = False
    lossless: bool = False  # another implementation in another framework: equality is reported, not enforced
    _stamps: list = dataclasses.field(default_factory=list)
    _warm: bool = False

    def __post_init__(self):
        # A forward hook counts target forwards (HF does not report them) and stamps the end of the prefill
        # forward, so decode time is measured from one generate call without a separate prefill run.
        self.model.register_forward_hook(lambda *_: self._stamps.append(time.perf_counter()))

    def run(self, ids, gen, seed):
        import torch

        s = gen.sampling
        kw = dict(max_new_tokens=gen.max_new_tokens, pad_token_id=2)
        if gen.ignore_eos:
            kw["min_new_tokens"] = gen.max_new_tokens
        if s.temperature > 0:
            # Explicit filters: HF's generation defaults (e.g. top_k=50) must not differ from lsjax's.
            kw.update(do_sample=True, temperature=s.temperature, top_k=s.top_k, top_p=s.top_p)
            if s.min_p > 0:
                kw["min_p"] = s.min_p
        else:
            kw.update(do_sample=False)
        if self.lookup:
            kw["prompt_lookup_num_tokens"] = self.lookup
        if not self._warm:
            # torch's first generate pays one-off setup (lazy init, allocator growth); lsjax's compile is excluded
            # from its timings, so the peer gets an untimed warm-up on a short prefix with the same options.
            with torch.no_grad():
                self.model.generate(torch.tensor([ids[:64]]), **{**kw, "max_new_tokens": 4, "min_new_tokens": 4})
            self._warm = True
        torch.manual_seed(seed)
        self._stamps.clear()
        with torch.no_grad():
            t0 = time.perf_counter()
            out = self.model.generate(torch.tensor([ids]), **kw)
            t1 = time.perf_counter()
        prefill_end = self._stamps[0] if self._stamps else t1
        return Outcome(out[0, len(ids) :].tolist(), prefill_end - t0, t1 - prefill_end, 0.0, len(self._stamps))


def load_hf(model, threads: int = 2):
    """The HF peer on the same GGUF file as lsjax."""
    import torch
    import transformers

    torch.set_num_threads(threads)
    return transformers.AutoModelForCausalLM.from_pretrained(
        model.path.parent, gguf_file=model.path.name, dtype=torch.float32, attn_implementation="sdpa"
    ).eval()


def parse_variant(spec: str) -> tuple[str, tuple[str, dict]]:
    """ "name=method:key=value,..." -> (name, (method, options)); values are ints, floats, '/'-tuples or text."""
    name, sep, rest = spec.partition("=")
    method, _, opts = rest.partition(":")
    if not sep or not name or not method:
        raise ValueError("expected NAME=METHOD[:key=value,...]")

    def value(text: str):
        parts = text.split("/")
        if len(parts) > 1 and all(x.strip().isdigit() for x in parts):  # widths 1/2/4; a path stays text
            return tuple(int(x) for x in parts)
        for kind in (int, float):
            try:
                return kind(text)
            except ValueError:
                pass
        return text

    options = {}
    for item in filter(None, opts.split(",")):
        k, eq, v = item.partition("=")
        if not eq:
            raise ValueError(f"option {item!r} is not key=value")
        options[k] = value(v)
    return name, (method, options)


def state_nbytes(generator: Generator, prompt_len: int, gen: GenerateConfig) -> dict[str, int]:
    """Bytes of the decode state for a prompt of this length: the target's KV cache and the drafter's own
    state (ring cache, token history; 0 for AR). Shapes are static, so this is also their peak."""
    gen = dataclasses.replace(gen, max_new_tokens=min(gen.max_new_tokens, generator.config.max_position - prompt_len))
    bucket = engine.prompt_bucket(prompt_len)
    capacity = engine.required_capacity(bucket, gen, generator.drafter)
    shape = jax.eval_shape(
        functools.partial(
            engine.start,
            config=engine.SpecConfig(
                generator.config, gen, generator.drafter, capacity=capacity, backend=generator.backend
            ),
        ),
        generator.params,
        generator.draft_params,
        tokens=jax.ShapeDtypeStruct((1, bucket), jnp.int32),
        lengths=jax.ShapeDtypeStruct((1,), jnp.int32),
        key=jax.random.key(0),
    )

    def nbytes(tree) -> int:
        return int(sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(tree)))

    return {"kv_cache": nbytes(shape.cache), "draft": nbytes(shape.draft)}


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
    """AR decoding, lsjax against HF transformers (the module's command)."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--lengths", type=int, nargs="+", default=[1024, 4096], help="prompt lengths in tokens")
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--threads", type=int, default=2, help="torch threads for the HF peer")
    p.add_argument("--json-out", type=Path, help="also write the results here as JSON")
    args = p.parse_args(argv)

    from lsjax.loading import load_model

    model = load_model()
    hf = load_hf(model, args.threads)
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
