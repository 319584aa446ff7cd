"""One registry from a decoding method's name to its drafter: what `decode.py --method` and the bench offer.

    drafter, draft_params = registry.build("pld", model, pld_tokens=4)
    registry.names()             # ("ar", "longspec", "hybrid", "pld", ...)

A method is a builder `build(model, **opts) -> (drafter, draft_params)`. `model` is a loaded target
(anything with `config`, `params` and `path`, e.g. `lsjax.loading.LoadedModel`); `opts` are the decode
options (`draft`, `tree`, `pld_tokens`, `pld_ngram`, and `cache`, a dict that lets methods built together
share one loaded draft). An option given as None means "the method's default"; a builder takes the options
it knows and ignores the rest (`**_`), so callers pass the same options to every method.

Which options a method reads is data (`Method.options`): its builder's keyword parameters, plus what it
declares with `register(extra_options=..., forwards=...)` (options read from `**opts`, and methods whose
options it passes on: `hybrid` and `auto` build a `longspec` drafter). `decode.py` warns about a flag that
the chosen method does not read.

Adding a drafter is one file: `lsjax/drafters/<name>.py` holds the drafter and registers it,

    @register("mine", help="what it proposes, in a few words")
    def _build(model, *, mine_depth=4, **_):
        return MineDrafter(depth=mine_depth), None

Every module of `lsjax.drafters` is imported on the first lookup, so its registration needs no edit
anywhere else. Drafters defined outside the package (a test, a user's code) call `register` the same way.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import pkgutil
from collections.abc import Callable

from lsjax.config import ConfigError

PLD_TOKENS = 8  # prompt lookup alone: a long chain costs little when it misses (one verify of 9 nodes)
HYBRID_PLD_TOKENS = 6  # beside the draft's tree, a shorter chain keeps the union's verification small
PLD_NGRAM = 3


@dataclasses.dataclass(frozen=True)
class Method:
    name: str
    build: Callable  # (model, **opts) -> (drafter, draft_params)
    help: str = ""
    uses_draft: bool = False  # reads a trained draft checkpoint (--draft, --tree)
    speculative: bool = True  # proposes tokens; False only for plain AR
    extra_options: tuple[str, ...] = ()  # options it reads beyond its builder's keyword parameters (from **opts)
    forwards: tuple[str, ...] = ()  # methods whose options its builder passes on (hybrid, auto: "longspec")

    def options(self) -> frozenset[str]:
        """The options this method reads: its builder's keyword parameters (but `cache`, which is not a
        decode option), its `extra_options`, and the options of the methods it `forwards` to."""
        params = inspect.signature(self.build).parameters.values()
        own = {p.name for p in params if p.kind == p.KEYWORD_ONLY and p.name != "cache"}
        for name in self.forwards:
            own |= get(name).options()
        return frozenset(own | set(self.extra_options))


_METHODS: dict[str, Method] = {}
_discovered = False


def register(
    name: str,
    build: Callable | None = None,
    *,
    help: str = "",
    uses_draft: bool = False,
    speculative: bool = True,
    extra_options: tuple[str, ...] = (),
    forwards: tuple[str, ...] = (),
    replace: bool = False,
):
    """Registers builder `build` under `name`; without `build`, a decorator. Re-registering a name raises
    unless `replace` (a reloaded module re-registering its own builder is fine). `extra_options` and
    `forwards`: see `Method.options`."""

    def add(fn: Callable) -> Callable:
        old = _METHODS.get(name)
        if old is not None and not replace and old.build.__qualname__ != fn.__qualname__:
            raise ConfigError(f"method: {name!r} is already registered (by {old.build.__module__})")
        _METHODS[name] = Method(name, fn, help, uses_draft, speculative, tuple(extra_options), tuple(forwards))
        return fn

    return add if build is None else add(build)


def unregister(name: str) -> None:
    _METHODS.pop(name, None)


def _discover() -> None:
    """Imports every module of lsjax.drafters once, so each file's `register` call has run."""
    global _discovered
    if _discovered:
        return
    _discovered = True
    import lsjax.drafters as package

    for mod in pkgutil.iter_modules(package.__path__):
        importlib.import_module(f"{package.__name__}.{mod.name}")


def names() -> tuple[str, ...]:
    """Registered method names, in registration order (the built-in ones first)."""
    _discover()
    return tuple(_METHODS)


def get(name: str) -> Method:
    _discover()
    if name not in _METHODS:
        raise ConfigError(f"method: unknown method {name!r}; choose from {', '.join(_METHODS)}")
    return _METHODS[name]


def build(name: str, model, **opts):
    """(drafter, draft_params) of method `name` for `model`; options that are None take the method's default."""
    return get(name).build(model, **{k: v for k, v in opts.items() if v is not None})


# ---------------------------------------------------------------------------
# The built-in methods. Imports are inside the builders: listing names must stay cheap.


@register("ar", help="autoregressive, one token per target forward", speculative=False)
def _ar(model, **_):
    from lsjax.drafters.base import ARDrafter

    return ARDrafter(), None


@register("longspec", help="the LongSpec draft model's tree", uses_draft=True)
def _longspec(model, *, draft: str | None = None, tree=None, cache: dict | None = None, **_):
    from lsjax.drafters.checkpoints import load_longspec

    key = ("longspec", draft, tree)
    if cache is not None and key in cache:
        return cache[key]
    out = load_longspec(model, draft, tree)
    _check_tree(model, *out, tree)
    if cache is not None:
        cache[key] = out
    return out


def _check_tree(model, drafter, params, spec) -> None:
    """A tree the draft cannot propose (a level wider than its vocabulary: top_k would fail inside the compiled
    step) or absurd for the context: a one-line ConfigError before anything compiles."""
    from lsjax.tree import check_fits

    vocab_ids = getattr(params, "vocab_ids", None)
    vocab, name = (
        (model.config.vocab_size, "the target's vocabulary")
        if vocab_ids is None
        else (len(vocab_ids), "its pruned vocabulary")
    )
    check_fits(drafter.tree, vocab, model.config.max_position, spec, name)


# The draft's tree inside `hybrid` and `auto` on a CPU unless --tree says otherwise: both were tuned with it
# there, and it is not the shipped draft's CPU tree, which is picked for `--method longspec` alone (one node).
# Elsewhere they take the draft's tree for the device, as `longspec` does.
COMBINED_TREE = "2,1,1"


def combined_tree(tree):
    import jax

    return tree or (COMBINED_TREE if jax.default_backend() == "cpu" else None)


@register(
    "hybrid",
    help="the draft's tree plus a prompt-lookup chain, verified together",
    uses_draft=True,
    forwards=("longspec",),
)
def _hybrid(model, *, pld_tokens: int = HYBRID_PLD_TOKENS, pld_ngram: int = PLD_NGRAM, **opts):
    from lsjax.drafters.hybrid import HybridDrafter
    from lsjax.drafters.pld import PLDDrafter

    drafter, draft_params = _longspec(model, **{**opts, "tree": combined_tree(opts.get("tree"))})
    return HybridDrafter(drafter, PLDDrafter(num_tokens=pld_tokens, ngram_max=pld_ngram)), draft_params


@register("pld", help="prompt lookup: continue an earlier n-gram match")
def _pld(model, *, pld_tokens: int = PLD_TOKENS, pld_ngram: int = PLD_NGRAM, **_):
    from lsjax.drafters.pld import PLDDrafter

    return PLDDrafter(num_tokens=pld_tokens, ngram_max=pld_ngram), None
