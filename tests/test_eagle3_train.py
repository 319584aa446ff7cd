"""Training EAGLE-3 drafts (`kind: eagle3`, `lsjax.methods.eagle3.train`): the training-time test against a direct
computation, the draft vocabulary, cached features equal to live ones, a tiny run whose loss falls, its exports
in both published layouts (equal to the reference modules' keys and outputs, loading back to identical
proposals, decoding exactly AR's tokens) and the bad input."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import yaml

from lsjax import attention
from lsjax.cache import KVCache
from lsjax.config import ConfigError, ModelConfig, from_dict
from lsjax.methods.eagle3 import model as em
from lsjax.methods.eagle3 import train as et
from lsjax.methods.eagle3.checkpoint import read_draft
from lsjax.methods.eagle3.train_config import Eagle3TrainConfig
from lsjax.models import target as target_lib

FIXTURES = Path(__file__).parent / "fixtures" / "eagle3_train"
TINY = ModelConfig(
    vocab_size=97,
    hidden_size=32,
    intermediate_size=64,
    num_layers=6,
    num_heads=4,
    num_kv_heads=2,
    head_dim=8,
    max_position=512,
    eos_token_ids=(1,),
    pad_token_id=0,
)


def train_config(**sections) -> Eagle3TrainConfig:
    raw = {"kind": "eagle3", "target": {"random_init": True, "model": dataclasses.asdict(TINY)}} | sections
    return from_dict(Eagle3TrainConfig, raw)


@pytest.fixture(scope="module")
def target():
    return target_lib.init_params(TINY, jax.random.PRNGKey(0), scale=0.2)


def _setup(target, steps, vocab_size=64, seed=3):
    """(draft config, params, consts, tokens, loss_mask) for direct checks on a 2 x 24 batch."""
    cfg = train_config(loss={"ttt_steps": steps, "chunk_size": 8}, draft={"draft_vocab_size": vocab_size})
    rng = np.random.default_rng(seed)
    vocab = np.sort(rng.permutation(TINY.vocab_size)[:vocab_size]).astype(np.int32)
    dcfg = et.draft_config(TINY, cfg, vocab_size)
    params = et.init_draft(dcfg, dataclasses.replace(cfg, draft=dataclasses.replace(cfg.draft, init_std=0.2)),
                           jax.random.PRNGKey(seed))  # fmt: skip
    consts = {"target": target, "vocab_ids": jnp.asarray(vocab), "t2d": jnp.asarray(et.vocab_masks(vocab, 97))}
    tokens = jnp.asarray(rng.integers(0, TINY.vocab_size, (2, 24)), jnp.int32)
    mask = jnp.asarray(rng.random((2, 24)) < 0.7, jnp.float32)
    return cfg, dcfg, params, consts, tokens, mask


def direct_features(target, dcfg, tokens, vocab):
    """The target's aux streams, full logits [B, T, V] and whether its argmax is in the draft vocabulary."""
    B, T = tokens.shape
    pos = jnp.broadcast_to(jnp.arange(T), (B, T))
    hidden, _, _, aux = target_lib.Transformer(TINY).apply(
        {"params": target}, tokens, pos, KVCache.zeros(TINY, B, 0), dcfg.aux_layers, method="streams"
    )
    full = target_lib.lm_head(target, TINY, hidden)
    return aux, full, np.isin(np.asarray(jnp.argmax(full, -1)), np.asarray(vocab))


