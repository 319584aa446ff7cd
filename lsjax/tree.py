"""Speculative trees as arrays with shapes fixed at trace time.

A tree of T nodes (node 0 is the root: the last emitted token, not yet in the
target cache) is laid out level by level: level d holds `widths[d-1]` nodes at
indices `[offset_d, offset_d + widths[d-1])`. Depths are therefore static;
tokens, parents and validity are arrays, so one compiled step serves every
tree a drafter builds (beam search picks parents per step; a retrieval drafter
may fill only part of a chain).

Invariants every drafter keeps (and tests check): a node's parent is on the
level above (so parents precede children), an invalid node has no valid
children, and `mask[b, i, j]` is True exactly when j is i or an ancestor of i.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from lsjax.config import ConfigError


@dataclasses.dataclass(frozen=True)
class TreeConfig:
    """Nodes per depth. (1, 1, 1, 1) is a chain of 4; the paper's beam tree is (4, 16, 16, 16, 16)."""

    widths: tuple[int, ...] = (4, 16, 16, 16, 16)

    def __post_init__(self):
        if not isinstance(self.widths, tuple) or not self.widths:
            raise ConfigError(f"tree.widths: must be a non-empty tuple of integers >= 1, got {self.widths!r}")
        for w in self.widths:
            if not isinstance(w, int) or w < 1:
                raise ConfigError(f"tree.widths: every width must be an integer >= 1, got {self.widths!r}")

    @property
    def depth(self) -> int:
        return len(self.widths)

    @property
    def num_nodes(self) -> int:  # T, the root included
        return 1 + sum(self.widths)

    def level_offsets(self) -> tuple[int, ...]:
        """Index of the first node of each level 0..depth (level 0 is the root)."""
        return tuple(int(x) for x in np.concatenate([[0], 1 + np.cumsum((0, *self.widths[:-1]))]))

    def node_depths(self) -> np.ndarray:
        return np.concatenate([[0]] + [np.full(w, d + 1) for d, w in enumerate(self.widths)]).astype(np.int32)


# Presets: the paper's GPU tree, and smaller ones for devices where verifying many nodes is not free
# (on a CPU a 16-token target forward costs ~2x a 1-token one, docs/design/cpu-verify-cost.md: studies/tree_cost).
TREE_PRESETS = {
    "paper": TreeConfig((4, 16, 16, 16, 16)),
    "gpu": TreeConfig((4, 8, 8, 8, 8)),
    "cpu": TreeConfig((2, 2, 2, 2, 2)),
    "cpu-small": TreeConfig((2, 2, 2)),
    "chain4": TreeConfig((1, 1, 1, 1)),
    "chain8": TreeConfig((1,) * 8),
}


def for_device(spec, backend: str):
    """A checkpoint's tree entry for `backend`: the entry itself, or its value for `backend` when the entry
    maps devices to trees (each measured on its device); None when it names none for this one."""
    return spec.get(backend) if isinstance(spec, dict) else spec


def parse_tree(spec: str) -> TreeConfig:
    """A preset name, comma-separated widths ("4,8,8") or the widths already split (a bench variant's 4/8/8)."""
    if isinstance(spec, int):  # one level (a bench variant's tree=3)
        spec = (spec,)
    if isinstance(spec, (tuple, list)):
        return TreeConfig(tuple(int(w) for w in spec))
    if spec in TREE_PRESETS:
        return TREE_PRESETS[spec]
    try:
        widths = tuple(int(w) for w in spec.split(","))
    except ValueError:
        raise ConfigError(
            f"tree: {spec!r} is neither a preset ({', '.join(TREE_PRESETS)}) nor comma-separated widths"
        ) from None
    return TreeConfig(widths)


