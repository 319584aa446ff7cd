"""Draft training: positions, chunked losses, flash-noisy lag, the run loop (loss, exact resume, NaN stop),
sharding on 8 fake devices, configs and the train.py CLI. Tiny random targets keep it fast."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import yaml

from lsjax import train as tr
from lsjax.config import ConfigError, ModelConfig, from_dict, load_yaml, to_dict
from lsjax.methods.longspec import losses as ls_losses
from lsjax.methods.longspec import model as draft_lib
from lsjax.methods.longspec import step as ls_step
from lsjax.methods.longspec import train as ls_train
from lsjax.methods.longspec import train as train_loop
from lsjax.methods.longspec.train_config import LongSpecTrainConfig
from lsjax.models import target as target_lib
from lsjax.train import data as data_lib
from lsjax.tree import TreeConfig

ROOT = Path(__file__).resolve().parents[1]
TINY = ModelConfig(
    vocab_size=96,
    hidden_size=32,
    intermediate_size=64,
    num_layers=2,
    num_heads=4,
    num_kv_heads=2,
    head_dim=8,
    max_position=256,
    name="tiny",
)


def tiny_dict(run_dir: Path | str = "", **over) -> dict:
    d = {
        "name": "tiny",
        "run_dir": str(run_dir),
        "target": {"random_init": True, "model": to_dict(TINY)},
        "data": {"sources": ["synthetic"], "seq_len": 16, "batch_size": 4, "grad_accum": 2, "synthetic_tokens": 4096},
        "positions": {"anchor_offset": True},
        "loss": {"chunk_size": 8},
        "optim": {"lr": 1e-2, "warmup_steps": 1, "total_steps": 6},
        "checkpoint": {"every": 2, "keep": 5},
        "log": {"progress": False, "plot": False, "tensorboard": False},
    }
    for path, value in over.items():
        node = d
        keys = path.split("__")
        for k in keys[:-1]:
            node = node.setdefault(k, {})
        node[keys[-1]] = value
    return d


def tiny_cfg(run_dir="", **over) -> LongSpecTrainConfig:
    return from_dict(LongSpecTrainConfig, tiny_dict(run_dir, **over))


# ----------------------------------------------------------------------------- positions


def test_anchor_offset_positions_from_data():
    cfg = tiny_cfg(data__seq_len=16, positions__max_len=200)
    high = data_lib.max_offset(cfg.positions, 16, TINY.max_position)
    assert high == 200 - 16
    offsets = data_lib.offsets_for(0, np.arange(500), high)
    assert offsets.min() >= 0 and offsets.max() <= high and len(set(offsets.tolist())) > 50
    assert np.array_equal(offsets, data_lib.offsets_for(0, np.arange(500), high))  # deterministic
    pos = np.asarray(tr.positions_from_offsets(16, jnp.asarray(offsets[:3])))
    assert (pos[:, :4] == np.arange(4)).all()
    assert (pos[:, 4:] == np.arange(4, 16) + offsets[:3, None]).all()
    assert pos.max() <= 199  # the last position stays inside max_len
    plain = tiny_cfg(positions__anchor_offset=False)
    assert data_lib.max_offset(plain.positions, 16, TINY.max_position) == 0
    assert np.array_equal(
        np.asarray(tr.positions_from_offsets(16, jnp.zeros(2, jnp.int32))), np.tile(np.arange(16), (2, 1))
    )


def test_batches_carry_offsets_and_resume_from_state():
    cfg = tiny_cfg()
    seqs, mask = data_lib.load_sequences(cfg.data, None, 2, TINY.vocab_size)
    ds = data_lib.batches(seqs, mask, cfg, TINY.max_position)
    it = iter(ds.to_iter_dataset())
    b0 = next(it)
    assert b0["tokens"].shape == (2, 4, 16) and b0["offset"].shape == (2, 4)
    assert b0["offset"].max() > 0
    state = it.get_state()
    want = [next(it) for _ in range(3)]
    it2 = iter(ds.to_iter_dataset())
    it2.set_state(state)
    for w in want:
        got = next(it2)
        assert all(np.array_equal(got[k], w[k]) for k in w)


# ----------------------------------------------------------------------------- chunked LM loss


@pytest.fixture(scope="module")
def tiny_models():
    tp = target_lib.init_params(TINY, jax.random.PRNGKey(0), scale=0.3)
    dp = draft_lib.init_draft_params(TINY, tiny_cfg().draft, tp)
    return tp, dp


@pytest.mark.parametrize("pruned", [False, True])
def test_chunked_ce_equals_dense(tiny_models, pruned):
    tp, dp = tiny_models
    B, T = 2, 10  # T not a multiple of the chunk: the padded tail must not count
    k1, k2, k3 = jax.random.split(jax.random.PRNGKey(3), 3)
    hidden = jax.random.normal(k1, (B, T, TINY.hidden_size))
    labels = jax.random.randint(k2, (B, T), 0, TINY.vocab_size)
    weights = (jax.random.uniform(k3, (B, T)) > 0.2).astype(jnp.float32)
    vocab = jnp.arange(0, TINY.vocab_size, 2, dtype=jnp.int32) if pruned else None  # odd labels fall outside

    def chunked(p, h):
        s = ls_losses.lm_losses(p, tp, TINY, h, labels, weights, chunk_size=4, vocab_ids=vocab)
        return s["ce"] / s["weight"]

    def dense(p, h):
        s = ls_losses.dense_lm_losses(p, tp, TINY, h, labels, weights, vocab_ids=vocab)
        return s["ce"] / s["weight"]

    v1 = jax.value_and_grad(chunked, argnums=(0, 1))(dp, hidden)
    v2 = jax.value_and_grad(dense, argnums=(0, 1))(dp, hidden)
    np.testing.assert_allclose(v1[0], v2[0], rtol=1e-5)
    for a, b in zip(jax.tree.leaves(v1[1]), jax.tree.leaves(v2[1])):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)
    s = ls_losses.lm_losses(dp, tp, TINY, hidden, labels, weights, chunk_size=4, vocab_ids=vocab)
    expect = float(jnp.sum(weights * ((labels % 2 == 0) if pruned else 1)))
    assert float(s["weight"]) == expect  # labels outside the pruned vocabulary are ignored


def test_distillation_losses(tiny_models):
    """argmax distillation equals CE on the target's argmax labels; KL is 0 when the draft is the target."""
    tp, dp = tiny_models
    B, T = 2, 8
    th = jax.random.normal(jax.random.PRNGKey(5), (B, T, TINY.hidden_size))
    w = jnp.ones((B, T))
    labels = jnp.zeros((B, T), jnp.int32)
    tlabels = jnp.argmax(tr.target_logits(tp, TINY, th, None), -1)
    a = ls_losses.lm_losses(dp, tp, TINY, th, labels, w, chunk_size=4, distill="argmax", target_hidden=th)
    b = ls_losses.dense_lm_losses(dp, tp, TINY, th, tlabels, w)
    np.testing.assert_allclose(a["distill"], b["ce"], rtol=1e-5)
    same = {**dp, "final_norm": tp["final_norm"]}
    kl = ls_losses.lm_losses(same, tp, TINY, th, labels, w, chunk_size=4, distill="kl", target_hidden=th)
    assert abs(float(kl["distill"])) < 1e-4
    kl2 = ls_losses.lm_losses(same, tp, TINY, th[:, ::-1], labels, w, chunk_size=4, distill="kl", target_hidden=th)
    assert float(kl2["distill"]) > 1e-3


