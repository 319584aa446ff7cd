"""Tokenizers built with the `tokenizers` library from GGUF metadata or HF tokenizer files.

No transformers and no torch at run time. What HF does that we reproduce:
- `encode(text)` == `AutoTokenizer(...)(text)["input_ids"]`: special tokens written in the text are
  matched whole, BOS/EOS are added only when the checkpoint says so (`add_bos_token`).
- `apply_chat_template` renders the checkpoint's Jinja template in a sandbox configured as
  transformers configures it (trim_blocks, lstrip_blocks, loopcontrols, `raise_exception`, a
  non-HTML-escaping `tojson`, `strftime_now`), with the special-token strings as variables.
"""

from __future__ import annotations

import datetime
import functools
import json
from collections.abc import Iterable, Sequence
from pathlib import Path

from tokenizers import AddedToken, Regex, decoders, models, pre_tokenizers, processors
from tokenizers import Tokenizer as _HFTokenizer

from lsjax.errors import ModelNotFoundError, UnsupportedModelError

# Pre-tokenizer split patterns by `tokenizer.ggml.pre` (the names llama.cpp's converter writes).
_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_SPLITS = {
    **dict.fromkeys(("llama3", "llama-v3", "llama-bpe", "smaug-bpe", "dbrx", "falcon3", "pixtral"), _LLAMA3_SPLIT),
    **dict.fromkeys(("qwen2", "deepseek-r1-qwen", "megrez"), _QWEN2_SPLIT),
}
# llama.cpp splits digits off first for "smollm", "starcoder" & co. (as their original tokenizer.json
# does); transformers' GGUF loader does not, and we follow transformers so that encodings match it.
# The two differ only on whitespace runs before a digit ("\n    0": one "\n    " token vs "\n   " + " ").

_CONTROL, _USER_DEFINED = 3, 4  # tokenizer.ggml.token_type values


@functools.cache
def _byte_alphabet() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character map used by byte-level BPE vocabularies."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table, extra = {}, 0
    for b in range(256):
        if b in printable:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return table


def _token_text(tok: str | dict | None) -> str | None:
    if isinstance(tok, dict):  # an AddedToken serialized in tokenizer_config.json
        return tok.get("content")
    return tok


