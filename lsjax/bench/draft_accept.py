"""What a draft would accept, teacher-forced on the target's own continuations: no decode timing.

    python -m lsjax.bench.draft_accept                                   # the shipped draft, dev 1K-4K
    python -m lsjax.bench.draft_accept --draft A --draft B --suite dev --buckets 1K-2K
    python -m lsjax.bench.draft_accept --method eagle3 --draft DIR --prompts my.jsonl --dump top5.jsonl
    python -m lsjax.bench.draft_accept --method dflash --draft DIR

`--method longspec` (default) measures LongSpec drafts, `--method eagle3` EAGLE-3 drafts in either published
layout (`--draft random`: an untrained one), `--method tokenswift` TokenSwift heads (lsjax's or a release;
`--draft shipped` or `zero`), `--method dflash` DFlash drafts (`--draft random`: an untrained one). Prompts come
from a suite or a JSONL file (`--prompts`, lines of {"id", "prompt"[, "chat"]}).

Per prompt and temperature the target writes `--new-tokens` with AR (seed 0); then one target pass and a few
draft passes over prompt + continuation give, at every root of the continuation:

- T = 0: whether the draft's first child is the next token of the (greedy) continuation (`first`), whether
  one of its top two is (`top2`), and a k-token greedy chain's expected tokens per verification (`chain2`,
  `chain4`: 1 + the depths accepted). Depth d of a chain is the draft at the root's (d - 1)-th successor
  with the target's cache d tokens behind (cross-attention lag d), which is what a chain drafts there once
  depths 1 .. d - 1 matched.
- T > 0: the probability that rejection sampling accepts a child drawn from the draft's q (`sampled`:
  sum_x min(p(x), q(x)), p and q at that temperature, q over the draft's vocabulary), that recursive rejection
  sampling accepts one of two children drawn from q without replacement (`sampled2`: what a two-wide sampled
  first level buys, `two_wide`), and that a deterministic child (q's argmax) matches the target's draw
  (`match`: p(argmax q)).

Each root's value is exact (T = 0: what a proposal there accepts, tested against `propose`; T > 0: the
acceptance probability itself, not a draw), so two drafts compared on the same continuations differ by what
the drafts do, not by timing noise: one pass per prompt where a decode benchmark needs rounds. The draft's
self-attention here is the training band of `window` keys (the ring at decode time holds up to a tree's depth
more). Dev split by default: the held-out one is for reporting.

EAGLE-3 drafts: one target pass gives the residual streams entering the draft's three target layers at every
position; one draft pass runs the pairs (streams at t, token t + 1) at positions t, causal, with the draft's own
K/V of every earlier pair (as decoding keeps them). The proposal at root r (the token at position r, not yet in
the target's cache) is the draft's output at the pair (streams at r - 1, token r): the first level of the tree
`propose` would grow there. `first`/`top2` and the T > 0 keys are as above (q over the draft vocabulary, p
restricted to it through d2t); `chain2`/`chain4` feed the draft its own states back as a chain does, through the
training-time test's unrolled forward (`eagle3_chains`); a dump line also has `chain_top_ids` and
`chain_top_logits` [root][depth 1 .. 4][5], what a chain drafts at each depth once the depths before matched.

TokenSwift heads: one target pass gives its last hidden state h (before the final norm) at every position. The
proposal at root r is head 1 on h at r - 1, the last node verification accepted (the `verified` draft pass: the
target's own head there sampled the root, head 1 guesses the token after it); `first`/`top2` and the T > 0 keys as
above over the whole vocabulary; the deeper heads' chain is not given.

DFlash drafts: one target pass gives the streams the draft reads at every position, one draft pass their context
K/V; then the block [root, MASK, ...] at each root runs over the context before it (what `propose` drafts there:
`lsjax.methods.dflash.drafter.teacher_forced_blocks`). `first`/`top2` and the T > 0 keys are block position 1's;
`chain2`/`chain4` are exact (the block's positions do not depend on one another's tokens: the chain at a root is
the block's top-1 at every position).

`--dump FILE` writes one JSON line per prompt (at T = 0): `tokens` (prompt + the target's greedy continuation),
`roots` (the root positions), and at each root the draft's first-level `top_ids` (target token ids, best first) and
`top_logits` (the draft's raw logits), five each, teacher-forced as described above: what another implementation
of the same draft, fed the same target states and tokens, should propose. A DFlash line also has, at each root,
`block_top_ids` and `block_top_logits` [block position 1 .. s - 1][5]: the same at every position of the block
(its first row is `top_ids`/`top_logits`).
"""

