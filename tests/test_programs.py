"""The compiled-program cache (`lsjax.runtime.programs`): keys that change with what determines a program and
with nothing else, a second Generator that loads instead of tracing and decodes the same, damaged files."""

from __future__ import annotations

import dataclasses
import json
import threading
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lsjax.config import GenerateConfig
from lsjax.engine.host import Generator
from lsjax.engine.types import SpecConfig
from lsjax.methods.pld.drafter import PLDDrafter
from lsjax.runtime import Startup, cpu, programs
from lsjax.runtime import split as split_mod
from lsjax.runtime.cpu import InLayout
from lsjax.runtime.programs import ProgramCache, program_key
from lsjax.runtime.split import SplitDecode
from tests.tiny import tiny_model

AVX2 = frozenset({"sse4_2", "avx", "avx2", "fma"})  # the flags of a CPU without AVX-512


@dataclasses.dataclass(frozen=True)
class Foreign:  # a plugin's static configuration: defined outside lsjax
    n: int = 1


def _args(width=8):
    return (jnp.zeros((2, width), jnp.float32), {"k": jax.ShapeDtypeStruct((3,), jnp.int32)})


def test_keys_follow_what_determines_a_program():
    config, _ = tiny_model()
    spec = SpecConfig(config, GenerateConfig(max_new_tokens=8), PLDDrafter(num_tokens=3), capacity=512)
    same = SpecConfig(config, GenerateConfig(max_new_tokens=8), PLDDrafter(num_tokens=3), capacity=512)
    key = program_key("start", spec, _args())
    assert key is not None and key == program_key("start", same, _args())
    assert key != program_key("decode", spec, _args())
    assert key != program_key("start", dataclasses.replace(spec, capacity=1024), _args())
    assert key != program_key("start", spec, _args(width=16))
    assert key != program_key("start", spec, (jnp.zeros((2, 8), jnp.int32), _args()[1]))
    other = SpecConfig(config, GenerateConfig(max_new_tokens=8), PLDDrafter(num_tokens=4), capacity=512)
    assert key != program_key("start", other, _args())


def test_each_kind_of_cpu_keeps_its_own_programs(monkeypatch, tmp_path):
    """XLA:CPU compiles for the host's instruction set, and `device_kind` is "cpu" on every processor: a program
    cache shared by two kinds keys each one's programs apart. `cpu.info` reads the model and the flags."""
    config, _ = tiny_model()
    spec = SpecConfig(config, GenerateConfig(max_new_tokens=8), PLDDrafter(num_tokens=3), capacity=512)
    monkeypatch.setattr(cpu, "info", lambda: ("an AVX2 CPU", AVX2))
    key = program_key("start", spec, _args())
    assert key == program_key("start", spec, _args())
    monkeypatch.setattr(cpu, "info", lambda: ("an AVX-512 CPU", AVX2 | {"avx512f"}))
    assert key != program_key("start", spec, _args())
    monkeypatch.undo()
    fake = tmp_path / "cpuinfo"
    fake.write_text("processor\t: 0\nmodel name\t: Some CPU @ 2.0GHz\nflags\t\t: fpu avx avx2 fma\n\nprocessor\t: 1\n")
    monkeypatch.setattr(cpu, "Path", lambda _: fake)
    assert cpu.info.__wrapped__() == ("Some CPU @ 2.0GHz", frozenset({"fpu", "avx", "avx2", "fma"}))


def test_fastbins_go_off_where_the_process_asks(monkeypatch):
    """decode.py turns glibc's fastbins off (its program loads spend less in malloc): `mallopt(M_MXFAST, 0)`;
    a libc without mallopt (not glibc) is left as it is."""
    import ctypes
    import platform

    calls = []

    class Glibc:
        def mallopt(self, param, value):
            calls.append((param, value))
            return 1

    monkeypatch.setattr(ctypes, "CDLL", lambda _: Glibc())
    assert cpu.no_fastbins() is True and calls == [(1, 0)]
    monkeypatch.setattr(ctypes, "CDLL", lambda _: object())
    assert cpu.no_fastbins() is False
    monkeypatch.undo()
    if platform.libc_ver()[0] == "glibc":  # the real call (it changes only how this process allocates)
        assert cpu.no_fastbins() is True


def test_code_from_outside_lsjax_is_never_cached():
    assert program_key("p", Foreign(), _args()) is None
    assert program_key("p", (1, Foreign()), _args()) is None
    assert program_key("p", object(), _args()) is None  # a repr naming an address


