"""Training DFlash drafts (`kind: dflash`, `lsjax.methods.dflash.train`): the blocks, masking and weighting against
a direct computation through the decode forward, a tiny target's draft learning, train.py -> export -> load, a
trained draft decoding AR's tokens, the export against z-lab's module (fixture), and bad input."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import yaml

from lsjax.cache import KVCache, commit
from lsjax.config import ConfigError, ModelConfig, from_dict, to_dict
from lsjax.methods.dflash import model as dm
from lsjax.methods.dflash import train as dt
from lsjax.methods.dflash.train_config import DFlashTrainConfig

FIXTURES = Path(__file__).parent / "fixtures" / "dflash_export"
# tests/tiny.py's target shapes with 4 layers (a draft's target layers then differ from each other)
_TINY = ModelConfig(
    vocab_size=29,
    hidden_size=48,
    intermediate_size=64,
    num_layers=4,
    num_heads=6,
    num_kv_heads=2,
    head_dim=8,
    max_position=2048,
    rope_theta=10000.0,
    eos_token_ids=(2,),
    pad_token_id=0,
)
QUIET = {"progress": False, "plot": False, "tensorboard": False}


def tiny_target(vocab: int = 29):
    """A 4-layer tiny target (peaky logits: its greedy text loops, which a draft can learn), its weights drawn
    with numpy (no device work, no op-by-op compiles)."""
    from lsjax.models import target
    from lsjax.models.layers import unflatten

    config = dataclasses.replace(_TINY, vocab_size=vocab)
    rng = np.random.default_rng(3)
    flat = {
        path: np.ones(spec.shape, np.float32) if spec.init == "ones" else 0.3 * rng.standard_normal(spec.shape)
        for path, spec in target.param_specs(config).items()
    }
    return config, jax.tree.map(lambda a: jnp.asarray(a, jnp.float32), unflatten(flat))


def train_cfg(tmp_path=None, **over) -> DFlashTrainConfig:
    config, _ = tiny_target()
    raw = {
        "name": "dflash-tiny",
        "kind": "dflash",
        "run_dir": str((tmp_path or Path("/nonexistent")) / "run"),
        "target": {"random_init": True, "model": to_dict(config)},
        "draft": {"num_layers": 1, "block_size": 4},
        "data": {"sources": ["synthetic"], "seq_len": 32, "batch_size": 4, "synthetic_tokens": 4096},
        "loss": {"num_anchors": 6, "decay_gamma": 2.0, "chunk_blocks": 4},
        "optim": {"lr": 0.01, "warmup_steps": 2, "total_steps": 40, "weight_decay": 0.0},
        "checkpoint": {"every": 40},
        "log": QUIET,
    }
    for k, v in over.items():
        raw[k] = {**raw.get(k, {}), **v} if isinstance(v, dict) else v
    return from_dict(DFlashTrainConfig, raw)


def random_params(dcfg, seed=0, scale=0.3):
    """`dm.init_params`' layout (norms 1, the rest normal), drawn with numpy."""
    from lsjax.models.layers import unflatten

    rng = np.random.default_rng(seed)
    flat = {
        path: np.ones(spec.shape, np.float32) if spec.init == "ones" else scale * rng.standard_normal(spec.shape)
        for path, spec in dm.param_specs(dcfg).items()
    }
    return jax.tree.map(lambda a: jnp.asarray(a, jnp.float32), unflatten(flat))


# ------------------------------------------------------------------------------------------ the objective


def test_anchors_are_a_draw_without_replacement_among_positions_whose_next_token_trains():
    mask = np.zeros((3, 20), np.float32)
    mask[0, 5:12] = 1  # qualifying anchors 4 .. 10: 7 of them
    mask[1, 19] = 1  # only anchor 18
    mask[2] = 1  # anchors 0 .. 18
    anchors, valid = dt.sample_anchors(jax.random.key(0), jnp.asarray(mask), 8)
    anchors, valid = np.asarray(anchors), np.asarray(valid)
    assert anchors.shape == (3, 8)
    assert sorted(anchors[0][valid[0]]) == list(range(4, 11)) and valid[0].sum() == 7
    assert list(anchors[1][valid[1]]) == [18] and valid[1].sum() == 1
    assert valid[2].all() and len(set(anchors[2])) == 8 and anchors[2].max() <= 18
    other = np.asarray(dt.sample_anchors(jax.random.key(1), jnp.asarray(mask), 8)[0])[2]
    assert set(other) != set(anchors[2])  # fresh anchors with a fresh key


