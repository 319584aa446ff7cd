"""studies.roofline.roofline on a tiny random target: both variants run, interleaved, and the ratios come out."""

from __future__ import annotations

import numpy as np
import pytest

from studies.roofline import roofline
from tests.tiny import tiny_model


@pytest.mark.slow  # ~28 s; a benchmark tool
def test_measure_and_report_on_a_tiny_model():
    config, params = tiny_model()
    lines = []
    variants = ("before", "after")
    res = roofline.measure(config, params, [16, 48], [1, 8], repeats=2, capacity=64, variants=variants)
    roofline.report(res, [16, 48], [1, 8], variants, log=lines.append)
    mats = roofline.weight_matrices(roofline.target.prepare_for_decode(params, config), config)
    # Every weight once: per layer w_qkv, wo, w_gate_up, w_down, plus the (tied) head.
    assert len(mats) == 4 * config.num_layers + 1 and mats[-1][1]
    assert res["weight_bytes"] == sum(int(np.prod(w.shape)) * 4 for w, _ in mats)
    assert set(res["times"]) == {(n, c, T) for n in variants for c in (16, 48) for T in (1, 8)}
    for n in variants:
        s = res["summary"][n]
        assert s["step_vs_weight_read"] > 0 and s["8_vs_1_at_max_context"] > 0
        assert "context_growth_vs_kv_read" in s
    text = "\n".join(lines)
    assert "goal <= 1.3" in text and "after/before" in text
    assert roofline.old_block_rule(4608) == 512 and roofline.old_block_rule(4352) == 256