def _cache_with_counted_lowering(root):
    cache = ProgramCache(root)
    lowered = []

    def get(x):
        def lower():
            lowered.append(1)
            return jax.jit(lambda a: a * 2 + 1).lower(x)

        return cache.get("double", ("double", 1), (x,), lower)

    return cache, get, lowered


def test_a_second_cache_loads_without_lowering(tmp_path):
    x = jnp.arange(6.0)
    _, get, lowered = _cache_with_counted_lowering(tmp_path)
    np.testing.assert_array_equal(get(x)(x), x * 2 + 1)
    assert lowered == [1] and len(list(tmp_path.glob(f"*{programs.SUFFIX}"))) == 1
    cache, get, lowered = _cache_with_counted_lowering(tmp_path)
    np.testing.assert_array_equal(get(x)(x), x * 2 + 1)
    assert lowered == [] and cache.hits == 1


def test_a_damaged_file_is_compiled_again_and_replaced(tmp_path):
    x = jnp.arange(4.0)
    _cache_with_counted_lowering(tmp_path)[1](x)
    (path,) = tmp_path.glob(f"*{programs.SUFFIX}")
    path.write_bytes(b"not a program")
    cache, get, lowered = _cache_with_counted_lowering(tmp_path)
    np.testing.assert_array_equal(get(x)(x), x * 2 + 1)
    assert lowered == [1] and cache.hits == 0 and path.read_bytes() != b"not a program"


@pytest.fixture
def jax_cache(tmp_path):
    """JAX's persistent cache on, in tmp_path/jax, for this test only."""
    from jax._src import compilation_cache

    names = ("jax_compilation_cache_dir", "jax_persistent_cache_min_compile_time_secs")
    saved = {n: getattr(jax.config, n) for n in names}
    compilation_cache.reset_cache()  # JAX decides once per process whether it has a cache
    jax.config.update("jax_compilation_cache_dir", str(tmp_path / "jax"))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    yield tmp_path / "jax"
    for n, v in saved.items():
        jax.config.update(n, v)
    compilation_cache.reset_cache()


_JAX_CACHE_SCRIPT = """
import sys
import jax, jax.numpy as jnp
from lsjax.runtime.programs import ProgramCache
jax.config.update("jax_compilation_cache_dir", sys.argv[1])
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
x = jnp.arange(5.0)

def lower():
    if sys.argv[3] == "load":
        raise SystemExit("lowered: the program was not loaded from the program cache")
    return jax.jit(lambda a: jnp.sin(a) * 3 + jnp.cumsum(a)).lower(x)

cache = ProgramCache(sys.argv[2])
print(cache.get("f", ("f",), (x,), lower)(x).tolist(), cache.hits)
"""


def test_a_program_from_jax_cache_is_stored_with_its_kernels(tmp_path):
    """XLA:CPU serializes an executable JAX loaded from its cache without its kernels: stored that way, it
    would fail at its first run in the next process ("Function ... not found"). The program cache stores the
    bytes JAX's cache holds instead. Each step is its own process: within one, the kernels are still there."""
    import subprocess
    import sys

    def run(programs_dir, mode):
        args = [sys.executable, "-c", _JAX_CACHE_SCRIPT, str(tmp_path / "jax"), str(tmp_path / programs_dir), mode]
        done = subprocess.run(args, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-2000:]
        values, hits = done.stdout.strip().rsplit(" ", 1)
        stored = len(list((tmp_path / programs_dir).glob(f"*{programs.SUFFIX}")))
        return np.asarray(json.loads(values)), int(hits), stored

    x = np.arange(5.0)
    want = np.sin(x) * 3 + np.cumsum(x)
    for programs_dir, mode, hits in (("first", "compile", 0), ("second", "compile", 0), ("second", "load", 1)):
        # first: compiled afresh, stored in both caches; second: JAX's cache hit, stored all the same; then
        # loaded from the program cache in a new process and run.
        values, got_hits, stored = run(programs_dir, mode)
        np.testing.assert_allclose(values, want, rtol=1e-6)
        assert (got_hits, stored) == (hits, 1), (programs_dir, mode)


def test_only_the_newest_files_are_kept(tmp_path, monkeypatch):
    monkeypatch.setattr(programs, "MAX_FILES", 2)
    _, get, _ = _cache_with_counted_lowering(tmp_path)
    for n in (3, 4, 5):
        get(jnp.zeros((n,)))
    assert len(list(tmp_path.glob(f"*{programs.SUFFIX}"))) == 2