def test_blocks_masking_and_weighting_equal_a_direct_computation():
    """`block_losses` (every block in one parallel forward, under the training mask, in chunks) against the decode
    forward (`DFlashDraft.__call__`) run block by block over a cache cut at the block's anchor, with the weights
    written out: labels x_{a+k}, weight exp(-(k - 1) / gamma) x loss_mask[a + k], 0 past the row's end."""
    from lsjax.methods.dflash.drafter import hf_streams
    from lsjax.models import target

    config, tparams = tiny_target()
    cfg = train_cfg(draft={"num_layers": 2, "block_size": 5}, loss={"num_anchors": 7, "decay_gamma": 3.0})
    dcfg = dt.draft_config(cfg, config)
    params = random_params(dcfg)
    B, T, s = 2, 24, 5
    rng = np.random.RandomState(0)
    tokens = jnp.asarray(rng.randint(0, config.vocab_size, (B, T)), jnp.int32)
    loss_mask = np.ones((B, T), np.float32)
    loss_mask[0, :9] = 0  # a prompt: blocks start at its last token, never learn its tokens
    loss_mask[1, 15:18] = 0
    anchors, valid = dt.sample_anchors(jax.random.key(4), jnp.asarray(loss_mask), 7)
    anchors = anchors.at[1, 0].set(T - 2)  # a block running past the row's end
    valid = valid.at[1, 0].set(True)
    decay = dt.decay_weights(s, 3.0)
    labels, mask, weights = dt.block_targets(tokens, jnp.asarray(loss_mask), anchors, valid, s, decay)
    got = dt.block_losses(params, tparams, config, dcfg, tokens, anchors, labels, mask, weights, chunk=3)

    pos = jnp.broadcast_to(jnp.arange(T), (B, T))
    net = target.Transformer(config).bind({"params": tparams})
    *_, streams = net.streams(tokens, pos, KVCache.zeros(config, B, 0), dcfg.taps)
    draft = dm.DFlashDraft(dcfg).bind({"params": params})
    k, v = draft.context_kv(hf_streams(streams, dcfg.taps, config, tparams), pos)
    full = commit(KVCache.zeros(dcfg.layer, B, T), k, v, jnp.full((B,), T, jnp.int32))

    @jax.jit
    def decode_block(b, a, block):  # the drafter's forward over a cache of the positions before a
        cache = KVCache(full.k[:, b][:, None], full.v[:, b][:, None], a[None])
        hidden = draft(draft.noise(block[None], tparams["embed"]), (a + jnp.arange(s))[None], cache)
        return jax.nn.log_softmax(draft.logits(hidden[0, 1:], None, tparams["embed"]))

    want = dict.fromkeys(dt.SUMS, 0.0)
    toks, lm = np.asarray(tokens), loss_mask
    for b in range(B):
        for m in range(anchors.shape[1]):
            a = int(anchors[b, m])
            if not bool(valid[b, m]):
                continue
            block = jnp.asarray([toks[b, a]] + [dcfg.mask_token_id] * (s - 1), jnp.int32)
            logp = np.asarray(decode_block(jnp.int32(b), jnp.int32(a), block))
            lead, leading = 0, True
            for kk in range(1, s):
                inside = a + kk < T
                w_mask = lm[b, a + kk] if inside else 0.0
                y = toks[b, a + kk] if inside else toks[b, T - 1]
                ce = -logp[kk - 1, y]
                hit = w_mask > 0 and int(np.argmax(logp[kk - 1])) == y
                want["wce"] += ce * w_mask * np.exp(-(kk - 1) / 3.0)
                want["weight"] += w_mask * np.exp(-(kk - 1) / 3.0)
                want["ce"] += ce * w_mask
                want["tokens"] += w_mask
                want["correct"] += hit
                leading = leading and hit
                lead += leading
            want["first_correct"] += int(lm[b, a + 1] > 0 and int(np.argmax(logp[0])) == toks[b, a + 1])
            want["blocks"] += lm[b, a + 1] > 0
            want["accept"] += lead
    for key in dt.SUMS:
        np.testing.assert_allclose(float(got[key]), want[key], rtol=2e-5, atol=2e-4, err_msg=key)
    assert want["tokens"] < valid.sum() * (s - 1)  # the prompt, the hole and the row's end all masked something