def check_fits(tree: TreeConfig, vocab: int, context: int, spec=None, vocab_name: str = "its vocabulary") -> None:
    """Raises ConfigError when `tree` cannot be drafted or verified: a level wider than the `vocab` tokens the
    draft proposes from (each level is a top-k over them), or more nodes than the `context` window. The message
    names the tree as `spec` (what the user gave: "--tree 100000"), else by its widths."""
    value = spec if isinstance(spec, str) else ",".join(str(w) for w in tree.widths)
    for d, w in enumerate(tree.widths, 1):
        if w > vocab:
            raise ConfigError(
                f"--tree {value}: {w} nodes at depth {d}, but the draft proposes from {vocab} tokens ({vocab_name})"
            )
    if tree.num_nodes > context:
        raise ConfigError(
            f"--tree {value}: {tree.num_nodes} nodes, more than the model's context window ({context} tokens)"
        )


DEVICES = ("cpu", "gpu", "tpu")


def parse_device_trees(spec: str) -> TreeConfig | dict[str, TreeConfig]:
    """A draft's stored default tree: one tree for every device ("2,1,1", a preset), or trees per device
    ("cpu=1" or "cpu=1;gpu=paper": each measured there; a device not named gets its preset)."""
    if "=" not in spec:
        return parse_tree(spec)
    trees = {}
    for part in spec.split(";"):
        device, sep, tree = part.partition("=")
        device = device.strip()
        if not sep or device not in DEVICES or device in trees:
            raise ConfigError(f"tree: {part!r} in {spec!r}: expected DEVICE=TREE, DEVICE one of {DEVICES}, each once")
        trees[device] = parse_tree(tree.strip())
    return trees


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Tree:
    tokens: jax.Array  # [B, T] int32; tokens[:, 0] is the root
    parents: jax.Array  # [B, T] int32; parents[:, 0] = -1
    depth: jax.Array  # [B, T] int32 (static per index, kept as an array for positions)
    valid: jax.Array  # [B, T] bool
    mask: jax.Array  # [B, T, T] bool: mask[b, i, j] = j is i or an ancestor of i, both valid
    # Stochastic trees only (None for deterministic drafters). A node with sampled[b, i] set was drawn from its
    # parent's draft distribution exp(logq[b, parent]) without replacement; sampled siblings appear in the order
    # they were drawn and how many children a node gets is fixed before they are drawn. Verification then uses
    # recursive rejection sampling over them (`lsjax.engine.verify`).
    logq: jax.Array | None = None  # [B, T, V] fp32: log q of the children of each node (full vocabulary)
    sampled: jax.Array | None = None  # [B, T] bool

    @property
    def stochastic(self) -> bool:
        return self.logq is not None

    @property
    def num_nodes(self) -> int:
        return self.tokens.shape[1]


def ancestor_mask(parents: jax.Array, valid: jax.Array, max_depth: int) -> jax.Array:
    """[B, T] parents -> [B, T, T] self-or-ancestor mask, by `max_depth` steps of pointer jumping."""
    B, T = parents.shape
    eye = jnp.eye(T, dtype=bool)[None]
    parent_onehot = jax.nn.one_hot(parents, T, dtype=jnp.float32)  # [B, T, T]; root (-1) maps to zeros
    mask = eye | (parent_onehot > 0)
    reach = parent_onehot
    for _ in range(max_depth - 1):
        reach = jnp.einsum("bij,bjk->bik", reach, parent_onehot)  # ancestors one level further up
        mask = mask | (reach > 0)
    return mask & valid[:, :, None] & valid[:, None, :]


def make_tree(tokens, parents, valid, config: TreeConfig, logq=None, sampled=None) -> Tree:
    B = tokens.shape[0]
    depth = jnp.broadcast_to(jnp.asarray(config.node_depths()), (B, config.num_nodes))
    return Tree(tokens, parents, depth, valid, ancestor_mask(parents, valid, config.depth), logq, sampled)


def chain_parents(num_nodes: int) -> np.ndarray:
    return np.arange(-1, num_nodes - 1, dtype=np.int32)


def root_only(root: jax.Array) -> Tree:
    """The empty tree: AR decoding is a speculative step that proposes nothing."""
    B = root.shape[0]
    return Tree(
        root[:, None].astype(jnp.int32),
        jnp.full((B, 1), -1, jnp.int32),
        jnp.zeros((B, 1), jnp.int32),
        jnp.ones((B, 1), bool),
        jnp.ones((B, 1, 1), bool),
    )