from __future__ import annotations

import argparse
import json

import numpy as np

T0_KEYS = ("first", "top2", "chain2", "chain4")
DUMP_TOP = 5  # proposals per root in a --dump
# What an estimator returns for the dump beside its per-root means: per root [new, DUMP_TOP]; `block_` per root
# and block position [new, s - 1, DUMP_TOP] (DFlash only); `chain_` per root and chain depth [new, 4, DUMP_TOP]
# (EAGLE-3 only).
DUMP_KEYS = ("top_ids", "top_logits", "block_top_ids", "block_top_logits", "chain_top_ids", "chain_top_logits")
T1_KEYS = ("sampled", "sampled2", "match")
PAD = 1024  # sequences are padded to a multiple of this: one compiled program per padded length


def two_wide(p_in, q):
    """[...] the probability that recursive rejection sampling (`lsjax.engine.verify`) accepts one of two
    children drawn from q without replacement, given p_in [..., Vd] (the target's p on the draft's vocabulary,
    its mass outside it left out) and q [..., Vd] (sums to 1).

    The first child c is accepted with probability min(1, p(c)/q(c)), on average a1 = sum min(p, q). Rejected,
    the residual is r = max(p - q, 0) / (1 - a1) whatever c was (and r(c) = 0: only a c with p(c) < q(c) is
    ever rejected), the second child is drawn from q without c, q(x) s with s = 1 / (1 - q(c)), and accepted
    with probability f(s) = sum_x min(r(x), s q(x)). So the answer is a1 + sum_c max(q(c) - p(c), 0) f(1 / (1 -
    q(c))); f at every s comes from the ratios r/q sorted once: f(s) = sum of r where r/q <= s, plus s times
    the sum of q where r/q > s."""
    import jax
    import jax.numpy as jnp

    def one(p, q):
        a1 = jnp.sum(jnp.minimum(p, q))
        r = jnp.maximum(p - q, 0.0) / jnp.maximum(1.0 - a1, 1e-12)
        ratio = jnp.where(q > 0, r / jnp.where(q > 0, q, 1.0), jnp.inf)  # q underflows to 0 in a long fp32 tail
        order = jnp.argsort(ratio)
        ratio, r_s, q_s = ratio[order], r[order], q[order]
        r_below = jnp.concatenate([jnp.zeros(1), jnp.cumsum(r_s)])  # r summed over the i smallest ratios
        q_above = jnp.sum(q_s) - jnp.concatenate([jnp.zeros(1), jnp.cumsum(q_s)])
        s = 1.0 / jnp.maximum(1.0 - q, 1e-12)
        i = jnp.searchsorted(ratio, s, side="right")
        return a1 + jnp.sum(jnp.maximum(q - p, 0.0) * (r_below[i] + s * q_above[i]))

    flat = jax.vmap(one)(p_in.reshape(-1, p_in.shape[-1]), q.reshape(-1, q.shape[-1]))
    return flat.reshape(p_in.shape[:-1])


