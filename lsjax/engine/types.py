"""The drafter contract: every proposer plugs into the same verify engine.

A drafter is a frozen, hashable dataclass (static under `jax.jit`) whose methods are pure functions of
explicit state `S` (any pytree; `()` for stateless drafters):

    init(ctx, state) -> S                           after the prompt is prefilled and the first token emitted
    propose(ctx, state, draft_state: S, key) -> Tree
    verify_extras(ctx, tree, hidden, logits[, taps]) -> E   optional: extra per-node outputs of the verify forward
    update(ctx, state, draft_state: S, verdict: Verdict[E]) -> S
    step_variants() -> tuple[Drafter, ...]          optional: whole-step alternatives chosen per step
    choose(ctx, state) -> int32 []                  (with step_variants) which variant runs this step
    root_logp_wanted(ctx, state) -> bool []         (with step_variants) whether this step reports
                                                    SwitchExtras.root_logp (T > 0; default: never)

* `propose` builds a tree rooted at `state.root` (the last emitted token, not yet in the cache). `key` is the
  drafting key: independent of the verification key by construction, so a tree sampled with it keeps
  verification exactly lossless. Deterministic drafters ignore it.
* `verify_extras` runs inside the verification forward on its final hidden states `[B, T, D]` and logits
  `[B, T, V]` at every node (heads on verified hidden states need no forward of their own); what it returns
  reaches `update` as `verdict.extras`.
* A drafter that sets `aux_hidden_layers` gets, as `taps`, the residual streams entering those target layers at
  every node, concatenated [B, T, len * D] (EAGLE-3's features); the other drafters' forward is untouched.
* A drafter that sets `extra_hidden_layer = l` (static) also gets `taps` (`lsjax.engine.verify.ForwardTaps`): the
  residual stream entering layer l, the nodes' positions, the committed cache and the nodes' K/V at every
  layer (what heads attending inside the target need, e.g. Speculative Streaming's streams). Such a drafter
  may also `prune` the tree between layers l - 1 and l (early exit): the verified tree is then the pruned
  one, and `tree` describes its shape. Drafters that leave it None run the plain forward, unchanged.
* `update` sees the decode state after the commit (its cache already holds the accepted tokens) and the
  `Verdict`: which nodes were accepted, how many tokens each row committed, the bonus token.

* `step_variants` lets one drafter pick among trees of different static shapes at every step (the adaptive
  `auto` policy): the engine runs `lax.switch(choose(ctx, state), ...)` over the variants' drafting and
  verification only, so a small tree costs a small verification (no padding to the largest); variants with
  the same node count share one compiled forward. The variants' `propose` read the drafter's state; their
  `init`/`update` are never called. The commit and the drafter's own `update` run once after the switch, with
  `lsjax.engine.step.chain_verdict`: the accepted path as a chain (`verdict.tree` holds the path's tokens,
  `verdict.path` = 0, 1, ..., padded to the deepest variant) and `verdict.extras` = `SwitchExtras` (the
  variant's index; at T > 0 the target's log-probability of the first emitted token at the root).
  Variants cannot ask for `verify_extras`. Empty (the default): a fixed-shape step.

`ctx` is a `DraftContext` bundling params, configs and static sizes, so signatures stay short and every
drafter sees the same things.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Protocol, runtime_checkable

import jax
import jax.numpy as jnp

from lsjax import mesh as mesh_lib
from lsjax.attention import BACKENDS
from lsjax.cache import KVCache
from lsjax.config import ConfigError, GenerateConfig, ModelConfig, SamplingConfig
from lsjax.tree import Tree, TreeConfig, root_only


@dataclasses.dataclass(frozen=True)
class DraftContext:
    target_params: Any
    draft_params: Any
    config: ModelConfig
    backend: str = "auto"
    # The target cache's static slot count: drafters that keep a token history size it like the cache.
    capacity: int = 0
    # The sampling the step verifies with: stochastic drafters read `sampling.sample_drafts` and build q with it.
    sampling: SamplingConfig = SamplingConfig()
    # Set for `init` only: the prompt as prefilled (tokens [B, P], lengths [B]).
    prompt_tokens: jax.Array | None = None
    prompt_lengths: jax.Array | None = None
    # Set for `init` only, when the prefill ran the drafter's `prefill_hook`: what its steps left.
    prefilled: Any = None


@dataclasses.dataclass(frozen=True)
class PrefillHook:
    """What a drafter asks of the prefill (`Drafter.prefill_hook`): the residual streams entering target layers
    `layers` at every prompt position, handed chunk by chunk to `step(carry, streams, start, tokens, lengths) ->
    carry` (streams [B, C, len * D] in the model's dtype for positions [start, start + C); tokens [B, P] and
    lengths [B] the whole prompt), from `init(batch) -> carry`. `init` then finds the last carry in
    `ctx.prefilled`. Prefill's own outputs are unchanged."""

    layers: tuple[int, ...]
    init: Any
    step: Any


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class SwitchExtras:
    """`verdict.extras` of a step chosen among `step_variants` (`lsjax.engine.step.switched_step`)."""

    index: jax.Array  # [] int32 the variant that ran
    # [B] the target's processed log-probability, at the root, of the first token the step emitted (0 at
    # T = 0). That token is a draw from exactly that distribution whatever the variant (verification is
    # lossless), so a drafter can score what it *would* have proposed there without bias (`auto`'s shadows).
    root_logp: jax.Array
    # [B, A, len * D] the target's streams entering the switching drafter's `aux_hidden_layers` at the accepted
    # path's nodes, root first (the chain verdict's order); None when it sets none.
    aux: jax.Array | None = None


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Verdict:
    """What verification decided for one step (every field per row)."""

    tree: Tree  # the verified tree
    path: jax.Array  # [B, max_depth + 1] node indices of the accepted path; path[:, 0] = 0 (the root)
    num_accepted: jax.Array  # [B] tree nodes accepted beyond the root (0 for finished rows)
    bonus: jax.Array  # [B] the token after the path: the next root
    count: jax.Array  # [B] tokens committed to the cache: num_accepted + 1, or 0 for a row already finished
    extras: Any = ()  # the drafter's `verify_extras` at every node

    @property
    def path_tokens(self) -> jax.Array:
        """[B, max_depth + 1] tokens along the path (root first; entries past num_accepted are junk)."""
        return jnp.take_along_axis(self.tree.tokens, self.path, axis=1)

    def emitted(self) -> jax.Array:
        """[B, max_depth + 1]: the accepted tokens after the root, then the bonus (the first count valid)."""
        B = self.path.shape[0]
        toks = jnp.concatenate([self.path_tokens[:, 1:], jnp.zeros((B, 1), jnp.int32)], axis=1)
        return toks.at[jnp.arange(B), self.num_accepted].set(self.bonus)


