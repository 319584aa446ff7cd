"""TokenSwift's configuration (the drafter's static shape) and its decode options."""

from __future__ import annotations

import dataclasses

from lsjax.config import ConfigError, _check, _positive_int
from lsjax.methods.registry import option


def integers(text: str) -> tuple[int, ...]:
    """'1,3,3' -> (1, 3, 3) (a flag's text)."""
    return tuple(int(k) for k in text.split(","))


DRAFT_PASSES = ("partial", "full", "verified")


@dataclasses.dataclass(frozen=True)
class TokenSwiftConfig:
    draft_pass: str = "partial"  # partial | full | verified (module doc)
    # Candidates per logit set, best first: (backbone, head 1, ..) for partial/full, (head 1, ..) for verified.
    topk: tuple[int, ...] = (1, 3, 3, 3)
    kv_budget: int = 1024  # partial cache entries (the paper sizes it like the prompt)
    kv_sink: int = 16  # first positions always kept (the official code's start_size)
    ngram_topk: int = 20  # n-gram chains per step (0 = no token reutilization)
    ngram_n: int = 4  # n = gamma
    ngram_lag: int = -1  # n-grams enter the pool this many tokens late; -1 = the penalty window when it is on

    def __post_init__(self):
        _check(
            self.draft_pass in DRAFT_PASSES,
            "tokenswift.draft_pass",
            f"must be one of {'|'.join(DRAFT_PASSES)}, got {self.draft_pass!r}",
        )
        _check(
            isinstance(self.topk, tuple)
            and len(self.topk) > 0
            and all(isinstance(k, int) and k > 0 for k in self.topk),
            "tokenswift.topk",
            f"must be a non-empty list of integers >= 1, got {self.topk!r}",
        )
        _positive_int(self.kv_budget, "tokenswift.kv_budget")
        _check(
            isinstance(self.kv_sink, int) and self.kv_sink >= 0,
            "tokenswift.kv_sink",
            f"must be an integer >= 0, got {self.kv_sink!r}",
        )
        # Named as the budget: the sink is a default most users never set, the budget a flag they did.
        _check(
            self.kv_budget > self.kv_sink,
            "tokenswift.kv_budget",
            f"must be > kv_sink={self.kv_sink} (the first positions always kept), got {self.kv_budget}",
        )
        _check(
            isinstance(self.ngram_topk, int) and self.ngram_topk >= 0,
            "tokenswift.ngram_topk",
            f"must be an integer >= 0 (0 = off), got {self.ngram_topk!r}",
        )
        _check(
            isinstance(self.ngram_n, int) and self.ngram_n >= 2,
            "tokenswift.ngram_n",
            f"must be an integer >= 2, got {self.ngram_n!r}",
        )
        _check(
            isinstance(self.ngram_lag, int) and self.ngram_lag >= -1,
            "tokenswift.ngram_lag",
            f"must be an integer >= 0, or -1 (the penalty window), got {self.ngram_lag!r}",
        )

    @property
    def self_draft(self) -> bool:
        return self.draft_pass != "verified"

    @property
    def chain_depth(self) -> int:
        """Tree levels an n-gram chain covers: the whole n-gram below the root when it starts with the best
        child guess, its last n - 1 tokens when it starts with the root."""
        return (self.ngram_n if self.self_draft else self.ngram_n - 1) if self.ngram_topk else 0


# The paper's configuration (its GPU setting), and one for devices where every verified node costs time and a
# draft pass costs a whole weight read (a CPU: studies/ultralong measures them).
TS_PRESETS = {
    "paper": TokenSwiftConfig(),
    "cpu": TokenSwiftConfig(draft_pass="verified", topk=(1, 1, 1), ngram_topk=1, ngram_n=8),
}


def default_preset() -> str:
    import jax

    return "cpu" if jax.default_backend() == "cpu" else "paper"


@dataclasses.dataclass(frozen=True)
class TokenSwiftOptions:
    draft: str | None = option(
        None, "a draft checkpoint (directory), or 'random' (untrained); default: the shipped one"
    )
    heads: str | None = option(
        None,
        "deprecated alias of --draft for tokenswift (a heads directory, lsjax's or a TokenSwift release, or 'zero')",
    )
    ts_preset: str | None = option(
        None,
        "paper = partial-cache draft pass, 1,3,3,3 tree, 20 n-grams; cpu = no draft pass, 1,1,1 heads + one "
        "8-gram chain (default: cpu on a CPU, else paper); the options below override it",
        choices=tuple(TS_PRESETS),
    )
    kv_budget: int | None = option(None, "partial KV cache entries (1024)")
    ngram_topk: int | None = option(None, "n-gram chains per step")
    ngram_n: int | None = option(None, "n-gram length (gamma = 4 in the paper)")
    ngram_lag: int | None = option(None, "n-grams enter the pool this many tokens late", flag=False)
    draft_pass: str | None = option(
        None,
        "the heads' hidden state from a draft pass over the partial cache (default), over the full cache, or "
        "from verification itself (no draft pass)",
        choices=DRAFT_PASSES,
        flag="ts-draft-pass",
    )
    ts_topk: tuple[int, ...] | None = option(
        None, "candidates per logit set, comma-separated (the preset's by default)", parse=integers
    )

    def __post_init__(self):
        if self.draft is not None and self.heads is not None and self.draft != self.heads:
            raise ConfigError(
                f"--draft {self.draft} and --heads {self.heads}: give one (--heads is --draft's old name)"
            )
        if self.ts_preset is not None and self.ts_preset not in TS_PRESETS:
            raise ConfigError(f"ts_preset: {self.ts_preset!r} is not one of {', '.join(TS_PRESETS)}")
        self.config()  # TokenSwiftConfig checks every value

    def weights(self) -> str | None:
        """The heads to load: --draft, else the deprecated --heads ("random" and "zero" both mean untrained)."""
        given = self.draft if self.draft is not None else self.heads
        return "zero" if given == "random" else given

    def config(self) -> TokenSwiftConfig:
        """The drafter's configuration: the preset, with the options given overriding it."""
        base = TS_PRESETS[self.ts_preset or default_preset()]
        ts_topk = self.ts_topk
        draft_pass = self.draft_pass
        if draft_pass is not None and draft_pass != base.draft_pass:
            if ts_topk is None and (draft_pass == "verified") != (base.draft_pass == "verified"):
                # The self passes' first logit set is the target's own head; the verified pass has no such set.
                ts_topk = base.topk[1:] or (1,) if draft_pass == "verified" else (1, *base.topk)
            base = dataclasses.replace(base, draft_pass=draft_pass)
        given = dict(
            kv_budget=self.kv_budget,
            ngram_topk=self.ngram_topk,
            topk=ts_topk,
            ngram_n=self.ngram_n,
            ngram_lag=self.ngram_lag,
        )
        return dataclasses.replace(base, **{k: v for k, v in given.items() if v is not None})