def first_level(
    target_params, config, draft_params, draft_config, tokens, new: int, temperature: float, length=None, depth=4
):
    """Per-root acceptance estimates [new] of one sequence: tokens [1, T], its first `length` (an int32 array;
    default T) real, the last `new` of those the target's continuation (at T = 0 its greedy one) of the ones
    before: padding after them changes nothing (everything here is causal), so one compiled program serves
    every prompt of a padded length. The roots are positions length - new - 1 .. length - 2.
    Returns the module doc's keys for the temperature (T = 0: T0_KEYS; else T1_KEYS), each [new] float32."""
    import jax
    import jax.numpy as jnp

    from lsjax.methods.longspec import model as draft_lib
    from lsjax.models.draft_params import DraftParams
    from lsjax.train.features import target_features, target_logits

    dp = DraftParams.of(draft_params)
    vocab_ids = dp.vocab_ids
    T = tokens.shape[1]
    length = jnp.int32(T) if length is None else length
    pos = jnp.arange(T)[None]
    feats = target_features(target_params, config, tokens, pos)
    first = length - new - 1

    def roots(x):  # x [1, T, ...] -> [1, new, ...] at the roots
        return jax.lax.dynamic_slice_in_dim(x, first, new, axis=1)

    net = draft_lib.LongSpecDraft(config, draft_config).bind({"params": dp.weights})

    def draft_at(shift):  # [new, Vd] logits at the roots, target cache `shift` tokens behind each
        h = net.forward_train(target_params, tokens, pos, feats["k"], feats["v"], jnp.int32(shift))
        return net.logits(target_params, roots(h), vocab_ids, dp.vocab_head)[0]

    def to_ids(local):
        return local if vocab_ids is None else jnp.take(jnp.asarray(vocab_ids), local)

    q_logits = draft_at(1)
    top_logits, top_local = jax.lax.top_k(q_logits, DUMP_TOP)
    dump = {"top_ids": to_ids(top_local), "top_logits": top_logits}
    if temperature == 0:
        y = jax.lax.dynamic_slice_in_dim(tokens[0], first + 1, new)  # at T = 0 a child is accepted iff it is next
        _, top = jax.lax.top_k(q_logits, 2)
        hit = [to_ids(top[:, 0]) == y]
        for d in range(2, depth + 1):  # depth d at root r: the draft at r + d - 1, lag d, must give y[r + d - 1]
            g = to_ids(jnp.argmax(draft_at(d), axis=-1)) == y
            hit.append(jnp.concatenate([g[d - 1 :], jnp.zeros((d - 1,), bool)]))
        run = jnp.cumprod(jnp.stack(hit).astype(jnp.float32), axis=0)  # [depth, new]: depths 1 .. d all match
        # The last roots lack the successors a deep chain needs: those depths count as unmatched.
        return {
            "first": run[0],
            "top2": jnp.any(to_ids(top) == y[:, None], axis=-1).astype(jnp.float32),
            "chain2": 1.0 + jnp.sum(run[:2], axis=0),
            "chain4": 1.0 + jnp.sum(run[:4], axis=0),
        } | dump
    p_logits = target_logits(target_params, config, roots(feats["hidden"]), None)[0]  # [new, V]
    return _sampled_keys(p_logits, q_logits, None if vocab_ids is None else jnp.asarray(vocab_ids), temperature) | dump


def target_streams(target_params, config, tokens, layers: tuple[int, ...]):
    """The target on tokens [1, T] (a plain causal forward, no cache): (the residual streams entering `layers`
    at every position, concatenated [1, T, len * D] in the model's dtype; the final hidden state [1, T, D], fp32)."""
    import jax.numpy as jnp

    from lsjax.cache import KVCache
    from lsjax.models import target

    pos = jnp.arange(tokens.shape[1])[None]
    net = target.Transformer(config).bind({"params": target_params})
    x, _, _, streams = net.streams(tokens, pos, KVCache.zeros(config, 1, 0), layers)
    return streams.astype(jnp.dtype(config.dtype)), x


