"""TokenSwift heads on the decode side: find, read, check and write the heads (`lsjax.artifacts`, kind
"tokenswift"), and build the drafter from them. Both layouts (lsjax's, a TokenSwift release) read into
`lsjax.methods.tokenswift.model.TokenSwiftHeads`'s params, checked against its declaration before anything
compiles."""

from __future__ import annotations

import json
from pathlib import Path

import jax.numpy as jnp
import numpy as np

from lsjax import artifacts
from lsjax.config import from_dict, to_dict
from lsjax.errors import ShapeMismatchError
from lsjax.methods.tokenswift import model as th
from lsjax.methods.tokenswift.config import TokenSwiftConfig
from lsjax.methods.tokenswift.drafter import TokenSwiftDrafter
from lsjax.models.module import variables_problem


def default_heads_path(model_path: str | Path) -> Path | None:
    """The heads shipped for this target, beside its LongSpec draft (`lsjax/drafts/<target>/tokenswift`)."""
    from lsjax.methods.longspec.checkpoint import DRAFTS_DIR, target_key

    p = DRAFTS_DIR / target_key(model_path) / HEADS_SUBDIR
    return p if artifacts.has_weights(p, "tokenswift") else None


def save_heads(path: str | Path, params: dict, heads: th.HeadsConfig, target_name: str, extra: dict | None = None):
    meta = {"target": target_name, "heads_config": to_dict(heads), **(extra or {})}
    artifacts.save_weights(path, params, meta, kind="tokenswift")


RELEASED = "model.medusa_layers.{i}.{name}.weight"  # TokenSwift's released full-model checkpoints


def is_released(path: Path) -> bool:
    """A TokenSwift release: a full model (config.json with `medusa_heads`, or medusa_layers tensors)."""
    cfg = path / "config.json"
    if cfg.is_file():
        try:
            if "medusa_heads" in json.loads(cfg.read_text()):
                return True
        except ValueError:
            return False
    if (path / "model.safetensors.index.json").is_file():
        index = json.loads((path / "model.safetensors.index.json").read_text())
        return any(k.startswith("model.medusa_layers.") for k in index.get("weight_map", {}))
    return False


def read_released(path: Path, config) -> tuple[dict, th.HeadsConfig, dict]:
    """The heads of a released TokenSwift checkpoint (bigai-nlco/TokenSwift's `MedusaModel`s under
    `model.medusa_layers`: h + linear(input_layernorm(h)), then post_layernorm before the target's LM head, which
    is lsjax's head), read alone from its single or sharded safetensors: the target's tensors stay unread."""
    from lsjax.errors import MissingTensorError
    from lsjax.loading.corrupt import reading
    from lsjax.loading.hf import SafetensorsDir

    with reading(path, "TokenSwift checkpoint (config.json or safetensors)"):
        hf = json.loads((path / "config.json").read_text()) if (path / "config.json").is_file() else {}
        st = SafetensorsDir(path)
        n = 0
        while RELEASED.format(i=n, name="linear") in st:
            n += 1
        if n == 0:
            raise MissingTensorError(
                f"{path}: a full-model checkpoint without TokenSwift heads (no model.medusa_layers.* tensors)"
            )
        D = config.hidden_size
        got = (hf.get("hidden_size", st.shape(RELEASED.format(i=0, name="linear"))[0]), hf.get("vocab_size"))
        if got[0] != D or (got[1] is not None and got[1] != config.vocab_size):
            raise ShapeMismatchError(
                f"heads {path} are for a target with hidden size {got[0]} and vocabulary {got[1]}; "
                f"{config.name} has {D} and {config.vocab_size}"
            )

        def stack(name, convert=lambda w: w):
            return np.stack(
                [convert(np.asarray(st.get(RELEASED.format(i=i, name=name)), np.float32)) for i in range(n)]
            )

        params = {
            "w": stack("linear", np.transpose),
            "in_norm": stack("input_layernorm"),
            "out_norm": stack("post_layernorm"),
        }
    hcfg = th.HeadsConfig(num_heads=n)
    if problem := variables_problem(th.TokenSwiftHeads(config, hcfg), params, f"heads {path}"):
        raise ShapeMismatchError(problem)
    return params, hcfg, {"target": hf.get("_name_or_path", "?"), "format": "tokenswift-release"}


