"""Training DeLS-Spec's local head without the target (`train.py` with `kind: local_head`).

Data: `data.sources` as plain text plus `dels.chat_sources` rendered with the chat template (loss on
assistant tokens only), packed into sequences of `data.seq_len`. The unigram prior is counted over the same
loss-carrying tokens once, before training, and stored with the head (`lsjax.methods.dels.local_head`).

Loss (the paper's eq. 9): block-local next-token cross-entropy. Each step cuts every sequence into
consecutive blocks of `local_head.block_size` tokens starting at a random phase, so block starts move from
step to step; the GRU restarts from zeros at every block start, and position j of a block predicts token
j + 1 from tokens 0..j of that block only, weighted by exp(-j / dels.decay_gamma). The Markov head reads one
token, so it trains densely on every position (the paper's "dense supervision") with flat weights. The
vocabulary projection goes through the target's frozen tied embedding, in chunks of `loss.chunk_size`
positions so [positions, V] logits are never held whole.

Export (`train.py --config ... --export DIR`) writes the head in float16 with its prior
(`lsjax.methods.dels.checkpoint`).
"""

from __future__ import annotations

import dataclasses
import json

import jax
import jax.numpy as jnp
import numpy as np

from lsjax.config import ModelConfig
from lsjax.methods.dels import local_head as lh
from lsjax.methods.dels.train_config import DelsTrainConfig
from lsjax.vocab import pruned_vocab, vocab_index


def load_data(cfg: DelsTrainConfig, tokenizer, eos: int, vocab_size: int, *, split: str = "train", log=print):
    """Packed (tokens, loss_mask) [S, T]: plain-text sources, then chat sources (assistant tokens carry loss)."""
    from lsjax.train import data as data_lib

    parts = []
    d = dataclasses.replace(cfg.data, split=split)
    if d.sources:
        parts.append(data_lib.load_sequences(d, tokenizer, eos, vocab_size, log=log))
    if cfg.dels.chat_sources:
        dc = dataclasses.replace(d, sources=cfg.dels.chat_sources, chat=True)
        parts.append(data_lib.load_sequences(dc, tokenizer, eos, vocab_size, log=log))
    return np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])


def split_blocks(tokens: jax.Array, mask: jax.Array, phase: jax.Array, block_size: int):
    """tokens, mask [B, T]; phase [B] in [0, s) -> blocks [B * nb, s] and their masks, nb = T // s - 1:
    block k of row b is tokens[b, phase + k s : phase + (k + 1) s]."""
    B, T = tokens.shape
    nb = T // block_size - 1
    idx = phase[:, None] + jnp.arange(nb * block_size)[None]
    blocks = jnp.take_along_axis(tokens, idx, axis=1).reshape(B * nb, block_size)
    return blocks, jnp.take_along_axis(mask, idx, axis=1).reshape(B * nb, block_size)


def position_weights(cfg: DelsTrainConfig, length: int) -> jax.Array:
    """Weight of the prediction from block position j (j = 0: after the block's first token)."""
    g = cfg.dels.decay_gamma
    if cfg.local_head.kind == "markov" or g == 0:
        return jnp.ones((length,), jnp.float32)
    return jnp.exp(-jnp.arange(length, dtype=jnp.float32) / g)