def tokenswift_first_level(
    target_params, config, heads_params, heads, tokens, new: int, temperature: float, length=None
):
    """`first_level` for TokenSwift heads (`heads`: their HeadsConfig): head 1 at every root (module doc)."""
    import jax
    import jax.numpy as jnp

    from lsjax.cache import KVCache
    from lsjax.methods.tokenswift import model as th
    from lsjax.models import target

    T = tokens.shape[1]
    length = jnp.int32(T) if length is None else length
    pos = jnp.arange(T)[None]
    net = target.Transformer(config)
    x, _, _ = net.apply({"params": target_params}, tokens, pos, KVCache.zeros(config, 1, 0), method="hidden")
    first = length - new - 1
    h = jax.lax.dynamic_slice_in_dim(x, first - 1, new, axis=1)[0].astype(jnp.dtype(config.dtype))
    q_logits = th.TokenSwiftHeads(config, heads).apply({"params": heads_params}, h, target_params)[:, 0]  # [new, V]
    return _one_level(target_params, config, tokens, x, first, new, q_logits, None, temperature)


def eagle3_first_level(target_params, config, draft_params, draft, tokens, new: int, temperature: float, length=None):
    """`first_level` for an EAGLE-3 draft (`draft`: its Eagle3Config): per-root estimates [new] of tokens [1, T]
    whose first `length` are real, the roots at positions length - new - 1 .. length - 2 (module doc)."""
    import jax
    import jax.numpy as jnp

    from lsjax.cache import KVCache
    from lsjax.methods.eagle3 import model as em

    T = tokens.shape[1]
    length = jnp.int32(T) if length is None else length
    pos = jnp.arange(T)[None]
    aux, x = target_streams(target_params, config, tokens, draft.aux_layers)
    pairs = jnp.concatenate([tokens[:, 1:], jnp.zeros((1, 1), tokens.dtype)], axis=1)
    dcache = KVCache.zeros(draft.layer, 1, 0)
    attend = em.attend_over(dcache.k, dcache.v, jnp.zeros((1,), jnp.int32), backend="auto")
    run, variables = em.Eagle3Draft(draft).apply, {"params": draft_params}
    h, _, _ = run(variables, aux, pairs, pos, attend, None if draft.own_embed else target_params["embed"])
    first = length - new - 1
    q_logits = run(variables, jax.lax.dynamic_slice_in_dim(h, first - 1, new, axis=1), method="logits")[0]
    out = _one_level(
        target_params, config, tokens, x, first, new, q_logits, draft_params["draft_to_target"], temperature
    )
    if temperature == 0:
        out |= eagle3_chains(target_params, draft_params, draft, aux, tokens, first, new, length)
    return out


def eagle3_chains(target_params, draft_params, draft, aux, tokens, first, new: int, length, depth: int = 4) -> dict:
    """`chain2`/`chain4` of an EAGLE-3 draft at the roots first .. first + new - 1: depth j of the chain at root r
    is the draft fed its own state of depth j - 1 and the token r + j - 1, attending to the real pairs before r
    and its own states of the depths before: the training-time test's unrolled forward
    (`lsjax.methods.eagle3.train.ttt_forward`), teacher-forced, which is what a chain drafts there once depths
    1 .. j - 1 matched."""
    import jax
    import jax.numpy as jnp

    from lsjax.methods.eagle3 import model as em
    from lsjax.methods.eagle3.train import ttt_forward

    T = tokens.shape[1]
    outs = ttt_forward(draft_params, draft, aux, tokens, em.embed_rows(draft_params, target_params), depth)
    logits_of = em.Eagle3Draft(draft).apply
    hits, tops = [], []
    for j, h in enumerate(outs):
        q = logits_of(
            {"params": draft_params}, jax.lax.dynamic_slice_in_dim(h, first - 1, new, axis=1), method="logits"
        )
        guess = jnp.take(draft_params["draft_to_target"], jnp.argmax(q[0], axis=-1))
        at = first + 1 + j + jnp.arange(new)  # the token depth j + 1 guesses
        hits.append((guess == jnp.take(tokens[0], jnp.minimum(at, T - 1))) & (at < length))
        tops.append(jax.lax.top_k(q[0], DUMP_TOP))
    run = jnp.cumprod(jnp.stack(hits, axis=1).astype(jnp.float32), axis=1)
    out = {f"chain{k}": 1.0 + jnp.sum(run[:, :k], axis=1) for k in (2, 4) if k <= depth}
    out["chain_top_logits"] = jnp.stack([v for v, _ in tops], axis=1)  # [new, depth, DUMP_TOP]
    ids = jnp.stack([i for _, i in tops], axis=1)
    out["chain_top_ids"] = jnp.take(draft_params["draft_to_target"], ids).astype(jnp.int32)
    return out


