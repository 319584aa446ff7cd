"""A switched drafter's decode loop split into one program per node-count group (`SplitDecode`) runs the very
steps the single program runs: the same choices, the same state, in one call or streamed; restricted to the
groups loaded so far it stays lossless; a group still loading is waited for where it must run."""

from __future__ import annotations

import concurrent.futures
import dataclasses
import functools
import os
import subprocess
import sys
import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lsjax import engine
from lsjax.config import GenerateConfig, SamplingConfig
from lsjax.engine import loop
from lsjax.engine.host import group_name
from lsjax.engine.step import PLAN, variant_groups
from lsjax.engine.types import ARDrafter, SpecConfig
from lsjax.methods.auto.drafter import auto_params
from lsjax.runtime import split as split_mod
from tests.test_auto import SMALL, repetitive_prompts
from tests.test_speculative import longspec_params, run
from tests.tiny import tiny_model


def SplitDecode(drafter, programs, partial, **kw):
    """A split decode of `drafter`'s node-count groups, as the engine's host makes one."""
    return split_mod.SplitDecode(drafter, variant_groups(drafter), programs, partial, plan=PLAN, **kw)


GREEDY = GenerateConfig(max_new_tokens=48, sampling=SamplingConfig(temperature=0.0), ignore_eos=True)
SAMPLED = GenerateConfig(max_new_tokens=48, sampling=SamplingConfig(temperature=1.0), ignore_eos=True)
CHEAP = [1.0, 1.05, 1.1, 1.15, 1.1]  # speculation priced to pay: the policy moves between candidates
PRICED_OUT = [1.0, 50.0, 50.0, 50.0, 50.0]  # AR only, in stretches


@functools.cache
def _setup(gen: GenerateConfig, drafter=SMALL):
    config, params = tiny_model()
    prompts = repetitive_prompts()
    tokens = jnp.asarray(np.stack([np.pad(p, (0, 64 - len(p))) for p in prompts]).astype(np.int32))
    lengths = jnp.asarray([len(p) for p in prompts], jnp.int32)
    spec = SpecConfig(config, gen, drafter, capacity=engine.required_capacity(64, gen, drafter), chunk=64)
    ls = longspec_params(params, config, drafter.longspec)
    start = jax.jit(functools.partial(engine.start, config=spec))

    def state():
        return start(params, auto_params(drafter, ls), tokens=tokens, lengths=lengths, key=jax.random.key(1))

    def programs():
        return [
            functools.partial(loop.group_decode_jit, spec=spec, group=g) for g in range(len(variant_groups(drafter)))
        ]

    return config, params, ls, spec, state, programs


def _same(a, b):
    for name in ("out", "num_out", "steps", "accepted", "done"):
        np.testing.assert_array_equal(np.asarray(getattr(a, name)), np.asarray(getattr(b, name)), err_msg=name)
    np.testing.assert_array_equal(np.asarray(a.draft.policy.uses), np.asarray(b.draft.policy.uses))


def _positional(program):
    return lambda p, dp, s, n, f, lim: program(p, dp, state=s, nxt=n, fresh=f, step_limit=lim)


@pytest.mark.parametrize(
    ("gen", "costs"),
    [
        pytest.param(GREEDY, CHEAP, marks=pytest.mark.slow),
        (GREEDY, PRICED_OUT),
        pytest.param(SAMPLED, CHEAP, marks=pytest.mark.slow),
    ],  # ~1 min each
    ids=["switching", "stretches", "T=1"],
)
def test_split_programs_run_the_steps_of_the_single_program(gen, costs):
    config, params, ls, spec, state, programs = _setup(gen)
    dp = auto_params(SMALL, ls, costs)
    single = loop.decode_jit(params, dp, spec, state(), jnp.int32(1000))
    split = SplitDecode(SMALL, [_positional(p) for p in programs()], partial=False)
    _same(split(params, dp, state(), 1000), single)
    uses = np.asarray(single.draft.policy.uses)
    if costs is CHEAP:
        assert (uses[1:] > 0).sum() >= 2, uses  # more than one program ran
    else:
        assert SMALL.summary(single.draft)["ar_stretch_steps"] > 20
    # Streamed in chunks (a stretch's step runs past its chunk's limit, as inside one switched step).
    s = state()
    streamed = loop.decode_jit(params, dp, spec, state(), jnp.int32(0))
    for limit in range(5, 1000, 5):
        s = split(params, dp, s, limit)
        streamed = loop.decode_jit(params, dp, spec, streamed, jnp.int32(limit))
        _same(s, streamed)
        if bool(jnp.all(s.done)):
            break
    _same(s, single)