def test_decay_weights_are_the_papers():
    np.testing.assert_allclose(dt.decay_weights(16, 7.0), np.exp(-np.arange(15) / 7.0), rtol=1e-6)
    np.testing.assert_array_equal(dt.decay_weights(4, 0.0), np.ones(3))


# --------------------------------------------------------------------------------------------- training


def greedy_rows(config, tparams, n, prompt_len, new, seed):
    """Rows of the tiny target's own greedy continuations (loss on the continuation): self-distilled data."""
    from lsjax.config import GenerateConfig
    from lsjax.engine.types import ARDrafter
    from tests.test_speculative import run

    prompts = [np.random.RandomState(seed + i).randint(3, config.vocab_size, prompt_len) for i in range(n)]
    out = run(tparams, config, prompts, GenerateConfig(max_new_tokens=new, ignore_eos=True), ARDrafter())
    tokens = np.concatenate([np.stack(prompts), np.asarray(out.out)[:, :new]], axis=1).astype(np.int32)
    mask = np.zeros_like(tokens, np.float32)
    mask[:, prompt_len:] = 1
    return tokens, mask


@pytest.fixture(scope="module")
def trained():
    """A 1-layer draft trained 100 steps on the tiny target's own greedy text: (config, target params, draft
    config, draft params, losses)."""
    config, tparams = tiny_target()
    cfg = train_cfg(
        draft={"num_layers": 1, "block_size": 4},
        data={"seq_len": 48, "batch_size": 8},
        loss={"num_anchors": 12, "chunk_blocks": 12},
        optim={"lr": 0.02, "warmup_steps": 3, "total_steps": 100},
    )
    dcfg = dt.draft_config(cfg, config)
    tokens, mask = greedy_rows(config, tparams, 8, 16, 32, seed=0)
    from lsjax.train.step import init_state, make_optimizer

    opt = make_optimizer(cfg.optim)
    state = init_state(random_params(dcfg, scale=0.02), opt)
    step = jax.jit(dt.make_train_step(config, dcfg, cfg, opt))
    batch = {"tokens": jnp.asarray(tokens)[None], "loss_mask": jnp.asarray(mask)[None]}
    losses = []
    for i in range(100):
        state, metrics = step(state, tparams, batch, jax.random.key(i))
        losses.append(float(metrics["loss"]))
    return config, tparams, dcfg, state.params, losses, metrics


def test_a_tiny_targets_draft_learns_its_text(trained):
    *_, losses, metrics = trained
    assert np.mean(losses[-5:]) < 0.5 * np.mean(losses[:5]), losses
    assert float(metrics["acc1"]) > 0.5 and float(metrics["accept"]) > 1.0


def test_a_trained_draft_decodes_ar_at_t0_and_accepts_what_it_learned(trained):
    from lsjax.config import GenerateConfig
    from lsjax.engine.types import ARDrafter
    from lsjax.methods.dflash.drafter import DFlashDrafter
    from tests.test_speculative import run

    config, tparams, dcfg, params, *_ = trained
    drafter = DFlashDrafter(dcfg)
    assert drafter.check_params(params, config) is None
    gen = GenerateConfig(max_new_tokens=24, ignore_eos=True)
    # A prompt it was trained on: its continuation is the text the draft learned (8 rows do not generalise).
    prompts = [np.random.RandomState(0).randint(3, config.vocab_size, 16)]
    ar = run(tparams, config, prompts, gen, ARDrafter())
    learned = run(tparams, config, prompts, gen, drafter, draft_params=params)
    untrained = run(tparams, config, prompts, gen, drafter, draft_params=random_params(dcfg, seed=1))
    for sp in (learned, untrained):
        np.testing.assert_array_equal(np.asarray(sp.out), np.asarray(ar.out))
        np.testing.assert_array_equal(np.asarray(sp.num_out), np.asarray(ar.num_out))
    assert int(learned.steps) < 0.7 * int(untrained.steps)