def chunked_ce(r: jax.Array, labels, weights, w_out, embed_rows, index, chunk: int) -> dict:
    """Sums of CE, correct argmax and weight over positions: r [P, rank] -> logits E (r W_out)^T in chunks.
    `index` maps full-vocabulary labels into `embed_rows` (-1 outside: weight 0), or None."""
    P = r.shape[0]
    C = min(chunk, P)
    n = -(-P // C)
    pad = n * C - P
    xs = {
        "r": jnp.pad(r, ((0, pad), (0, 0))).reshape(n, C, -1),
        "y": jnp.pad(labels, (0, pad)).reshape(n, C),
        "w": jnp.pad(weights, (0, pad)).reshape(n, C),
    }

    @jax.checkpoint
    def one(c):
        logits = (c["r"] @ w_out) @ embed_rows.T  # [C, V]
        y = c["y"] if index is None else index[c["y"]]
        w = c["w"] * (y >= 0)
        logp = jax.nn.log_softmax(logits, axis=-1)
        picked = jnp.take_along_axis(logp, jnp.maximum(y, 0)[:, None], axis=1)[:, 0]
        correct = (jnp.argmax(logits, axis=-1) == y) * w
        return {"ce": -jnp.sum(picked * w), "correct": jnp.sum(correct), "weight": jnp.sum(w)}

    return jax.tree.map(lambda a: jnp.sum(a, axis=0), jax.lax.map(one, xs))


def local_head_losses(params, cfg: DelsTrainConfig, embed, embed_rows, index, tokens, mask, phase) -> dict:
    """One micro-batch tokens, mask [B, T] at block phases [B] -> loss sums."""
    hc = cfg.local_head
    if hc.kind == "markov":
        blocks, bmask = tokens, mask  # one token of context: block starts do not matter, every position trains
    else:
        blocks, bmask = split_blocks(tokens, mask, phase, hc.block_size)
    head = lh.LocalHead(hc, embed.shape[-1])
    r = head.apply({"params": params}, embed, blocks, method="block_states")[:, :-1]  # position j predicts j + 1
    weights = bmask[:, 1:].astype(jnp.float32) * position_weights(cfg, r.shape[1])[None]
    return chunked_ce(
        r.reshape(-1, r.shape[-1]),
        blocks[:, 1:].reshape(-1),
        weights.reshape(-1),
        params["w_out"],
        embed_rows,
        index,
        cfg.loss.chunk_size,
    )


def make_step(cfg: DelsTrainConfig, optimizer):
    """`(state, consts, batch, key) -> (state, metrics)` with consts = (embed, embed_rows, index)."""
    import optax

    from lsjax.train.step import TrainState, apply_grads, lr_schedule

    schedule = lr_schedule(cfg.optim)
    s = cfg.local_head.block_size

    def step(state: TrainState, consts, batch, key):
        embed, rows, index = consts
        A, B = batch["tokens"].shape[:2]
        phases = jax.random.randint(key, (A, B), 0, s)

        def total(p):
            sums = [
                local_head_losses(p, cfg, embed, rows, index, batch["tokens"][a], batch["loss_mask"][a], phases[a])
                for a in range(A)
            ]
            sums = jax.tree.map(lambda *x: sum(x), *sums)
            return sums["ce"] / jnp.maximum(sums["weight"], 1.0), sums

        # One gradient of the whole step's loss: its normaliser (the weight of every micro-batch) is a sum the
        # forward computes.
        (loss, sums), grads = jax.value_and_grad(total, has_aux=True)(state.params)
        new_state = apply_grads(state, grads, optimizer)
        metrics = {
            "loss": loss,
            "acc": sums["correct"] / jnp.maximum(sums["weight"], 1.0),
            "loss_tokens": sums["weight"],
            "grad_norm": optax.tree.norm(grads),
            "lr": schedule(state.step),
        }
        return new_state, metrics

    return step


def embed_rms(embed) -> float:
    return float(jnp.sqrt(jnp.mean(jnp.square(jnp.asarray(embed, jnp.float32)))))


def fit_local_head(cfg: DelsTrainConfig, **run) -> dict:
    """Runs (or resumes) a local-head run (`lsjax.train.runner.fit`); the unigram prior (`out["prior"]`) and,
    at the end, the dev loss (`out["dev"]`, dev.json) come with it."""
    from lsjax.train.runner import fit

    prior: list = []
    out = fit(cfg, lambda cfg, open_run_dir, log: _setup(cfg, open_run_dir, log, prior), **run)
    out["prior"] = prior[0]
    return out


def _setup(cfg: DelsTrainConfig, open_run_dir, log, prior_out: list):
    from lsjax.train import data as data_lib
    from lsjax.train.inputs import GrainBatches, eos_id, load_target
    from lsjax.train.runner import Job
    from lsjax.train.step import init_state, make_optimizer

    run_dir = open_run_dir()
    config, target_params, tokenizer = load_target(cfg)
    sources = (*cfg.data.sources, *cfg.dels.chat_sources)
    if tokenizer is None and any(s != "synthetic" for s in sources):
        raise ValueError("data.sources: a random-init target has no tokenizer; use the synthetic source")
    V = config.vocab_size
    seqs, mask = load_data(cfg, tokenizer, eos_id(config), V, log=log)
    log(f"data: {data_lib.describe(seqs, mask)} ({', '.join(sources)}, {cfg.data.split})")

    prior = lh.unigram_logprior(seqs, mask, V, cfg.dels.prior_lambda)
    prior_out.append(prior)
    np.save(run_dir / "unigram_logprior.npy", prior)
    (run_dir / "prior.json").write_text(
        json.dumps({"loss_tokens": int(mask.sum()), "lambda": cfg.dels.prior_lambda, "sources": list(sources)}) + "\n"
    )
    embed = jnp.asarray(target_params["embed"], jnp.float32)
    vocab_ids = None
    if cfg.local_head.vocab_size:
        counts = np.bincount(seqs[mask > 0].reshape(-1), minlength=V)
        vocab_ids = pruned_vocab(config, cfg.local_head.vocab_size, token_counts=counts)
        np.save(run_dir / "vocab_ids.npy", vocab_ids)
    rows = embed if vocab_ids is None else embed[jnp.asarray(vocab_ids)]
    consts = (embed, rows, vocab_index(vocab_ids, V))

    data = GrainBatches(iter(data_lib.batches(seqs, mask, cfg, config.max_position).to_iter_dataset()))
    head = lh.LocalHead(cfg.local_head, config.hidden_size, embed_rms(embed))
    params = head.random_weights(jax.random.PRNGKey(cfg.seed))
    optimizer = make_optimizer(cfg.optim)
    d = cfg.data

    def finish(out, run_dir) -> dict:
        if not cfg.log.eval_batches:
            return {}
        max_sequences = 8 * cfg.log.eval_batches
        dev = dev_loss(cfg, config, out["state"].params, consts, tokenizer, max_sequences=max_sequences, log=log)
        (run_dir / "dev.json").write_text(json.dumps(dev) + "\n")
        log(f"dev: {dev}")
        return {"dev": dev}

    return Job(
        init_state(params, optimizer),
        make_step(cfg, optimizer),
        consts,
        data,
        jax.random.PRNGKey(cfg.seed),
        tokens_per_step=d.batch_size * d.grad_accum * d.seq_len,
        max_minutes=cfg.dels.max_minutes,
        finish=finish,
    )


def dev_loss(cfg: DelsTrainConfig, config: ModelConfig, params, consts, tokenizer, *, max_sequences=64, log=print):
    """Block-local CE and accuracy of a head on the dev split (phase 0, fixed sequences), over the vocabulary
    it was trained on (`consts` as in training)."""
    from lsjax.train.inputs import eos_id

    seqs, mask = load_data(cfg, tokenizer, eos_id(config), config.vocab_size, split="dev", log=log)
    pick = np.random.default_rng(0).permutation(len(seqs))[:max_sequences]
    embed, rows, index = consts

    @jax.jit
    def f(p, t, m):
        return local_head_losses(p, cfg, embed, rows, index, t, m, jnp.zeros(t.shape[0], jnp.int32))

    sums = {"ce": 0.0, "correct": 0.0, "weight": 0.0}
    for i in range(0, len(pick), 8):
        got = jax.device_get(f(params, jnp.asarray(seqs[pick[i : i + 8]]), jnp.asarray(mask[pick[i : i + 8]])))
        sums = {k: sums[k] + float(got[k]) for k in sums}
    w = max(sums["weight"], 1.0)
    return {"dev_ce": sums["ce"] / w, "dev_acc": sums["correct"] / w, "dev_tokens": int(sums["weight"])}
