"""The per-device cost profile `auto` chooses with: seconds per step of each candidate, cached on disk.

    costs = prior_costs(drafter)                               # built-in, relative to an AR step
    costs = profile_costs(drafter, model_name, backend, params, draft_params, gen, bucket, state, decode)

A profile is measured with the very program that decodes: the compiled `auto` loop run with one candidate
forced (`PolicyState.force`) for a few steps on a copy of the prefilled state, candidates interleaved and
repeated, median per candidate. So it costs no compile and sees the real context length, cache layout and
sampling. Files live in `$LSJAX_PROFILE_DIR` (default `$XDG_CACHE_HOME/lsjax/profiles/`, `~/.cache/...`), one
per device kind (on a CPU its model and core count: `device_name`), model configuration (shapes and dtype: a
bf16 step costs other ratios than an fp32 one), backend and candidate set, holding one entry per context bucket
and sampling mode (greedy or sampled trees verify differently).

A profile is never used silently where it may not hold: a corrupt file, one of another format, candidate set
or lsjax version, and an entry whose AR step no longer takes what it took when measured (checked at every
start from a few forced AR steps: a profile measured while the machine was busy skews every ratio) are
measured again, with one line saying why; so is a profile missing for this device that another device (another
CPU model sharing the directory) has. Never fatal.

Only ratios matter to the policy (it maximises tokens per second), so the prior is in units of one AR step:
verification ratios measured with `studies.tree_cost.tree_cost` on a 2-core CPU at 1K context (1.21x / 1.35x /
1.63x / 2.24x a 1-token forward at 2 / 4 / 8 / 16 nodes: docs/design/cpu-verify-cost.md) plus drafting.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

from lsjax.runtime import cpu

# 2: T > 0 steps got cheaper (lsjax.sampling.draw), so profiles of format 1 overstate them. 3: + the shadow draft.
# 4: verifications of 3+ nodes got cheaper on a CPU (out-major projections, `target.default_layout`).
# 5: and again (compiled without YNNPACK fusions, projections [in, out]: `lsjax.runtime.cpu.wide_program`).
# 6: ... except on a CPU with AVX-512, where those programs keep YNNPACK (`lsjax.engine.host.xla_gemm_pays`).
FORMAT = 6
STEPS = 4  # forced steps per timing
REPEATS = 5
# Verification cost vs nodes (log2 scale), in 1-token forwards; drafting in the same unit.
_NODES = (1, 2, 4, 8, 16, 32)
_VERIFY = (1.0, 1.21, 1.35, 1.63, 2.24, 3.05)
PLD_DRAFT = 0.03
LS_LEVEL = 0.08
E3_LEVEL = 0.08  # one EAGLE-3 draft layer over the frontier, like a LongSpec level (an estimate, not measured)
DF_LAYER = 0.06  # one DFlash draft layer over the block, and its context K/V after the step (an estimate)


def prior_costs(drafter) -> np.ndarray:
    """A guess at each of `drafter.cost_names` (every candidate's step, then an AR step with a shadow draft) in
    AR steps, for a device never profiled."""
    out = []
    for c in drafter.candidates:
        verify = float(np.interp(np.log2(c.drafter.num_nodes), np.log2(_NODES), _VERIFY))
        draft = {"ar": 0.0, "pld": PLD_DRAFT, "ls": 0.0, "hybrid": PLD_DRAFT, "e3": 0.0, "df": 0.0}[c.kind]
        if c.kind == "e3":  # a draft pass per level, and one over the accepted pairs after it
            draft += E3_LEVEL * (c.drafter.max_depth + 1)
        if c.kind == "df":  # one block forward, whatever the tree
            draft += DF_LAYER * c.drafter.draft.layer.num_layers
        if c.kind in ("ls", "hybrid"):
            draft += LS_LEVEL * drafter.longspec.max_depth if c.kind == "hybrid" else LS_LEVEL * c.drafter.max_depth
        out.append(verify + draft)
    if drafter.longspec is not None:  # an AR step with a shadow draft of the draft's tree
        out.append(1.0 + LS_LEVEL * drafter.longspec.max_depth)
    return np.asarray(out, np.float32)


def profile_dir() -> Path:
    # Beside the program cache: one XDG_CACHE_HOME moves both, so a fresh cache never meets a profile measured
    # with another one's programs.
    from lsjax.runtime.cache import cache_root

    return Path(os.environ.get("LSJAX_PROFILE_DIR") or cache_root() / "profiles")


def device_name(device) -> str:
    """What the profile is keyed by: the runtime's `device_kind`, which on a CPU is just "cpu", so there the
    processor's model and the cores this process may use are added: a profile measured on one CPU (two CPU
    models price a 2-row verification ~10% apart: docs/design/cpu-verify-cost.md) is not read on another that
    shares the home directory."""
    if device.platform != "cpu":
        return device.device_kind
    model = cpu.info()[0]
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return f"cpu {model} x{cores}"


def profile_path(device_kind: str, model: str, backend: str, candidates: tuple[str, ...], model_sig: str = "") -> Path:
    """One file per (device kind, model, backend, candidate set, model configuration `model_sig`); context
    buckets are entries inside."""
    sig = hashlib.sha1((",".join(candidates) + (f"|{model_sig}" if model_sig else "")).encode()).hexdigest()[:10]
    safe = "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in f"{device_kind}--{model}--{backend}")
    return profile_dir() / f"{safe}--{sig}.json"


def draft_signature(draft_params) -> str:
    """A short hash of the draft's tensors' names, shapes and dtypes (not their values; `costs` left out): a draft
    of another shape (deeper, wider, another vocabulary) steps at other costs, so its profile is its own. "" for
    no draft."""
    import jax

    if isinstance(draft_params, dict):
        draft_params = {k: v for k, v in draft_params.items() if k != "costs"}
    leaves = jax.tree_util.tree_leaves_with_path(draft_params)
    if not leaves:
        return ""
    spec = ";".join(
        f"{jax.tree_util.keystr(path)}:{tuple(getattr(x, 'shape', ()))}:{getattr(x, 'dtype', type(x).__name__)}"
        for path, x in leaves
    )
    return "draft " + hashlib.sha1(spec.encode()).hexdigest()[:12]


def measured_elsewhere(path: Path) -> list[str]:
    """The devices (as their file names spell them) that have a profile for the same model, backend and
    candidates as `path` in its directory, `path`'s own device excepted: a profile that is missing here
    but exists for another device is a machine change worth one line, not a silent first measurement."""
    device, *rest = path.name[: -len(".json")].rsplit("--", 3)
    if len(rest) != 3:
        return []
    tail = "--" + "--".join(rest) + ".json"
    found = []
    for other in sorted(path.parent.glob(f"*{tail}")) if path.parent.is_dir() else []:
        name = other.name[: -len(tail)]
        if name != device and "--" not in name:
            found.append(name)
    return found


def lsjax_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("lsjax")
    except PackageNotFoundError:  # a checkout on PYTHONPATH (the GPU machine)
        return "checkout"


def entry_key(bucket: int, greedy: bool) -> str:
    return f"{bucket}/{'greedy' if greedy else 'sampled'}"


def read_profile(path: Path, candidates: tuple[str, ...]) -> dict:
    """{entry key: [C] seconds}; {} when the file is missing, corrupt or for another candidate set."""
    return load_profile(path, candidates)[0]


def load_profile(path: Path, candidates: tuple[str, ...], version: str | None = None) -> tuple[dict, str | None]:
    """({entry key: [C] seconds}, why the file was not used): ({}, None) for a missing file; ({}, reason) for
    a corrupt one or one of another format, candidate set or (given `version`) lsjax version."""
    if not path.exists():
        return {}, None
    try:
        data = json.loads(path.read_text())
        if data.get("format") != FORMAT:
            return {}, f"has format {data.get('format')!r}, this lsjax writes {FORMAT}"
        if tuple(data.get("candidates", ())) != candidates:
            return {}, "was measured for other candidates"
        if version is not None and data.get("lsjax", version) != version:
            return {}, f"was measured by lsjax {data.get('lsjax')}, this is {version}"
        entries = {}
        for k, v in data["entries"].items():
            arr = np.asarray(v, np.float64)
            if arr.shape == (len(candidates),) and np.all(np.isfinite(arr)) and np.all(arr > 0):
                entries[k] = arr.tolist()
        return entries, None
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return {}, "is unreadable"


def borrowed_costs(
    path: Path, candidates: tuple[str, ...], bucket: int, greedy: bool, version: str | None = None
) -> tuple[np.ndarray, int] | None:
    """(costs, the bucket they were measured at): the entry of the nearest prompt bucket (on a log scale; the
    smaller of two as near) with the same sampling mode, when `bucket` has none; None when the file has no
    such entry. Only ratios steer the policy, and a neighbour's ratios hold nearly: a new prompt width starts
    at once with them instead of measuring (tens of seconds on a small CPU) before its first speculative
    step (`decode.py --precompile WIDTH` measures its own)."""
    entries, why = load_profile(path, candidates, version)
    if why or entry_key(bucket, greedy) in entries:
        return None
    mode = entry_key(0, greedy).partition("/")[2]
    widths = [int(b) for b, _, m in (k.partition("/") for k in entries) if m == mode and b.isdigit() and int(b)]
    if not widths:
        return None
    b = min(widths, key=lambda w: (abs(np.log2(w / bucket)), w))
    return np.asarray(entries[entry_key(b, greedy)], np.float32), b


def write_profile(path: Path, candidates: tuple[str, ...], entries: dict, meta: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(json.dumps({"format": FORMAT, "candidates": list(candidates), "entries": entries, **meta}))
    tmp.replace(path)  # atomic: a reader never sees half a file


def cached_costs(
    path: Path, candidates: tuple[str, ...], key: str, measure, check=None, version: str | None = None
) -> tuple[np.ndarray, bool]:
    """(costs [C], measured now): the cached entry, else `measure()` -> [C] seconds, written back.

    `check(entry) -> reason | None` says why a cached entry no longer holds; `version`: the lsjax version the
    file must have been written by. Either way the profile is measured again with one line saying why."""
    entries, why = load_profile(path, candidates, version)
    if why:
        print(f"[lsjax] auto's cost profile {path.name} {why}: measuring it again", file=sys.stderr)
    if key in entries:
        why = check(entries[key]) if check is not None else None
        if why is None:
            return np.asarray(entries[key], np.float32), False
        print(f"[lsjax] {why}: measuring auto's costs again", file=sys.stderr)
    costs = np.asarray(measure(), np.float64)
    meta = {"written": time.time(), **({"lsjax": version} if version is not None else {})}
    try:
        write_profile(path, candidates, {**entries, key: costs.tolist()}, meta)
    except OSError as e:  # a read-only cache dir costs a re-measure next time, nothing more
        print(f"[lsjax] could not write the cost profile {path}: {e}", file=sys.stderr)
    return costs.astype(np.float32), True


def measure_costs(
    decode, params, draft_params, state, prior: np.ndarray, progress: bool = True, names: tuple[str, ...] = ()
) -> np.ndarray:
    """[C] median seconds per step of each candidate, run forced in the compiled loop `decode` on copies of
    `state` (interleaved over candidates, REPEATS times, after one warm-up each). `names`: the candidates'
    (`cost_names`), shown on the progress bar as each runs."""
    from tqdm import tqdm

    forced = _forced(decode, params, draft_params, state)

    def run(c: int, steps: int):
        if names:
            bar.set_postfix_str(names[c], refresh=False)
        return forced(c, steps)

    num_candidates = len(prior)
    times = [[] for _ in range(num_candidates)]
    bar = tqdm(
        total=num_candidates * (REPEATS + 1),
        desc="[lsjax] profiling auto's candidates",
        unit="run",
        file=sys.stderr,
        disable=not progress,
        leave=False,
    )
    for c in range(num_candidates):
        run(c, 1)
        bar.update()
    for _ in range(REPEATS):
        for c in range(num_candidates):
            dt, n = run(c, STEPS)
            if n > 0:
                times[c].append(dt / n)
            bar.update()
    bar.close()
    if not times[0]:  # the row is already finished: nothing to time
        return np.asarray(prior, np.float64)
    # A candidate that could not step keeps the prior's ratio to AR.
    base = np.median(times[0]) / prior[0]
    return np.asarray([np.median(t) if t else base * p for t, p in zip(times, prior)], np.float64)


def _forced(decode, params, draft_params, state):
    """run(c, steps) -> (seconds, steps taken): candidate c forced for `steps` steps on a copy of `state`."""
    import dataclasses

    import jax
    import jax.numpy as jnp

    def run(c: int, steps: int):
        s = jax.tree.map(jnp.copy, state)  # decode donates its state: the caller's stays intact
        pol = dataclasses.replace(s.draft.policy, force=jnp.int32(c))
        s = dataclasses.replace(s, draft=dataclasses.replace(s.draft, policy=pol))
        s0 = int(s.steps)
        jax.block_until_ready(s)
        t = time.perf_counter()
        s = jax.block_until_ready(decode(params, draft_params, s, jnp.int32(s0 + steps)))
        return time.perf_counter() - t, int(s.steps) - s0

    return run


# An AR step this far from the profile's (as a ratio either way) means conditions other than those it was
# measured in.
STALE_RATIO = 1.35


def ar_step_seconds(decode, params, draft_params, state, repeats: int = 3) -> float | None:
    """Median seconds of a forced AR step (after one warm-up run); None when the row cannot step."""
    run = _forced(decode, params, draft_params, state)
    run(0, 1)
    times = [dt / n for dt, n in (run(0, STEPS) for _ in range(repeats)) if n > 0]
    return float(np.median(times)) if times else None


def stale_reason(now: float | None, cached: float) -> str | None:
    """Why a cached profile whose AR step took `cached` seconds does not hold when one takes `now`."""
    if now is None or 1 / STALE_RATIO <= now / cached <= STALE_RATIO:
        return None
    return (
        f"an AR step takes {now * 1e3:.1f} ms now and took {cached * 1e3:.1f} ms when auto's cost profile was "
        "measured (another load on the machine?)"
    )


def profile_costs(
    drafter,
    model_name: str,
    backend: str,
    params,
    draft_params,
    gen,
    bucket: int,
    state,
    decode,
    mode: str = "cached",
    model_sig: str = "",
    mesh: str = "",
    borrow: bool = False,
    settled: bool = True,
) -> np.ndarray:
    """[C] costs of `drafter`'s candidates at this prompt bucket and sampling, for the compiled loop
    `decode(params, draft_params, state, step_limit)` and a prefilled `state`: `mode` "prior" (never measure),
    "cached" (the cached profile, measured once when missing or when it no longer holds: module doc) or
    "measure" (measure again). `model_sig`: `ModelConfig.signature()`. `mesh`: the mesh's shape when the run is
    split over devices: part of the device's name, so a profile measured on one device is never read for a
    mesh (whose steps add all-reduces) or the other way round, and one found only for the other says so.
    `borrow` (a start that loaded its programs): the bucket's entry is taken unchecked, and a bucket without
    one takes its nearest neighbour's, with one line (`borrowed_costs`), instead of measuring first. `settled`
    False (the decode programs are still being compiled): nothing runs; the entry, else a neighbour's, else the
    prior (`Generator.finish` measures it after the output)."""
    import jax

    prior = prior_costs(drafter)
    if mode == "prior":
        return prior
    names = drafter.cost_names
    device = device_name(jax.devices()[0]) + (f" mesh {mesh}" if mesh else "")
    path = profile_path(
        device, model_name, backend, names, "|".join(filter(None, (model_sig, draft_signature(draft_params))))
    )
    key = entry_key(bucket, gen.sampling.greedy or not gen.sampling.sample_drafts)
    if mode == "cached" and not path.exists() and (others := measured_elsewhere(path)):
        print(
            f"[lsjax] auto's cost profile exists for {', '.join(others)}, not for this device"
            f" ({device}): measuring it here",
            file=sys.stderr,
        )
    greedy = gen.sampling.greedy or not gen.sampling.sample_drafts
    borrow = borrow or not settled
    if borrow and mode == "cached":
        # A start that loaded its programs takes its width's entry unchecked: the check is ~15 forced AR steps,
        # a large share of a short run's decode on a CPU; a start that compiles still checks.
        entries, why = load_profile(path, names, lsjax_version())
        if not why and key in entries:
            return np.asarray(entries[key], np.float32)
    borrowed = borrowed_costs(path, names, bucket, greedy, lsjax_version()) if borrow and mode == "cached" else None
    if borrowed is not None:
        print(
            f"[lsjax] auto's cost profile has no entry for prompt width {bucket} yet: using width "
            f"{borrowed[1]}'s (decode.py --precompile {bucket} measures its own)",
            file=sys.stderr,
        )
        return borrowed[0]

    if not settled:
        return prior

    def measure():
        return measure_costs(decode, params, draft_params, state, prior, names=names)

    if mode == "measure":
        entries = read_profile(path, names)
        entries.pop(key, None)
        with contextlib.suppress(OSError):
            write_profile(path, names, entries, {"written": time.time()})

    def check(entry):
        return stale_reason(ar_step_seconds(decode, params, draft_params, state), entry[0])

    return cached_costs(path, names, key, measure, check, lsjax_version())[0]


def candidate_split(generator, prompt_ids: list[int], gen, seed: int = 0) -> dict:
    """auto: ms per step of each candidate (`cost_names`: every candidate, then an AR step with a shadow draft),
    each run forced in the compiled loop on this prompt. "step_ms_source" says where they come from: "profile",
    the device's cost profile the run chose with (`cost_profile` cached or measure: already measured, free), or
    "measured" now the same way (`cost_profile` prior: its costs are a guess in AR steps, not times)."""
    from lsjax.engine.profiling import prefilled

    drafter = generator.drafter
    known = generator.known_draft_params(prompt_ids, gen) if drafter.cost_profile != "prior" else None
    if known is not None:  # the run read them: no second prefill (seconds after the output, on a long prompt)
        return _split(drafter, known["costs"], "profile")
    gen, bucket, state, (_, decode, _) = prefilled(generator, prompt_ids, gen, seed)
    if bool(state.done[0]):
        return {}  # prefill ended the row: no step to time
    if drafter.cost_profile == "prior":
        prior = prior_costs(drafter)
        secs, source = measure_costs(decode, generator.params, generator.draft_params, state, prior, False), "measured"
    else:
        secs, source = generator._draft_params(gen, bucket, state, decode)["costs"], "profile"
    return _split(drafter, secs, source)


def _split(drafter, secs, source: str) -> dict:
    return {
        "step_ms_by_candidate": {n: round(float(s) * 1e3, 3) for n, s in zip(drafter.cost_names, np.asarray(secs))},
        "step_ms_source": source,
    }
