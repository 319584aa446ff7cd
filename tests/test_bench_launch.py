"""lsjax.bench.launch: the summary of decode.py runs (medians per prompt and start, the default's wall time over
AR's, whether the texts agree) and its argument errors. The runs themselves are decode.py processes
(tests/test_precompile.py checks the fields they report)."""

from __future__ import annotations

import pytest

from lsjax.bench import launch


def row(method, start, last, text="same", r=0):
    return {"round": r, "prompt": "p.txt", "method": method, "start": start, "first_token_s": 1.0,
            "decode_program_in_use_s": 2.0, "last_token_s": last, "programs_compiled": 0, "text": text,
            "prompt_tokens": 1500}  # fmt: skip


def test_the_summary_is_per_prompt_and_start_with_medians():
    rows = [row("default", "warm", 10.0), row("default", "warm", 14.0, r=1), row("default", "warm", 30.0, r=2)]
    rows += [row("ar", "warm", 20.0, r=r) for r in range(3)] + [
        row("default", "new-width", 50.0),
        row("ar", "new-width", 25.0),
    ]
    lines = launch.summarize(rows, "default")
    assert [(x["start"], x["wall_vs_ar"]) for x in lines] == [("new-width", 2.0), ("warm", 0.7)]
    assert lines[1]["default_last_token_s"] == 14.0 and lines[1]["identical_to_ar"]
    assert not launch.summarize([row("default", "warm", 1.0, "a"), row("ar", "warm", 1.0, "b")], "default")[0][
        "identical_to_ar"
    ]


def test_bad_arguments_are_one_line(capsys):
    with pytest.raises(SystemExit) as e:
        launch.main(["--max-new-tokens", "1", "--prompt-file", "a", "--prompt-file", "b"])
    assert e.value.code == 2 and "--max-new-tokens must be >= 2" in capsys.readouterr().err


class _Chars:
    """A tokenizer of one token per character."""

    def encode(self, text, add_special_tokens=True):
        return [ord(c) for c in text]

    def decode(self, ids):
        return "".join(map(chr, ids))


def test_last_tokens_cuts_a_prompt_to_its_last_n_tokens():
    assert launch.last_tokens(_Chars(), "abcdefgh", [3, 5, 20]) == [(3, "fgh"), (5, "defgh"), (20, "abcdefgh")]


@pytest.mark.parametrize("extra", [["--last-tokens", "8"], ["--last-tokens", "600", "--prompt-file", "a"]])
def test_bad_last_tokens_are_one_line(capsys, extra):
    with pytest.raises(SystemExit) as e:
        launch.main(extra)
    err = capsys.readouterr().err
    assert e.value.code == 2 and "--last-tokens: expected suite prompts (no --prompt-file) and N >= 16" in err