def test_groups_still_loading_are_not_chosen_and_output_equals_ar():
    """Only the first group loaded: auto runs AR (and its stretches), and its tokens are AR's; once the rest
    loads, the next call uses them. A forced candidate whose group is still loading is waited for."""
    config, params, ls, spec, state, programs = _setup(GREEDY)
    dp = auto_params(SMALL, ls, CHEAP)
    progs = [_positional(p) for p in programs()]
    pending = [concurrent.futures.Future() for _ in progs[1:]]
    split = SplitDecode(SMALL, [progs[0], *pending], partial=True)
    assert not split.complete and split.ready().tolist() == [True] + [False] * (len(SMALL.candidates) - 1)
    out = split(params, dp, state(), 1000)
    ref = run(params, config, repetitive_prompts(), GREEDY, ARDrafter())
    np.testing.assert_array_equal(np.asarray(out.out), np.asarray(ref.out))
    uses = np.asarray(out.draft.policy.uses)
    assert uses[0] == int(out.steps) and uses[1:].sum() == 0, uses
    assert 0 < split.restricted_steps <= int(out.steps)  # it asked for another group (cheap costs)
    restricted = split.restricted_steps
    for f, p in zip(pending, progs[1:]):
        f.set_result(p)
    assert split.complete
    again = split(params, dp, state(), 1000)
    np.testing.assert_array_equal(np.asarray(again.out), np.asarray(ref.out))
    assert np.asarray(again.draft.policy.uses)[1:].sum() > 0 and split.restricted_steps == restricted


@pytest.mark.slow  # waiting for a group: the lazy split tests below
def test_a_forced_group_still_loading_is_waited_for():
    config, params, ls, spec, state, programs = _setup(GREEDY)
    dp = auto_params(SMALL, ls, CHEAP)
    progs = [_positional(p) for p in programs()]
    later = concurrent.futures.Future()
    split = SplitDecode(SMALL, [progs[0], later, *progs[2:]], partial=True)
    forced = len(SMALL.candidates) - 1  # the hybrid: not in the first group
    assert split.group_of[forced] != 0
    s = state()
    policy = dataclasses.replace(s.draft.policy, force=jnp.int32(forced))
    s = dataclasses.replace(s, draft=dataclasses.replace(s.draft, policy=policy))
    threading.Timer(0.3, lambda: later.set_result(progs[1])).start()
    out = split(params, dp, s, 6)
    assert int(np.asarray(out.draft.policy.uses)[forced]) == int(out.steps) == 6
    if split.group_of[forced] == 1:
        assert split.waited > 0.1


def test_the_first_groups_program_holds_one_target_forward(monkeypatch):
    """A stretch's AR steps and AR's own switched step run in one loop over one target forward: the first
    group's program is what a start loads beside its prefill, and two forwards made it ~1.5x the size."""
    from lsjax.engine import step, verify

    config, params, ls, spec, state, _ = _setup(GREEDY)
    calls = []
    real = verify.tree_forward
    monkeypatch.setattr(verify, "tree_forward", lambda *a, **k: calls.append(1) or real(*a, **k))
    ctx = step.context(params, auto_params(SMALL, ls, PRICED_OUT), config, GREEDY, spec.capacity)
    assert SMALL.ar_stretch(ctx, state()) is not None  # the drafter stretches
    jax.eval_shape(lambda s: step.group_loop(ctx, SMALL, GREEDY, s, step.PLAN, True, 0, 0), state())
    assert len(calls) == 1


def test_group_names_say_the_node_count():
    names = [group_name(SMALL, g) for g in range(len(variant_groups(SMALL)))]
    assert names[0] == "decode-1n" and len(set(names)) == len(names), names


def test_ready_params_refuse_a_mask_without_ar():
    with pytest.raises(ValueError, match="AR's entry"):
        SMALL.ready_params(auto_params(SMALL), np.zeros(len(SMALL.candidates), bool))
    assert ARDrafter().ready_params((), np.ones(1, bool)) is None  # a drafter without a choice cannot restrict


@pytest.mark.slow  # ~1 min
def test_a_drafter_without_stretches_splits_too():
    """AR's group without the stretch branch (`AutoPolicy(stretch=0)`: `next_unit` never says STRETCH)."""
    from lsjax.methods.auto.drafter import AutoPolicy

    drafter = dataclasses.replace(SMALL, policy=AutoPolicy(stretch=0))
    config, params, ls, spec, state, programs = _setup(GREEDY, drafter)
    dp = auto_params(drafter, ls, CHEAP)
    single = loop.decode_jit(params, dp, spec, state(), jnp.int32(1000))
    split = SplitDecode(drafter, [_positional(p) for p in programs()], partial=False)
    _same(split(params, dp, state(), 1000), single)