@pytest.mark.parametrize("method", ["ar", "pld"])
def test_a_second_generator_loads_both_programs_and_decodes_the_same(tmp_path, method):
    config, params = tiny_model()
    drafter = PLDDrafter(num_tokens=3) if method == "pld" else None
    ids = [5, 6, 7, 8, 5, 6, 7, 8, 5, 6]
    gen = GenerateConfig(max_new_tokens=12, ignore_eos=True)
    kw = {} if drafter is None else {"drafter": drafter}
    first = Generator(config, params, startup=Startup(ProgramCache(tmp_path)), **kw).run(ids, gen)
    cache = ProgramCache(tmp_path)
    second = Generator(config, params, startup=Startup(cache), **kw).run(ids, gen)
    assert cache.hits == 2 and second.tokens == first.tokens


@pytest.mark.slow  # ~10 s; a start-up speed choice, not what is decoded
def test_a_start_reads_ahead_the_programs_the_last_start_with_its_tag_fetched_first(tmp_path):
    config, params = tiny_model()
    ids = [5, 6, 7, 8, 5, 6, 7, 8, 5, 6]
    gen = GenerateConfig(max_new_tokens=12, ignore_eos=True)
    first = ProgramCache(tmp_path)
    assert first.read_ahead("tag") == 0  # nothing noted yet
    plain = Generator(config, params, startup=Startup(first)).run(ids, gen)
    first.remember("tag", ("start", "decode"))
    cache = ProgramCache(tmp_path)
    assert cache.read_ahead("another tag") == 0 and cache.read_ahead("tag") == 2
    again = Generator(config, params, startup=Startup(cache)).run(ids, gen)
    assert again.tokens == plain.tokens and cache.hits == 2 and cache.read_ahead_hits == 2
    # Read ahead or not, each read is timed: what a later load will cost by its size (`SplitDecode` prices one).
    assert first.seconds_per_byte() is None and len(cache.reads) == 2 and cache.seconds_per_byte() > 0
    # A prompt of another width: what was read ahead goes unused, the programs it needs are compiled.
    other = ProgramCache(tmp_path)
    assert other.read_ahead("tag") == 2
    longer = ids * 30
    assert Generator(config, params, startup=Startup(other)).run(longer, gen).tokens == (
        Generator(config, params).run(longer, gen).tokens
    )
    assert other.read_ahead_hits == 0
    # A damaged file read ahead is read (and fails) again at its fetch: compiled and replaced, never a crash.
    for path in tmp_path.glob(f"*{programs.SUFFIX}"):
        path.write_bytes(b"not a program")
    damaged = ProgramCache(tmp_path)
    assert damaged.read_ahead("tag") == 2
    assert Generator(config, params, startup=Startup(damaged)).run(ids, gen).tokens == plain.tokens
    assert damaged.hits == damaged.read_ahead_hits == 0 and damaged.seconds_per_byte() is None


def test_a_mesh_generator_does_not_use_the_cache(tmp_path):
    config, params = tiny_model()
    from lsjax import mesh as mesh_lib

    g = Generator(config, params, mesh=mesh_lib.make("data=1"), startup=Startup(ProgramCache(tmp_path)))
    assert g.startup.store is None


# ------------------------------------------------------------------ the decode program compiled during prefill


@pytest.mark.parametrize("where", ["accelerator", "cpu-loading"])
def test_a_decode_program_compiled_while_prefilling_decodes_the_same(tmp_path, monkeypatch, where):
    import lsjax.runtime

    config, params = tiny_model()
    ids = [5, 6, 7, 8, 5, 6, 7, 8, 5, 6]
    gen = GenerateConfig(max_new_tokens=12, ignore_eos=True)
    plain = Generator(config, params, PLDDrafter(num_tokens=3), startup=Startup(ProgramCache(tmp_path))).run(ids, gen)
    if where == "accelerator":
        monkeypatch.setattr(lsjax.runtime, "beside_device", lambda: True)
        g = Generator(config, params, PLDDrafter(num_tokens=3))
    else:  # on a CPU: only a program loaded from disk (one thread) is left to the background
        g = Generator(config, params, PLDDrafter(num_tokens=3), startup=Startup(ProgramCache(tmp_path)))
    assert g.compile(ids, gen, background=True) > 0 and g.compiling
    assert g.loading_decode == (where == "cpu-loading")  # what decode.py's status line says it is doing
    ready = []
    overlapped = g.run(ids, gen, on_ready=lambda: ready.append(1))
    assert overlapped.tokens == plain.tokens and ready == [1]
    assert overlapped.prefill_alongside_compile and not plain.prefill_alongside_compile
    assert overlapped.compile_s > 0  # the decode program's seconds, added by the run that waited for it
    again = g.run(ids, gen)
    assert again.tokens == plain.tokens and again.compile_s == 0 and not again.prefill_alongside_compile