def test_export_loads_back_with_identical_proposals(trained, tmp_path):
    """The published layout through lsjax's loader: the same params (fp32: bit for bit), so the same blocks."""
    from lsjax.methods.dflash.checkpoint import read_draft
    from lsjax.methods.dflash.drafter import teacher_forced_blocks
    from lsjax.methods.dflash.export import save_draft

    config, tparams, dcfg, params, *_ = trained
    save_draft(tmp_path / "draft", dcfg, jax.device_get(params), num_target_layers=config.num_layers)
    hf = json.loads((tmp_path / "draft" / "config.json").read_text())
    assert hf["architectures"] == ["DFlashDraftModel"] and hf["block_size"] == 4
    assert hf["dflash_config"] == {"target_layer_ids": list(dcfg.target_layer_ids), "mask_token_id": 28}
    got_cfg, got, info = read_draft(tmp_path / "draft", config)
    assert info.format == "dflash" and got_cfg.target_layer_ids == dcfg.target_layer_ids
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(jax.device_get(params))):
        np.testing.assert_array_equal(a, b)
    tokens = jnp.asarray(np.random.RandomState(5).randint(3, config.vocab_size, (1, 30)), jnp.int32)
    mine, _ = teacher_forced_blocks(tparams, config, params, dcfg, tokens, 8, 12)
    loaded, _ = teacher_forced_blocks(tparams, config, jax.tree.map(jnp.asarray, got), got_cfg, tokens, 8, 12)
    np.testing.assert_array_equal(np.asarray(mine), np.asarray(loaded))


# -------------------------------------------------------------------------------------------- train.py


def write_config(tmp_path, **over) -> Path:
    raw = to_dict(train_cfg(tmp_path, **over))
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


