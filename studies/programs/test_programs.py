"""studies.programs.programs: a stored program's load time and size read in a fresh process; a bad width is one line."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest

from lsjax.runtime.programs import SUFFIX, ProgramCache
from studies.programs import programs


def test_a_stored_program_is_loaded_in_a_fresh_process(tmp_path):
    cache = ProgramCache(tmp_path)
    cache.get("double", None, ((jnp.zeros(4),), {}), lambda: jax.jit(lambda a: a * 2).lower(jnp.zeros(4)))
    stored = next(tmp_path.glob(f"double-*{SUFFIX}"))
    seconds, size = programs.load_seconds(stored, 1)
    assert 0 < seconds < 30 and size > 100


def test_a_bad_width_is_one_line(capsys):
    with pytest.raises(SystemExit) as e:
        programs.main(["--width", "300"])
    assert e.value.code == 2 and "--width must be one of [256, 512" in capsys.readouterr().err