def dflash_first_level(target_params, config, draft_params, draft, tokens, new: int, temperature: float, length=None):
    """`first_level` for a DFlash draft (`draft`: its DFlashConfig): per-root estimates [new] (module doc)."""
    import jax
    import jax.numpy as jnp

    from lsjax.methods.dflash.drafter import teacher_forced_blocks

    T = tokens.shape[1]
    length = jnp.int32(T) if length is None else length
    first = length - new - 1
    logits, x = teacher_forced_blocks(target_params, config, draft_params, draft, tokens, first, new)  # [new, D, V]
    out = _one_level(target_params, config, tokens, x, first, new, logits[:, 0], None, temperature)
    block_logits, block_ids = jax.lax.top_k(logits, DUMP_TOP)
    out |= {"block_top_ids": block_ids.astype(jnp.int32), "block_top_logits": block_logits}
    if temperature == 0:
        D = logits.shape[1]
        at = first + 1 + jnp.arange(new)[:, None] + jnp.arange(D)[None]  # [new, D]: the token each position guesses
        hit = (jnp.argmax(logits, axis=-1) == jnp.take(tokens[0], jnp.minimum(at, T - 1))) & (at < length)
        run = jnp.cumprod(hit.astype(jnp.float32), axis=1)
        out |= {f"chain{k}": 1.0 + jnp.sum(run[:, :k], axis=1) for k in (2, 4) if k <= D}
    return out


def _one_level(target_params, config, tokens, final, first, new: int, q_logits, to_target, temperature: float):
    """The module doc's keys at the roots first .. first + new - 1 from a draft's first-level logits q_logits
    [new, Vd] (draft id i is target id to_target[i]; None: the target's ids), the target's final hidden states
    [1, T, D] and the tokens [1, T]; plus the dump's top ids (target ids) and logits."""
    import jax
    import jax.numpy as jnp

    from lsjax.models import target

    top_logits, top_local = jax.lax.top_k(q_logits, DUMP_TOP)
    ids = top_local if to_target is None else jnp.take(to_target, top_local)
    dump = {"top_ids": ids.astype(jnp.int32), "top_logits": top_logits}
    if temperature == 0:
        y = jax.lax.dynamic_slice_in_dim(tokens[0], first + 1, new)
        top2 = jnp.any(ids[:, :2] == y[:, None], axis=-1).astype(jnp.float32)
        return {"first": (ids[:, 0] == y).astype(jnp.float32), "top2": top2} | dump
    at_roots = jax.lax.dynamic_slice_in_dim(final, first, new, axis=1)
    p_logits = target.Transformer(config).apply({"params": target_params}, at_roots, method="logits")[0]  # [new, V]
    return _sampled_keys(p_logits, q_logits, to_target, temperature) | dump