class Tokenizer:
    """Text <-> token ids, plus the chat template, for one checkpoint."""

    def __init__(
        self,
        backend: _HFTokenizer,
        *,
        special_tokens: dict[str, str | None],
        eos_token_ids: Sequence[int],
        chat_template: str | None = None,
        clean_up_tokenization_spaces: bool = False,
    ):
        self.backend = backend
        self.special_tokens = {k: v for k, v in special_tokens.items() if v is not None}
        self._eos_token_ids = tuple(dict.fromkeys(int(t) for t in eos_token_ids))
        self.chat_template = chat_template
        self._clean_up = clean_up_tokenization_spaces

    # -- constructors ---------------------------------------------------------------------------
    @classmethod
    def from_gguf_metadata(cls, meta: dict) -> Tokenizer:
        kind = meta.get("tokenizer.ggml.model")
        if kind != "gpt2":
            raise UnsupportedModelError(f"GGUF tokenizer model {kind!r} is not supported (only byte-level BPE 'gpt2')")
        tokens: list[str] = meta["tokenizer.ggml.tokens"]
        types: list[int] = meta.get("tokenizer.ggml.token_type") or [1] * len(tokens)
        alphabet = _byte_alphabet()
        spelled = set(alphabet.values())
        # Tokens are stored in the byte alphabet; a few files store some as raw text: respell those.
        vocab = {}
        for i, t in enumerate(tokens):
            key = t if set(t) <= spelled else "".join(alphabet[b] for b in t.encode("utf-8"))
            vocab.setdefault(key, i)
        merges = [tuple(m.split(" ", 1)) for m in meta.get("tokenizer.ggml.merges", [])]
        backend = _HFTokenizer(
            models.BPE(vocab=vocab, merges=merges, continuing_subword_prefix="", end_of_word_suffix="", fuse_unk=False)
        )
        pre = meta.get("tokenizer.ggml.pre", "default")
        if pre in _SPLITS:
            backend.pre_tokenizer = pre_tokenizers.Sequence(
                [
                    pre_tokenizers.Split(Regex(_SPLITS[pre]), behavior="isolated"),
                    pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
                ]
            )
        else:  # "gpt2", "default" and unknown names: GPT-2's own split, as transformers does
            backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        backend.decoder = decoders.ByteLevel()

        # Control tokens are special (matched whole, dropped by skip_special_tokens); user-defined
        # ones are matched whole but kept. A control token outside the byte alphabet is a converter
        # mislabel (transformers skips it too).
        backend.add_special_tokens(
            [
                AddedToken(t, special=True, normalized=False)
                for t, ty in zip(tokens, types)
                if ty == _CONTROL and set(t) <= spelled
            ]
        )
        user = [AddedToken(t, special=False, normalized=False) for t, ty in zip(tokens, types) if ty == _USER_DEFINED]
        if user:
            backend.add_tokens(user)

        def tok(key):
            i = meta.get(f"tokenizer.ggml.{key}")
            return tokens[i] if i is not None and 0 <= i < len(tokens) else None

        special = {
            "bos_token": tok("bos_token_id"),
            "eos_token": tok("eos_token_id"),
            "unk_token": tok("unknown_token_id"),
        }
        special["pad_token"] = tok("padding_token_id")
        backend.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in special.values() if t])
        _set_post_processor(
            backend,
            special["bos_token"] if meta.get("tokenizer.ggml.add_bos_token", False) else None,
            special["eos_token"] if meta.get("tokenizer.ggml.add_eos_token", False) else None,
        )
        eos = [meta[k] for k in ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id") if k in meta]
        return cls(
            backend, special_tokens=special, eos_token_ids=eos, chat_template=meta.get("tokenizer.chat_template")
        )

    @classmethod
    def from_hf_dir(cls, path: str | Path, eos_token_ids: Iterable[int] = ()) -> Tokenizer:
        """From `tokenizer.json` + `tokenizer_config.json` (+ `chat_template.jinja`, as transformers 5 saves)."""
        path = Path(path)
        tj = path / "tokenizer.json"
        if not tj.is_file():
            raise ModelNotFoundError(f"no tokenizer.json in {path} (only fast tokenizer files are supported)")
        backend = _HFTokenizer.from_file(str(tj))
        tc_file = path / "tokenizer_config.json"
        tc = json.loads(tc_file.read_text()) if tc_file.is_file() else {}
        special = {k: _token_text(tc.get(k)) for k in ("bos_token", "eos_token", "unk_token", "pad_token")}
        template = tc.get("chat_template")
        if isinstance(template, list):  # named templates: transformers uses "default"
            template = {t["name"]: t["template"] for t in template}.get("default")
        if template is None and (path / "chat_template.jinja").is_file():
            template = (path / "chat_template.jinja").read_text()
        # transformers rebuilds the post-processor from these flags when the config sets them.
        if "add_bos_token" in tc or "add_eos_token" in tc:
            bos = special["bos_token"] if tc.get("add_bos_token") else None
            eos_tok = special["eos_token"] if tc.get("add_eos_token") else None
            if tc.get("add_bos_token") or tc.get("add_eos_token") or backend.post_processor is None:
                _set_post_processor(backend, bos, eos_tok)
        eos = list(eos_token_ids)
        if special["eos_token"] is not None and backend.token_to_id(special["eos_token"]) is not None:
            eos.insert(0, backend.token_to_id(special["eos_token"]))
        return cls(
            backend,
            special_tokens=special,
            eos_token_ids=eos,
            chat_template=template,
            clean_up_tokenization_spaces=bool(tc.get("clean_up_tokenization_spaces", False)),
        )

    # -- properties -----------------------------------------------------------------------------
    @property
    def vocab_size(self) -> int:
        return self.backend.get_vocab_size(with_added_tokens=True)

    @property
    def bos_token_id(self) -> int | None:
        t = self.special_tokens.get("bos_token")
        return None if t is None else self.backend.token_to_id(t)

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        return self._eos_token_ids

    @property
    def pad_token_id(self) -> int | None:
        t = self.special_tokens.get("pad_token")
        return None if t is None else self.backend.token_to_id(t)

    # -- text <-> ids ---------------------------------------------------------------------------
    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self.backend.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        text = self.backend.decode(list(ids), skip_special_tokens=skip_special_tokens)
        return _clean_up_spaces(text) if self._clean_up else text

    def stream_decoder(self, skip_special_tokens: bool = False) -> StreamDecoder:
        return StreamDecoder(self, skip_special_tokens)

    # -- chat -----------------------------------------------------------------------------------
    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True, **kwargs) -> str:
        if not self.chat_template:
            raise UnsupportedModelError("this tokenizer has no chat template")
        template = _compile(self.chat_template)
        return template.render(
            messages=messages,
            tools=None,
            documents=None,
            add_generation_prompt=add_generation_prompt,
            **{**self.special_tokens, **kwargs},
        )