class Drafter:
    """Base class. Subclasses are frozen dataclasses and set `tree` (the static tree shape)."""

    name = "base"
    tree: TreeConfig  # the shape of the tree verification walks
    extra_hidden_layer: int | None = None
    # Target layers whose input residual streams the drafter reads at every verified node (EAGLE-3's three):
    # `verify_extras` then gets them as `taps` [B, T, len * D], concatenated in this order. () for the rest,
    # whose verify forward is the plain one. A drafter with `step_variants` that sets them gets the streams along
    # the accepted path in `SwitchExtras.aux`, whichever variant ran.
    aux_hidden_layers: tuple[int, ...] = ()
    stretch_limit = 0  # the longest `ar_stretch` (static: its catch-up chain has this many tokens + 1)
    no_mesh = ""  # why this drafter cannot decode on a mesh (`SpecConfig.mesh` refuses it); "": it can

    @property
    def max_depth(self) -> int:
        return self.tree.depth

    @property
    def num_nodes(self) -> int:
        return self.tree.num_nodes

    def levels(self) -> tuple[int, ...] | None:
        """Where each depth's nodes start in the trees this drafter proposes (`TreeConfig.level_offsets`): the
        walk then visits only a level's nodes. None: depths vary per tree (a dynamic tree, EAGLE's), so the
        walk checks every node's depth."""
        return self.tree.level_offsets() if self.max_depth > 0 else None

    def check_params(self, draft_params, config: ModelConfig) -> str | None:
        """Why `draft_params` cannot run this drafter on `config`'s target (one line), or None. `lsjax.generate`
        calls it at trace time (shapes only), so a wrong or missing draft is named before anything runs; the
        default (a drafter without weights) accepts anything."""
        return None

    def init(self, ctx: DraftContext, state) -> Any:
        return ()

    def prefill_hook(self, ctx: DraftContext) -> PrefillHook | None:
        """What this drafter reads while the prompt is prefilled (target streams it would otherwise compute again
        in `init`), or None (the default: the plain prefill). `init` must still work without it
        (`ctx.prefilled` None: a caller that prefilled on its own, `lsjax.engine.begin`)."""
        return None

    def propose(self, ctx: DraftContext, state, draft_state, key: jax.Array) -> Tree:
        raise NotImplementedError

    def verify_extras(self, ctx: DraftContext, tree: Tree, hidden: jax.Array, logits: jax.Array, taps=None) -> Any:
        return ()

    def prune(self, ctx: DraftContext, tree: Tree, mid_hidden: jax.Array) -> tuple[Tree, jax.Array] | None:
        """With `extra_hidden_layer` set: (the tree to verify, idx [B, T'] of its nodes in `tree`), chosen from
        the residual stream entering that layer; None keeps the proposed tree."""
        return None

    def update(self, ctx: DraftContext, state, draft_state, verdict: Verdict) -> Any:
        return draft_state

    def step_variants(self) -> tuple[Drafter, ...]:
        return ()

    def choose(self, ctx: DraftContext, state) -> jax.Array:
        raise NotImplementedError

    def root_logp_wanted(self, ctx: DraftContext, state) -> jax.Array | bool:
        return False

    def choice_rates(self, ctx: DraftContext, state) -> jax.Array | None:
        """[V] float32: each variant's expected tokens per unit of time as `choose` weighs them (-inf where none
        can run; any unit, only ratios are read), for the host to price loading a variant's program against
        what running it would save (`lsjax.runtime.split.SplitDecode`). None (the default): unknown, and the
        host loads whatever `choose` wants."""
        return None

    def ready_params(self, draft_params, ready) -> Any:
        """Draft params under which `choose` picks only the variants `ready` ([V] bool; the first is) marks:
        the host decodes with a switched drafter while the programs of its other variants still load
        (`lsjax.runtime.split.SplitDecode`). None (the default): it cannot, and the host waits for them all."""
        return None

    def ar_stretch(self, ctx: DraftContext, state) -> jax.Array | None:
        """A switched drafter whose policy has settled on AR: how many plain AR steps [] int32 the engine runs
        back to back before this step, in an inner loop with no choosing, no drafting and no bookkeeping (then
        `catch_up` brings the draft state up to date once). None (the default): never."""
        return None

    def stretch_plan(self, ctx: DraftContext, start) -> Any:
        """Computed once before a stretch begun at `start`, for `stretch_stop` (the loop's condition runs
        before every AR step: what does not change inside the stretch belongs here). None by default."""
        return None

    def stretch_stop(self, ctx: DraftContext, start, plan, state) -> jax.Array | bool:
        """Before each AR step of a stretch begun at `start` (`state`: the loop's state, its draft state still
        `start`'s; `plan`: `stretch_plan`'s): whether the stretch ends here, because something the policy would
        act on turned up. False (the default): it runs its length."""
        return False

    def catch_up(self, ctx: DraftContext, state, draft_state, verdict: Verdict, ran: jax.Array) -> Any:
        """The draft state after `ran` [] plain AR steps committed `verdict` (a chain: the stretch's committed
        tokens as one path, `Verdict.emitted()` the tokens they emitted)."""
        return self.update(ctx, state, draft_state, verdict)


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

    def propose(self, ctx: DraftContext, state, draft_state, key) -> Tree:
        return root_only(state.root)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class DecodeState:
    cache: KVCache
    root: jax.Array  # [B] last emitted token, not yet in the cache
    out: jax.Array  # [B, M] emitted tokens
    num_out: jax.Array  # [B] int32
    done: jax.Array  # [B] bool
    key: jax.Array
    steps: jax.Array  # [] int32 decode steps run (target forwards after prefill)
    accepted: jax.Array  # [] int32 tokens emitted by decode steps (for tau)
    # [] int32 row-steps of rows still generating: tau = accepted / active_steps (a finished row in a batch
    # rides along in the remaining forwards but neither commits nor counts).
    active_steps: jax.Array
    draft: Any = ()  # the drafter's state (a pytree; () for AR)
    # [B] int32: the new tokens each row may emit, at most `out`'s width (`GenerateConfig.max_new_tokens`, static):
    # a run-time bound, so one program serves every length up to the width (`init_state` sets it).
    limit: Any = None

    @property
    def mean_accepted(self) -> jax.Array:
        """tau: tokens emitted per active row-step of decoding."""
        return self.accepted / jnp.maximum(self.active_steps, 1)