def _sampled_keys(p_logits, q_logits, draft_ids, temperature: float) -> dict:
    """The T > 0 keys (module doc) from the target's logits [new, V] and the draft's [new, Vd] at the roots; draft
    id i is target id draft_ids[i] (None: the same ids). p is kept on the draft's vocabulary, its mass outside
    left out."""
    import jax
    import jax.numpy as jnp

    p = jax.nn.softmax(p_logits / temperature, axis=-1)
    p_in = p if draft_ids is None else p[:, draft_ids]
    q = jax.nn.softmax(q_logits / temperature, axis=-1)
    best = jnp.argmax(q_logits, axis=-1)
    return {
        "sampled": jnp.sum(jnp.minimum(p_in, q), axis=-1),
        "sampled2": two_wide(p_in, q),
        "match": jnp.take_along_axis(p_in, best[:, None], axis=-1)[:, 0],
    }


def summarize(rows: list[dict]) -> dict:
    """{(draft, T): {key: mean over prompts}} of the per-prompt rows."""
    out: dict = {}
    for r in rows:
        out.setdefault((r["draft"], r["T"]), []).append(r)

    def keys(k, v):  # rows written before a key existed (`sampled2`) lack it
        return [m for m in (T0_KEYS if k[1] == 0 else T1_KEYS) if all(m in r for r in v)]

    return {k: {m: float(np.mean([r[m] for r in v])) for m in keys(k, v)} | {"prompts": len(v)} for k, v in out.items()}