def test_on_a_cpu_the_decode_program_compiles_beside_the_prefill(tmp_path):
    """The start program compiles first (its layers scanned: ~1.5 s for SmolLM2), the decode program on a host
    thread while the prompt is prefilled (`lsjax.runtime.beside`); outputs are AR's either way.
    The first token streams as soon as the prefill has made it, before the decode program is waited for."""
    config, params = tiny_model()
    ids = [5, 6, 7, 8, 5, 6]
    gen = GenerateConfig(max_new_tokens=6, ignore_eos=True)
    g = Generator(config, params, startup=Startup(ProgramCache(tmp_path)))
    g.compile(ids, gen, background=True)
    assert g.compiling and not g.loading_decode
    streamed, seen, ready = [], [], []  # seen, ready: tokens streamed when the prefill ended, when decoding began
    result = g.run(
        ids,
        gen,
        on_tokens=streamed.extend,
        on_prefilled=lambda: seen.append(len(streamed)),
        on_ready=lambda: ready.append(len(streamed)),
    )
    assert result.prefill_alongside_compile and not g.compiling
    assert [(p.name, p.how) for p in g.program_log] == [("start", "compiled"), ("decode", "compiled")]
    assert result.tokens == Generator(config, params).run(ids, gen).tokens == streamed
    assert seen == [0] and ready == [1]


@pytest.mark.parametrize("arch", ["llama", pytest.param("qwen3", marks=pytest.mark.slow)])
def test_programs_compile_from_the_targets_shapes_while_its_weights_load(tmp_path, arch):
    """A generator made from the target's shapes (`target.abstract_params`: decode.py compiles while the model
    loads) makes the programs a generator with the weights loads from the cache; `give_weights` hands the
    weights over and the run equals one with them from the start; misuse is one named error."""
    from lsjax.errors import InputError
    from lsjax.models import target

    config, params = tiny_model(arch=arch)
    ids = [5, 6, 7, 8, 5, 6, 7, 8, 5, 6]
    gen = GenerateConfig(max_new_tokens=12, ignore_eos=True)
    plain = Generator(config, params, PLDDrafter(num_tokens=3)).run(ids, gen)
    g = Generator(
        config, target.abstract_params(config), PLDDrafter(num_tokens=3), startup=Startup(ProgramCache(tmp_path))
    )
    assert g.weights_pending and g.compile(ids, gen) > 0
    with pytest.raises(InputError, match="run: the target's weights are still to come"):
        g.run(ids, gen)
    with pytest.raises(InputError, match="shapes alone"):
        g.give_weights(target.abstract_params(config))
    short = {**params, "embed": params["embed"][:, :-1]}
    with pytest.raises(InputError, match=r"give_weights: \['embed'\] is float32\[97, 47\], expected float32\[97, 48\]"):
        g.give_weights(short)
    g.give_weights(params)
    assert not g.weights_pending
    result = g.run(ids, gen)
    assert result.tokens == plain.tokens and result.compile_s == 0
    with pytest.raises(InputError, match="has its weights already"):
        g.give_weights(params)
    again = Generator(config, params, PLDDrafter(num_tokens=3), startup=Startup(ProgramCache(tmp_path)))
    assert again.run(ids, gen).tokens == plain.tokens
    assert [p.how for p in again.program_log] == ["loaded", "loaded"]  # the programs made from shapes


def test_a_background_compile_error_is_raised_by_run_and_the_next_run_compiles_again(monkeypatch):
    import lsjax.runtime
    from lsjax.engine import loop

    monkeypatch.setattr(lsjax.runtime, "beside_device", lambda: True)
    config, params = tiny_model()
    ids = [5, 6, 7, 8, 5, 6]
    gen = GenerateConfig(max_new_tokens=6, ignore_eos=True)
    g = Generator(config, params)
    real = loop.decode_jit.lower

    def broken(*a, **k):
        raise RuntimeError("XLA ran out of something")

    monkeypatch.setattr(loop.decode_jit, "lower", broken, raising=False)
    g.compile(ids, gen, background=True)
    with pytest.raises(RuntimeError, match="ran out"):
        g.run(ids, gen)
    monkeypatch.setattr(loop.decode_jit, "lower", real, raising=False)
    assert g.run(ids, gen).new_tokens == 6