@pytest.mark.slow  # distillation losses are tested alone in the default run
def test_distillation_on_the_whole_text(tiny_models):
    """`loss.distill_on: text`: the distillation term weighs every position up to the row's last training
    target (a self-distilled row's prompt too, never the padding after it), normalised by its own weight;
    CE stays on the answer. A step on a row whose only target is its last token then learns from the
    prompt."""
    mask = jnp.asarray([[0, 0, 0, 1, 1, 0, 0, 0]], jnp.float32)
    np.testing.assert_array_equal(ls_losses.text_weights(mask), [[1, 1, 1, 1, 0, 0, 0, 0]])
    np.testing.assert_array_equal(ls_losses.text_weights(jnp.ones((1, 4))), [[1, 1, 1, 0]])
    tp, dp = tiny_models
    th = jax.random.normal(jax.random.PRNGKey(5), (2, 8, TINY.hidden_size))
    labels = jnp.zeros((2, 8), jnp.int32)
    w, dw = jnp.zeros((2, 8)).at[:, 5].set(1.0), jnp.ones((2, 8)).at[:, 7].set(0.0)
    for kind in ("argmax", "kl"):
        kw = dict(chunk_size=4, distill=kind, target_hidden=th)
        own = ls_losses.lm_losses(dp, tp, TINY, th, labels, w, distill_weights=dw, **kw)
        ref = ls_losses.lm_losses(dp, tp, TINY, th, labels, dw, **kw)
        np.testing.assert_allclose(own["distill"], ref["distill"], rtol=1e-5)
        assert float(own["weight"]) == 2.0 and float(own["distill_weight"]) == 14.0

    cfg_a = tiny_cfg(loss__distill="argmax", loss__distill_weight=1.0, loss__ce_weight=0.0, loss__flash_noisy=False)
    cfg_t = dataclasses.replace(cfg_a, loss=dataclasses.replace(cfg_a.loss, distill_on="text"))
    (batch,) = _batch(cfg_a)
    T = batch["tokens"].shape[-1]
    batch = {**batch, "loss_mask": jnp.zeros_like(batch["loss_mask"]).at[..., T - 1].set(1.0)}
    micro = jax.tree.map(lambda x: x[0], batch)
    a = ls_losses.micro_losses(dp, tp, TINY, cfg_a, micro, jnp.int32(0))
    t = ls_losses.micro_losses(dp, tp, TINY, cfg_t, micro, jnp.int32(0))
    assert float(t["distill_weight"]) > 10 * float(a["distill_weight"]) > 0
    np.testing.assert_allclose(t["ce"], a["ce"])
    opt = tr.make_optimizer(cfg_t.optim)
    _, m = jax.jit(ls_step.make_train_step(TINY, cfg_t))(tr.init_state(dp, opt), tp, batch, jax.random.PRNGKey(0))
    np.testing.assert_allclose(m["loss"], m["distill"], rtol=1e-5)  # CE weighs 0: the loss is the text's distill
    assert float(m["loss"]) > 0 and np.isfinite(float(m["grad_norm"])) and float(m["grad_norm"]) > 0
    with pytest.raises(ConfigError, match="loss.distill_on"):
        tiny_cfg(loss__distill_on="prompt")
    with pytest.raises(ConfigError, match="loss.distill_on"):
        tiny_cfg(loss__distill_on="text")  # no distillation term to put there