def direct_objective(params, feats, target, dcfg, vocab, tokens, mask, steps, weight=0.8):
    """EAGLE-3's training-time test written out plainly: every step's keys concatenated and one explicit mask
    (step 0 causal, later steps only their own position), the target's full logits, the loop of the reference's
    `Model.forward` and `main.py` (shift, mask by the position's loss mask and the target argmax's membership,
    mean over positions, 0.8^j)."""
    B, T = tokens.shape
    pos = jnp.broadcast_to(jnp.arange(T), (B, T))
    aux, full, in_vocab = feats
    g, ks, vs, total, per_step = em.fuse(params, aux), [], [], 0.0, []
    for j in range(steps):
        nxt = np.zeros((B, T), np.int32)
        nxt[:, : max(T - 1 - j, 0)] = np.asarray(tokens)[:, 1 + j :]
        emb = target["embed"][nxt]
        allowed = np.zeros((T, (j + 1) * T), bool)
        for t in range(T):
            allowed[t, : t + 1] = True
            for i in range(1, j + 1):
                allowed[t, i * T + t] = True

        def attend(q, k, v, allowed=allowed, ks=ks, vs=vs):
            keys, vals = jnp.concatenate([*ks, k], 1), jnp.concatenate([*vs, v], 1)
            return attention.tree_attention_xla(q, keys, vals, jnp.broadcast_to(allowed, (B, *allowed.shape)))[0]

        out, k, v = em.layer(params, dcfg, emb, g, pos + j, attend)
        ks, vs, g = ks + [k], vs + [v], out
        logq = jax.nn.log_softmax(em.logits(params, dcfg, out), -1)
        n = T - 1 - j  # positions t < n have a target, at t + 1 + j
        p = jax.nn.softmax(full[:, 1 + j :][..., vocab], -1)
        w = np.asarray(mask)[:, j : j + n] * in_vocab[:, 1 + j :]
        per_step.append(jnp.sum(w * -jnp.sum(p * logq[:, :n], -1)) / (B * T))
        total = total + weight**j * per_step[-1]
    return total, per_step


def test_training_time_test_matches_a_direct_computation(target):
    """`ttt_losses` + `objective` (band attention merged with the diagonal by LSE, chunked soft targets) equal the
    plain loop: value, per-step losses and gradients; some targets fall outside the 64-token vocabulary."""
    S = 3
    cfg, dcfg, params, consts, tokens, mask = _setup(target, S)
    micro = {"tokens": tokens, "loss_mask": mask}
    positions = float(tokens.size)

    def ours(p):
        sums = et.ttt_losses(p, consts, TINY, dcfg, cfg, micro)
        return et.objective(sums, cfg, positions), sums

    (value, sums), grads = jax.jit(jax.value_and_grad(ours, has_aux=True))(params)
    vocab = np.asarray(consts["vocab_ids"])
    feats = direct_features(target, dcfg, tokens, vocab)
    (want, per_step), want_grads = jax.jit(
        jax.value_and_grad(lambda p: direct_objective(p, feats, target, dcfg, vocab, tokens, mask, S), has_aux=True)
    )(params)
    np.testing.assert_allclose(value, want, rtol=1e-5)
    np.testing.assert_allclose(np.asarray(sums["ploss"]) / positions, per_step, rtol=1e-5)
    for name in grads:
        np.testing.assert_allclose(grads[name], want_grads[name], rtol=2e-4, atol=1e-6, err_msg=name)
    # The masks did something: fewer weighted positions than loss-mask positions (out-of-vocabulary argmaxes).
    assert float(sums["mask"][0]) > 0 and np.all(np.asarray(sums["ploss"]) > 0)


def test_draft_vocabulary_from_frequencies():
    counts = np.array([5, 0, 9, 9, 1, 7, 0, 3])
    np.testing.assert_array_equal(et.draft_vocab(counts, 4), [0, 2, 3, 5])  # the 4 most frequent, ascending
    np.testing.assert_array_equal(et.draft_vocab(counts, 5), [0, 2, 3, 5, 7])
    np.testing.assert_array_equal(et.draft_vocab(np.array([2, 1, 1, 1]), 2), [0, 1])  # ties by id
    np.testing.assert_array_equal(et.draft_vocab(counts, 0), np.arange(8))
    t2d = et.vocab_masks(et.draft_vocab(counts, 4), 8)
    np.testing.assert_array_equal(t2d, [1, 0, 1, 1, 0, 1, 0, 0])