def test_a_loaded_program_that_fails_to_run_is_removed_with_one_line(tmp_path, monkeypatch, capsys):
    from lsjax.cli import decode
    from lsjax.runtime import cache as compile_cache
    from lsjax.runtime import weights as stored

    class JaxRuntimeError(RuntimeError):  # XLA's error type, by name (jax.errors.JaxRuntimeError)
        pass

    def loaded_then_broken(self, *a, **k):
        self.startup.store.hits = 1
        (self.startup.store.root / f"decode-x{programs.SUFFIX}").write_bytes(b"")
        raise JaxRuntimeError("NOT_FOUND: Function iota_compare_fusion not found (type id: 1)\ndetails")

    monkeypatch.setattr(compile_cache, "enable", lambda *a: None)  # JAX's own cache stays as the test has it
    monkeypatch.setattr(compile_cache, "programs_dir", lambda flag: tmp_path)
    monkeypatch.setattr(compile_cache, "weights_dir", lambda flag: None)  # (the user's cache is not the test's)
    monkeypatch.setattr(stored, "_defer", [])  # (decode.main defers this process's writes: this test's only)
    monkeypatch.setattr(Generator, "run", loaded_then_broken)
    with pytest.raises(SystemExit) as exit_:
        decode.main(["--method", "ar", "--prompt", "hi", "--max-new-tokens", "2"], as_program=True)
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert exit_.value.code == 2 and "failed to run (NOT_FOUND: Function" in err and "run again" in err
    assert not list(tmp_path.glob(f"*{programs.SUFFIX}"))


# ------------------------------------------- a split decode: AR's group first, the others loading behind it


@pytest.mark.slow  # ~23 s; the default run's split decode: tests/test_split_decode.py (groups still loading)
def test_a_split_decode_runs_with_the_groups_loaded_so_far_and_takes_the_rest_as_they_come(tmp_path, monkeypatch):
    """A second start of `auto`: its first group (AR's) loads before decoding, the other group's program loads
    on a host thread once auto asks for it (held here until 3 tokens have streamed); auto runs on AR meanwhile,
    then uses it. Greedy output equals AR's; every step is counted as one candidate's."""
    from lsjax.methods.auto.drafter import AutoDrafter, auto_params

    monkeypatch.setenv("LSJAX_PROFILE_DIR", str(tmp_path / "profiles"))
    # The second group loads only when asked for (as in a split of more groups than load at once), as if loads
    # took no time: a tiny model's 40 tokens would be over before a load was in (`SplitDecode._pays`).
    monkeypatch.setattr(split_mod, "EAGER_GROUPS", 1)
    monkeypatch.setattr(SplitDecode, "_make_estimate", lambda self, g: 0.0)
    monkeypatch.setattr(cpu, "info", lambda: ("an AVX2 CPU", AVX2))  # (where the 4-node group is a wide program)
    config, params = tiny_model()
    drafter = dataclasses.replace(AutoDrafter(pld_tokens=(3,)), cost_profile="prior")
    ids = [5, 6, 7, 8, 5, 6, 7, 8, 5, 6]
    gen = GenerateConfig(max_new_tokens=40, ignore_eos=True)
    ar = Generator(config, params).run(ids, gen)

    first = Generator(config, params, drafter, auto_params(drafter), startup=Startup(ProgramCache(tmp_path)))
    assert first.splits() and first.partial(gen)
    assert first.run(ids, gen).tokens == ar.tokens
    assert sorted(p.name for p in first.program_log) == ["decode-1n", "decode-4n", "start"]

    released = threading.Event()
    load = ProgramCache._load

    def held(self, path):
        if path.name.startswith("decode-4n"):
            assert released.wait(120)
        return load(self, path)

    monkeypatch.setattr(ProgramCache, "_load", held)
    g = Generator(config, params, drafter, auto_params(drafter), startup=Startup(ProgramCache(tmp_path)))
    g.compile(ids, gen, background=True)
    assert g.compiling and g.loading_decode
    streamed, split = [], next(iter(g._compiled.values()))[1]

    def on_tokens(new):
        streamed.extend(new)
        if len(streamed) >= 3:
            released.set()
        if released.is_set() and split.busy:
            split.programs[1].result()  # asked for by auto and now loaded: the next call may use it

    result = g.run(ids, gen, on_tokens=on_tokens, stream_every=2)
    assert result.tokens == ar.tokens and streamed == ar.tokens
    assert result.bridged_steps >= 2 and result.prefill_alongside_compile
    assert result.decode_program_at > result.first_token_at
    assert result.drafter_stats["steps_by_candidate"].get("pld-3", 0) > 0  # the second group ran once loaded
    assert sum(result.drafter_stats["steps_by_candidate"].values()) == result.target_forwards - 1
    assert g.startup.store.hits == 3 and not g.compiling  # start and both groups, all loaded
    # Loaded beside the prefill, the first group is soon ready: a status line says "prefilling", not "loading".
    again = Generator(config, params, drafter, auto_params(drafter), startup=Startup(ProgramCache(tmp_path)))
    again.compile(ids, gen, background=True)
    deadline = time.monotonic() + 60
    while again.first_pending and time.monotonic() < deadline:
        time.sleep(0.01)
    assert again.loading_decode and not again.first_pending
    again.close()
    # The 4-node group: compiled without YNNPACK fusions, stored, loaded, run on the [in, out] projections.
    assert isinstance(split.programs[1], InLayout) and not isinstance(split.programs[0], InLayout)
    assert "__ynn_fusion" not in split.programs[1].program.as_text()
    assert "__ynn_fusion" in split.programs[0].as_text()


