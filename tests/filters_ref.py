"""A plain numpy reference for the sampling filters, written apart from `lsjax.sampling` (and checked against
HF's logits processors in the tests), so the exact distributions the losslessness tests compare with do not
share code with what they test."""

from __future__ import annotations

import numpy as np


def reference_probs(
    logits: np.ndarray,
    temperature: float,
    top_k: int = 0,
    top_p: float = 1.0,
    min_p: float = 0.0,
    penalty: float = 1.0,
    penalized=(),
):
    """1-D logits -> probabilities after the contextual penalty, temperature, top-k, top-p, min-p (in that
    order, as HF applies them). `penalized`: the token ids in the penalty window (repeats allowed): each
    one's logit is divided by `penalty` when positive, multiplied when negative (CTRL, HF's
    RepetitionPenaltyLogitsProcessor, TokenSwift's contextual penalty).

    Ties: a filter that keeps one member of a group of equal logits keeps the whole group (HF's top-p keeps
    whichever members its sort happens to put first)."""
    x = np.array(logits, np.float64)
    for t in set(int(t) for t in penalized):
        x[t] = x[t] * penalty if x[t] < 0 else x[t] / penalty
    if temperature == 0:
        out = np.zeros_like(x)
        out[int(np.argmax(x))] = 1.0
        return out
    x = x / temperature
    keep = np.ones(x.shape, bool)
    if 0 < top_k < x.size:
        kth = np.sort(x)[::-1][top_k - 1]
        keep &= x >= kth
    if top_p < 1.0:
        p = _softmax(np.where(keep, x, -np.inf))
        for i in range(x.size):  # keep token i if the mass of strictly more likely tokens is < top_p
            if keep[i]:
                keep[i] = p[p > p[i]].sum() < top_p
    if min_p > 0.0:
        p = _softmax(np.where(keep, x, -np.inf))
        keep &= p >= min_p * p.max()
    return _softmax(np.where(keep, x, -np.inf))


def _softmax(x: np.ndarray) -> np.ndarray:
    m = np.max(x)
    e = np.where(np.isfinite(x), np.exp(x - m), 0.0)
    return e / e.sum()