@pytest.mark.slow  # the default suite's budget (make test-slow runs it)
def test_cached_features_equal_live_ones(target, tmp_path):
    """A feature set built with the draft's aux layers holds its streams (aux_hidden = the target's `streams`);
    the losses read from it equal the live ones within float16; a set of other aux layers is refused by name."""
    from lsjax.train import feature_cache as fcm

    cfg, dcfg, params, consts, tokens, mask = _setup(target, 2)
    spec = dataclasses.replace(fcm.default_spec(TINY), aux_layers=dcfg.aux_layers)
    toks = np.asarray(tokens)
    fc = fcm.build(tmp_path / "set", toks, np.asarray(mask, np.uint8), target, TINY, spec=spec, shard_size=2,
                   progress=False, log=lambda *_: None)  # fmt: skip
    assert fc.aux_layers == dcfg.aux_layers
    order = [int(np.flatnonzero((toks == row).all(1))[0]) for row in fc.tokens]
    rows = fc.read(np.arange(2))
    live = et.live_features(target, TINY, tokens[np.asarray(order)], dcfg.aux_layers, 8)
    np.testing.assert_allclose(rows["aux_hidden"].astype(np.float32), live["aux"], rtol=2e-3, atol=2e-3)
    np.testing.assert_array_equal(rows["topk_ids"][..., 0], live["argmax"])
    cached = {
        "tokens": jnp.asarray(rows["tokens"]),
        "loss_mask": jnp.asarray(rows["loss_mask"], jnp.float32),
        "target_aux": jnp.asarray(rows["aux_hidden"]),
        "target_hidden": jnp.asarray(rows["hidden"]),
        "target_argmax": jnp.asarray(rows["topk_ids"][..., 0]),
    }
    got = et.ttt_losses(params, consts, TINY, dcfg, cfg, cached)
    want = et.ttt_losses(params, consts, TINY, dcfg, cfg, {k: cached[k] for k in ("tokens", "loss_mask")})
    np.testing.assert_allclose(got["ploss"], want["ploss"], rtol=2e-3)

    other = train_config(
        features={"set": str(tmp_path / "set")}, draft={"aux_layers": [0, 1, 2]}, data={"seq_len": 24, "batch_size": 2}
    )
    with pytest.raises(ConfigError, match=r"features.set: its aux layers are \[2, 3, 3\], the draft reads \[0, 1, 2\]"):
        et._feature_set_inputs(other, (0, 1, 2), log=lambda *_: None)


# ------------------------------------------------------------------------------------- a tiny run, exported


def _write_config(tmp_path, **over) -> Path:
    raw = {
        "kind": "eagle3",
        "name": "tiny-eagle3",
        "run_dir": str(tmp_path / "run"),
        "target": {"random_init": True, "model": dataclasses.asdict(TINY)},
        "draft": {"draft_vocab_size": 64},
        "data": {"sources": ["synthetic"], "seq_len": 32, "batch_size": 4, "synthetic_tokens": 8192},
        "loss": {"ttt_steps": 2, "chunk_size": 16},
        "optim": {"lr": 5.0e-3, "warmup_steps": 4, "total_steps": 80},
        "checkpoint": {"every": 80},
        "log": {"tensorboard": False, "plot": False, "progress": False, "every": 1},
    } | over
    raw["target"]["model"]["eos_token_ids"] = list(TINY.eos_token_ids)
    path = tmp_path / "eagle3-tiny.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


@pytest.fixture(scope="module")
def trained(tmp_path_factory, target):
    """A tiny run through `train.py` (80 steps), exported by `train.py --export` in both layouts (fp32). The target
    is `target` (peaky logits: something to learn), handed to the trainer in place of its random init."""
    from lsjax.cli import train as cli

    tmp = tmp_path_factory.mktemp("eagle3-train")
    config = _write_config(tmp)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("lsjax.train.inputs.load_target", lambda cfg: (TINY, target, None))
        assert cli.main(["--config", str(config), "--no-progress"]) == 0
    exports = {}
    for fmt in ("eagle", "speculators"):
        exports[fmt] = tmp / fmt
        sets = ["--set", f"export.format={fmt}", "--set", "export.dtype=float32"]
        assert cli.main(["--config", str(config), "--export", str(exports[fmt]), *sets]) == 0
    return tmp / "run", exports


