"""LongSpec draft checkpoints on the decode side: find, read and check a draft, build its drafter.

A draft directory (`lsjax.artifacts`, kind "longspec") holds `model.safetensors` (the draft's tensors in
bfloat16, plus `vocab_ids` when the vocabulary is pruned) and `config.json` (the DraftConfig, the target's
name, the default tree and the training summary); a draft written before 2026-11-26 (`params.npz` +
`draft.json`) still loads. Training writes them (`lsjax.methods.longspec.export`); nothing here imports the trainer, so
decoding never loads optax, orbax or grain. `load_draft` returns the file's arrays (floating ones as
float32); `load_longspec` turns them into the `DraftParams` the drafter runs with (weights, vocab_ids, and
the vocabulary's head gathered once).

A bad draft is a named one-line error: a truncated or corrupt file is a `CorruptFileError`, a draft made for
another target (its tensors do not fit this target's shapes) a `ShapeMismatchError`.
"""

from __future__ import annotations

from pathlib import Path

import jax
import jax.numpy as jnp

from lsjax import artifacts
from lsjax.config import DraftConfig, from_dict
from lsjax.errors import MissingTensorError, ModelNotFoundError, ShapeMismatchError
from lsjax.methods.longspec.drafter import LongSpecDrafter
from lsjax.methods.longspec.model import LongSpecDraft, init_draft_params
from lsjax.models.draft_params import VOCAB_IDS, DraftParams
from lsjax.models.module import Model, shapes
from lsjax.tree import TreeConfig, for_device, parse_tree

DEFAULT_TARGET = "SmolLM2-135M-Instruct"  # the name drafts of the bundled target are filed under
DRAFTS_DIR = Path(__file__).resolve().parents[2] / "drafts"


def load_draft(path: str | Path) -> tuple[dict, DraftConfig, dict]:
    """(the draft's arrays {name: numpy array}, DraftConfig, its metadata) of a draft directory;
    `DraftParams.from_arrays` makes the first the typed structure."""
    params, meta = artifacts.load_weights(path, "longspec")
    dcfg = artifacts.parse_config(
        path, "longspec", lambda: from_dict(DraftConfig, meta["draft_config"], "draft_config")
    )
    return params, dcfg, meta


def check_draft_fits(
    params: dict, dcfg: DraftConfig, config, where: str, made_for: str = "", model: Model | None = None
) -> None:
    """Raises ShapeMismatchError (MissingTensorError) when the draft's tensors (the file's arrays) are not the
    variables of its module `model` (default `LongSpecDraft(config, dcfg)`) for target `config`: a draft trained
    for another target would otherwise fail deep inside jit with an XLA shape error. One line naming the tensor
    and both shapes. Entries the module does not declare (`vocab_ids`, checked here; a block draft's
    `mask_embed` read as a LongSpec draft) are not its variables and are left to their readers."""
    model = LongSpecDraft(config, dcfg) if model is None else model
    note = f" (it was made for {made_for})" if made_for else ""
    for name, shape in shapes(model).items():
        if name not in params:
            raise MissingTensorError(f"draft {where}: tensor {name} is missing{note}")
        if tuple(params[name].shape) != shape:
            raise ShapeMismatchError(
                f"draft {where} does not fit target {config.name}: tensor {name} has shape "
                f"{tuple(params[name].shape)}, this target needs {shape}{note}"
            )
    ids = params.get(VOCAB_IDS)
    if ids is not None and (ids.ndim != 1 or ids.size == 0 or ids.min() < 0 or ids.max() >= config.vocab_size):
        raise ShapeMismatchError(
            f"draft {where} does not fit target {config.name}: its vocab_ids lie outside [0, {config.vocab_size}){note}"
        )


def target_key(model_path: str | Path) -> str:
    """The name drafts are filed under: the checkpoint's name without quantization and extension
    ("SmolLM2-135M-Instruct.Q4_1.gguf" -> "SmolLM2-135M-Instruct"; an HF directory's name)."""
    return Path(model_path).name.split(".")[0]


