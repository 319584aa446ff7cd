"""The README's Python example runs as printed (the front page must not rot)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def python_example() -> str:
    text = (ROOT / "README.md").read_text()
    start = text.index("```python\n", text.index("## Python API")) + len("```python\n")
    return text[start : text.index("```", start)]


@pytest.mark.slow
def test_the_python_api_example_runs(tmp_path):
    """~1 min: loads SmolLM2 and compiles `generate` with prompt lookup under a plain `jax.jit`."""
    done = subprocess.run(
        [sys.executable, "-c", python_example()], capture_output=True, text=True, cwd=tmp_path, timeout=600
    )
    assert done.returncode == 0, done.stderr[-2000:]
    text, tau = done.stdout.strip().rsplit(" ", 1)
    assert text and float(tau) >= 1.0, done.stdout  # some text, and tokens per step (tau) printed last


def test_the_example_is_where_the_test_looks():
    assert "lsjax.generate" in python_example()
