"""docs/flax.md's example, run as the page shows it: a user's Flax module holding the shipped LongSpec draft,
loaded, trained a few optax steps on a real prompt, then decoding through `lsjax.generate` equal to AR."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow  # the default suite's budget (make test-slow runs it)
def test_the_flax_page_runs_as_written(monkeypatch):
    page = (ROOT / "docs" / "flax.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", page, re.S)
    assert len(blocks) == 1, "docs/flax.md: one runnable example"
    monkeypatch.chdir(ROOT)
    scope: dict = {}
    exec(compile(blocks[0], "docs/flax.md", "exec"), scope)  # the page's own asserts: loss falls, output == AR
    assert scope["losses"][-1] < scope["losses"][0]
    assert int(scope["out"].num_tokens[0]) == 24
