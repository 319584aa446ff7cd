"""The evaluation harness end to end on the quick suite: outputs well formed, T=0 equality enforced.

Runs in-process. The quick-suite run (T=0, three lsjax methods, ~2 min), the tests that read it and the
mismatch check (AR on one prompt at T=0 and T=1, ~36 s) are in the slow set; the default run keeps the
argument checks. No speed is asserted: speeds are ratios inside one run, never timed.
"""

from __future__ import annotations

import dataclasses
import json

import matplotlib.image
import pytest

from lsjax.bench import run as bench
from lsjax.bench.methods import Outcome

LSJAX = ["lsjax-ar", "lsjax-longspec", "lsjax-pld"]
# One ~240-token prompt per task; the small tree keeps LongSpec's compile short (an untrained draft anyway).
QUICK = ["--suite", "quick", "--per-cell", "1", "--draft", "random", "--tree", "cpu-small", "--split-steps", "2"]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    out = tmp_path_factory.mktemp("quick")
    result = bench.run([*QUICK, "--temperatures", "0", "--out", str(out)])
    return out, result


@pytest.mark.slow
def test_quick_json(quick):
    out, result = quick
    data = json.loads((out / "results.json").read_text())
    assert data["passed"] and not data["failures"]
    assert not (out / "rows.partial.jsonl").exists()  # the crash-safety log is dropped once results are written
    meta = data["meta"]
    assert meta["methods"] == LSJAX and meta["temperatures"] == [0.0]
    assert meta["command"].startswith("python -m lsjax.bench.run --suite quick")
    assert {"cpu", "cores", "jax", "loadavg_start", "loadavg_end"} <= set(meta["machine"])
    assert {p["task"] for p in meta["prompts"]} == {"summarization", "code"}
    assert all(150 <= p["tokens"] <= 256 for p in meta["prompts"])
    rows = data["rows"]
    assert len(rows) == meta["num_prompts"] * len(LSJAX)
    for r in rows:
        assert r["new_tokens"] == 16 and r["tokens_per_s"] > 0 and r["tau"] >= 1.0
        if r["method"] != "lsjax-ar":
            assert r["equal_to_lsjax_ar"] is True
        if r["method"] == "lsjax-ar":
            assert r["draft_state_bytes"] == 0 and r["speedup_vs_lsjax_ar"] == pytest.approx(1.0)
        else:
            assert r["draft_state_bytes"] > 0
            assert sum(r["step_tokens"]) == r["new_tokens"] - 1  # every decode step accounted for
        assert r["verify_ms"] > 0 and r["steps_profiled"] >= 1
    cells = {(a["method"], a["task"], a["temperature"]) for a in data["aggregates"]["task"]}
    assert len(cells) == len(LSJAX) * 2
    hf = [a["speedup_vs_hf_ar"] for a in data["aggregates"]["method"]]
    assert hf == [None] * len(hf)  # no HF peer in the quick suite unless asked for


@pytest.mark.slow
def test_quick_markdown_and_plots(quick):
    out, _ = quick
    md = (out / "results.md").read_text()
    assert md.startswith("# lsjax evaluation: suite `quick`")
    assert "**PASS**" in md and "| method | summarization: tau |" in md and "| bucket | method | tok/s |" in md
    for m in LSJAX:
        assert f"| {m} |" in md
    for name in ("table1.png", "table5.png", "latency.png", "accepted.png"):
        raw = (out / name).read_bytes()
        assert raw.startswith(PNG_MAGIC), name
        img = matplotlib.image.imread(out / name)
        assert img.ndim == 3 and img.shape[0] > 100 and img.shape[1] > 100, name


@dataclasses.dataclass
class _Broken:
    """A 'lossless' method whose output is not AR's: the harness must fail loudly and name the prompt."""

    name: str = "lsjax-broken"
    lossless: bool = True
    speculative: bool = False

    def run(self, ids, gen, seed):
        return Outcome(list(range(1, gen.max_new_tokens + 1)), prefill_s=0.1, decode_s=1.0, target_forwards=16)


@pytest.mark.slow  # ~36 s (loads the real model)
def test_mismatch_fails_and_names_prompt(monkeypatch, tmp_path, capsys):
    monkeypatch.setitem(bench.METHODS, "lsjax-broken", lambda ctx: _Broken())
    args = [*QUICK, "--methods", "lsjax-broken", "--temperatures", "0", "1", "--limit", "1", "--out", str(tmp_path)]
    assert bench.main(args) == 1
    err = capsys.readouterr().err
    data = json.loads((tmp_path / "results.json").read_text())
    first = data["meta"]["prompts"][0]["id"]
    assert f"lsjax-broken differs from lsjax-ar at T=0 on prompt {first}" in err
    assert "FAILED" in err
    # The results are still written, marked failed, so the mismatch can be inspected.
    assert not data["passed"] and len(data["failures"]) == 1 and first in data["failures"][0]
    # At T=1 outputs may differ (only the distribution is preserved): no failure, no equality verdict.
    t1 = [r for r in data["rows"] if r["temperature"] == 1.0]
    assert {r["method"] for r in t1} == {"lsjax-ar", "lsjax-broken"}
    assert all(r["equal_to_lsjax_ar"] is None and r["tokens_per_s"] > 0 for r in t1)
    assert "verify_ms" not in t1[0]  # the quick suite profiles the step split at T=0 only
    assert "FAIL" in (tmp_path / "results.md").read_text()


@pytest.mark.slow
def test_variant_runs_a_registry_method_with_options(quick, tmp_path):
    # A --variant is the registry's method with build options: here PLD proposing 2 tokens instead of 8.
    args = [*QUICK, "--methods", "lsjax-ar", "--variant", "pld2=pld:pld_tokens=2", "--temperatures", "0"]
    result = bench.run([*args, "--limit", "1", "--out", str(tmp_path)])
    rows = [r for r in result["rows"] if r["method"] == "pld2"]
    assert len(rows) == 1 and rows[0]["equal_to_lsjax_ar"] is True
    assert max(rows[0]["step_tokens"]) <= 3  # at most 2 drafted tokens + the bonus per step


@pytest.mark.parametrize(
    "spec, message",
    [
        ("pld2", "expected NAME=METHOD"),
        ("x=nosuch", "unknown method 'nosuch'"),
        ("x=pld:k", "is not key=value"),
        ("x=pld:pld_token=3", "pld has no option pld_token (its options: pld_ngram, pld_tokens)"),
        ("x=pld:pld_tokens=0", "pld_tokens: must be an integer >= 1, got 0"),
    ],
)
def test_bad_variant_is_one_line(spec, message, capsys):
    with pytest.raises(SystemExit) as e:
        bench.parse_args(["--variant", spec])
    assert e.value.code == 2 and message in capsys.readouterr().err


def test_write_prompts_writes_the_suite_as_text_files_and_runs_nothing(tmp_path):
    """`--write-prompts DIR`: one file per prompt, named by its id, holding the text decode.py reads."""
    got = bench.run(["--suite", "quick", "--per-cell", "1", "--write-prompts", str(tmp_path)])
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["code-quick-00.txt", "summarization-quick-00.txt"]
    assert sorted(got["files"]) == sorted(str(tmp_path / n) for n in names)
    assert (tmp_path / "code-quick-00.txt").read_text(encoding="utf-8").strip()
