"""`lsjax.generate` and its configs check their inputs: a named one-line error for every bad argument where it
can be known (shapes and dtypes at trace time, values where concrete), and under the caller's jit an invalid row
yields no output rather than output computed from garbage."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import lsjax
from lsjax.config import ConfigError, GenerateConfig
from lsjax.errors import InputError
from lsjax.models import target
from tests.tiny import tiny_model

CHUNK = 64


@pytest.fixture(scope="module")
def tiny():
    return tiny_model()


def cfg(config, max_new=4, **kw):
    return lsjax.SpecConfig(model=config, gen=GenerateConfig(max_new, ignore_eos=True), chunk=CHUNK, **kw)


def one_line(e) -> str:
    msg = str(e.value)
    assert "\n" not in msg
    return msg


@pytest.mark.parametrize(
    "prompt, lengths, message",
    [
        (np.ones((1, CHUNK), np.float32), None, "prompt_ids: expected integer token ids, got dtype float32"),
        (np.ones((CHUNK,), np.int32), None, "prompt_ids: expected shape [batch, width], got (64,)"),
        (
            np.ones((2, CHUNK), np.int32),
            np.array([3]),
            "prompt_lengths: expected shape (2,) (one per prompt row), got (1,)",
        ),
        (np.ones((1, CHUNK), np.int32), np.array([0]), "prompt_lengths[0]: 0 is outside [1, 64] (the prompt width)"),
        (np.ones((1, CHUNK), np.int32), np.array([65]), "prompt_lengths[0]: 65 is outside [1, 64] (the prompt width)"),
        (
            np.full((1, CHUNK), 97, np.int32),
            np.array([5]),
            "prompt_ids[0]: token id 97 is outside the vocabulary [0, 97)",
        ),
        (
            np.full((1, CHUNK), -1, np.int32),
            np.array([5]),
            "prompt_ids[0]: token id -1 is outside the vocabulary [0, 97)",
        ),
        (np.ones((1, CHUNK), np.int32), np.array([3.0]), "prompt_lengths: expected integers, got dtype float64"),
    ],
)
def test_bad_prompts_are_named(tiny, prompt, lengths, message):
    config, params = tiny
    with pytest.raises(InputError) as e:
        lsjax.generate(params, (), prompt, cfg(config), jax.random.key(0), lengths)
    assert one_line(e) == message


def test_padding_past_the_length_is_not_checked(tiny):
    """Ids past a row's length are padding: anything may stand there."""
    config, params = tiny
    prompt = np.full((1, CHUNK), -7, np.int32)
    prompt[0, :5] = [3, 4, 5, 6, 7]
    out = lsjax.generate(params, (), prompt, cfg(config), jax.random.key(0), np.array([5]))
    assert int(out.num_tokens[0]) == 4


def test_context_window_overflow_is_named(tiny):
    config, params = tiny
    prompt = np.ones((1, 2048), np.int32)
    with pytest.raises(InputError) as e:
        lsjax.generate(params, (), prompt, cfg(config, max_new=8), jax.random.key(0), np.array([2045]))
    assert one_line(e) == "prompt_lengths[0]: 2045 prompt tokens + max_new_tokens 8 exceed the context window of 2048"
    with pytest.raises(ConfigError, match="SpecConfig.gen.max_new_tokens: 2048 does not fit the model's context"):
        cfg(config, max_new=2048)


def test_under_jit_invalid_rows_return_nothing(tiny):
    """Values are data under the caller's jit: row 0 is fine, row 1 has length 0, row 2 an id outside the
    vocabulary; only row 0 returns tokens, and they are the tokens row 0 gets alone."""
    config, params = tiny
    prompt = np.ones((3, CHUNK), np.int32)
    prompt[2, 1] = 500
    lengths = np.array([5, 0, 5], np.int32)
    run = jax.jit(lsjax.generate, static_argnames="config")
    out = run(params, (), prompt, cfg(config), jax.random.key(0), lengths)
    assert np.asarray(out.num_tokens).tolist() == [4, 0, 0]
    alone = lsjax.generate(params, (), prompt[:1], cfg(config), jax.random.key(0), lengths[:1])
    np.testing.assert_array_equal(np.asarray(out.tokens[0]), np.asarray(alone.tokens[0]))


@pytest.mark.parametrize(
    "kw, message",
    [
        (dict(drafter="pld"), "SpecConfig.drafter: expected a Drafter (e.g. lsjax.PLDDrafter()), got 'pld'"),
        (dict(capacity=0), "SpecConfig.capacity: must be None or an integer >= 1, got 0"),
        (dict(backend="cuda"), "SpecConfig.backend: must be one of"),
    ],
)
def test_spec_config_checks_its_fields(tiny, kw, message):
    with pytest.raises(ConfigError) as e:
        cfg(tiny[0], **kw)
    assert one_line(e).startswith(message)