def test_a_wide_program_compiles_without_ynnpack_and_runs_on_the_in_major_projections(monkeypatch):
    """`wide_program`: verifications of 3+ rows on one CPU device without AVX-512; `WideLowered` compiles without
    YNNPACK fusions (an XLA without the option: as it is); `InLayout` hands the program the [in, out] view of
    the params."""
    import functools

    from lsjax.models import target
    from lsjax.runtime.cpu import WIDE_ROWS, WideLowered, wide_program

    monkeypatch.setattr(cpu, "info", lambda: ("an AVX2 CPU", AVX2))
    assert WIDE_ROWS == 3 and not wide_program(1) and not wide_program(2) and wide_program(3) and wide_program(9)
    assert not wide_program(9, mesh=object()) and not wide_program(9, dtype="bfloat16")
    monkeypatch.setattr(cpu, "info", lambda: ("an AVX-512 CPU", AVX2 | {"avx512f"}))
    assert not wide_program(9)  # YNNPACK's wider kernels won there
    monkeypatch.setattr(cpu, "info", lambda: ("a CPU whose flags are unknown", frozenset()))
    assert not wide_program(9)  # XLA's default

    lowered = jax.jit(lambda x, w: jnp.tanh(x @ w)).lower(jnp.ones((9, 16)), jnp.ones((16, 16)))
    assert "__ynn_fusion" in lowered.compile().as_text()
    assert "__ynn_fusion" not in WideLowered(lowered).compile().as_text()

    class Older:  # an XLA that has no such option
        calls: list = []

        def compile(self, options=None):
            self.calls.append(options)
            if options:
                raise jax.errors.JaxRuntimeError("INVALID_ARGUMENT: No such compile option: 'xla_cpu_...'")
            return "compiled"

    assert WideLowered(Older()).compile() == "compiled" and Older.calls[-1] is None

    config, params = tiny_model()
    both = target.prepare_for_decode(params, config, layout="both")
    seen = []
    view = functools.partial(target.prepare_for_decode, config=config, layout="in")
    program = InLayout(lambda p, *rest: seen.append((p, rest)) or "ran", view)
    assert program(both, 1, 2) == "ran" and program(both, 3) == "ran"
    view = seen[0][0]
    assert target.layout_of(view) == "in" and seen[1][0] is view  # made once per params object
    assert view["layers"][0]["w_qkv"] is both["layers"][0]["w_qkv"]  # the same arrays, no copy


def _first_start_setup(tmp_path, monkeypatch):
    from lsjax.methods.auto import profile
    from lsjax.methods.auto.drafter import AutoDrafter, auto_params

    monkeypatch.setenv("LSJAX_PROFILE_DIR", str(tmp_path / "profiles"))
    monkeypatch.setattr(profile, "REPEATS", 1)
    config, params = tiny_model()
    drafter = AutoDrafter(pld_tokens=(3,))  # cost_profile "cached": measured once, kept on disk
    ids = [5, 6, 7, 8, 5, 6, 7, 8, 5, 6]
    gen = GenerateConfig(max_new_tokens=40, ignore_eos=True)
    ar = Generator(config, params).run(ids, gen)

    def generator():
        return Generator(config, params, drafter, auto_params(drafter), startup=Startup(ProgramCache(tmp_path / "p")))

    return ids, gen, ar, generator


