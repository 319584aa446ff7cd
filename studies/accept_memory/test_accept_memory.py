"""studies.accept_memory: the rate after a hit and after a miss, counted from each step's accepted count."""

from __future__ import annotations

import pytest

from studies.accept_memory.accept_memory import main, memory


def test_accept_memory_counts_the_rate_after_a_hit_and_after_a_miss(capsys):
    # hit, hit, miss, hit, miss, miss: after a hit (3 steps) 1 of 3 hits; after a miss (2 steps) 1 of 2.
    p, p11, p01, n1, n0 = memory([2, 1, 0, 1, 0, 0])
    assert (round(p, 3), round(p11, 3), round(p01, 3), n1, n0) == (0.5, 0.333, 0.5, 3, 2)
    # Alternating steps: all memory, no hit after a hit.
    assert memory([1, 0, 1, 0, 1])[1:3] == (0.0, 1.0)
    with pytest.raises(SystemExit) as e:
        main(["--steps", "1"])
    assert e.value.code == 2 and "--steps: must be >= 2" in capsys.readouterr().err