def test_stage3_loss_is_on_assistant_tokens_only(ours, tiny_models):
    """Dialogue SFT (stage 3): the chat-rendered mask covers each assistant turn (and its end marker) and
    nothing the user or the template wrote; the loss then counts exactly the tokens under it."""
    tok = ours.tokenizer
    msgs = [
        {"role": "user", "content": "What is two plus two?"},
        {"role": "assistant", "content": "Four, of course."},
        {"role": "user", "content": "And three plus three?"},
        {"role": "assistant", "content": "Six."},
    ]
    ids, mask = (np.asarray(a) for a in data_lib.dialogue_tokens(tok, msgs))
    said = tok.decode(ids[mask == 1].tolist())
    rest = tok.decode(ids[mask == 0].tolist())
    assert "Four, of course." in said and "Six." in said and said.count("<|im_end|>") == 2
    for text in ("two plus two", "three plus three", "user", "assistant", "system"):
        assert text not in said, text
    assert "two plus two" in rest and "Four" not in rest and "Six" not in rest

    # Position t predicts token t + 1 with weight mask[t + 1]: the weighted labels are the assistant tokens.
    labels, weights = ls_losses.next_token_targets(jnp.asarray(ids)[None], jnp.asarray(mask)[None])
    np.testing.assert_array_equal(np.asarray(labels[0])[np.asarray(weights[0]) > 0], ids[1:][mask[1:] == 1])
    tp, dp = tiny_models
    hidden = jax.random.normal(jax.random.PRNGKey(0), (1, len(ids), TINY.hidden_size))
    small = labels % TINY.vocab_size
    s = ls_losses.lm_losses(dp, tp, TINY, hidden, small, weights, chunk_size=16)
    assert float(s["weight"]) == mask[1:].sum()
    # A wrong label where the mask is 0 changes nothing; one under the mask does.
    user_pos = int(np.flatnonzero(np.asarray(weights[0]) == 0)[0])
    asst_pos = int(np.flatnonzero(np.asarray(weights[0]) > 0)[0])
    for pos, changes in ((user_pos, False), (asst_pos, True)):
        other = small.at[0, pos].set((small[0, pos] + 1) % TINY.vocab_size)
        s2 = ls_losses.lm_losses(dp, tp, TINY, hidden, other, weights, chunk_size=16)
        assert (abs(float(s2["ce"]) - float(s["ce"])) > 1e-6) == changes


# ----------------------------------------------------------------------------- the step


def _batch(cfg, n=1):
    seqs, mask = data_lib.load_sequences(cfg.data, None, 2, TINY.vocab_size)
    it = iter(data_lib.batches(seqs, mask, cfg, TINY.max_position).to_iter_dataset())
    return [{k: v for k, v in next(it).items() if k != "index"} for _ in range(n)]


@pytest.mark.parametrize("gamma", [2, 5, 6])
def test_flash_noisy_lags_cover_exactly_the_configured_range(gamma):
    # Level i of a tree drafts at lag i: gamma = depth + 1 must train every lag 1..depth and nothing else.
    cfg = tiny_cfg(loss__gamma=gamma)
    draws = jax.vmap(lambda k: ls_step.draw_shift(k, cfg))(jax.random.split(jax.random.PRNGKey(0), 2000))
    assert set(np.asarray(draws).tolist()) == set(range(1, gamma))


