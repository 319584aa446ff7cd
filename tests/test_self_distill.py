"""Self-distilled data: rows hold prompt + the target's own answer, the mask covers the answer; resumable."""

import filecmp

import jax
import numpy as np
import pytest

from lsjax import api
from lsjax.cli import distill as sd
from lsjax.config import GenerateConfig, ModelConfig
from lsjax.errors import LsjaxError
from lsjax.models import target as target_lib
from lsjax.prompts import Prompt

CFG = ModelConfig(
    vocab_size=64, hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=8, intermediate_size=64,
    eos_token_ids=(1,), pad_token_id=0,
)  # fmt: skip


class Chars:
    """A tokenizer stand-in: one id per character."""

    def encode(self, text, add_special_tokens=True):
        return [2 + ord(c) % 60 for c in text]


def _prompts(n):
    texts = ["abcdefghij" * (1 + i % 3) for i in range(n)]
    return [Prompt(f"t/{i}", "code", "b", t, False, len(t), {"doc": f"d{i}"}) for i, t in enumerate(texts)]


@pytest.mark.slow  # ~20 s on two cores: the default run stays under 15 min
def test_rows_are_prompt_plus_the_targets_answer(tmp_path):
    params = target_lib.init_params(CFG, jax.random.PRNGKey(0), scale=0.3)
    prompts = _prompts(5)
    kw = dict(seq_len=64, max_new_tokens=8, batch_size=2, log=lambda *_: None)
    sd.write_answers(tmp_path / "a", params, CFG, Chars(), prompts, **kw)
    tokens, mask = sd.load(tmp_path / "a")
    assert tokens.shape == (5, 64) and mask.shape == (5, 64)
    # Part 0 is greedy: its answers are exactly what AR generation gives for each prompt alone.
    for r in range(2):
        ids = Chars().encode(prompts[r].text)
        cfg = api.SpecConfig(model=CFG, gen=GenerateConfig(8), chunk=32)
        ref = api.generate(params, (), np.asarray([ids + [0] * (32 - len(ids))]), cfg, jax.random.PRNGKey(0),
                           np.asarray([len(ids)]))  # fmt: skip
        n = int(ref.num_tokens[0])
        np.testing.assert_array_equal(tokens[r, : len(ids)], ids)
        np.testing.assert_array_equal(tokens[r, len(ids) : len(ids) + n], ref.tokens[0, :n])
        assert mask[r, : len(ids)].sum() == 0 and mask[r, len(ids) : len(ids) + n].all()
        assert mask[r, len(ids) + n :].sum() == 0

    # A killed run resumes: a missing part is redone identically, finished parts are kept.
    sd.write_answers(tmp_path / "b", params, CFG, Chars(), prompts, **kw)
    (tmp_path / "b" / "part-00001.npz").unlink()
    sd.write_answers(tmp_path / "b", params, CFG, Chars(), prompts, **kw)
    names = [f"part-{i:05d}.npz" for i in range(3)]
    match, mismatch, _ = filecmp.cmpfiles(tmp_path / "a", tmp_path / "b", names, shallow=False)
    assert mismatch == [] and len(match) == 3
    with pytest.raises(LsjaxError, match="another prompt set"):
        sd.write_answers(tmp_path / "b", params, CFG, Chars(), _prompts(4), **kw)