PREFILL_CHUNK = 256  # prompt tokens per prefill step; a prompt buffer is a multiple of it


@dataclasses.dataclass(frozen=True)
class SpecConfig:
    """Everything static about a generation call (hashable: a `jax.jit` static argument), taken by every entry
    point of the engine (`lsjax.engine.loop.start/begin/run/decode`) and by `lsjax.generate`."""

    model: ModelConfig
    gen: GenerateConfig = GenerateConfig()
    drafter: Drafter = ARDrafter()
    # Cache slots; default: prompt buffer + max_new_tokens + one step of slack. Too small raises CapacityError.
    capacity: int | None = None
    chunk: int = PREFILL_CHUNK  # prefill chunk; the prompt buffer length must be a multiple of it
    backend: str = "auto"
    # A ("data", "model") jax Mesh (`lsjax.mesh.make`) to decode on, with the target params placed by
    # `lsjax.mesh.place`; None: one device.
    mesh: Any = None
    # The weights' and K/V cache's dtype is `model.dtype` (fp32 on a CPU, bf16 on TPU/GPU:
    # `lsjax.config.default_dtype`); `generate` checks the target params carry it.

    def __post_init__(self):
        # A wrong type here would otherwise fail far away, inside tracing (`drafter="pld"` has no `.tree`).
        for name, cls in (("model", ModelConfig), ("gen", GenerateConfig), ("drafter", Drafter)):
            value = getattr(self, name)
            if not isinstance(value, cls):
                hint = " (e.g. lsjax.PLDDrafter())" if name == "drafter" else ""
                raise ConfigError(f"SpecConfig.{name}: expected a {cls.__name__}{hint}, got {value!r}")
        if self.capacity is not None and not (isinstance(self.capacity, int) and self.capacity > 0):
            raise ConfigError(f"SpecConfig.capacity: must be None or an integer >= 1, got {self.capacity!r}")
        if not (isinstance(self.chunk, int) and self.chunk > 0):
            raise ConfigError(f"SpecConfig.chunk: must be an integer >= 1, got {self.chunk!r}")
        if self.backend not in BACKENDS:
            raise ConfigError(f"SpecConfig.backend: must be one of {'|'.join(BACKENDS)}, got {self.backend!r}")
        if self.mesh is not None:
            if not isinstance(self.mesh, jax.sharding.Mesh):
                raise ConfigError(f"SpecConfig.mesh: expected a jax Mesh (lsjax.mesh.make), got {self.mesh!r}")
            mesh_lib.check(self.model, self.mesh)
            if self.drafter.no_mesh:
                raise ConfigError(
                    f"SpecConfig.mesh: {self.drafter.name} cannot decode on a mesh ({self.drafter.no_mesh}); "
                    "decode it on one device (mesh=None)"
                )
        rows = self.model.invariant_rows
        if rows and rows < self.drafter.num_nodes:
            raise ConfigError(
                f"SpecConfig.model.invariant_rows: {rows} rows do not fit {self.drafter.name}'s largest tree of "
                f"{self.drafter.num_nodes} nodes; give >= {self.drafter.num_nodes} (invariant_rows_for(drafter))"
            )
        if self.gen.max_new_tokens >= self.model.max_position:
            raise ConfigError(
                f"SpecConfig.gen.max_new_tokens: {self.gen.max_new_tokens} does not fit the model's context window "
                f"of {self.model.max_position} tokens"
            )


