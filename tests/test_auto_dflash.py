"""`auto` with a DFlash draft: its chains (the block's first tokens) and its static tree among the candidates,
the draft's context cache fed the target's streams along every committed path whichever candidate ran."""

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
from lsjax.methods.dflash.checkpoint import random_draft
from lsjax.methods.dflash.drafter import DFlashDrafter, DFlashTree
from tests.test_dflash import small_target
from tests.test_speculative import repetitive_prompts, run


@functools.cache
def _setup():
    config, params = small_target()
    cfg, dp, _ = random_draft(config, layers=2, block_size=5, seed=1)
    df = DFlashDrafter(cfg, DFlashTree(8, 3))
    auto = AutoDrafter(dflash=df, chains=(1, 3, 6), hybrid_pld=0, policy=AutoPolicy(probe_min=2, probe_max=4))
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

    return config, params, auto, df, dp, prompts, gen, ar, decode


def test_candidates_and_layout():
    _c, _p, auto, df, *_ = _setup()
    names = [c.name for c in auto.candidates]
    # Chains longer than the block's 4 drafted positions are cut to it.
    assert names == ["ar", "pld-4", "pld-8", "df-chain1", "df-chain3", "df-chain4", "df-tree"], names
    assert auto.families[-2:] == ("df-chain", "df-tree")
    assert auto.aux_hidden_layers == df.aux_hidden_layers and not auto.shadows and not auto.ar_stretches
    assert auto.cost_names == tuple(names)
    assert auto.check_params(auto_params(auto, dflash_params=_setup()[4]), _setup()[0]) is None


@pytest.mark.slow  # the default suite's budget (make test-slow runs it)
def test_the_policy_runs_the_draft_and_stays_lossless():
    """Priced to pay, the draft's candidates run beside AR and prompt lookup; the output is AR's, and the draft's
    context cache is what a prefill of everything committed gives (every committed token went in once, with the
    target's streams there, whichever candidate committed it)."""
    config, params, auto, df, dp, prompts, gen, ar, decode = _setup()
    costs = np.asarray([1.0, 1.02, 1.04, 1.05, 1.07, 1.08, 1.1], np.float32)
    out = decode(auto_params(auto, dflash_params=dp, costs=costs))
    np.testing.assert_array_equal(np.asarray(out.out), np.asarray(ar.out))
    used = auto.summary(out.draft)["steps_by_candidate"]
    assert any(k.startswith("df") for k in used), used
    n = np.asarray(out.cache.lengths)
    num_out = np.asarray(out.num_out)
    rows = [list(p) + list(np.asarray(out.out)[b, : num_out[b] - 1]) for b, p in enumerate(prompts)]
    m = np.asarray([len(r) for r in rows])
    toks = jnp.asarray(np.stack([np.pad(r, (0, 96 - len(r))) for r in rows]).astype(np.int32))
    ref = engine.start(params, dp, config, df, gen, toks, jnp.asarray(m), jax.random.key(0), capacity=128, chunk=32)
    cache = out.draft.ring.cache
    np.testing.assert_array_equal(np.asarray(cache.lengths), n)
    for b in range(len(rows)):
        got, want = np.asarray(cache.k)[:, b, :, : m[b]], np.asarray(ref.draft.cache.k)[:, b, :, : m[b]]
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


@pytest.mark.slow
def test_every_candidate_forced_equals_ar_and_the_draft_alone():
    """Forced, each candidate emits AR's tokens; forcing df-tree (or a chain) runs exactly the steps of the dflash
    method with that tree."""
    config, params, auto, df, dp, prompts, gen, ar, decode = _setup()
    adp = auto_params(auto, dflash_params=dp)
    for i, c in enumerate(auto.candidates):
        out = decode(adp, force=i)
        np.testing.assert_array_equal(np.asarray(out.out), np.asarray(ar.out), err_msg=c.name)
        if c.kind == "df":
            alone = run(params, config, prompts, gen, c.drafter, draft_params=dp)
            assert int(out.steps) == int(alone.steps), c.name


def test_a_dflash_directory_makes_auto_use_it():
    """`--draft DIR` of a DFlash draft with auto gives the df candidates and `--json` names its layout; `--dflash
    random` as well; both at once is one line."""
    from pathlib import Path

    from lsjax.config import ConfigError
    from lsjax.methods import registry
    from lsjax.methods.auto.config import AutoOptions, draft_info
    from lsjax.methods.dflash.checkpoint import is_dflash_dir
    from tests.test_dflash import fixture_target

    path = Path(__file__).parent / "fixtures" / "dflash" / "qwen3"
    assert is_dflash_dir(path) and not is_dflash_dir(path.parent)
    config = fixture_target("qwen3")
    model = type("Model", (), {"config": config, "params": None, "path": None})
    drafter, adp = registry.build("auto", model, draft=str(path))
    assert drafter.dflash is not None and drafter.longspec is None and "dflash" in adp
    assert draft_info(AutoOptions(draft=str(path))) == {"dir": str(path), "format": "dflash"}
    drafter, _ = registry.build("auto", model, dflash="random")
    assert [c.name for c in drafter.candidates][-1] == "df-tree"
    with pytest.raises(ConfigError, match="give one draft"):
        registry.build("auto", model, dflash="random", draft=str(path))
