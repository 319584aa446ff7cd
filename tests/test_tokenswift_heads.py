"""TokenSwift's chained heads against a numpy reference; zero init reproduces the target's own head."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lsjax.config import ConfigError
from lsjax.methods.tokenswift import model as th
from lsjax.models import target
from tests.tiny import tiny_model


def _rms(x, w, eps):
    return w * x / np.sqrt(np.mean(x * x, -1, keepdims=True) + eps)


def numpy_heads(params, tparams, config, h0):
    p = {k: np.asarray(v, np.float64) for k, v in params.items()}
    emb = np.asarray(tparams["embed"], np.float64)
    h, out = np.asarray(h0, np.float64), []
    for i in range(p["w"].shape[0]):
        h = h + _rms(h, p["in_norm"][i], config.rms_norm_eps) @ p["w"][i]
        out.append(_rms(h, p["out_norm"][i], config.rms_norm_eps) @ emb.T)
    return np.stack(out, -2)


@pytest.mark.parametrize("untied", [False, True])
def test_heads_match_numpy_and_zero_init_is_the_target_head(untied):
    config, tparams = tiny_model()
    if untied:
        config = dataclasses.replace(config, tie_embeddings=False)
        tparams = {**tparams, "lm_head": jnp.asarray(tparams["embed"]).T}
    hcfg = th.HeadsConfig(3)
    h0 = jax.random.normal(jax.random.key(0), (2, 5, config.hidden_size))
    params = th.init_params(config, hcfg, tparams, key=jax.random.key(1))
    params["in_norm"] = params["in_norm"] * 1.3
    got = th.heads_logits(params, tparams, config, h0)
    assert got.shape == (2, 5, 3, config.vocab_size)
    np.testing.assert_allclose(np.asarray(got), numpy_heads(params, tparams, config, h0), rtol=2e-4, atol=2e-4)
    zero = th.init_params(config, hcfg, tparams)
    every = th.all_logits(zero, tparams, config, h0)  # [2, 5, 4, V]
    own = target.lm_head(tparams, config, h0)
    for i in range(4):
        np.testing.assert_allclose(np.asarray(every[..., i, :]), np.asarray(own), rtol=1e-5, atol=1e-5)


def test_every_head_gets_a_gradient():
    config, tparams = tiny_model()
    params = th.init_params(config, th.HeadsConfig(3), tparams)
    h0 = jax.random.normal(jax.random.key(0), (4, config.hidden_size))

    def loss(p):
        return -jnp.sum(jax.nn.log_softmax(th.heads_logits(p, tparams, config, h0))[..., 7])

    g = jax.grad(loss)(params)
    assert all(float(jnp.abs(g["w"][i]).sum()) > 0 for i in range(3))
    with pytest.raises(ConfigError, match="heads.num_heads"):
        th.HeadsConfig(0)
