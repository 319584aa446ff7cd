"""The ultra-long bench on a tiny random model: curves, per-length aggregates, plots, T=0 equality."""

from __future__ import annotations

import json

import pytest

from studies.ultralong import ultralong


@pytest.mark.slow
def test_ultralong_dry_run(tmp_path):
    result = ultralong.run(
        [
            "--model", "tiny", "--lengths", "16", "40", "--prompt-tokens", "32", "--methods", "ar", "tokenswift",
            "--ts-preset", "paper", "--ts-topk", "1,2,1", "--kv-budget", "24", "--ngram-topk", "2",
            "--stream-every", "4",
            "--penalties", "1.0", "1.3", "--penalty-window", "40", "--out", str(tmp_path),
        ]
    )  # fmt: skip
    assert result["mismatches"] == []
    aggs = {(a["penalty"], a["method"], a["length"]): a for a in result["aggregates"]}
    assert set(aggs) == {(p, m, n) for p in (1.0, 1.3) for m in ("ar", "tokenswift") for n in (16, 40)}
    assert aggs[(1.0, "ar", 40)]["speedup_vs_ar"] == 1.0 and aggs[(1.0, "tokenswift", 40)]["tau"] >= 1.0
    # The penalty changes the text; lossless methods agree with AR on it.
    ar = {r["penalty"]: r["tokens"] for r in result["rows"] if r["method"] == "ar"}
    assert ar[1.0] != ar[1.3]
    assert aggs[(1.3, "ar", 40)]["distinct"] == aggs[(1.3, "tokenswift", 40)]["distinct"]
    for f in ("results.json", "results.md", "speedup_vs_length.png", "tau_vs_length.png"):
        assert (tmp_path / f).is_file()
    assert json.loads((tmp_path / "results.json").read_text())["meta"]["lengths"] == [16, 40]


def test_distinct_n_and_interpolated_curves():
    assert ultralong.distinct_n([1, 2, 1, 2, 1], 2) == 0.5
    c = ultralong.Curve([1, 5, 9], [0.0, 1.0, 3.0], [0, 2, 4])
    assert c.at(7) == (2.0, 3.0)


@pytest.mark.parametrize("split", ["dev", "heldout"])
def test_speech_prompts_follow_the_split(split):
    from lsjax.corpora import eval_split_of

    class Bytes:  # a stand-in tokenizer: one id per byte
        def encode(self, text):
            return list(text.encode())

    got = ultralong.speech_prompts(Bytes(), 2, 300, seed=0, split=split)
    assert len(got) == 2 and all(len(ids) == 300 for _, ids in got)
    assert {eval_split_of(doc_id) for doc_id, _ in got} == {split}