def test_pld_needs_a_token(tiny):
    with pytest.raises(ValueError, match=r"pld: num_tokens must be an integer >= 1 \(tokens per lookup chain\), got 0"):
        lsjax.PLDDrafter(num_tokens=0)


def test_valid_calls_still_run_under_jit(tiny):
    config, params = tiny
    out = jax.jit(lsjax.generate, static_argnames="config")(
        params, (), jnp.ones((1, CHUNK), jnp.int32), cfg(config, drafter=lsjax.PLDDrafter(2)), jax.random.key(0),
        jnp.array([9]),
    )  # fmt: skip
    assert int(out.num_tokens[0]) == 4


# ------------------------------------------------------------------ params, key and jit: named at trace time


@pytest.mark.parametrize(
    "key, message",
    [
        (0, "key: expected a PRNG key (jax.random.key(seed)), got int"),
        (jax.random.split(jax.random.key(0), 2), "key: expected one PRNG key (shape ()), got a batch of shape (2,)"),
        (np.zeros(2, np.float32), "key: expected a PRNG key (jax.random.key(seed)), got a float32 array of shape (2,)"),
    ],
)
def test_a_bad_key_is_named(tiny, key, message):
    config, params = tiny
    with pytest.raises(InputError) as e:
        lsjax.generate(params, (), np.ones((1, CHUNK), np.int32), cfg(config), key)
    assert one_line(e) == message


def test_a_raw_key_is_still_a_key(tiny):
    """The legacy uint32 form (jax.random.PRNGKey) passes the check as the typed one does (the draw takes both)."""
    config, params = tiny
    for key in (jax.random.PRNGKey(5), jax.random.key(5)):
        assert lsjax.engine.check_inputs(params, (), key, cfg(config)) is None


def test_a_prompt_width_off_the_chunk_is_named(tiny):
    config, params = tiny
    with pytest.raises(InputError) as e:
        lsjax.generate(params, (), np.ones((1, CHUNK - 14), np.int32), cfg(config), jax.random.key(0))
    assert one_line(e) == "prompt_ids: width 50 must be a multiple of SpecConfig.chunk=64; pad it"


def _target_cases(config, params):
    prepared = target.prepare_for_decode(params, config, layout="in")
    layers, stacked = prepared["layers"], params["layers"]
    trimmed = dict(layers[0], w_qkv=layers[0]["w_qkv"][:, :-1])
    return [
        ({k: v for k, v in params.items() if k != "embed"}, "tensor embed: missing (expected shape (97, 48))"),
        (
            {**params, "layers": {**stacked, "wq": stacked["wq"][..., :-1]}},
            "tensor layers/wq: expected shape (2, 48, 6, 8), got (2, 48, 6, 7)",
        ),
        (
            {**params, "layers": {**stacked, "lora_a": stacked["wq"]}},
            "tensor layers/lora_a: not a parameter of this model",
        ),
        ({**prepared, "layers": layers[:1]}, "layers: 1 of them, the model config has num_layers=2"),
        (
            {**prepared, "layers": (trimmed, layers[1])},
            "tensor layers[0]/w_qkv: shape (48, 79), the model config implies 3840 elements",
        ),
        ([params], "expected the target's {name: array} dict (lsjax.load_model().params), got list"),
    ]


def test_target_params_that_do_not_fit_the_config_are_named(tiny):
    """A missing tensor used to be a KeyError and another model's weights an einsum error, deep in the step."""
    config, params = tiny
    for bad, message in _target_cases(config, params):
        with pytest.raises(InputError) as e:
            lsjax.generate(bad, (), np.ones((1, CHUNK), np.int32), cfg(config), jax.random.key(0))
        assert one_line(e) == f"target_params: {message}"


def test_every_layout_of_the_right_target_params_passes(tiny):
    config, params = tiny
    assert target.check_params(params, config) is None
    for layout in target.LAYOUTS:
        assert target.check_params(target.prepare_for_decode(params, config, layout=layout), config) is None
    assert target.check_params(target.group_for_shards(params, config, 2), config) is None  # a mesh's layout
    as_bf16 = jax.tree.map(lambda a: a.astype(jnp.bfloat16), params)
    assert target.check_params(as_bf16, dataclasses.replace(config, dtype="bfloat16")) is None


