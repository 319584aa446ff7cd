"""The method registry: a method's name -> its drafter builder, its options and its training kinds.

    drafter, draft_params = registry.build("pld", model, pld_tokens=4)
    registry.names()                  # ("ar", "pld", "longspec", "hybrid", "auto", ...)
    registry.flags()                  # every method option as a command-line flag (decode.py, the bench)

A method is one folder, `lsjax/methods/<name>/`, whose `__init__.py` registers it:

    @register("mine", MineOptions, help="what it proposes, in a few words")
    def build(model, opts: MineOptions, cache: dict | None):
        return MineDrafter(depth=opts.mine_depth), None          # (drafter, draft_params)

`MineOptions` is a frozen dataclass (the folder's `config.py`) whose fields are the method's decode options,
each made with `option(default, help)`: decode.py and the bench make one flag of each (`--mine-depth`), a
flag named by several methods is one flag read by each. `build` gets the options with every flag the user
left unset at the method's default. `model` is a loaded target (`config`, `params`, `path`); `cache` lets
methods built together share one loaded draft.

Training kinds (`train.py --config`: the config's `kind:`) register beside it with `register_kind`; one of them
says `default=True`, what a config without `kind:` trains. The training scaffold (`lsjax.train`) knows no kind:
`train.py` (`lsjax.cli.train`) resolves a config's kind here and hands its config to the kind's trainer.

Every subpackage of `lsjax.methods` is imported on the first lookup, and so is every module or folder named in
`$LSJAX_METHODS` (comma-separated: dotted module names, or paths to a method folder outside the package), so
adding a method edits nothing outside its folder. The folders' `__init__.py` import only their options and
this module: listing methods and kinds loads neither jax nor optax.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import os
import pkgutil
import sys
import typing
from collections.abc import Callable
from pathlib import Path

from lsjax.config import ConfigError

ENV = "LSJAX_METHODS"
# The order `--method` lists the built-in folders in (AR first, then by kinship); other folders follow by name.
BUILTIN = ("ar", "longspec", "hybrid", "pld", "auto", "dels", "streams", "tokenswift", "eagle3", "dflash")


def option(
    default=None,
    help: str = "",
    *,
    choices: tuple | None = None,
    parse: Callable | None = None,
    flag: bool | str = True,
):
    """A field of a method's options dataclass: `help` and `choices` become its flag's; `parse` turns the
    flag's text into the value (default: the field's type); `flag=False` keeps it off the command line (an
    option only the API and bench variants set), a string names the flag when the field's name would be
    ambiguous among all methods' flags (tokenswift's `draft_pass` is `--ts-draft-pass`)."""
    meta = {"help": help, "choices": choices, "parse": parse, "flag": flag}
    if isinstance(default, list | dict | set):
        raise TypeError("option: a mutable default; use a tuple")
    return dataclasses.field(default=default, metadata=meta)


@dataclasses.dataclass(frozen=True)
class NoOptions:
    """A method without options (ar)."""


@dataclasses.dataclass(frozen=True)
class Method:
    name: str
    build: Callable  # (model, opts, cache) -> (drafter, draft_params)
    options_class: type = NoOptions
    help: str = ""
    uses_draft: bool = False  # reads a trained draft checkpoint (--draft, --tree)
    speculative: bool = True  # proposes tokens; False only for plain AR
    no_mesh: str = ""  # why it cannot decode on a mesh, for decode.py to say before the model loads; "": it can
    # "module:function" (the method's options -> {"dir", "format"}): what `--json` reports as "draft"
    describe_draft: str = ""

    def options(self) -> frozenset[str]:
        """The names of the options this method reads (its options' fields, and the names its `from_values`
        takes apart, `EXTRA_OPTIONS`)."""
        own = {f.name for f in dataclasses.fields(self.options_class)}
        return frozenset(own | set(getattr(self.options_class, "EXTRA_OPTIONS", ())))

    def make_options(self, **values):
        """The method's options from `values` (None = the method's default; names it does not read are
        ignored: callers pass the same options to every method). An options class with a `from_values`
        classmethod builds itself from the flat values (auto: its policy's fields)."""
        kept = {k: v for k, v in values.items() if v is not None and k in self.options()}
        make = getattr(self.options_class, "from_values", None)
        return make(**kept) if make is not None else self.options_class(**kept)


@dataclasses.dataclass(frozen=True)
class Kind:
    """A training kind (`train.py --config`: the config's `kind:`): its config class, trainer and export, as
    "module:attribute" strings imported on first use (resolving a kind, and rejecting an unknown one, loads
    neither jax nor optax)."""

    name: str
    help: str
    config: str  # the config dataclass
    trainer: str  # fit(cfg, *, resume, overwrite, stop_after, log, progress, config_dict) -> summary dict
    exporter: str  # export(cfg, out_dir, *, config_path, tree) -> dict (what to report)
    flags: tuple[str, ...] = ()  # train.py options this kind reads beyond the common ones ("tree")
    default: bool = False  # what a config without `kind:` trains (one kind at most)

    @property
    def config_class(self) -> type:
        return load(self.config)

    def fit(self, cfg, **opts) -> dict:
        return load(self.trainer)(cfg, **opts)

    def export(self, cfg, out_dir, *, config_path: str | None = None, tree: str | None = None) -> dict:
        return load(self.exporter)(cfg, out_dir, config_path=config_path, tree=tree)


def load(path: str) -> Callable:
    """The attribute a "module:attribute" string names."""
    module, _, attr = path.partition(":")
    return getattr(importlib.import_module(module), attr)


_METHODS: dict[str, Method] = {}
_KINDS: dict[str, Kind] = {}
_discovered = False


def register(
    name: str,
    options: type = NoOptions,
    *,
    help: str = "",
    uses_draft=False,
    speculative=True,
    no_mesh: str = "",
    describe_draft: str = "",
    replace=False,
):
    """A decorator registering `build(model, opts, cache)` under `name` with its options dataclass.
    Re-registering a name raises unless `replace` (a reloaded module re-registering its own builder is fine).
    `no_mesh`: why the method cannot decode on a mesh (its drafter's `no_mesh` says the same to the API)."""
    if not (dataclasses.is_dataclass(options) and options.__dataclass_params__.frozen):
        raise ConfigError(f"method {name!r}: options must be a frozen dataclass, got {options!r}")

    def add(fn: Callable) -> Callable:
        old = _METHODS.get(name)
        if old is not None and not replace and old.build.__qualname__ != fn.__qualname__:
            raise ConfigError(f"method: {name!r} is already registered (by {old.build.__module__})")
        _METHODS[name] = Method(name, fn, options, help, uses_draft, speculative, no_mesh, describe_draft)
        return fn

    return add


def unregister(name: str) -> None:
    _METHODS.pop(name, None)


def register_kind(
    kind: Kind | str, help: str = "", *, config: str = "", export: str = "", flags=(), default=False, replace=False
):
    """Registers a training kind: a `Kind`, or, called with its name, a decorator of its `fit(cfg, **run)` (a
    thin function in the folder's `__init__.py` that imports its trainer when called):

        @register_kind("echo", "what it trains", config="pkg.train:EchoConfig", export="pkg.train:export")
        def fit(cfg, **run):
            from pkg.train import fit_echo
            return fit_echo(cfg, **run)

    `default=True`: the kind a config without `kind:` trains; a second default is refused."""
    if isinstance(kind, str):

        def add(fn: Callable) -> Callable:
            trainer = f"{fn.__module__}:{fn.__qualname__}"
            register_kind(Kind(kind, help, config, trainer, export, tuple(flags), default), replace=replace)
            return fn

        return add
    old = _KINDS.get(kind.name)
    if old is not None and not replace and old != kind:
        raise ConfigError(f"training kind: {kind.name!r} is already registered")
    other = next((k.name for k in _KINDS.values() if k.default and k.name != kind.name), None)
    if kind.default and other is not None:
        raise ConfigError(f"training kind: {kind.name!r} cannot be the default, {other!r} is")
    _KINDS[kind.name] = kind
    return kind


def unregister_kind(name: str) -> None:
    _KINDS.pop(name, None)


def _import_path(path: Path) -> None:
    """Imports a method folder (a package outside lsjax) by its path, under its folder's name."""
    name = path.name
    if name in sys.modules:
        return
    init = path / "__init__.py"
    if not init.is_file():
        raise ConfigError(f"{ENV}: {path} is not a method folder (it has no __init__.py)")
    spec = importlib.util.spec_from_file_location(name, init, submodule_search_locations=[str(path)])
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise


def _discover() -> None:
    """Imports every method folder of lsjax.methods once, and every `$LSJAX_METHODS` entry not yet imported
    (read at each lookup, so a folder named after the first lookup is found too)."""
    global _discovered
    if not _discovered:
        _discovered = True
        import lsjax.methods as package

        found = {mod.name for mod in pkgutil.iter_modules(package.__path__) if mod.ispkg}
        for name in [n for n in BUILTIN if n in found] + sorted(found - set(BUILTIN)):
            importlib.import_module(f"{package.__name__}.{name}")
    for entry in filter(None, (e.strip() for e in os.environ.get(ENV, "").split(","))):
        path = Path(entry).expanduser()
        if path.is_dir():
            _import_path(path.resolve())
        elif entry not in sys.modules:
            try:
                importlib.import_module(entry)
            except ImportError as e:
                raise ConfigError(f"{ENV}: cannot import {entry!r} (a module name or a method folder): {e}") from None


def _rank(module: str) -> int:
    """A built-in folder's place in BUILTIN; anything else after them."""
    parts = module.split(".")
    folder = parts[2] if len(parts) > 2 and parts[:2] == ["lsjax", "methods"] else None
    return BUILTIN.index(folder) if folder in BUILTIN else len(BUILTIN)


def names() -> tuple[str, ...]:
    """Registered method names: the built-in folders' in BUILTIN order, then the others as registered."""
    _discover()
    return tuple(sorted(_METHODS, key=lambda n: _rank(_METHODS[n].build.__module__)))


def get(name: str) -> Method:
    _discover()
    if name not in _METHODS:
        raise ConfigError(f"method: unknown method {name!r}; choose from {', '.join(_METHODS)}")
    return _METHODS[name]


def cached(cache: dict | None, key, load: Callable):
    """`load()` once per key for methods built together (`build`'s `cache`: one loaded draft shared by several
    methods of a run); without a cache, every call loads."""
    if cache is None:
        return load()
    if key not in cache:
        cache[key] = load()
    return cache[key]


def build(name: str, model, *, cache: dict | None = None, **opts):
    """(drafter, draft_params) of method `name` for `model`; options that are None take the method's default."""
    method = get(name)
    return method.build(model, method.make_options(**opts), cache)


def kind_names() -> tuple[str, ...]:
    _discover()
    return tuple(sorted(_KINDS, key=lambda n: _rank(_KINDS[n].trainer.partition(":")[0])))


def get_kind(name) -> Kind:
    _discover()
    if not isinstance(name, str) or name not in _KINDS:
        raise ConfigError(f"kind: unknown kind {name!r}; known kinds: {', '.join(kind_names())}")
    return _KINDS[name]


def default_kind() -> str:
    """The name of the kind registered with `default=True`."""
    _discover()
    name = next((k.name for k in _KINDS.values() if k.default), None)
    if name is None:
        raise ConfigError(
            f"kind: the config names none and no kind is the default; known kinds: {', '.join(kind_names())}"
        )
    return name


def kind_of(raw) -> str:
    """The kind a config (the YAML as a dict) names; the default kind where it names none."""
    kind = raw.get("kind") if isinstance(raw, dict) else None
    return default_kind() if kind is None else kind


def fit_kind(cfg, **run) -> dict:
    """Trains `cfg` with the trainer of its kind (`cfg.kind`): `lsjax.train.runner.run_steps`' summary."""
    return get_kind(cfg.kind).fit(cfg, **run)


# ------------------------------------------------------------------------------------------- flags


@dataclasses.dataclass(frozen=True)
class Flag:
    """One method option as a command-line flag: `--name-with-dashes`, read by `methods` (in order)."""

    name: str  # the option's name: the argparse dest
    type: Callable
    help: str
    choices: tuple | None
    methods: tuple[str, ...]
    default: object = None  # the readers' default where they all share one, else None (each its own)
    flag_name: str = ""  # the flag's own name where it is not the option's

    @property
    def flag(self) -> str:
        return "--" + (self.flag_name or self.name.replace("_", "-"))


def _flag_type(cls: type, field: dataclasses.Field) -> Callable:
    if field.metadata.get("parse") is not None:
        return field.metadata["parse"]
    hint = typing.get_type_hints(cls)[field.name]
    args = [a for a in typing.get_args(hint) if a is not type(None)] or [hint]
    base = args[0]
    if base is bool:
        return lambda s: s.lower() in ("1", "true", "yes", "on")
    return base if base in (int, float, str) else str


def flags() -> tuple[Flag, ...]:
    """Every method option that is a flag, once, with the methods reading it (help: each method's own words,
    joined)."""
    seen: dict[str, dict] = {}
    for name in names():
        cls = _METHODS[name].options_class
        for f in dataclasses.fields(cls):
            if not f.metadata.get("flag", True):
                continue
            named = f.metadata.get("flag")
            entry = seen.setdefault(
                f.name,
                {
                    "type": _flag_type(cls, f),
                    "help": {},
                    "choices": f.metadata.get("choices"),
                    "methods": [],
                    "flag_name": named if isinstance(named, str) else "",
                },
            )
            entry["methods"].append(name)
            entry.setdefault("defaults", set()).add(repr(f.default))
            entry.setdefault("default", f.default)
            text = f.metadata.get("help", "")
            if f.default is not None and f.default is not dataclasses.MISSING:
                text = f"{text} (default {f.default})" if text else f"default {f.default}"
            entry["help"].setdefault(text, []).append(name)
    return tuple(
        Flag(
            n,
            e["type"],
            "; ".join(f"{'|'.join(ms)}: {text}" for text, ms in e["help"].items()),
            e["choices"],
            tuple(e["methods"]),
            e["default"] if len(e["defaults"]) == 1 else None,
            e["flag_name"],
        )
        for n, e in seen.items()
    )


def flag_of(name: str) -> str:
    """The command-line flag of option `name`."""
    return next((f.flag for f in flags() if f.name == name), "--" + name.replace("_", "-"))


def add_flags(parser) -> tuple[str, ...]:
    """Adds every method option to an argparse parser (one group; the default is the readers' shared one, or
    None: each method's own); returns the dests."""
    group = parser.add_argument_group("method options", "each read by the methods it names; others ignore it")
    dests = []
    for f in flags():
        kw = {"type": f.type, "default": f.default, "help": f.help, "dest": f.name}
        if f.choices:
            kw["choices"] = f.choices
        dests.append(group.add_argument(f.flag, **kw).dest)
    return tuple(dests)