def test_a_tiny_run_lowers_its_loss(trained, target):
    """The trained draft's objective on fixed rows is well below its initial one's; the vocabulary is the 64 most
    frequent tokens of the training rows (every position carries loss here)."""
    from lsjax.train import data as data_lib
    from lsjax.train.checkpoint import load_draft_params

    run_dir, _ = trained
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 80 and {"ploss_0", "ploss_1", "acc_0", "acc_1"} <= set(rows[0])
    cfg = train_config(
        data={"sources": ["synthetic"], "seq_len": 32, "synthetic_tokens": 8192},
        draft={"draft_vocab_size": 64},
        loss={"ttt_steps": 2, "chunk_size": 16},
    )
    seqs, mask = data_lib.load_sequences(cfg.data, None, 1, TINY.vocab_size)
    counts = np.bincount(seqs[mask > 0], minlength=TINY.vocab_size)
    vocab = np.load(run_dir / "vocab_ids.npy")
    np.testing.assert_array_equal(vocab, et.draft_vocab(counts, 64))

    dcfg = et.draft_config(TINY, cfg, 64)
    consts = {"target": target, "vocab_ids": jnp.asarray(vocab), "t2d": jnp.asarray(et.vocab_masks(vocab, 97))}
    micro = {"tokens": jnp.asarray(seqs[:16]), "loss_mask": jnp.asarray(mask[:16], jnp.float32)}

    @jax.jit
    def measure(p):
        sums = et.ttt_losses(p, consts, TINY, dcfg, cfg, micro)
        return et.objective(sums, cfg, 16 * 32), sums["correct"] / sums["mask"]

    loss0, acc0 = measure(et.init_draft(dcfg, cfg, jax.random.PRNGKey(0)))
    loss1, acc1 = measure(jax.tree.map(jnp.asarray, load_draft_params(run_dir)))
    assert float(loss1) < float(loss0) - 0.15, (loss0, loss1)  # its floor is the target's entropy, not 0
    assert np.all(np.asarray(acc1) > np.asarray(acc0) + 0.1), (acc0, acc1)  # at every step of the test


def test_the_head_can_start_as_the_targets(target, tmp_path):
    """`draft.head_init: target`: the LM head starts as the target's columns of the draft vocabulary, in draft-id
    order, and the final norm as the target's, so at step 0 the draft's head scores a state as the target's head
    does on those tokens; the layer's weights are still random. The run trains from there, and `random` (the
    reference's start) leaves both random."""
    from lsjax.cli import train as cli
    from lsjax.models.layers import rms_norm
    from lsjax.train.checkpoint import load_draft_params

    cfg = train_config(draft={"draft_vocab_size": 64, "head_init": "target"})
    vocab = np.sort(np.random.default_rng(1).permutation(TINY.vocab_size)[:64]).astype(np.int32)
    dcfg = et.draft_config(TINY, cfg, 64)
    params = et.init_draft(dcfg, cfg, jax.random.PRNGKey(0), target, vocab)
    state = jax.random.normal(jax.random.PRNGKey(1), (3, TINY.hidden_size))
    np.testing.assert_allclose(  # the target's logits at the draft's tokens, from the draft's own head
        np.asarray(rms_norm(state, params["final_norm"], TINY.rms_norm_eps) @ params["lm_head"]),
        np.asarray(target_lib.lm_head(target, TINY, state))[:, vocab],
        rtol=1e-6,
        atol=1e-6,
    )
    np.testing.assert_array_equal(np.asarray(params["final_norm"]), np.asarray(target["final_norm"]))
    assert params["lm_head"] is not target.get("lm_head") and float(jnp.std(params["wq"])) < 0.05
    rand = et.init_draft(dcfg, train_config(draft={"draft_vocab_size": 64}), jax.random.PRNGKey(0), target, vocab)
    assert not np.allclose(np.asarray(rand["lm_head"]), np.asarray(params["lm_head"]))
    with pytest.raises(ValueError, match="head_init target needs"):
        et.init_draft(dcfg, cfg, jax.random.PRNGKey(0))

    short = {"optim": {"lr": 5.0e-3, "warmup_steps": 2, "total_steps": 6}, "checkpoint": {"every": 6}}
    config = _write_config(tmp_path, draft={"draft_vocab_size": 64, "head_init": "target"}, **short)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("lsjax.train.inputs.load_target", lambda cfg: (TINY, target, None))
        assert cli.main(["--config", str(config), "--no-progress"]) == 0
    trained_head = load_draft_params(tmp_path / "run")["lm_head"]
    run_vocab = np.load(tmp_path / "run" / "vocab_ids.npy")
    start = np.asarray(et.target_head(target, jnp.asarray(run_vocab)))
    moved = np.abs(np.asarray(trained_head, np.float32) - start).max()
    assert 0 < moved < 0.5 * np.abs(start).max(), moved  # trained from the target's head, not from noise


