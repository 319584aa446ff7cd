"""The drafter interface: every proposer plugs into the same verify engine.

A drafter is a frozen, hashable dataclass (static under `jax.jit`) whose
methods are pure functions of explicit state:

* `init(ctx)` -> draft state, after the prompt is prefilled;
* `propose(ctx, state)` -> a `Tree` whose root is `state.root` (the last emitted
  token); it must not use the verification RNG key (losslessness at T > 0 relies
  on the tree being independent of the target's draws);
* `update(ctx, state, draft_state, tree, path, num_accepted, bonus)` -> the new
  draft state once the accepted path is committed (`state` is the updated decode
  state: its cache already holds the accepted tokens).

`ctx` is a `DraftContext` bundling the params and configs, so signatures stay
short and every drafter sees the same things.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax

from lsjax.config import ModelConfig
from lsjax.tree import Tree, TreeConfig, root_only


@dataclasses.dataclass(frozen=True)
class DraftContext:
    target_params: Any
    draft_params: Any
    config: ModelConfig
    backend: str = "auto"
    # Set by `init` only: the prompt as prefilled (tokens [B, P], lengths [B]).
    prompt_tokens: jax.Array | None = None
    prompt_lengths: jax.Array | None = None


class Drafter:
    """Base class. Subclasses are frozen dataclasses and set `tree` (the static tree shape)."""

    name = "base"
    tree: TreeConfig

    @property
    def max_depth(self) -> int:
        return self.tree.depth

    @property
    def num_nodes(self) -> int:
        return self.tree.num_nodes

    def init(self, ctx: DraftContext, state) -> Any:
        return ()

    def propose(self, ctx: DraftContext, state) -> Tree:
        raise NotImplementedError

    def update(self, ctx: DraftContext, state, draft_state, tree: Tree, path, num_accepted, bonus) -> Any:
        return draft_state


@dataclasses.dataclass(frozen=True)
class ARDrafter(Drafter):
    """Proposes nothing: the speculative step degenerates to one AR step."""

    name = "ar"

    @property
    def max_depth(self) -> int:
        return 0

    @property
    def num_nodes(self) -> int:
        return 1

    def propose(self, ctx: DraftContext, state) -> Tree:
        return root_only(state.root)
