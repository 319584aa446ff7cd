"""The methods the harness compares, behind one small interface.

A method turns (prompt ids, GenerateConfig, seed) into an `Outcome`. lsjax methods wrap a `Generator`
(AR, PLD and LongSpec share one engine, so they differ only in the drafter); HF methods wrap
`transformers.generate` on the same GGUF weights (torch fp32, sdpa). Methods with `lossless=True` must
reproduce lsjax AR token for token at T=0; the harness enforces it.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Protocol

from lsjax.bench.profiling import state_nbytes, time_split
from lsjax.config import GenerateConfig
from lsjax.engine.host import Generator


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
    """The HF peer on the same GGUF file as lsjax (as in lsjax.bench.ar)."""
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
