"""`auto` with an EAGLE-3 draft: its chains and dynamic tree among the candidates, the draft's cache fed the
target's streams along every committed path whichever candidate ran."""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lsjax import engine
from lsjax.config import GenerateConfig, SamplingConfig
from lsjax.engine.types import ARDrafter
from lsjax.methods.auto.drafter import AutoDrafter, AutoPolicy, auto_params
from lsjax.methods.eagle3.checkpoint import random_draft
from lsjax.methods.eagle3.drafter import Eagle3Drafter, Eagle3Tree
from tests.test_eagle3 import small_target
from tests.test_speculative import repetitive_prompts, run

TREE = Eagle3Tree(6, 4, 2)


@functools.cache
def _setup():
    config, params = small_target()
    cfg, dp, _ = random_draft(config, seed=1)
    e3 = Eagle3Drafter(cfg, TREE)
    auto = AutoDrafter(eagle3=e3, chains=(1, 3), hybrid_pld=0, policy=AutoPolicy(probe_min=2, probe_max=4))
    dp = jax.tree.map(jnp.asarray, dp)
    prompts = repetitive_prompts(config, 2, 40, seed=1) + [np.arange(3, 12)]
    gen = GenerateConfig(max_new_tokens=24, ignore_eos=True, sampling=SamplingConfig(temperature=0.0))
    ar = run(params, config, prompts, gen, ARDrafter())
    tokens = jnp.asarray(np.stack([np.pad(p, (0, 64 - len(p))) for p in prompts]).astype(np.int32))
    lengths = jnp.asarray([len(p) for p in prompts], jnp.int32)
    cap = engine.required_capacity(64, gen, auto)
    start = jax.jit(functools.partial(engine.start, config=config, drafter=auto, gen=gen, capacity=cap, chunk=64))

    def decode(draft_params, force: int = -1):
        state = start(params, draft_params, tokens=tokens, lengths=lengths, key=jax.random.key(0))
        pol = dataclasses.replace(state.draft.policy, force=jnp.int32(force))
        state = dataclasses.replace(state, draft=dataclasses.replace(state.draft, policy=pol))
        return engine.decode(params, draft_params, config, auto, gen, state, jnp.int32(100))

    return config, params, auto, e3, dp, prompts, gen, ar, decode


def test_candidates_and_layout():
    *_, auto, e3, dp, _p, _g, _a, _d = _setup()[:9]
    names = [c.name for c in auto.candidates]
    assert names == ["ar", "pld-4", "pld-8", "e3-chain1", "e3-chain3", "e3-tree"], names
    assert auto.families[-2:] == ("e3-chain", "e3-tree")
    assert auto.aux_hidden_layers == e3.aux_hidden_layers and not auto.shadows and not auto.ar_stretches
    assert auto.cost_names == tuple(names)  # no shadow entry: EAGLE-3's candidates are probed


@pytest.mark.slow
def test_every_candidate_forced_equals_ar_and_the_draft_alone():
    """Forced, each candidate emits AR's tokens; forcing e3-tree (or a chain) runs exactly the steps of the
    eagle3 method with that tree, so the draft's cache saw the same pairs through auto's path as on its own."""
    config, params, auto, e3, dp, prompts, gen, ar, decode = _setup()
    adp = auto_params(auto, eagle3_params=dp)
    for i, c in enumerate(auto.candidates):
        out = decode(adp, force=i)
        np.testing.assert_array_equal(np.asarray(out.out), np.asarray(ar.out), err_msg=c.name)
        if c.kind == "e3":
            alone = run(params, config, prompts, gen, c.drafter, draft_params=dp)
            assert int(out.steps) == int(alone.steps), c.name
            if c.name == "e3-tree":
                assert int(out.steps) < int(ar.steps)


@pytest.mark.slow
def test_the_policy_runs_the_draft_and_stays_lossless():
    *_, auto, e3, dp, _p, _g, ar, decode = _setup()
    adp = auto_params(auto, eagle3_params=dp, costs=np.asarray([1.0, 1.02, 1.04, 1.05, 1.08, 1.1], np.float32))
    out = decode(adp)
    np.testing.assert_array_equal(np.asarray(out.out), np.asarray(ar.out))
    used = auto.summary(out.draft)["steps_by_candidate"]
    assert any(k.startswith("e3") for k in used) and used.get("ar", 0) + used.get("pld-4", 0) > 0, used
    _check_draft_state(out)


def _check_draft_state(out):
    """The draft's state after a run is the one a prefill of everything committed gives: every pair went into
    its cache once, with the target's streams at that position, whichever candidate committed it."""
    config, params, auto, e3, dp, prompts, gen, _ar, _ = _setup()
    n = np.asarray(out.cache.lengths)
    num_out = np.asarray(out.num_out)
    # A row's last step may commit past its token limit (the tokens it did not emit): compare what it emitted.
    rows = [list(p) + list(np.asarray(out.out)[b, : num_out[b] - 1]) for b, p in enumerate(prompts)]
    m = np.asarray([len(r) for r in rows])
    assert np.all(m <= n)
    W = 96
    toks = jnp.asarray(np.stack([np.pad(r, (0, W - len(r))) for r in rows]).astype(np.int32))
    ref = engine.start(params, dp, config, e3, gen, toks, jnp.asarray(m), jax.random.key(0), capacity=128, chunk=32)
    ring = out.draft.ring
    np.testing.assert_array_equal(np.asarray(ring.cache.lengths), n)
    for b in range(len(rows)):
        got, want = np.asarray(ring.cache.k)[0, b, :, : m[b] - 1], np.asarray(ref.draft.cache.k)[0, b, :, : m[b] - 1]
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_one_draft_at_a_time():
    from lsjax.config import ConfigError
    from lsjax.methods.longspec.drafter import LongSpecDrafter

    e3 = _setup()[3]
    with pytest.raises(ConfigError, match="one draft at a time"):
        AutoDrafter(longspec=LongSpecDrafter.__new__(LongSpecDrafter), eagle3=e3)


def test_a_draft_directory_in_an_eagle3_layout_makes_auto_use_it(tmp_path):
    """`--draft DIR` with auto: an EAGLE-3 directory (either layout, told apart by its config.json) gives the
    e3 candidates and `--json` names its layout; `--eagle3 random` as well; both at once is one line."""
    from lsjax.config import ConfigError
    from lsjax.methods import registry
    from lsjax.methods.auto.config import AutoOptions, draft_info
    from lsjax.methods.eagle3.checkpoint import is_eagle3_dir, write_draft

    config, params, _auto, e3, dp, *_ = _setup()
    path = write_draft(tmp_path / "e3", e3.draft, jax.tree.map(np.asarray, dp), "speculators")
    assert is_eagle3_dir(path) and not is_eagle3_dir(tmp_path)
    model = type("Model", (), {"config": config, "params": params, "path": None})
    drafter, adp = registry.build("auto", model, draft=str(path))
    assert drafter.eagle3 is not None and drafter.longspec is None and "eagle3" in adp
    assert draft_info(AutoOptions(draft=str(path))) == {"dir": str(path), "format": "speculators"}
    drafter, _ = registry.build("auto", model, eagle3="random")
    assert [c.name for c in drafter.candidates][-1] == "e3-tree"
    with pytest.raises(ConfigError, match="give one draft"):
        registry.build("auto", model, eagle3="random", draft=str(path))