# A pytree with no leaves (the config is its tree structure), so plain `jax.jit(lsjax.generate)` treats it as
# static without `static_argnames`; equal configs share one compiled program either way.
jax.tree_util.register_static(SpecConfig)


def step_keys(key: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    """(next state key, drafting key, verification key) for one step."""
    k = jax.random.split(key, 3)
    return k[0], k[1], k[2]


# ------------------------------------------------------------------------------------------- host protocols
# What a drafter may offer the host driver (`lsjax.engine.host`), which knows no method by name.


@dataclasses.dataclass(frozen=True)
class HostRun:
    """One prompt bucket's compiled run, as `HostTuned.host_params` sees it before the timed decode:
    `decode(params, draft_params, state, step_limit)` is the compiled loop (or a `SplitDecode`, whose groups
    may still be loading: it waits for one it is forced to) and `state` the prefilled state."""

    model_name: str
    backend: str
    params: Any
    draft_params: Any
    gen: Any  # GenerateConfig
    bucket: int
    state: DecodeState
    decode: Any
    model_sig: str = ""  # the model configuration's signature (shapes, dtype): what a step's cost depends on
    mesh: str = ""  # the mesh's shape ("model=2,data=1") when the run is split over devices, else ""
    # Whether the params may come from what was measured before without checking it again (`auto`: its cost
    # profile's entry for this bucket, unchecked, else a neighbouring bucket's): a start that loaded its decode
    # program, where measuring would be most of its wait. A start that compiles anyway, a warm-up (`decode.py
    # --precompile`) and the API check or measure their own.
    borrow: bool = False
    # False: the decode programs are still being compiled (a split decode started with AR's group), so nothing
    # may run to find the params: what is known already (`auto`: the entry, a neighbour's, the prior), not kept;
    # `Generator.finish` finds them properly after the output.
    settled: bool = True


@runtime_checkable
class HostTuned(Protocol):
    """A drafter whose params depend on the device and the prompt bucket, found on the host before the timed
    decode, once per (bucket, sampling) (`auto`: its candidates' per-device step costs, an array, so a new
    profile never recompiles)."""

    def host_params(self, run: HostRun) -> Any: ...


@runtime_checkable
class Summarized(Protocol):
    """A drafter that reports diagnostics from its final state (`auto`: the steps each candidate ran)."""

    def summary(self, draft_state) -> dict: ...


@runtime_checkable
class SwitchProfiled(Protocol):
    """A drafter whose steps are variants chosen on device, so one step has no single draft/verify/commit
    split: it reports its own (`lsjax.engine.profiling.time_split`)."""

    def switch_split(self, generator, prompt_ids: list[int], gen, seed: int) -> dict: ...


def invariant_rows_for(drafter: Drafter | None) -> int:
    """The fewest rows batch-invariant numerics can run `drafter` on (`ModelConfig.invariant_rows`): a power
    of 2 >= its largest tree, and >= 16.

    Every forward, AR's included, runs as that many rows, and each query gathers that many recent keys: fewer
    rows are less work per step (16 for prompt lookup and `auto`'s candidates, against 128 for the paper tree).
    The bits depend on the row count, so runs compared for equality (a method and its AR) share one count.
    16: the kernels' tiles are at least 16 rows."""
    nodes = 1 if drafter is None else drafter.num_nodes
    return max(16, 1 << (nodes - 1).bit_length())


@dataclasses.dataclass
class GenerationResult:
    tokens: list[int]
    prompt_tokens: int
    compile_s: float
    prefill_s: float
    decode_s: float
    target_forwards: int  # prefill counts as one
    stop_reason: str  # "eos" | "max_new_tokens"
    method: str = "ar"
    # Drafter diagnostics (auto: steps run by each candidate), from `drafter.summary(draft_state)` if it has one.
    drafter_stats: dict | None = None
    # The prefill ran while the decode program compiled (`Generator.compile(background=True)`): prefill_s then
    # includes sharing the host with XLA.
    prefill_alongside_compile: bool = False
    # Steps a split decode ran with the drafter restricted to the groups loaded so far while it wanted another
    # (AR, or a smaller tree, bridging); they are part of decode_s and target_forwards.
    bridged_steps: int = 0
    # Times a split decode did not load a group its drafter wanted: it would have been in only after the last
    # token.
    declined_loads: int = 0
    # `time.perf_counter()` when the speculative program could first run as it would with everything loaded
    # (after its host tuning; for a split decode, after the last step the drafter ran restricted): "seconds
    # until the speculative program is in use" (`decode.py --json`).
    decode_program_at: float = 0.0
    first_token_at: float = 0.0  # `time.perf_counter()` when the first new token was ready (after the prefill)
    # The run decoded with AR's own programs while the method's were not compiled (`Generator.stands_in`): its
    # steps all count as bridged, and `decode_program_at` stays 0.
    ar_stand_in: bool = False

    @property
    def new_tokens(self) -> int:
        return len(self.tokens)

    @property
    def tokens_per_s(self) -> float:
        """Decode throughput: tokens after the first (which prefill produces) per decode second."""
        return (self.new_tokens - 1) / self.decode_s if self.decode_s > 0 and self.new_tokens > 1 else 0.0

    @property
    def mean_accepted(self) -> float:
        """tau: tokens emitted per target forward during decoding (1.0 for AR)."""
        steps = self.target_forwards - 1
        return (self.new_tokens - 1) / steps if steps > 0 else 0.0
