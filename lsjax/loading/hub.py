"""A Hugging Face repository id where a model or draft directory is asked for: resolved through
`huggingface_hub`'s cache, downloaded when online, read from the cache alone when `HF_HUB_OFFLINE=1`.

The cache is the one `huggingface_hub` uses (`HF_HUB_CACHE`, else `HF_HOME/hub`, else `~/.cache/huggingface/hub`),
read from the environment at each call so that a caller (a test) may point it elsewhere."""

from __future__ import annotations

import os
import re
from pathlib import Path

from lsjax.errors import ModelNotFoundError

# owner/name, as the Hub spells them (letters, digits, '-', '_', '.'; no leading '.' or '-')
_REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*$")
# What a model or draft directory needs: its config, weights and tokenizer; never another framework's copy.
WANTED = ["*.json", "*.safetensors", "*.model", "*.txt", "*.jinja", "*.gguf"]


def is_repo_id(spec: str | None) -> bool:
    """Whether `spec` names a Hugging Face repository (owner/name) and not a path that exists here."""
    return bool(spec) and _REPO_ID.match(spec) is not None and not Path(spec).expanduser().exists()


def _offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


def _cache_dir() -> Path:
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    home = os.environ.get("HF_HOME") or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "huggingface"
    return Path(home).expanduser() / "hub"


def resolve(spec: str, flag: str) -> Path:
    """`spec` as a local path: itself where it is not a repository id, else the repository's snapshot in the
    cache (downloaded first unless offline). Raises ModelNotFoundError, one line naming `flag`, where it can be
    had neither way."""
    if not is_repo_id(spec):
        return Path(spec).expanduser()
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError

    offline = _offline()
    try:
        path = snapshot_download(
            spec, cache_dir=_cache_dir(), local_files_only=offline, allow_patterns=WANTED, tqdm_class=None
        )
    except LocalEntryNotFoundError:
        why = (
            "HF_HUB_OFFLINE=1 and it is not in the cache" if offline else "not in the cache, and the Hub is unreachable"
        )
        raise ModelNotFoundError(f"{flag} {spec}: a Hugging Face repository id, {why} ({_cache_dir()})") from None
    except (HfHubHTTPError, OSError, ValueError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ModelNotFoundError(f"{flag} {spec}: cannot download it from the Hugging Face Hub ({first})") from None
    return Path(path)