def test_export_refuses_a_tree_deeper_than_the_trained_lags(tmp_path):
    from lsjax.methods.longspec.export import check_tree_lags

    check_tree_lags(tiny_cfg(loss__gamma=6), TreeConfig((4, 16, 16, 16, 16)))
    with pytest.raises(ConfigError, match="loss.gamma"):
        check_tree_lags(tiny_cfg(loss__gamma=4), TreeConfig((4, 16, 16, 16, 16)))
    check_tree_lags(tiny_cfg(loss__gamma=2, loss__flash_noisy=False), TreeConfig((2, 2, 2)))


def test_flash_noisy_shift_is_traced_not_static(tiny_models):
    tp, dp = tiny_models
    cfg = tiny_cfg(loss__gamma=4, data__grad_accum=1)
    traces = []
    inner = ls_step.make_train_step(TINY, cfg)

    def step(*a):
        traces.append(1)
        return inner(*a)

    jitted = jax.jit(step)
    state = tr.init_state(dp, tr.make_optimizer(cfg.optim))
    (batch,) = _batch(cfg)
    shifts = set()
    for i in range(5):
        _, m = jitted(state, tp, batch, jax.random.PRNGKey(i))
        shifts.add(float(m["shift"]))
    assert len(traces) == 1
    assert len(shifts) > 1 and shifts <= {1.0, 2.0, 3.0}  # j ~ U[1, gamma)
    no_noise = tiny_cfg(loss__flash_noisy=False)
    assert int(ls_step.draw_shift(jax.random.PRNGKey(0), no_noise)) == 0


def test_lag_changes_what_the_draft_sees(tiny_models):
    """The step's loss depends on j: the cross-attention really is lagged (not a no-op argument)."""
    tp, dp = tiny_models
    cfg = tiny_cfg()
    (batch,) = _batch(cfg)
    micro = jax.tree.map(lambda x: x[0], batch)
    f = jax.jit(lambda shift: ls_losses.micro_losses(dp, tp, TINY, cfg, micro, shift)["ce"])
    l1, l3 = f(jnp.int32(1)), f(jnp.int32(3))
    assert abs(float(l1) - float(l3)) > 1e-4


# ----------------------------------------------------------------------------- the run loop


def test_loss_decreases(tmp_path):
    # The untempered head starts confidently wrong, so there is a clear loss to shed on synthetic data.
    cfg = tiny_cfg(
        tmp_path / "run",
        steps=30,
        optim__total_steps=30,
        optim__lr=1e-2,
        checkpoint__every=30,
        draft__init_head_scale=1.0,
    )
    out = ls_train.fit(cfg, log=lambda *_: None)
    losses = out["losses"]
    assert len(losses) == 30
    assert np.mean(losses[-5:]) < np.mean(losses[:5]) - 0.3, losses
    recs = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in recs] == list(range(1, 31))