def _set_post_processor(backend: _HFTokenizer, bos: str | None, eos: str | None) -> None:
    """BOS/EOS around every encoded text, as transformers builds it from add_bos_token/add_eos_token."""
    single = (f"{bos}:0 " if bos else "") + "$A:0" + (f" {eos}:0" if eos else "")
    pair = single + (f" {bos}:1" if bos else "") + " $B:1" + (f" {eos}:1" if eos else "")
    tokens = [(t, backend.token_to_id(t)) for t in dict.fromkeys(x for x in (bos, eos) if x)]
    backend.post_processor = processors.TemplateProcessing(single=single, pair=pair, special_tokens=tokens)


def _clean_up_spaces(text: str) -> str:
    # transformers' clean_up_tokenization: undo the spaces old tokenizers put before punctuation.
    for a, b in ((" .", "."), (" ?", "?"), (" !", "!"), (" ,", ","), (" ' ", "'"), (" n't", "n't"), (" 'm", "'m")):
        text = text.replace(a, b)
    for a, b in ((" 's", "'s"), (" 've", "'ve"), (" 're", "'re")):
        text = text.replace(a, b)
    return text


@functools.lru_cache(maxsize=8)
def _compile(source: str):
    import jinja2
    import jinja2.ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        # Jinja's own tojson HTML-escapes; chat templates expect plain JSON.
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.datetime.now().strftime(fmt)
    return env.from_string(source)


class StreamDecoder:
    """Turns ids arriving one (or a few) at a time into text deltas, never splitting a UTF-8 character.

    Byte-level BPE tokens can hold part of a multi-byte character; decoding such a prefix ends in
    U+FFFD. We hold text back until it decodes cleanly, and re-decode only a short window of recent
    ids (from `_prefix`), so the cost per token stays constant.
    """

    def __init__(self, tokenizer: Tokenizer, skip_special_tokens: bool = False):
        self._tok = tokenizer
        self._skip = skip_special_tokens
        self._ids: list[int] = []
        self._prefix = 0  # ids[_prefix:_read] were already emitted; kept as left context for decoding
        self._read = 0

    def _decode(self, ids) -> str:
        return self._tok.decode(ids, skip_special_tokens=self._skip)

    def push(self, ids: int | Iterable[int]) -> str:
        """Adds ids; returns the text that became final (possibly "")."""
        self._ids.extend([ids] if isinstance(ids, int) else [int(i) for i in ids])
        done = self._decode(self._ids[self._prefix : self._read])
        full = self._decode(self._ids[self._prefix :])
        if len(full) > len(done) and not full.endswith("\ufffd"):
            delta = full[len(done) :]
            self._prefix, self._read = self._read, len(self._ids)
            return delta
        return ""

    def flush(self) -> str:
        """Whatever is still held back (an incomplete character decodes as U+FFFD)."""
        done = self._decode(self._ids[self._prefix : self._read])
        full = self._decode(self._ids[self._prefix :])
        self._prefix = self._read = len(self._ids)
        return full[len(done) :]