def test_a_first_start_decodes_with_ars_programs_and_compiles_the_methods_after(tmp_path, monkeypatch):
    """A start with nothing stored (greedy, exact, on a CPU) decodes with AR's own programs, which compile in
    AR's time, and leaves the method's to `finish` (its costs measured with them), so the next start loads
    everything and reads them; a second run in the same process runs the method's own programs."""
    ids, gen, ar, generator = _first_start_setup(tmp_path, monkeypatch)
    g = generator()
    assert g.stands_in(ids, gen)
    g.compile(ids, gen, background=True)
    assert g.compiling and not g.loading_decode  # AR's decode program, beside the prefill
    assert g.first_pending  # (a status line says "compiling" until it is made)
    result = g.run(ids, gen)
    assert [p.name for p in g.program_log] == ["start", "decode"] and result.prefill_alongside_compile
    assert result.tokens == ar.tokens and result.ar_stand_in and result.drafter_stats is None
    assert result.bridged_steps == result.target_forwards - 1 and result.decode_program_at == 0.0
    assert not list((tmp_path / "profiles").glob("*.json")) and not g.stands_in(ids, gen)
    assert g.owes and g.finish() > 0 and not g.owes
    assert list((tmp_path / "profiles").glob("*.json"))  # this width's costs, measured after the output
    assert {"decode-1n", "decode-4n"} <= {p.name for p in g.program_log}
    again = g.run(ids, gen)  # the same process: the method's own programs now
    assert again.tokens == ar.tokens and not again.ar_stand_in and again.drafter_stats is not None
    nxt = generator()  # the next start loads everything
    assert not nxt.stands_in(ids, gen)
    nxt.compile(ids, gen, background=True)
    assert nxt.loading_decode
    # AR's group and one more, stored: the second loads at once, unasked (`lsjax.runtime.split.loading`)
    assert [c[1].eager for c in nxt._compiled.values()] == [True]
    assert nxt.run(ids, gen).tokens == ar.tokens and not nxt.owes
    assert all(p.how == "loaded" for p in nxt.program_log)
    nxt.close()


@pytest.mark.slow  # ~7 s; the default run's first start: test_a_first_start_decodes_with_ars_programs_...
def test_a_first_start_with_ars_group_stored_keeps_to_it_and_compiles_the_rest_after(tmp_path, monkeypatch):
    """AR's group stored, a tree's not: the run keeps to AR's group (compiling beside the decode takes the cores
    it runs on) and `finish` compiles the tree for the next start."""
    ids, gen, ar, generator = _first_start_setup(tmp_path, monkeypatch)
    full = generator()
    full.run(ids, gen)  # (foreground: every program compiled and stored)
    for f in (tmp_path / "p").glob("decode-4n-*"):
        f.unlink()
    g = generator()
    assert not g.stands_in(ids, gen)
    g.compile(ids, gen, background=True)
    result = g.run(ids, gen)
    assert result.tokens == ar.tokens and not result.ar_stand_in
    assert set(result.drafter_stats["steps_by_candidate"]) == {"ar"}
    assert "decode-4n" not in {p.name for p in g.program_log}
    assert g.owes and g.finish() > 0 and not g.owes
    assert [p.how for p in g.program_log if p.name == "decode-4n"] == ["compiled"]
    assert list((tmp_path / "p").glob("decode-4n-*"))


def test_beside_an_accelerator_a_first_start_compiles_every_group_beside_the_decode(tmp_path, monkeypatch):
    """Where XLA compiles beside the device (an accelerator's host, simulated), a first start does not stand in
    with AR's programs: AR's group compiles beside the prefill and decodes while the others compile; the costs
    are the prior meanwhile (measuring would wait for every program). `finish` then compiles the rest and
    measures the width's costs, so the next start loads everything and reads them."""
    import lsjax.runtime

    monkeypatch.setattr(lsjax.runtime, "beside_device", lambda: True)
    ids, gen, ar, generator = _first_start_setup(tmp_path, monkeypatch)
    g = generator()
    assert not g.stands_in(ids, gen)
    g.compile(ids, gen, background=True)
    assert g.compiling and not g.loading_decode  # compiling, in the background
    result = g.run(ids, gen)
    assert result.tokens == ar.tokens and not list((tmp_path / "profiles").glob("*.json"))
    assert g.owes and g.finish() > 0 and not g.owes
    assert list((tmp_path / "profiles").glob("*.json"))  # this width's costs, measured after the output
    again = generator()
    again.compile(ids, gen, background=True)
    assert again.loading_decode
    assert again.run(ids, gen).tokens == ar.tokens and not again.owes
    assert all(p.how == "loaded" for p in again.program_log)
    again.close()


def test_split_and_partial_only_where_they_hold(tmp_path):
    from lsjax.config import SamplingConfig
    from lsjax.methods.auto.drafter import AutoDrafter, auto_params

    config, params = tiny_model()
    auto = AutoDrafter(pld_tokens=(3,))
    greedy = GenerateConfig(max_new_tokens=8)
    sampled = GenerateConfig(max_new_tokens=8, sampling=SamplingConfig(temperature=1.0))
    cached = Generator(config, params, auto, auto_params(auto), startup=Startup(ProgramCache(tmp_path)))
    assert cached.splits() and cached.partial(greedy) and not cached.partial(sampled)
    assert not Generator(config, params, auto, auto_params(auto)).splits()  # no program cache: one program
    assert not Generator(config, params, PLDDrafter(3), startup=Startup(ProgramCache(tmp_path))).splits()
    ar_only = AutoDrafter(pld_tokens=())  # one group: nothing to split
    assert not Generator(
        config, params, ar_only, auto_params(ar_only), startup=Startup(ProgramCache(tmp_path))
    ).splits()
    bf16 = dataclasses.replace(config, dtype="bfloat16")
    assert not Generator(bf16, params, auto, auto_params(auto), startup=Startup(ProgramCache(tmp_path))).partial(greedy)


