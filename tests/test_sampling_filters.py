"""The sampling filters three ways: lsjax's `processed_logprobs`, an independent numpy reference
(`tests/filters_ref.py`, used by the losslessness tests as "the target's distribution") and HF's logits
processors, on random logits full of ties."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

from lsjax.config import SamplingConfig
from lsjax.sampling import processed_logprobs
from tests.filters_ref import reference_probs

CONFIGS = [
    SamplingConfig(temperature=1.0),
    SamplingConfig(temperature=0.7, top_k=5),
    SamplingConfig(temperature=1.3, top_p=0.7),
    SamplingConfig(temperature=1.0, min_p=0.2),
    SamplingConfig(temperature=0.9, top_k=8, top_p=0.9, min_p=0.05),
    SamplingConfig(temperature=1.0, top_k=1),
    SamplingConfig(temperature=1.0, top_p=0.01),
]


def tied_logits(rng, rows=64, vocab=24):
    """Logits on a coarse grid (many exact ties), some rows with a few huge values."""
    x = rng.integers(-6, 6, size=(rows, vocab)).astype(np.float32) / 2
    x[::7, :3] = 9.0
    return x


def hf_probs(logits: np.ndarray, cfg: SamplingConfig) -> np.ndarray:
    torch = pytest.importorskip("torch")
    from transformers.generation import logits_process as lp

    procs = [lp.TemperatureLogitsWarper(cfg.temperature)]
    if cfg.top_k:
        procs.append(lp.TopKLogitsWarper(cfg.top_k))
    if cfg.top_p < 1:
        procs.append(lp.TopPLogitsWarper(cfg.top_p))
    if cfg.min_p:
        procs.append(lp.MinPLogitsWarper(cfg.min_p))
    scores = torch.tensor(logits, dtype=torch.float64)
    for proc in procs:
        scores = proc(None, scores)
    return torch.softmax(scores, -1).numpy()


@pytest.mark.parametrize("cfg", CONFIGS, ids=str)
def test_numpy_reference_matches_hf_processors(cfg):
    """Equal to HF wherever HF is order-independent. HF's top-p sorts, so inside a group of tied logits at
    the cut it keeps whichever members the sort put first; the reference keeps the whole group. There the
    reference's kept set must contain HF's, and differ only by members of that group."""
    logits = tied_logits(np.random.default_rng(0))
    for row in logits:
        ref = reference_probs(row, cfg.temperature, cfg.top_k, cfg.top_p, cfg.min_p)
        hf = hf_probs(row[None], cfg)[0]
        if np.array_equal(ref > 0, hf > 0):
            np.testing.assert_allclose(ref, hf, atol=1e-9)
            continue
        assert cfg.top_p < 1, "only top-p may break ties by sort order"
        extra = (ref > 0) & ~(hf > 0)
        assert not np.any((hf > 0) & ~(ref > 0)), "HF kept a token the reference dropped"
        assert len(set(row[extra].tolist())) == 1, "the sets differ outside one tie group"
        assert row[extra][0] == row[ref > 0].min(), "the differing group is not the one at the cut"


@pytest.mark.parametrize("cfg", CONFIGS, ids=str)
def test_processed_logprobs_matches_the_reference(cfg):
    logits = tied_logits(np.random.default_rng(1))
    ours = np.exp(np.asarray(processed_logprobs(jnp.asarray(logits), cfg), np.float64))
    for row, got in zip(logits, ours):
        np.testing.assert_allclose(
            got, reference_probs(row, cfg.temperature, cfg.top_k, cfg.top_p, cfg.min_p), atol=2e-6
        )


def test_reference_catches_a_wrong_filter():
    """The comparison can fail: top-p that also drops the token crossing the threshold differs."""
    logits = tied_logits(np.random.default_rng(2))
    cfg = SamplingConfig(temperature=1.0, top_p=0.5)
    wrong = processed_logprobs(jnp.asarray(logits), SamplingConfig(temperature=1.0, top_p=0.3))
    diffs = [
        not np.allclose(np.exp(np.asarray(w, np.float64)), reference_probs(r, 1.0, 0, cfg.top_p, 0.0), atol=2e-6)
        for r, w in zip(logits, wrong)
    ]
    assert any(diffs)