def main(argv=None) -> int:
    from lsjax.prompts import BUCKETS, TASKS

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--method",
        choices=("longspec", "eagle3", "tokenswift", "dflash"),
        default="longspec",
        help="whose drafts (longspec)",
    )
    p.add_argument(
        "--draft",
        action="append",
        help="a draft directory, `shipped` (longspec) or `random` (eagle3, dflash); repeat to compare (default: "
        "shipped)",
    )
    p.add_argument("--prompts", metavar="FILE", help='a JSONL file of {"id", "prompt"[, "chat"]} instead of a suite')
    p.add_argument(
        "--dump",
        metavar="FILE",
        help="write each prompt's tokens and per-root top-5 proposals here (dflash: at every block position)",
    )
    p.add_argument("--suite", choices=("dev", "heldout"), default="dev")
    p.add_argument("--tasks", nargs="+", choices=TASKS, default=list(TASKS))
    p.add_argument("--buckets", nargs="+", choices=list(BUCKETS), default=["1K-2K", "2K-4K"])
    p.add_argument("--per-cell", type=int, default=1)
    p.add_argument("--temperatures", nargs="+", type=float, default=[0.0, 1.0])
    p.add_argument("--new-tokens", type=int, default=96, help="the continuation's length (roots per prompt)")
    p.add_argument("--json", metavar="FILE", help="also write every prompt's row here")
    args = p.parse_args(argv)
    if args.new_tokens < 8:
        p.error(f"--new-tokens: must be >= 8, got {args.new_tokens}")
    if args.per_cell < 1:
        p.error(f"--per-cell: must be >= 1, got {args.per_cell}")
    if any(t < 0 for t in args.temperatures):
        p.error(f"--temperatures: must be >= 0, got {args.temperatures}")
    from pathlib import Path

    if args.method == "eagle3" and not args.draft:
        p.error("--method eagle3 needs --draft DIR (an EAGLE-3 draft in either published layout) or --draft random")
    if args.method == "dflash" and not args.draft:
        p.error("--method dflash needs --draft DIR (a DFlash draft as published) or --draft random")
    for d in args.draft or []:  # before the model loads
        if d not in ("shipped", "random", "zero") and not Path(d).is_dir():
            p.error(f"--draft {d}: no such directory (a draft directory, or `shipped`)")
    if args.prompts and not Path(args.prompts).is_file():
        p.error(f"--prompts {args.prompts}: no such file")

    import jax
    import jax.numpy as jnp

    from lsjax.config import GenerateConfig, SamplingConfig
    from lsjax.engine.host import Generator
    from lsjax.errors import LsjaxError
    from lsjax.loading import load_model
    from lsjax.methods import registry
    from lsjax.methods.longspec.checkpoint import load_longspec
    from lsjax.models import target
    from lsjax.prompts import encode, load_suite

    model = load_model()
    drafts = {}
    for d in args.draft or ["shipped"]:
        try:
            if args.method == "eagle3":
                drafter, dp = registry.build("eagle3", model, draft=d)
            elif args.method == "dflash":
                drafter, dp = registry.build("dflash", model, draft=d)
            elif args.method == "tokenswift":
                drafter, dp = registry.build("tokenswift", model, draft=None if d == "shipped" else d)
                dp = jax.tree.map(jnp.asarray, dp)
            else:
                drafter, dp = load_longspec(model, None if d == "shipped" else d, "1")
        except LsjaxError as e:
            p.error(f"--draft {d}: {e}")
        drafts[d] = (drafter.heads if args.method == "tokenswift" else drafter.draft, dp)
    ar = Generator(
        model.config,
        jax.tree.map(jnp.asarray, target.prepare_for_decode(model.params, model.config)),
        *registry.build("ar", model),
    )
    tp = jax.tree.map(jnp.asarray, model.params)
    one = {
        "longspec": first_level,
        "eagle3": eagle3_first_level,
        "tokenswift": tokenswift_first_level,
        "dflash": dflash_first_level,
    }[args.method]
    measure = jax.jit(
        lambda dp, toks, n, temperature, dcfg: one(tp, model.config, dp, dcfg, toks, args.new_tokens, temperature, n),
        static_argnums=(3, 4),
    )
    rows = []
    try:
        prompts = load_suite(model.tokenizer, args.suite, args.prompts, args.per_cell, args.tasks, args.buckets)
    except LsjaxError as e:
        p.error(str(e))
    dump = open(args.dump, "w") if args.dump else None  # noqa: SIM115 (written prompt by prompt)
    source = args.prompts or args.suite
    print(f"{len(prompts)} {source} prompts, {args.new_tokens} roots each, T in {args.temperatures}", flush=True)
    for prompt in prompts:
        ids = encode(model.tokenizer, prompt)
        for temp in args.temperatures:
            gen = GenerateConfig(args.new_tokens, SamplingConfig(temperature=temp), ignore_eos=True)
            cont = ar.run(ids, gen, seed=0).tokens[: args.new_tokens]
            seq = ids + cont
            toks = np.zeros((1, -(-len(seq) // PAD) * PAD), np.int32)
            toks[0, : len(seq)] = seq
            for name, (dcfg, dp) in drafts.items():
                got = measure(dp, jnp.asarray(toks), jnp.int32(len(seq)), float(temp), dcfg)
                top = {k: np.asarray(got.pop(k)) for k in DUMP_KEYS if k in got}
                if dump is not None and temp == 0:
                    first = len(seq) - args.new_tokens - 1
                    entry = {"id": prompt.id, "method": args.method, "draft": name, "tokens": [int(t) for t in seq]}
                    entry["roots"] = list(range(first, first + args.new_tokens))
                    for k, v in top.items():
                        entry[k] = np.round(v, 5).tolist() if k.endswith("logits") else v.tolist()
                    dump.write(json.dumps(entry) + "\n")
                    dump.flush()
                row = {"prompt": prompt.id, "draft": name, "T": temp}
                row |= {k: round(float(np.mean(np.asarray(v))), 4) for k, v in got.items()}
                rows.append(row)
                vals = "  ".join(f"{k} {v:.3f}" for k, v in row.items() if k not in ("prompt", "draft", "T"))
                print(f"{prompt.id:26s} T={temp:g}  {name:10s} {vals}", flush=True)
    for (name, temp), means in summarize(rows).items():
        vals = "  ".join(f"{k} {v:.3f}" for k, v in means.items() if k != "prompts")
        print(f"{'mean of ' + str(means['prompts']):26s} T={temp:g}  {name:10s} {vals}")
    if dump is not None:
        dump.close()
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"suite": args.suite, "new_tokens": args.new_tokens, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
