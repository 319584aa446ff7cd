"""The compiled-program cache (`lsjax.engine.programs`): keys that change with what determines a program and
with nothing else, a second Generator that loads instead of tracing and decodes the same, damaged files."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lsjax.config import GenerateConfig
from lsjax.engine import programs
from lsjax.engine.host import Generator
from lsjax.engine.programs import ProgramCache, program_key
from lsjax.engine.types import SpecConfig
from lsjax.methods.pld.drafter import PLDDrafter
from tests.tiny import tiny_model


@dataclasses.dataclass(frozen=True)
class Foreign:  # a plugin's static configuration: defined outside lsjax
    n: int = 1


def _args(width=8):
    return (jnp.zeros((2, width), jnp.float32), {"k": jax.ShapeDtypeStruct((3,), jnp.int32)})


def test_keys_follow_what_determines_a_program():
    config, _ = tiny_model()
    spec = SpecConfig(config, GenerateConfig(max_new_tokens=8), PLDDrafter(num_tokens=3), capacity=512)
    same = SpecConfig(config, GenerateConfig(max_new_tokens=8), PLDDrafter(num_tokens=3), capacity=512)
    key = program_key("start", spec, _args())
    assert key is not None and key == program_key("start", same, _args())
    assert key != program_key("decode", spec, _args())
    assert key != program_key("start", dataclasses.replace(spec, capacity=1024), _args())
    assert key != program_key("start", spec, _args(width=16))
    assert key != program_key("start", spec, (jnp.zeros((2, 8), jnp.int32), _args()[1]))
    other = SpecConfig(config, GenerateConfig(max_new_tokens=8), PLDDrafter(num_tokens=4), capacity=512)
    assert key != program_key("start", other, _args())


def test_code_from_outside_lsjax_is_never_cached():
    assert program_key("p", Foreign(), _args()) is None
    assert program_key("p", (1, Foreign()), _args()) is None
    assert program_key("p", object(), _args()) is None  # a repr naming an address


def _cache_with_counted_lowering(root):
    cache = ProgramCache(root)
    lowered = []

    def get(x):
        def lower():
            lowered.append(1)
            return jax.jit(lambda a: a * 2 + 1).lower(x)

        return cache.get("double", ("double", 1), (x,), lower)

    return cache, get, lowered


def test_a_second_cache_loads_without_lowering(tmp_path):
    x = jnp.arange(6.0)
    _, get, lowered = _cache_with_counted_lowering(tmp_path)
    np.testing.assert_array_equal(get(x)(x), x * 2 + 1)
    assert lowered == [1] and len(list(tmp_path.glob(f"*{programs.SUFFIX}"))) == 1
    cache, get, lowered = _cache_with_counted_lowering(tmp_path)
    np.testing.assert_array_equal(get(x)(x), x * 2 + 1)
    assert lowered == [] and cache.hits == 1


def test_a_damaged_file_is_compiled_again_and_replaced(tmp_path):
    x = jnp.arange(4.0)
    _cache_with_counted_lowering(tmp_path)[1](x)
    (path,) = tmp_path.glob(f"*{programs.SUFFIX}")
    path.write_bytes(b"not a program")
    cache, get, lowered = _cache_with_counted_lowering(tmp_path)
    np.testing.assert_array_equal(get(x)(x), x * 2 + 1)
    assert lowered == [1] and cache.hits == 0 and path.read_bytes() != b"not a program"


def test_only_the_newest_files_are_kept(tmp_path, monkeypatch):
    monkeypatch.setattr(programs, "MAX_FILES", 2)
    _, get, _ = _cache_with_counted_lowering(tmp_path)
    for n in (3, 4, 5):
        get(jnp.zeros((n,)))
    assert len(list(tmp_path.glob(f"*{programs.SUFFIX}"))) == 2


@pytest.mark.parametrize("method", ["ar", "pld"])
def test_a_second_generator_loads_both_programs_and_decodes_the_same(tmp_path, method):
    config, params = tiny_model()
    drafter = PLDDrafter(num_tokens=3) if method == "pld" else None
    ids = [5, 6, 7, 8, 5, 6, 7, 8, 5, 6]
    gen = GenerateConfig(max_new_tokens=12, ignore_eos=True)
    kw = {} if drafter is None else {"drafter": drafter}
    first = Generator(config, params, program_cache=ProgramCache(tmp_path), **kw).run(ids, gen)
    cache = ProgramCache(tmp_path)
    second = Generator(config, params, program_cache=cache, **kw).run(ids, gen)
    assert cache.hits == 2 and second.tokens == first.tokens


def test_a_mesh_generator_does_not_use_the_cache(tmp_path):
    config, params = tiny_model()
    from lsjax import mesh as mesh_lib

    g = Generator(config, params, mesh=mesh_lib.make("data=1"), program_cache=ProgramCache(tmp_path))
    assert g.programs is None