@pytest.mark.slow  # ~15-30 s on 2 cores: the step's compile and the random target's op-by-op init
def test_train_py_trains_and_exports(tmp_path, capsys):
    """train.py with `kind: dflash`: a run on a random target's synthetic text, its loss falling; --export writes
    the published layout, which `decode.py`'s loader reads and the drafter accepts for that target."""
    from lsjax.cli.train import main
    from lsjax.methods.dflash.checkpoint import load_dflash
    from lsjax.train.inputs import load_target

    path = write_config(tmp_path, optim={"total_steps": 16, "lr": 0.02}, checkpoint={"every": 8})
    assert main(["--config", str(path), "--no-progress"]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["steps"] == 16
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert rows[-1]["loss"] < rows[0]["loss"]
    assert main(["--config", str(path), "--export", str(tmp_path / "out")]) == 0
    assert (tmp_path / "out" / "model.safetensors").is_file()
    cfg = from_dict(DFlashTrainConfig, yaml.safe_load(path.read_text()))
    config, _, _ = load_target(cfg)
    drafter, params = load_dflash(type("M", (), {"config": config})(), str(tmp_path / "out"))
    assert drafter.draft.block_size == 4 and drafter.draft.target_layer_ids == (2,)


@pytest.mark.parametrize(
    "over,match",
    [
        ({"draft": {"target_layer_ids": [1, 4]}}, r"draft\.target_layer_ids: \[1, 4\] reach beyond the target's 4"),
        ({"draft": {"block_size": 1}}, r"draft\.block_size: must be an integer in \[2, 64\]"),
        ({"draft": {"mask_token_id": 29}}, r"draft\.mask_token_id: 29 is outside the target's vocabulary of 29"),
        ({"loss": {"decay_gamma": -1.0}}, r"loss\.decay_gamma: must be >= 0"),
        ({"data": {"seq_len": 8}, "draft": {"block_size": 8}}, r"data\.seq_len: must be > draft\.block_size"),
    ],
    ids=["layers-beyond-depth", "block-size", "mask-token", "gamma", "seq-len"],
)
def test_bad_input_is_one_line_naming_the_field(tmp_path, capsys, over, match):
    from lsjax.cli.train import main

    raw = yaml.safe_load(write_config(tmp_path).read_text())
    for k, v in over.items():
        raw[k] = {**raw[k], **v}
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(raw))
    assert main(["--config", str(path), "--no-progress"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("error: ")
    assert __import__("re").search(match, err), err


def test_a_draft_or_rows_for_another_vocabulary_are_named(tmp_path, capsys):
    """Continuing a DFlash draft made for another target's vocabulary, or training on rows holding token ids the
    target does not have: one line each, naming the field and both sides."""
    from lsjax.cli.train import main
    from lsjax.methods.dflash.checkpoint import random_draft
    from lsjax.methods.dflash.export import save_draft

    config, _ = tiny_target()
    other = dataclasses.replace(config, vocab_size=40)
    dcfg, params, _ = random_draft(other, layers=1, block_size=4)
    save_draft(tmp_path / "other", dcfg, params, num_target_layers=4)
    path = write_config(tmp_path, checkpoint={"init_from": str(tmp_path / "other")})
    assert main(["--config", str(path), "--no-progress"]) == 2
    err = capsys.readouterr().err.strip()
    assert "checkpoint.init_from" in err and "vocabulary 40" in err and "has 29" in err and "\n" not in err

    rows = tmp_path / "rows"
    rows.mkdir()
    np.savez(rows / "part-00000.npz", tokens=np.full((4, 32), 35, np.int32), loss_mask=np.ones((4, 32), np.uint8))
    path = write_config(tmp_path, data={"distilled": str(rows)})
    assert main(["--config", str(path), "--no-progress"]) == 2
    err = capsys.readouterr().err.strip()
    assert "data.distilled: token id 35 is outside the target's vocabulary of 29" in err and "\n" not in err


def test_continuing_an_exported_draft_keeps_its_shape(trained, tmp_path):
    """`checkpoint.init_from` an exported draft: its params and shape start the run; a draft section that
    contradicts it is named."""
    from lsjax.methods.dflash.export import save_draft

    config, tparams, dcfg, params, *_ = trained
    save_draft(tmp_path / "d", dcfg, jax.device_get(params), num_target_layers=config.num_layers)
    cfg = train_cfg(tmp_path, checkpoint={"init_from": str(tmp_path / "d")}, draft={"block_size": 6})
    got_cfg, got = dt._draft(cfg, config, tparams, log=lambda *_: None)
    assert got_cfg.block_size == 6 and got_cfg.target_layer_ids == dcfg.target_layer_ids
    np.testing.assert_array_equal(np.asarray(got["fc"]), np.asarray(params["fc"]))
    bad = train_cfg(tmp_path, checkpoint={"init_from": str(tmp_path / "d")}, draft={"num_layers": 2})
    with pytest.raises(ConfigError, match=r"draft\.num_layers: must equal the init_from draft's 1, got 2"):
        dt._draft(bad, config, tparams, log=lambda *_: None)


# ---------------------------------------------------------------------------------- the reference module


def test_export_matches_z_labs_module(tmp_path):
    """The fixture (`tests/fixtures/make/dflash_export_fixtures.py`): z-lab/dflash's `DFlashDraftModel` built from
    the config.json lsjax exports, the exported weights loaded with strict key matching, run on fixed inputs. The
    same export made here has the fixture's config, tensor names and shapes, and lsjax's draft reproduces the
    reference's outputs: a decode block over a context, and the training forward (several blocks at once, each
    over the context before its anchor, under z-lab's additive attention mask)."""
    from safetensors.numpy import load_file

    from lsjax.methods.dflash.checkpoint import read_draft
    from lsjax.methods.dflash.export import save_draft
    from tests.fixtures.make.dflash_export_fixtures import fixture_draft

    ref = np.load(FIXTURES / "reference.npz")
    keys = json.loads((FIXTURES / "keys.json").read_text())
    target, dcfg, params = fixture_draft()
    out = save_draft(tmp_path / "draft", dcfg, params, num_target_layers=target.num_layers)
    assert json.loads((out / "config.json").read_text()) == json.loads((FIXTURES / "config.json").read_text())
    tensors = load_file(str(out / "model.safetensors"))
    assert {k: list(v.shape) for k, v in tensors.items()} == keys
    cfg, loaded, _ = read_draft(out, target)
    C, s = len(ref["ctx"]), cfg.block_size

    @jax.jit
    def forwards(params, ctx, noise, lm_head, anchors, train_noise):
        draft = dm.DFlashDraft(cfg).bind({"params": params})
        k, v = draft.context_kv(ctx[None], jnp.arange(C)[None])
        cache = commit(KVCache.zeros(cfg.layer, 1, 32), k, v, jnp.array([C]))
        hidden = draft(noise[None], jnp.arange(C, C + s)[None], cache)
        logits = draft.logits(hidden[0, 1:], None, lm_head)
        a = anchors[None]  # [1, M]
        blocks = draft.blocks(train_noise[None], a[..., None] + jnp.arange(s), a, k, v)
        return hidden[0], logits, blocks[0]

    names = ("ctx", "noise", "lm_head", "anchors", "train_noise")
    hidden, logits, blocks = forwards(jax.tree.map(jnp.asarray, loaded), *(jnp.asarray(ref[n]) for n in names))
    np.testing.assert_allclose(np.asarray(hidden), ref["block_hidden"], atol=1e-4, rtol=0)
    np.testing.assert_allclose(np.asarray(logits), ref["block_logits"], atol=1e-4, rtol=0)
    np.testing.assert_allclose(np.asarray(blocks), ref["train_hidden"], atol=1e-4, rtol=0)