def shipped_dir(model_path: str | Path, kind: str = "") -> Path:
    """Where drafts for a target ship: `lsjax/drafts/<target>/` holds its LongSpec draft, `<kind>/` below it
    another method's (`eagle3`, `dflash`, `tokenswift`, ...)."""
    p = DRAFTS_DIR / target_key(model_path)
    return p / kind if kind else p


def shipped_draft(model_path: str | Path | None, kind: str) -> Path | None:
    """The draft of method `kind` shipped for this target (`shipped_dir`, a config.json there), if any."""
    if model_path is None:
        return None
    p = shipped_dir(model_path, kind)
    return p if (p / "config.json").is_file() else None


def default_draft_path(model_path: str | Path) -> Path | None:
    """The draft shipped in the package for this target, if any."""
    p = shipped_dir(model_path)
    return p if artifacts.has_weights(p, "longspec") else None


def draft_info(opts) -> dict | None:
    """`--json`'s "draft" field: the directory and its format ("lsjax": lsjax's own, "released": the authors'
    layout and semantics, "random"); None for the shipped draft (the directory is found once the model loads)."""
    from lsjax.methods.longspec.release import is_release

    if opts.draft in (None, "shipped"):
        return None
    if opts.draft == "random":
        return {"dir": "random", "format": "random"}
    return {"dir": str(opts.draft), "format": "released" if is_release(opts.draft) else "lsjax"}


def load_longspec(model, draft: str | None, tree_spec: str | TreeConfig | None):
    """(drafter, DraftParams) for a loaded model (config, params, path): `draft` is a checkpoint directory,
    "random" (initialised from the target's last layer, untrained), or None or "shipped" (the shipped draft for
    this target).
    `tree_spec`: a preset or widths ("2,1"), a TreeConfig, or None (the draft's own tree, else the device's)."""
    if draft == "random":
        dcfg = DraftConfig()
        params = DraftParams(init_draft_params(model.config, dcfg, jax.tree.map(jnp.asarray, model.params)))
        meta = {}
    else:
        path = Path(draft) if draft and draft != "shipped" else default_draft_path(model.path)
        if path is None:
            raise ModelNotFoundError(
                f"no shipped LongSpec draft for {target_key(model.path)}; pass --draft DIR (or --draft random)"
            )
        from lsjax.methods.longspec.release import is_release, read_release

        if is_release(path):  # the authors' layout (sail/longspec-*), with its semantics
            dcfg, arrays = read_release(path, model.config)
            meta = {"format": "released"}
        else:
            arrays, dcfg, meta = load_draft(path)
        check_draft_fits(arrays, dcfg, model.config, str(path), meta.get("target", ""))
        params = (
            DraftParams.from_arrays(arrays).in_dtype(model.config.dtype).with_vocab_head(model.params, model.config)
        )
    if isinstance(tree_spec, TreeConfig):
        tree = tree_spec
    elif tree_spec:
        tree = parse_tree(tree_spec)
    else:
        tree = shipped_tree(meta, jax.default_backend())
    return LongSpecDrafter(tree=tree, draft=dcfg), params


def shipped_tree(meta: dict, backend: str) -> TreeConfig:
    """The tree a draft's metadata names for `backend`: `"tree"` is widths for every device or a mapping
    backend -> widths or preset (the tree was measured on that device: studies/trees); without one,
    the device's preset."""
    tree = for_device(meta.get("tree"), backend)
    if tree:
        return parse_tree(tree if isinstance(tree, str) else tuple(tree))
    return parse_tree("cpu" if backend == "cpu" else "paper")


def load_checked(model, draft: str | None, tree_spec: str | TreeConfig | None):
    """`load_longspec`, then a tree the draft cannot propose (a level wider than its vocabulary: top_k would
    fail inside the compiled step) or absurd for the context is a one-line ConfigError before anything
    compiles."""
    from lsjax.tree import check_fits

    drafter, params = load_longspec(model, draft, tree_spec)
    vocab_ids = getattr(params, "vocab_ids", None)
    vocab, name = (
        (model.config.vocab_size, "the target's vocabulary")
        if vocab_ids is None
        else (len(vocab_ids), "its pruned vocabulary")
    )
    check_fits(drafter.tree, vocab, model.config.max_position, tree_spec, name)
    return drafter, params
