"""`--model` and `--draft` take a Hugging Face repository id: resolved through huggingface_hub's cache, read from
it alone with HF_HUB_OFFLINE=1 (a cache this test fills, laid out as huggingface_hub lays it out); a repository
that is not there is one line naming the flag."""

from __future__ import annotations

import json

import pytest

from lsjax.errors import ModelNotFoundError
from lsjax.loading import hub
from tests.test_loading import _tiny_hf_model

COMMIT = "0123456789abcdef0123456789abcdef01234567"


def _cached_repo(cache, repo: str):
    """The snapshot directory of `repo` at `COMMIT` in a huggingface_hub cache, with refs/main pointing at it."""
    folder = cache / f"models--{repo.replace('/', '--')}"
    snapshot = folder / "snapshots" / COMMIT
    snapshot.mkdir(parents=True)
    (folder / "refs").mkdir()
    (folder / "refs" / "main").write_text(COMMIT)
    return snapshot


@pytest.fixture
def offline_cache(tmp_path, monkeypatch):
    cache = tmp_path / "hf" / "hub"
    cache.mkdir(parents=True)
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return cache


def test_what_is_a_repository_id(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert hub.is_repo_id("HuggingFaceTB/SmolLM2-135M-Instruct") and hub.is_repo_id("z-lab/Qwen3-8B-DFlash-b16")
    (tmp_path / "local").mkdir()
    (tmp_path / "local" / "draft").mkdir()
    assert not hub.is_repo_id("local/draft")  # a directory here wins over a repository of that name
    for spec in ("model.gguf", "a/b/c", "/abs/path", "./x/y", "", None, "shipped", "random"):
        assert not hub.is_repo_id(spec), spec
    assert hub.resolve(str(tmp_path / "local"), "--model") == tmp_path / "local"  # a path is itself


def test_a_repository_in_the_cache_resolves_offline_and_decodes_as_its_directory(
    offline_cache, hf_gguf_tokenizer, capsys
):
    from lsjax.cli import decode

    snapshot = _cached_repo(offline_cache, "acme/tiny-qwen2")
    _tiny_hf_model("qwen2", False).save_pretrained(snapshot)
    hf_gguf_tokenizer[0].save_pretrained(snapshot)
    assert hub.resolve("acme/tiny-qwen2", "--model") == snapshot

    flags = ["--prompt", "hello there", "--max-new-tokens", "4", "--ignore-eos", "--method", "ar", "--json"]
    outs = []
    for model in ("acme/tiny-qwen2", str(snapshot)):
        assert decode.main(["--model", model, *flags, "--compile-cache", "off"]) == 0
        outs.append(json.loads(capsys.readouterr().out.strip().splitlines()[-1]))
    assert outs[0]["model"] == str(snapshot) and outs[0]["text"] == outs[1]["text"]
    assert outs[0]["new_tokens"] == 4


def test_a_draft_repository_resolves_to_its_snapshot(offline_cache):
    from lsjax.cli.flags import DecodeRun
    from lsjax.config import GenerateConfig

    snapshot = _cached_repo(offline_cache, "acme/a-draft")
    (snapshot / "config.json").write_text("{}")
    run = DecodeRun(method="longspec", gen=GenerateConfig(), options=(("draft", "acme/a-draft"), ("tree", "1")))
    assert hub.is_repo_id(run.draft)
    resolved = run.with_draft(hub.resolve(run.draft, "--draft"))
    assert resolved.draft == str(snapshot) and dict(resolved.options)["tree"] == "1"


def test_a_repository_not_in_the_cache_is_one_line_naming_the_flag(offline_cache, capsys):
    from lsjax.cli import decode

    with pytest.raises(ModelNotFoundError, match=r"^--draft acme/missing: .*HF_HUB_OFFLINE=1"):
        hub.resolve("acme/missing", "--draft")
    with pytest.raises(SystemExit) as exit_:
        decode.main(["--model", "acme/missing", "--prompt", "hi", "--compile-cache", "off"])
    err = capsys.readouterr().err.strip().splitlines()
    assert exit_.value.code == 2 and len(err) == 1
    assert err[0].startswith("decode.py: error: --model acme/missing: a Hugging Face repository id, HF_HUB_OFFLINE=1")