def test_exports_load_back_to_the_trained_draft(trained):
    """Either layout reads back (the decode side's loader) to the checkpoint's weights, its vocabulary as d2t/t2d."""
    from safetensors.numpy import load_file

    from lsjax.train.checkpoint import load_draft_params

    run_dir, exports = trained
    params = load_draft_params(run_dir)
    vocab = np.load(run_dir / "vocab_ids.npy")
    cfgs = {}
    for fmt, path in exports.items():
        cfg, got, info = read_draft(path, TINY)
        assert info.format == fmt and cfg.draft_vocab_size == 64 and cfg.aux_layers == em.default_aux_layers(6)
        np.testing.assert_array_equal(got.pop("draft_to_target"), vocab)
        assert set(got) == set(params)
        for name in params:
            np.testing.assert_array_equal(got[name], params[name], err_msg=f"{fmt}: {name}")
        tensors = load_file(str(path / "model.safetensors"))
        np.testing.assert_array_equal(tensors["d2t"], vocab - np.arange(64))
        np.testing.assert_array_equal(np.flatnonzero(tensors["t2d"]), vocab)
        cfgs[fmt] = cfg
    assert cfgs["eagle"] == cfgs["speculators"]


@pytest.fixture(scope="module")
def decoded(trained, target):
    """Greedy decodes through `lsjax.generate` of AR and of the trained draft read from each export."""
    import lsjax
    from lsjax.config import GenerateConfig
    from lsjax.methods.eagle3.drafter import Eagle3Drafter, Eagle3Tree

    _, exports = trained
    params = target
    rng = np.random.default_rng(5)
    prompts = [np.resize(rng.integers(3, 97, 5), 40), rng.integers(3, 97, 30)]
    prompt, lengths = lsjax.pad_prompts([p.tolist() for p in prompts])
    gen = GenerateConfig(max_new_tokens=24, ignore_eos=True)
    generate = jax.jit(lsjax.generate)
    out = {}
    for name in ("ar", *exports):
        if name == "ar":
            drafter, dp = lsjax.ARDrafter(), ()
        else:
            dcfg, dp, _ = read_draft(exports[name], TINY)
            drafter, dp = Eagle3Drafter(dcfg, Eagle3Tree(6, 4, 2)), jax.tree.map(jnp.asarray, dp)
        cfg = lsjax.SpecConfig(model=TINY, gen=gen, drafter=drafter)
        out[name] = jax.device_get(
            generate(params, dp, prompt, cfg, jax.random.key(0), prompt_lengths=lengths, max_new_tokens=jnp.int32(24))
        )
    return out


@pytest.mark.slow  # ~15 s: the decodes compile (test_exports_load_back_to_the_trained_draft checks the weights)
def test_both_exports_propose_identically(decoded):
    a, b = decoded["eagle"], decoded["speculators"]
    np.testing.assert_array_equal(a.tokens, b.tokens)
    assert float(a.mean_accepted) == float(b.mean_accepted)


@pytest.mark.slow
def test_the_trained_draft_decodes_exactly_ar(decoded):
    ar, sp = decoded["ar"], decoded["eagle"]
    np.testing.assert_array_equal(sp.num_tokens, ar.num_tokens)
    for row in range(len(ar.tokens)):
        n = int(ar.num_tokens[row])
        np.testing.assert_array_equal(sp.tokens[row, :n], ar.tokens[row, :n])


# ------------------------------------------------------------------------------------ the reference modules


