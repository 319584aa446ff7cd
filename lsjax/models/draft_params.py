"""What a LongSpec (or block) draft runs with: its trained weights, its pruned vocabulary, the derived head.

    params = DraftParams.from_arrays(load_weights(d, "longspec")[0])  # the file's layout -> the typed structure
    params = params.with_vocab_head(target_params, config)            # at load: gather the head rows once
    jax.jit(f)(params)                                                # a pytree: weights, vocab_ids, vocab_head
    save_weights(d, params.arrays(), meta, kind="longspec")           # back to the file's layout (no head)

The three parts used to share one dict. They are different things:

* `weights` {name: Array}: the trained tensors, the params collection of the draft's linen module
  (`LongSpecDraft(config, draft).apply({"params": weights}, ...)`, `lsjax.methods.longspec.model`; the block
  draft `lsjax.methods.dels.model.BlockDraft` adds `mask_embed`). Trainers optimise exactly this dict.
* `vocab_ids` [Vd] int or None: the pruned draft vocabulary (`lsjax.vocab`), metadata chosen before training
  and never trained. None = the target's whole vocabulary. Like the head, an argument of the module's
  `logits`, not one of its variables.
* `vocab_head` [Vd, D] or None: the target's LM-head rows at `vocab_ids`, derived at load so drafting does not
  gather them from the [V, D] head every step (19 MB of reads per step for SmolLM2 at Vd = 8192). Never saved.

On disk (`lsjax.artifacts`) the weights are stored by name plus `vocab_ids` when pruned (`from_arrays` /
`arrays`). A flat dict in that layout is still accepted wherever a DraftParams is expected
(`DraftParams.of`), so a trainer's or a test's weights dict runs as it is.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import jax
import jax.numpy as jnp
import numpy as np

from lsjax.config import ModelConfig
from lsjax.models.layers import ParamSpec, shape_problem

VOCAB_IDS, VOCAB_HEAD = "vocab_ids", "vocab_head"  # their names in the file layout (the head is never saved)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class DraftParams:
    weights: dict  # {name: Array}: the trained tensors (the model's param_specs)
    vocab_ids: jax.Array | None = None  # [Vd] the pruned vocabulary, or None (the target's whole vocabulary)
    vocab_head: jax.Array | None = None  # [Vd, D] the LM-head rows at vocab_ids (derived at load, never saved)

    @classmethod
    def from_arrays(cls, arrays: Mapping) -> DraftParams:
        """The file layout (a flat {name: array}: weights, plus "vocab_ids" when pruned) -> DraftParams. A
        "vocab_head" entry (a dict from before this type existed) is kept as the derived head."""
        weights = {k: v for k, v in arrays.items() if k not in (VOCAB_IDS, VOCAB_HEAD)}
        return cls(weights, arrays.get(VOCAB_IDS), arrays.get(VOCAB_HEAD))

    @classmethod
    def of(cls, params) -> DraftParams:
        """`params` as a DraftParams: itself, or a flat dict in the file layout (`from_arrays`)."""
        return params if isinstance(params, DraftParams) else cls.from_arrays(params)

    def arrays(self) -> dict:
        """The file layout: the weights by name, plus "vocab_ids" when pruned (never the derived head)."""
        return {**self.weights, **({} if self.vocab_ids is None else {VOCAB_IDS: self.vocab_ids})}

    def with_vocab_head(self, target_params: dict, config: ModelConfig) -> DraftParams:
        """The same params with `vocab_head` gathered from the target's LM head; unchanged without vocab_ids."""
        if self.vocab_ids is None:
            return self
        return dataclasses.replace(self, vocab_head=vocab_head_rows(target_params, config, self.vocab_ids))

    def in_dtype(self, dtype: str) -> DraftParams:
        """The weights cast to `dtype` (the target's: bf16 on TPU/GPU), vocab_ids and the head as they are. Files
        hold bf16 or fp32 whatever the device; the draft then reads its weights in the dtype its matmuls run in
        rather than promoting every product with the target's bf16 activations to fp32."""
        dt = jnp.dtype(dtype)
        return dataclasses.replace(self, weights={k: jnp.asarray(w, dt) for k, w in self.weights.items()})

    def replace_weights(self, **weights) -> DraftParams:
        """The same params with some weights replaced or added (e.g. a block draft's `mask_embed`)."""
        return dataclasses.replace(self, weights={**self.weights, **weights})


def weights_problem(params, specs: dict[str, ParamSpec], method: str) -> str | None:
    """Why `params` cannot be the weights of a `method` draft whose schema is `specs` (one line), or None."""
    if not isinstance(params, DraftParams | Mapping):
        return (
            f"{method} needs its draft's params (a DraftParams or a {{name: array}} dict, as load_draft or "
            f"registry.build returns them), got {type(params).__name__}"
        )
    return shape_problem(DraftParams.of(params).weights, specs)


def vocab_head_rows(target_params: dict, config: ModelConfig, vocab_ids) -> jax.Array:
    """The target's LM-head rows [Vd, D] at `vocab_ids` (the embedding's when the head is tied)."""
    table = target_params["embed"] if config.tie_embeddings else target_params["lm_head"]
    if isinstance(table, np.ndarray) and not isinstance(vocab_ids, jax.core.Tracer):
        # Host arrays (a loaded or mapped model): the rows gathered there. jnp.asarray would copy the whole table
        # to the device first (SmolLM2: 113 MB, 0.1-0.3 s of every start of a pruned-vocabulary draft).
        ids = np.asarray(vocab_ids, np.int32)
        return jnp.asarray(np.take(table, ids, axis=0) if config.tie_embeddings else np.take(table, ids, axis=1).T)
    ids = jnp.asarray(vocab_ids, jnp.int32)
    if config.tie_embeddings:
        return jnp.take(jnp.asarray(table), ids, axis=0)
    return jnp.take(jnp.asarray(table), ids, axis=1).T
