"""The DFlash draft's training config (`kind: dflash`): the scaffold's shared sections (`lsjax.train.config`: the
run, target, data) with the draft's shape and the block-diffusion loss.

Light to import (no jax): `train.py` builds it from the YAML before any trainer loads. What can only be checked
against the loaded target (target layers beyond its depth, a mask token outside its vocabulary, a draft to
continue that was made for another target) is checked when the run loads it (`lsjax.methods.dflash.train`),
one line naming the field.
"""

from __future__ import annotations

import dataclasses

from lsjax.config import _check, _positive_int
from lsjax.train.config import DataConfig, PositionConfig, RunConfig, TargetConfig

KIND = "dflash"


@dataclasses.dataclass(frozen=True)
class DFlashDraftSection:
    """The draft's shape. Its layers are Qwen3's (q/k norms) at the target's width, heads and MLP size, as the
    published drafts are; it has no embedding or LM head of its own (it reads the target's, frozen)."""

    num_layers: int = 2
    block_size: int = 16  # s: the anchor and s - 1 masked positions, drafted in one forward
    # The target layers whose outputs are the context features (HF's hidden_states[i + 1] for each i); () = the
    # published rule for num_layers (`lsjax.methods.dflash.model.default_layer_ids`).
    target_layer_ids: tuple[int, ...] = ()
    mask_token_id: int = -1  # -1 = the target's last token id (any id the text rarely holds will do)
    init_std: float = 0.02  # random init of the layers (std of a normal), as HF's initializer_range

    def __post_init__(self):
        _positive_int(self.num_layers, "draft.num_layers")
        s = self.block_size
        _check(
            isinstance(s, int) and not isinstance(s, bool) and 2 <= s <= 64,
            "draft.block_size",
            f"must be an integer in [2, 64] (the anchor and at least one masked position), got {s!r}",
        )
        ids = self.target_layer_ids
        _check(
            isinstance(ids, tuple) and all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in ids),
            "draft.target_layer_ids",
            f"must be a list of layer indices >= 0 ([] = the published rule), got {ids!r}",
        )
        _check(len(set(ids)) == len(ids), "draft.target_layer_ids", f"must not repeat a layer, got {list(ids)}")
        m = self.mask_token_id
        _check(
            isinstance(m, int) and not isinstance(m, bool) and m >= -1,
            "draft.mask_token_id",
            f"must be a token id >= 0, or -1 (the target's last id), got {m!r}",
        )
        _check(0 < self.init_std < 1, "draft.init_std", f"must be in (0, 1), got {self.init_std}")


@dataclasses.dataclass(frozen=True)
class DFlashLossConfig:
    """The block-diffusion objective: `num_anchors` blocks per sequence, each anchored at a random position whose
    next token is a training target; block position k (1 .. s - 1) weighs exp(-(k - 1) / decay_gamma)."""

    num_anchors: int = 64  # blocks per sequence (fewer where fewer positions qualify)
    # The position decay: 0 weighs every block position alike. The paper uses 7 for blocks of 16, 5 for 10 and 4
    # for 8: an error early in a block loses every later token of it, so early positions matter more.
    decay_gamma: float = 7.0
    chunk_blocks: int = 16  # blocks per draft and LM-head chunk: [B, chunk, s - 1, V] is the largest logits block

    def __post_init__(self):
        _positive_int(self.num_anchors, "loss.num_anchors")
        g = self.decay_gamma
        _check(
            isinstance(g, float | int) and not isinstance(g, bool) and g >= 0,
            "loss.decay_gamma",
            f"must be >= 0 (0 = no decay), got {g!r}",
        )
        _positive_int(self.chunk_blocks, "loss.chunk_blocks")


@dataclasses.dataclass(frozen=True)
class DFlashTrainConfig(RunConfig):
    """One DFlash draft-training run: `python train.py --config configs/train/dflash-smollm2.yaml`. The target's
    features are computed in the step (its streams at the draft's target layers); data are packed corpora or
    self-distilled rows (`data.distilled`), read by the scaffold's pipeline. `checkpoint.init_from` continues a
    run's checkpoint or an exported (or published) DFlash draft directory."""

    name: str = "dflash"
    kind: str = KIND
    target: TargetConfig = TargetConfig()
    draft: DFlashDraftSection = DFlashDraftSection()
    data: DataConfig = DataConfig()
    loss: DFlashLossConfig = DFlashLossConfig()

    def __post_init__(self):
        _check(self.kind == KIND, "kind", f"must be {KIND!r}, got {self.kind!r}")
        super().__post_init__()
        T, s = self.data.seq_len, self.draft.block_size
        _check(s < T, "data.seq_len", f"must be > draft.block_size ({s}): a block needs context, got {T}")

    @property
    def positions(self) -> PositionConfig:
        """Plain positions (no anchor offsets): what the shared batch pipeline reads of every kind."""
        return PositionConfig()