@pytest.mark.slow  # the CPU start-up machinery; the default run stores and loads programs in the tests above
@pytest.mark.parametrize("bytes_kept", [True, False], ids=["jax-bytes", "no-jax-bytes"])
def test_split_programs_are_stored_from_jax_bytes_where_they_can_be(tmp_path, jax_cache, monkeypatch, bytes_kept):
    """Programs JAX took from its own cache are stored from JAX's bytes; where those cannot be had (a JAX
    version that moved its reader) they are not stored, and the next start compiles them in the foreground."""
    from lsjax.methods.auto.drafter import AutoDrafter, auto_params

    real, from_jax_cache = programs._compile, []

    def compile_(lower):
        made = real(lower)
        from_jax_cache.append(made.from_jax_cache)
        return made if bytes_kept else dataclasses.replace(made, jax_bytes=None)

    monkeypatch.setattr(programs, "_compile", compile_)
    jax.clear_caches()  # an earlier test's programs in memory would keep this one's out of JAX's cache
    config, params = tiny_model()
    drafter = dataclasses.replace(AutoDrafter(pld_tokens=(3,)), cost_profile="prior")
    ids, gen = [5, 6, 7, 8, 5, 6], GenerateConfig(max_new_tokens=6, ignore_eos=True)
    Generator(config, params, drafter, auto_params(drafter), startup=Startup(ProgramCache(tmp_path / "a"))).compile(
        ids, gen
    )
    jax.clear_caches()
    again = Generator(config, params, drafter, auto_params(drafter), startup=Startup(ProgramCache(tmp_path / "b")))
    del from_jax_cache[:]
    again.compile(ids, gen)
    assert from_jax_cache == [True, True, True]  # start and both groups came from JAX's cache
    stored = list((tmp_path / "b").glob(f"decode-*{programs.SUFFIX}"))
    assert len(stored) == (2 if bytes_kept else 0)
    last = Generator(config, params, drafter, auto_params(drafter), startup=Startup(ProgramCache(tmp_path / "b")))
    last.compile(ids, gen, background=True)
    assert last.loading_decode == bytes_kept  # else compiled in the background, AR's group first
    last.finish()


@pytest.mark.slow  # ~10 s; a start-up speed choice, not what is decoded
def test_a_start_that_loaded_its_decode_program_may_borrow_host_params(tmp_path):
    """`HostRun.borrow` (auto: a neighbouring width's cost profile): only where the decode program was loaded
    from the cache, never at a start that compiles it (which then measures its own) or in a warm-up."""
    config, params = tiny_model()
    ids, gen = [5, 6, 7, 8, 5, 6], GenerateConfig(max_new_tokens=6, ignore_eos=True)
    first = Generator(config, params, PLDDrafter(num_tokens=3), startup=Startup(ProgramCache(tmp_path)))
    first.run(ids, gen)
    assert not first._host_run(gen, 256, None, None).borrow
    again = Generator(config, params, PLDDrafter(num_tokens=3), startup=Startup(ProgramCache(tmp_path)))
    again.run(ids, gen)
    assert again._host_run(gen, 256, None, None).borrow and not again._host_run(gen, 512, None, None).borrow
    again.warming_up = True
    assert not again._host_run(gen, 256, None, None).borrow


@pytest.mark.slow  # ~8 s
def test_an_unwritable_program_cache_is_one_warning_and_the_run_goes_on(tmp_path, capsys):
    config, params = tiny_model()
    ids, gen = [5, 6, 7, 8, 5, 6], GenerateConfig(max_new_tokens=6, ignore_eos=True)
    blocked = tmp_path / "not-a-dir"
    blocked.write_text("a file where the cache directory should be")
    result = Generator(config, params, startup=Startup(ProgramCache(blocked))).run(ids, gen)
    assert result.tokens == Generator(config, params).run(ids, gen).tokens
    warnings = [line for line in capsys.readouterr().err.splitlines() if "cannot store compiled programs" in line]
    assert len(warnings) == 1 and "decoding goes on" in warnings[0], warnings