def test_a_group_never_made_is_never_chosen():
    """`Generator.close` stops the loading: the groups it left out are failed futures, never chosen."""
    config, params, ls, spec, state, programs = _setup(GREEDY)
    progs = [_positional(p) for p in programs()]
    dropped = [concurrent.futures.Future() for _ in progs[1:]]
    for f in dropped:
        f.set_exception(RuntimeError("not loaded"))
    split = SplitDecode(SMALL, [progs[0], *dropped], partial=True)
    assert split.complete and split.ready().tolist() == [True] + [False] * (len(SMALL.candidates) - 1)
    out = split(params, auto_params(SMALL, ls, CHEAP), state(), 1000)
    ref = run(params, config, repetitive_prompts(), GREEDY, ARDrafter())
    np.testing.assert_array_equal(np.asarray(out.out), np.asarray(ref.out))


def _lazy(gen, costs, partial, first_only=False):
    """A split decode that makes each group's program only when asked for (`eager=False`), recording which."""
    config, params, ls, spec, state, programs = _setup(gen)
    made = []
    progs = [_positional(p) for p in programs()]

    def make(g):
        made.append(g)
        return progs[g]

    futures = [concurrent.futures.Future() for _ in progs]
    split = SplitDecode(SMALL, futures, partial=partial, make=make, eager=False, first_only=first_only)
    return split, made, params, auto_params(SMALL, ls, costs), spec, state


def _groups_run(state) -> set[int]:
    uses = np.asarray(state.draft.policy.uses)
    groups = variant_groups(SMALL)
    return {g for g, members in enumerate(groups) if uses[members].sum() > 0} | {0}


@pytest.mark.parametrize("gen", [GREEDY, pytest.param(SAMPLED, marks=pytest.mark.slow)], ids=["T=0", "T=1"])
def test_groups_are_made_when_the_drafter_asks_for_them(gen):
    """Not eager: a group is made only once the drafter runs it or would choose it; waiting for each group it
    runs (not `partial`) leaves the steps, and so the sample at T = 1, those of the single program."""
    split, made, params, dp, spec, state = _lazy(gen, CHEAP, partial=False)
    out = split(params, dp, state(), 1000)
    _same(out, loop.decode_jit(params, dp, spec, state(), jnp.int32(1000)))
    ran = _groups_run(out)
    assert len(ran) >= 2 and set(made) >= ran and made[0] == 0, (made, ran)
    assert len(made) == len(set(made))  # each made once
    assert not split.busy or split._worker is not None


def test_a_drafter_that_keeps_to_ar_loads_nothing_else():
    split, made, params, dp, spec, state = _lazy(GREEDY, PRICED_OUT, partial=True)
    out = split(params, dp, state(), 1000)
    assert np.asarray(out.draft.policy.uses)[1:].sum() == 0 and int(out.steps) > 20
    assert made == [0] and split.restricted_steps == 0 and not split.complete


def test_a_partial_split_loads_what_the_drafter_wants_while_ar_bridges():
    """Greedy (`partial`): the first calls run AR while the group the drafter wants loads beside them; the
    tokens are AR's, and the wanted group runs once made."""
    split, made, params, dp, spec, state = _lazy(GREEDY, CHEAP, partial=True)
    out = split(params, dp, state(), 1000)
    config, _ = tiny_model()
    ref = run(params, config, repetitive_prompts(), GREEDY, ARDrafter())
    np.testing.assert_array_equal(np.asarray(out.out), np.asarray(ref.out))
    assert len(made) >= 2 and split.restricted_steps > 0
    assert _groups_run(out) <= set(made)
    split.close()
    assert split.complete and not split.busy  # the rest given up: never chosen, never waited for
    again = split(params, dp, state(), 1000)
    np.testing.assert_array_equal(np.asarray(again.out), np.asarray(ref.out))


def test_no_split_loads_a_group_that_would_come_after_the_last_token():
    """A group whose load (by its size at the seconds per byte this process's reads took)
    would end after the run's last token at its pace so far is not asked for; the run keeps to AR's group, with
    AR's tokens."""
    config, _ = tiny_model()
    split, made, params, dp, spec, state = _lazy(GREEDY, CHEAP, partial=True)
    ref = run(params, config, repetitive_prompts(), GREEDY, ARDrafter())
    split.sizes = [1_000_000] * len(split.programs)
    split.load_rate = lambda: 1e-3  # 1000 s a program
    out = split(params, dp, state(), 1000)
    np.testing.assert_array_equal(np.asarray(out.out), np.asarray(ref.out))
    assert made == [0] and split.declined > 0 and split.restricted_steps == 0
    assert np.asarray(out.draft.policy.uses)[1:].sum() == 0