@pytest.mark.parametrize("fmt", ["eagle", "speculators"])
def test_export_matches_the_reference_modules(fmt, tmp_path):
    """The exported files are what the reference module (`tests/fixtures/make/eagle3_train_export_fixtures.py`:
    EAGLE's cnets `Model`, speculators' `Eagle3DraftModel`, each loading them with strict key matching) holds,
    but for the tensors it takes from the target; re-exporting the draft lsjax reads writes the same files; and
    lsjax's logits equal the reference's (teacher-forced pairs; for speculators over 3 training-time-test steps)."""
    from safetensors.numpy import load_file

    from lsjax.methods.eagle3.export import export_draft

    ref = np.load(FIXTURES / f"{fmt}.npz")
    meta = json.loads((FIXTURES / f"{fmt}.json").read_text())
    target = ModelConfig(vocab_size=61, hidden_size=32, intermediate_size=48, num_layers=8, num_heads=4,
                         num_kv_heads=2, head_dim=8, max_position=256, rope_theta=10000.0, eos_token_ids=(),
                         pad_token_id=0)  # fmt: skip
    dcfg, params, info = read_draft(FIXTURES / fmt, target)
    vocab = params.pop("draft_to_target")
    again = export_draft(tmp_path / fmt, dcfg, params, vocab, target_layers=8, fmt=fmt, dtype="float32")
    written, stored = load_file(str(again / "model.safetensors")), load_file(str(FIXTURES / fmt / "model.safetensors"))
    assert set(written) == set(stored)
    for k in written:
        np.testing.assert_array_equal(written[k], stored[k], err_msg=k)
    reference_keys = {k: v for k, v in meta["keys"].items() if k not in meta["from_target"]}
    assert {k: list(v.shape) for k, v in written.items()} == reference_keys

    n = len(ref["hidden"])
    steps = ref["logits"].shape[0] if ref["logits"].ndim == 3 else 1
    # Pair t is (hidden[t], ids[t + 1]) and step j's token at t is ids[t + 1 + j], 0 past the end (as there): the
    # row is ids with one position past the pairs (causal: it changes none of theirs).
    aux = jnp.concatenate([jnp.asarray(ref["hidden"]), jnp.zeros_like(ref["hidden"][:1])])[None]
    tokens = jnp.asarray(ref["ids"], jnp.int32)[None]
    outs = et.ttt_forward(jax.tree.map(jnp.asarray, params), dcfg, aux, tokens, jnp.asarray(ref["embed"]), steps)
    got = np.stack([np.asarray(em.logits(params, dcfg, o[:, :n]))[0] for o in outs])
    np.testing.assert_allclose(got, ref["logits"].reshape(steps, n, -1), rtol=1e-4, atol=1e-4)


# -------------------------------------------------------------------------------------------------- bad input


def _cli_error(tmp_path, capsys, *args, **over) -> str:
    from lsjax.cli import train as cli

    assert cli.main(["--config", str(_write_config(tmp_path, **over)), *args]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err, err
    return err


def test_bad_input_is_one_line_naming_the_field(tmp_path, capsys):
    err = _cli_error(tmp_path, capsys, draft={"aux_layers": [1, 3, 6]})
    assert "draft.aux_layers: 6 is beyond the target's depth (6 layers: indices 0..5)" in err
    err = _cli_error(tmp_path, capsys, draft={"draft_vocab_size": 200})
    assert "draft.draft_vocab_size: 200 is larger than the target's vocabulary (97)" in err
    err = _cli_error(tmp_path, capsys, kind="eagle4")
    assert "kind: unknown kind 'eagle4'; known kinds:" in err and "eagle3" in err
    err = _cli_error(tmp_path, capsys, loss={"ttt_steps": 0})
    assert "loss.ttt_steps: must be an integer >= 1, got 0" in err
    err = _cli_error(tmp_path, capsys, export={"format": "medusa"})
    assert "export.format: must be one of eagle|speculators, got 'medusa'" in err
    err = _cli_error(tmp_path, capsys, draft={"head_init": "embed"})
    assert "draft.head_init: must be one of random, target, got 'embed'" in err


def test_a_layout_that_cannot_express_the_draft_is_refused_by_name(tmp_path):
    from lsjax.methods.eagle3.export import export_draft

    cfg = train_config(draft={"aux_layers": [0, 1, 2], "norm_before_residual": True})
    dcfg = dataclasses.replace(et.draft_config(TINY, cfg, 97), aux_layers=(0, 1, 2))
    params = {k: np.zeros(s.shape, np.float32) for k, s in et.trainable_specs(dcfg).items()}
    vocab = np.arange(97)
    with pytest.raises(ConfigError, match=r"draft.aux_layers: \[0, 1, 2\] cannot be expressed in the eagle layout"):
        export_draft(tmp_path / "e", dcfg, params, vocab, target_layers=6, fmt="eagle")
    published = dataclasses.replace(dcfg, aux_layers=em.default_aux_layers(6))
    with pytest.raises(ConfigError, match="draft.norm_before_residual: true cannot be expressed in the eagle layout"):
        export_draft(tmp_path / "e", published, params, vocab, target_layers=6, fmt="eagle")
    export_draft(tmp_path / "s", dcfg, params, vocab, target_layers=6, fmt="speculators")  # it can