def test_each_drafter_names_params_that_do_not_fit(tiny):
    from lsjax.config import BlockConfig, DraftConfig
    from lsjax.methods.dels import model as dels_model
    from lsjax.methods.dels.drafter import BlockDrafter
    from lsjax.methods.longspec.model import init_draft_params
    from lsjax.methods.streams import model as ss
    from lsjax.methods.streams.drafter import StreamsDrafter
    from lsjax.methods.tokenswift import model as th
    from lsjax.methods.tokenswift.drafter import TokenSwiftDrafter

    config, params = tiny
    ls = lsjax.LongSpecDrafter(tree=lsjax.TreeConfig((2, 1)))
    draft = init_draft_params(config, DraftConfig(), params)
    key = jax.random.key(1)
    heads = th.HeadsConfig()  # 3, as the default tokenswift tree's levels need
    streams = ss.StreamsConfig(num_streams=2, msa_layers=1)
    block = BlockConfig(block_size=3)
    no_wq = {k: v for k, v in draft.items() if k != "self_wq"}
    block_draft = dels_model.init_block_params(config, DraftConfig(), params)
    two_heads = th.init_params(config, th.HeadsConfig(2), params, key)
    auto = lsjax.AutoDrafter(longspec=ls)
    cases = [  # (drafter, params that fit, params that do not, how the message starts)
        (ls, draft, (), "longspec needs its draft's params (a DraftParams or a {name: array} dict, as load_draft"),
        (ls, draft, no_wq, "tensor self_wq: missing (expected shape (48, 6, 8))"),
        (lsjax.HybridDrafter(ls), draft, None, "longspec needs its draft's params"),
        (auto, {"longspec": draft}, draft, "auto with a LongSpec draft needs {'longspec': "),
        (auto, {"longspec": draft}, {"longspec": ()}, "['longspec']: longspec needs"),
        (lsjax.AutoDrafter(), None, None, None),  # AR and prompt lookup: no weights
        (BlockDrafter(block=block), block_draft, draft, "tensor mask_embed: missing"),
        (
            TokenSwiftDrafter(heads=heads),
            th.init_params(config, heads, params, key),
            two_heads,
            "tensor w: expected shape (3, 48, 48), got (2, 48, 48)",
        ),
        (
            StreamsDrafter(streams=streams, widths=(2, 2), layer=1),
            ss.init_params(config, streams, key),
            (),
            "streams needs its adapters' params",
        ),
    ]
    for drafter, good, bad, message in cases:
        assert drafter.check_params(good, config) is None, drafter.name
        problem = drafter.check_params(bad, config)
        assert (problem is None) if message is None else problem.startswith(message), (drafter.name, problem)


def test_generate_names_a_missing_draft(tiny):
    config, params = tiny
    ls = lsjax.LongSpecDrafter(tree=lsjax.TreeConfig((2, 1)))
    with pytest.raises(InputError) as e:
        lsjax.generate(params, (), np.ones((1, CHUNK), np.int32), cfg(config, drafter=ls), jax.random.key(0))
    assert one_line(e).startswith("draft_params: longspec needs its draft's params")


def test_plain_jit_keeps_the_config_static(tiny):
    """`jax.jit(lsjax.generate)` without static_argnames: the config is a pytree without leaves, so it runs,
    decodes what the static form decodes, and an equal config reuses the program."""
    config, params = tiny
    prompt, lengths = jnp.ones((1, CHUNK), jnp.int32), jnp.array([9])
    run = jax.jit(lsjax.generate)
    out = run(params, (), prompt, cfg(config, drafter=lsjax.PLDDrafter(2)), jax.random.key(0), lengths)
    compiled = run._cache_size()  # shared by every jit of `generate`: compare before and after, not with 1
    run(params, (), prompt, cfg(config, drafter=lsjax.PLDDrafter(2)), jax.random.key(1), lengths)  # an equal config
    assert run._cache_size() == compiled
    static = jax.jit(lsjax.generate, static_argnames="config")
    ref = static(params, (), prompt, cfg(config, drafter=lsjax.PLDDrafter(2)), jax.random.key(0), lengths)
    np.testing.assert_array_equal(np.asarray(out.tokens), np.asarray(ref.tokens))


def test_the_engine_entry_points_check_too(tiny):
    """`lsjax.engine.start` (the finer-grained API, and decode.py's host driver) runs the same check."""
    config, params = tiny
    spec = cfg(config, drafter=lsjax.LongSpecDrafter(tree=lsjax.TreeConfig((2, 1))))
    tokens, lengths = jnp.ones((1, CHUNK), jnp.int32), jnp.array([9])
    with pytest.raises(InputError) as e:
        lsjax.engine.start(params, (), spec, tokens, lengths, jax.random.key(0))
    assert one_line(e).startswith("draft_params: longspec needs its draft's params")
    with pytest.raises(InputError) as e:
        lsjax.engine.start(params, (), cfg(config), tokens, lengths, 7)
    assert one_line(e) == "key: expected a PRNG key (jax.random.key(seed)), got int"