def test_a_split_kept_to_its_first_group_loads_no_other():
    """Compiling on a CPU (`first_only`: the rest compile after the output): where the drafter wants a tree it
    keeps to AR's group, with AR's tokens."""
    config, _ = tiny_model()
    split, made, params, dp, spec, state = _lazy(GREEDY, CHEAP, partial=True, first_only=True)
    out = split(params, dp, state(), 1000)
    ref = run(params, config, repetitive_prompts(), GREEDY, ARDrafter())
    np.testing.assert_array_equal(np.asarray(out.out), np.asarray(ref.out))
    assert made == [0] and split.declined > 0 and np.asarray(out.draft.policy.uses)[1:].sum() == 0


def test_a_load_is_estimated_by_the_size_of_its_program():
    n = len(variant_groups(SMALL))
    split = SplitDecode(SMALL, [object()] * n, partial=True, sizes=[10_000_000] + [4_000_000] * (n - 1))
    split._make_s = {0: 3.0}  # AR's group, 10 MB, in 3 s
    assert split._make_estimate(1) == pytest.approx(1.2)
    split.load_rate = lambda: 0.5e-6  # this process's reads: 0.5 s per MB (the first group's read ahead)
    assert split._make_estimate(1) == pytest.approx(2.0)
    split.from_disk = False  # compiled, not read: the reads say nothing of it
    assert split._make_estimate(1) == pytest.approx(1.2)
    split.sizes = None
    assert split._make_estimate(1) == 3.0  # unknown sizes: as long as those made so far took
    split._make_s = {}
    assert split._make_estimate(1) is None  # nothing to go by: asked for (`_pays`)


def test_one_loading_rule():
    """Beside an accelerator every group at once; compiling on a CPU the first group only; read from disk on a
    CPU, a split of two at once, a larger one as the drafter asks, at idle priority in a one-decode process."""
    loading = split_mod.loading
    assert loading(stored=False, beside_device=True, groups=6, one_decode=True) == {"eager": True}
    assert loading(stored=True, beside_device=True, groups=6, one_decode=False) == {"eager": True}
    assert loading(stored=False, beside_device=False, groups=2, one_decode=True) == {"eager": False, "first_only": True}
    assert loading(stored=True, beside_device=False, groups=2, one_decode=True) == {"eager": True}
    assert loading(stored=True, beside_device=False, groups=3, one_decode=True) == {"eager": False, "idle": True}
    assert loading(stored=True, beside_device=False, groups=3, one_decode=False) == {"eager": False, "idle": False}


def test_an_idle_split_loads_the_groups_after_the_first_at_idle_priority(monkeypatch):
    lowered = []
    monkeypatch.setattr(split_mod, "idle_priority", lambda: lowered.append(True) or True)
    monkeypatch.setattr(split_mod, "_idled", [])
    made = []  # (group, whether the priority was lowered before it was made)
    n = len(variant_groups(SMALL))
    futures = [concurrent.futures.Future() for _ in range(n)]
    split = SplitDecode(SMALL, futures, partial=True, make=lambda g: made.append((g, bool(lowered))), idle=True)
    split.wait()
    assert made[0] == (0, False) and sorted(g for g, _ in made) == list(range(n))
    assert all(low for _, low in made[1:]) and lowered == [True]  # once for the process


IDLE_CHECK = """
import os, threading, time
import jax.numpy as jnp
from lsjax.runtime.cpu import COMPUTE_THREADS, idle_priority
jnp.ones(2).block_until_ready()  # XLA's thread pools exist
base = os.getpriority(os.PRIO_PROCESS, os.getpid())
seen, go = [], threading.Event()
worker = threading.Thread(target=lambda: (seen.append(threading.get_native_id()), go.wait()))
worker.start()
while not seen:
    time.sleep(0.01)
assert idle_priority()
names = {int(t): open(f"/proc/self/task/{t}/comm").read().strip() for t in os.listdir("/proc/self/task")}
compute = [t for t, n in names.items() if n.startswith(COMPUTE_THREADS)]
assert compute and all(os.getpriority(os.PRIO_PROCESS, t) == base for t in compute), "the decode's threads"
assert os.getpriority(os.PRIO_PROCESS, os.getpid()) == base, "the main thread"
assert os.getpriority(os.PRIO_PROCESS, seen[0]) == 19, "another thread"
go.set()
"""


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="Linux threads")
def test_idle_priority_lowers_every_thread_but_the_main_one_and_xlas_compute_pool():
    # In a process of its own: the priority cannot be raised again, and this worker's other tests would load slower.
    subprocess.run([sys.executable, "-c", IDLE_CHECK], check=True, timeout=120)