def load_heads(path: str | Path, config) -> tuple[dict, th.HeadsConfig, dict]:
    """(params as float32 numpy, HeadsConfig, metadata) of a heads directory (lsjax's, or a TokenSwift release),
    checked against target `config`."""
    path = Path(path)
    if not artifacts.has_weights(path, "tokenswift") and path.is_dir():
        if is_released(path):
            return read_released(path, config)
        if any(path.glob("*.safetensors")):  # a checkpoint, but neither layout's
            from lsjax.errors import MissingTensorError

            raise MissingTensorError(
                f"{path}: neither lsjax's TokenSwift heads (config.json of kind tokenswift + model.safetensors) nor a "
                "TokenSwift release (model.medusa_layers.* in a full-model checkpoint); a full model without heads?"
            )
    params, meta = artifacts.load_weights(path, "tokenswift")
    hcfg = artifacts.parse_config(
        path, "tokenswift", lambda: from_dict(th.HeadsConfig, meta["heads_config"], "heads_config")
    )
    if problem := variables_problem(th.TokenSwiftHeads(config, hcfg), params, f"heads {path}"):
        raise ShapeMismatchError(
            f"{problem}; these heads do not fit target {config.name} (they were made for {meta.get('target', '?')})"
        )
    return params, hcfg, meta


def load_tokenswift(model, heads: str | None, cfg: TokenSwiftConfig):
    """(drafter, heads params) for a loaded model: `heads` a directory, "zero" (untrained heads: each repeats
    the target's own next-token guess, so only the n-grams and the draft pass's own head propose anything
    useful), or None (the heads shipped for this target, else zero heads)."""
    path = Path(heads) if heads not in (None, "zero") else None
    if heads is None:
        path = default_heads_path(model.path)
    if path is None:
        hcfg = th.HeadsConfig()
        params = th.TokenSwiftHeads(model.config, hcfg).untrained_weights(jnp.asarray(model.params["final_norm"]))
    else:
        params, hcfg, _ = load_heads(path, model.config)
    return TokenSwiftDrafter(cfg, hcfg), params


HEADS_SUBDIR = "tokenswift"


def draft_info(opts) -> dict:
    """`--json`'s "draft" field: the heads directory and its layout ("lsjax", "tokenswift-release"), or "zero"."""
    given = opts.weights()
    if given == "zero":
        return {"dir": "zero", "format": "zero"}
    path = Path(given) if given is not None else None
    if given is None:
        # The default is the shipped heads (found like a checkpoint), else untrained ones.
        return {"dir": "shipped", "format": "lsjax"}
    return {"dir": str(path), "format": "tokenswift-release" if is_released(path) else "lsjax"}


def write_released(path: str | Path, params: dict, hidden_size: int, vocab_size: int) -> Path:
    """Heads in the released layout (tests): config.json with `medusa_heads` and the `model.medusa_layers.*`
    tensors, beside a stand-in target tensor a reader must leave alone."""
    from safetensors.numpy import save_file

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    n = params["w"].shape[0]
    tensors = {"model.norm.weight": np.ones(hidden_size, np.float32)}
    for i in range(n):
        tensors[RELEASED.format(i=i, name="linear")] = np.ascontiguousarray(np.asarray(params["w"][i], np.float32).T)
        tensors[RELEASED.format(i=i, name="input_layernorm")] = np.asarray(params["in_norm"][i], np.float32)
        tensors[RELEASED.format(i=i, name="post_layernorm")] = np.asarray(params["out_norm"][i], np.float32)
    save_file(tensors, str(path / "model.safetensors"))
    hf = {"model_type": "llama", "hidden_size": hidden_size, "vocab_size": vocab_size, "medusa_heads": n}
    (path / "config.json").write_text(json.dumps(hf))
    return path