@pytest.mark.slow  # ~24 s; resume is also exercised by the streams and DeLS trainers' tests
def test_exact_resume(tmp_path):
    quiet = dict(log=lambda *_: None)
    full = ls_train.fit(tiny_cfg(tmp_path / "a", optim__total_steps=4), **quiet)
    # saved at 2, dies after 3
    killed = ls_train.fit(tiny_cfg(tmp_path / "b", optim__total_steps=4), stop_after=3, **quiet)
    assert killed["last_checkpoint"] == 2
    resumed = ls_train.fit(tiny_cfg(tmp_path / "b", optim__total_steps=4), resume=True, **quiet)
    assert resumed["start"] == 2
    assert resumed["losses"] == full["losses"][2:]  # bit-identical from step 3 on
    assert killed["losses"][:3] == full["losses"][:3]
    for a, b in zip(jax.tree.leaves(full["state"].params), jax.tree.leaves(resumed["state"].params)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    recs = [json.loads(line)["step"] for line in (tmp_path / "b" / "metrics.jsonl").read_text().splitlines()]
    assert recs == list(range(1, 5))  # the killed run's step 3 record was replaced, not duplicated

    # The next stage starts from this one's params (checkpoint.init_from reads them the same way).
    from lsjax.train.checkpoint import load_draft_params

    for a, b in zip(jax.tree.leaves(load_draft_params(tmp_path / "a")), jax.tree.leaves(full["state"].params)):
        np.testing.assert_array_equal(a, np.asarray(b))


def test_nan_loss_stops_and_keeps_last_good_checkpoint(tmp_path, monkeypatch):
    real = ls_step.make_train_step

    def poisoned(*a, **k):
        step = real(*a, **k)

        def f(state, target_params, batch, key):
            new, m = step(state, target_params, batch, key)
            bad = jnp.where(state.step >= 2, jnp.nan, 0.0)
            return new, {**m, "loss": m["loss"] + bad}

        return f

    monkeypatch.setattr(train_loop, "make_train_step", poisoned)
    with pytest.raises(tr.TrainingDiverged, match=r"non-finite loss .* at step 3; .*last good checkpoint: step 2"):
        ls_train.fit(tiny_cfg(tmp_path / "r"), log=lambda *_: None)
    from lsjax.train.checkpoint import Checkpointer

    assert Checkpointer(tmp_path / "r" / "checkpoints").latest_step() == 2


# ----------------------------------------------------------------------------- sharding


SHARDED = textwrap.dedent(
    """
    import os, sys
    os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
    sys.path.insert(0, {tests!r})
    import jax, jax.numpy as jnp, numpy as np
    assert jax.device_count() == 8
    from test_train import TINY, tiny_cfg, _batch
    from lsjax import sharding, train as tr
    from lsjax.models import target as target_lib
    from lsjax.methods.longspec import model as draft_lib
    from lsjax.methods.longspec import step as ls_step
    cfg = tiny_cfg(data__batch_size=8, mesh__data=2, mesh__fsdp=4, loss__distill="kl", loss__distill_weight=0.5,
                   draft__depth={depth})
    tp = target_lib.init_params(TINY, jax.random.PRNGKey(0), scale=0.3)
    dp = draft_lib.init_draft_params(TINY, cfg.draft, tp)
    opt = tr.make_optimizer(cfg.optim)
    (batch,) = _batch(cfg)
    step = ls_step.make_train_step(TINY, cfg)
    key = jax.random.PRNGKey(1)
    single = jax.jit(step)
    s1, m1 = single(tr.init_state(dp, opt), tp, batch, key)
    mesh = sharding.make_mesh(cfg.mesh)
    state = tr.init_state(dp, opt)
    axes = sharding.model_axes(target_lib.Transformer(TINY), draft_lib.LongSpecDraft(TINY, cfg.draft))
    jitted, ssh, tsh, bsh = sharding.shard_train_step(step, mesh, state, tp, batch, axes)
    state, tps = sharding.place(state, ssh), sharding.place(tp, tsh)
    s2, m2 = jitted(state, tps, sharding.place(batch, bsh), key)
    sharded_leaves = [x for x in jax.tree.leaves(s2.params) if not x.sharding.is_fully_replicated]
    assert sharded_leaves, "nothing was sharded"
    np.testing.assert_allclose(float(m1["loss"]), float(m2["loss"]), rtol=1e-5)
    for a, b in zip(jax.tree.leaves(s1.params), jax.tree.leaves(s2.params)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-6)
    print("OK", float(m1["loss"]), len(sharded_leaves))
    """
)


@pytest.mark.slow  # a fresh 8-device process: ~15 s alone on this machine
@pytest.mark.parametrize("depth", [1, 2])  # 2: the deeper blocks' stacked weights on the mesh too
def test_sharded_step_matches_single_device(tmp_path, depth):
    script = tmp_path / "sharded.py"
    script.write_text(SHARDED.format(tests=str(ROOT / "tests"), depth=depth))
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=8"}
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.startswith("OK")


def test_partition_specs():
    from lsjax import sharding

    mesh = jax.sharding.Mesh(np.asarray(jax.devices()[:1]).reshape(1, 1), ("data", "fsdp"))
    axes = {"w_gate": ("embed", "mlp"), "layers/wq": ("layers", "embed", "heads", "head_dim")}
    tree = {"w_gate": np.zeros((32, 64)), "layers": {"wq": np.zeros((2, 32, 4, 8))}, "count": np.zeros(())}
    # an optimizer's moments repeat the params' paths under their own keys
    specs = sharding.tree_shardings({"params": tree, "mu": tree}, mesh, axes)
    for part in ("params", "mu"):
        assert specs[part]["w_gate"].spec == jax.sharding.PartitionSpec("fsdp", None)
        assert specs[part]["layers"]["wq"].spec == jax.sharding.PartitionSpec(None, "fsdp", None, None)
        assert specs[part]["count"].spec == jax.sharding.PartitionSpec()
    with pytest.raises(ConfigError, match="mesh"):
        sharding.make_mesh(from_dict(LongSpecTrainConfig, {"mesh": {"data": 3, "fsdp": 1}}).mesh)


# ----------------------------------------------------------------------------- configs


@pytest.mark.parametrize("path", sorted((ROOT / "configs" / "train").glob("*.yaml")), ids=lambda p: p.stem)
def test_every_train_config_parses(path):
    import yaml

    from lsjax.methods import registry

    raw = yaml.safe_load(path.read_text()) or {}
    kind = registry.get_kind(registry.kind_of(raw)).config_class  # the class its kind registered
    cfg = load_yaml(kind, path)
    assert from_dict(kind, to_dict(cfg)) == cfg
    hash(cfg)


@pytest.mark.parametrize(
    "override, field",
    [
        ({"data": {"seq_len": 4}}, "data.seq_len"),
        ({"data": {"sources": ["wiki"]}}, "data.sources"),
        ({"loss": {"gamma": 1}}, "loss.gamma"),
        ({"loss": {"distill": "mse"}}, "loss.distill"),
        ({"optim": {"lr": 2.0}}, "optim.lr"),
        ({"optim": {"warmup_steps": 10, "total_steps": 5}}, "optim.warmup_steps"),
        ({"mesh": {"data": 0}}, "mesh.data"),
        ({"loss": {"distill": "kl"}}, "loss.distill_weight"),
        ({"data": {"bogus": 1}}, "data.bogus"),
        ({"bogus": 1}, "bogus"),
    ],
)
def test_config_validation_names_the_field(override, field):
    import re

    with pytest.raises(ConfigError, match="^" + re.escape(field)):
        from_dict(LongSpecTrainConfig, override)


# ----------------------------------------------------------------------------- CLI


def _cli(args, cwd, timeout=240):
    return subprocess.run(
        [sys.executable, str(ROOT / "train.py"), *args], capture_output=True, text=True, cwd=cwd, timeout=timeout
    )


def test_cli_bad_config_exits_2(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("data: {seq_len: 2}\n")
    out = _cli(["--config", str(bad)], tmp_path)
    assert out.returncode == 2
    assert out.stderr.count("\n") == 1 and "data.seq_len" in out.stderr
    out = _cli(["--config", str(ROOT / "configs/train/smollm2-smoke.yaml"), "--set", "optim.nope=1"], tmp_path)
    assert out.returncode == 2 and "optim.nope" in out.stderr


@pytest.mark.slow  # the default suite's budget (make test-slow runs it)
def test_cli_end_to_end_tiny(tmp_path):
    cfg = tmp_path / "tiny.yaml"
    d = tiny_dict(tmp_path / "run", log={"plot": True, "progress": True, "tensorboard": False}, checkpoint={"every": 4})
    cfg.write_text(yaml.safe_dump(d))
    out = _cli(["--config", str(cfg), "--set", "steps=4"], tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    summary = json.loads(out.stdout.strip().splitlines()[-1])
    assert summary["steps"] == 4 and summary["loss"] > 0
    run = tmp_path / "run"
    assert (run / "loss.png").stat().st_size > 1000
    assert len((run / "metrics.jsonl").read_text().splitlines()) == 4
    assert "it" in out.stderr or "step" in out.stderr  # the tqdm bar
    # --export: the run as a draft directory decode.py loads, with its training summary and default tree
    out = _cli(["--config", str(cfg), "--export", str(tmp_path / "draft"), "--tree", "2,1"], tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    from lsjax.methods.longspec.checkpoint import load_draft

    params, dcfg, meta = load_draft(tmp_path / "draft")
    assert meta["tree"] == [2, 1] and meta["training"]["steps"] == 4 and meta["training"]["final_loss"] > 0
    assert set(params) >= {"cross_wq", "self_wq", "final_norm"} and dcfg == tiny_cfg().draft
    # per device: the CPU's measured tree stored under its name, other devices fall back to their preset
    out = _cli(["--config", str(cfg), "--export", str(tmp_path / "d2"), "--tree", "cpu=1;tpu=2,1"], tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    from lsjax.methods.longspec.checkpoint import shipped_tree

    meta = load_draft(tmp_path / "d2")[2]
    assert meta["tree"] == {"cpu": [1], "tpu": [2, 1]} and shipped_tree(meta, "cpu").widths == (1,)
    assert shipped_tree(meta, "tpu").widths == (2, 1) and shipped_tree(meta, "gpu").num_nodes > 10
    # a run continuing that draft records the configs that made it, first stage first
    d["checkpoint"]["init_from"] = str(tmp_path / "d2")
    d["run_dir"] = str(tmp_path / "run2")
    cfg2 = tmp_path / "stage2.yaml"
    cfg2.write_text(yaml.safe_dump(d))
    assert _cli(["--config", str(cfg2), "--set", "steps=1"], tmp_path).returncode == 0
    assert _cli(["--config", str(cfg2), "--export", str(tmp_path / "d3")], tmp_path).returncode == 0
    assert load_draft(tmp_path / "d3")[2]["lineage"] == [str(cfg), str(cfg2)]


def _tiny_yaml(tmp_path, **over) -> Path:
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(tiny_dict(tmp_path / "run", **over)))
    return path


def _one_error_line(proc) -> str:
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr and proc.stderr.startswith("error: ")
    return proc.stderr.strip()


def _train_main(capsys, *args) -> tuple[int, str, str]:
    """train.py's main in this process (no second jax import): (exit status, stdout, stderr)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("train_cli", ROOT / "train.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    capsys.readouterr()
    code = module.main(list(args))
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.mark.slow  # ~20 s (two short runs)
def test_cli_rerun_over_checkpoints_needs_resume_or_overwrite(tmp_path, capsys):
    """Training again in a directory with checkpoints would keep the old run's weights as the latest (orbax
    skips a step that exists, and --export would ship them): it is one line naming --resume and --overwrite;
    --overwrite starts afresh (old checkpoints gone), --resume continues."""
    from lsjax.train.checkpoint import load_draft_params

    cfg, run = str(_tiny_yaml(tmp_path, steps=2, checkpoint__every=1)), tmp_path / "run"
    code, _, err = _train_main(capsys, "--config", cfg)
    assert code == 0, err[-2000:]
    first = jax.tree.leaves(load_draft_params(run))
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["1", "2"]

    line = _one_error_line(_cli(["--config", cfg, "--set", "seed=1"], tmp_path))  # the CLI: exit 2, one line
    assert line == (
        f"error: run directory {run} has checkpoints (latest step 2): pass --resume to continue it "
        "or --overwrite to start afresh"
    )
    assert yaml.safe_load((run / "config.yaml").read_text())["seed"] == 0  # nothing of the old run rewritten
    code, _, err = _train_main(capsys, "--config", cfg, "--resume", "--overwrite")
    assert code == 2 and err.count("\n") == 1 and "--resume and --overwrite" in err
    # a tree deeper than the lags the draft was trained at (gamma=6: depth <= 5) is not "no checkpoint"
    code, _, err = _train_main(capsys, "--config", cfg, "--export", str(tmp_path / "d"), "--tree", "2,2,2,2,2,2")
    assert code == 2 and err.count("\n") == 1 and "no checkpoint" not in err, err
    assert "6 levels deep" in err and "lags 1..5 (loss.gamma=6)" in err and not (tmp_path / "d").exists()

    code, _, err = _train_main(capsys, "--config", cfg, "--set", "seed=1", "--set", "checkpoint.every=2", "--overwrite")
    assert code == 0, err[-2000:]
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["2"]  # the old run's step 1 is gone
    second = jax.tree.leaves(load_draft_params(run))
    assert any(not np.array_equal(a, b) for a, b in zip(first, second))  # the new run's weights, not stale ones
    assert [json.loads(r)["step"] for r in (run / "metrics.jsonl").read_text().splitlines()] == [1, 2]
    assert yaml.safe_load((run / "config.yaml").read_text())["seed"] == 1

    code, out, err = _train_main(capsys, "--config", cfg, "--set", "seed=1", "--set", "steps=3", "--resume")
    assert code == 0, err[-2000:]
    assert "resumed from step 2" in out
    summary = json.loads(out.strip().splitlines()[-1])
    assert summary["steps"] == 3 and summary["last_checkpoint"] == 3


@pytest.mark.slow  # ~25 s: a training run to interrupt; the bad-config exit runs by default
def test_cli_ctrl_c_is_one_line_and_exit_130(tmp_path):
    """Ctrl-C in the step loop: no KeyboardInterrupt traceback, one line with the steps done and the
    checkpoint to resume from, exit status 130."""
    import select
    import signal

    cfg = _tiny_yaml(tmp_path, steps=100_000, optim__total_steps=100_000, checkpoint__every=2, log__every=1)
    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "train.py"), "--config", str(cfg), "--no-progress"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=tmp_path,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        deadline, seen = time.monotonic() + 120, ""
        while not seen.startswith("step=3 ") and time.monotonic() < deadline:
            if select.select([proc.stdout], [], [], 1.0)[0]:
                seen = proc.stdout.readline()
                assert seen or proc.poll() is None, proc.stderr.read()[-2000:]
        assert seen.startswith("step=3 "), "no third step logged in 120 s"
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130 and "Traceback" not in err, err[-2000:]
    last = err.strip().splitlines()[-1]
    assert re.fullmatch(
        r"interrupted after step \d+ of 100000; the last checkpoint is step \d+: continue with --resume", last
    ), err[-2000:]
    steps, ckpt = map(int, re.findall(r"step (\d+)", last))
    assert steps >= 3 and 2 <= ckpt <= steps and ckpt % 2 == 0


@pytest.mark.slow
def test_cli_smoke_config_real_target(tmp_path):
    """configs/train/smollm2-smoke.yaml with the real SmolLM2 target: end to end in < 60 s."""
    import resource

    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    out = _cli(["--config", str(ROOT / "configs/train/smollm2-smoke.yaml"), "--set", f"run_dir={tmp_path}/run"], ROOT)
    assert out.returncode == 0, out.stderr[-2000:]
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    # CPU seconds, not wall: the 2 shared cores are often busy with other runs (~37 s wall when idle).
    assert (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime) < 60
    assert json.loads(out.stdout.strip().splitlines()[-1])["last_checkpoint"] == 3


@pytest.mark.slow  # ~16 s; tests/test_feature_cache.py covers the build
def test_feature_cache_builds_once_and_reuses(tmp_path):
    """features.enabled: the target's K/V are written once to npy; a run pointed at an existing cache trains
    exactly as the run that built it (same losses), without running the target again."""
    quiet = dict(log=lambda *_: None)
    common = dict(steps=8, optim__total_steps=8, features__enabled=True, checkpoint__every=8)
    built = ls_train.fit(tiny_cfg(tmp_path / "a", **common), **quiet)
    cache = tmp_path / "a" / "features"
    assert {"target_k.npy", "target_v.npy", "meta.json"} <= {p.name for p in cache.iterdir()}
    assert all(np.isfinite(built["losses"]))
    reused = ls_train.fit(tiny_cfg(tmp_path / "b", features__dir=str(cache), **common), **quiet)
    assert reused["losses"] == built["losses"]


@pytest.mark.slow  # ~22 s
def test_shared_feature_set_trains_like_live_features(tmp_path):
    """features.set: data and target features from the shared cache (K pre-RoPE, roped at the batch's anchor
    offsets in the loss) give the same losses as the live target, up to the cache's float16 rounding."""
    from lsjax.train import feature_cache as fcm

    cfg = tiny_cfg(tmp_path / "run", steps=6, optim__total_steps=6, checkpoint__every=6)
    _, tp, _ = tr.load_target(cfg)
    seqs, mask = data_lib.load_sequences(cfg.data, None, 2, TINY.vocab_size)
    fc = fcm.build(tmp_path / "set", seqs[:24], mask[:24], tp, TINY, shard_size=8, progress=False)
    fcm.build(tmp_path / "set2", seqs[24:40], mask[24:40], tp, TINY, shard_size=8, progress=False)
    shared = tiny_cfg(
        tmp_path / "run", steps=6, optim__total_steps=6, checkpoint__every=6, features__set=str(fc.directory)
    )

    micro = {k: v[0] for k, v in _batch(cfg)[0].items()}
    rows = fc.read(np.arange(4), ("tokens", "k", "v", "topk_ids"))
    micro = {**micro, "tokens": jnp.asarray(rows["tokens"]), "loss_mask": jnp.ones((4, 16), jnp.float32)}
    dp = draft_lib.init_draft_params(TINY, cfg.draft, tp, jax.random.PRNGKey(1))
    shift = jnp.asarray(2, jnp.int32)
    live = ls_losses.micro_losses(dp, tp, TINY, cfg, micro, shift)
    cached = {**micro, "target_k_raw": rows["k"], "target_v": rows["v"], "target_argmax": rows["topk_ids"][..., 0]}
    from_cache = ls_losses.micro_losses(dp, tp, TINY, cfg, cached, shift)
    np.testing.assert_allclose(float(from_cache["ce"]), float(live["ce"]), rtol=2e-3)

    out = ls_train.fit(shared, log=lambda *_: None)
    assert all(np.isfinite(out["losses"])) and len(out["losses"]) == 6
    both = fcm.FeatureSets.open(f"{fc.directory},{tmp_path / 'set2'}")
    assert both.num_sequences == 40 and both.describe() == "set 24/24, set2 16/16"
    got = both.read(np.array([30, 2]), ("tokens", "topk_ids"))
    np.testing.assert_array_equal(got["tokens"][1], fc.tokens[2])
    np.testing.assert_array_equal(got["topk_ids"][0], fcm.FeatureCache.open(tmp_path / "set2").read([6])["topk_ids"][0])
    capped = fcm.FeatureSets.open(f"{fc.directory}:10,{tmp_path / 'set2'}")
    assert capped.num_sequences == 26 and capped.describe() == "set 10/24, set2 16/16"
    np.testing.assert_array_equal(capped.read(np.array([12]), ("tokens",))["tokens"][0], both.tokens[26])
    for bad, msg in ((":0", "N must be in"), (":25", "N must be in")):
        with pytest.raises(fcm.FeatureCacheError, match=msg):
            fcm.FeatureSets.open(f"{fc.directory}{bad}")
    last = fc.directory / "shard-00002"
    last.rename(tmp_path / "aside")  # as if the build were still writing its third shard
    with pytest.raises(fcm.FeatureCacheError, match="asks for 20 sequences, 16 are built"):
        fcm.FeatureSets.open(f"{fc.directory}:20")
    with pytest.raises(ConfigError, match="data.seq_len"):
        ls_train.fit(tiny_cfg(tmp_path / "bad", data__seq_len=32, features__set=str(fc.directory)), log=lambda *_: None)
