"""decode.py misused (issue 33) and a new user's first minutes: a named one-line error (exit 2, no traceback)
before anything compiles where the value is known, one warning line where the user meant no harm, Ctrl-C as
one line, progress while compiling, the persistent compilation cache, and auto's per-step time split."""

from __future__ import annotations

import dataclasses
import json
import re
import signal
import subprocess
import sys
import threading
import time
import warnings

import pytest

from lsjax.cli import decode
from lsjax.config import ConfigError, GenerateConfig
from lsjax.errors import MethodNote, ModelNotFoundError
from lsjax.loading import default_model_path
from lsjax.methods import registry
from lsjax.tree import TreeConfig, check_fits
from tests.test_bad_inputs import tiny_draft  # noqa: F401  (a fixture: a valid draft for the tiny target)
from tests.test_decode_cli import ROOT
from tests.test_decode_cli import decode as run_decode
from tests.tiny import fake_loading, tiny_model


def only_line(proc, status: int = 2) -> str:
    """The single line decode.py wrote on stderr (no traceback), after checking its exit status."""
    assert proc.returncode == status and "Traceback" not in proc.stderr, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    return lines[0]


def stderr_until(args, marker: str, timeout: float = 180) -> list[str]:
    """decode.py's stderr lines up to the first that holds `marker`; the run is then killed (what comes after,
    compiling and decoding, is not what these tests are about)."""
    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "decode.py"), *args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    timer = threading.Timer(timeout, proc.kill)
    timer.start()
    lines = []
    try:
        for line in proc.stderr:
            lines.append(line.rstrip("\n"))
            if marker in line:
                break
    finally:
        timer.cancel()
        proc.kill()
        proc.wait()
    assert lines and marker in lines[-1], lines
    return lines


def toy_model(path):
    config, params = tiny_model()
    return type("M", (), {"config": config, "params": params, "path": path})()


# ------------------------------------------------------------------------------ 1. --draft under auto


def test_auto_uses_the_draft_it_is_given_or_fails_with_its_error(tmp_path, tiny_draft):  # noqa: F811
    config, path = tiny_draft
    model = toy_model(tmp_path / "renamed.gguf")  # no draft is shipped for it
    with pytest.warns(MethodNote, match="no LongSpec draft for renamed: auto uses AR and prompt lookup only"):
        assert registry.build("auto", model, draft="shipped")[0].longspec is None  # none shipped: AR + lookup
    assert registry.build("auto", model, draft=str(path), tree="2,1")[0].longspec is not None
    with pytest.raises(ModelNotFoundError, match="no LongSpec draft at"):
        registry.build("auto", model, draft=str(tmp_path / "missing"))


def test_auto_on_a_cpu_leaves_the_shipped_draft_out_unless_asked(tmp_path, tiny_draft, monkeypatch):  # noqa: F811
    """On a CPU, auto's default runs AR and prompt lookup only, without a note (its choice, not a fallback);
    `--draft shipped` brings the shipped draft back; `--draft none` leaves it out on any device."""
    import jax

    from lsjax.methods.auto.config import AutoOptions, draft_info
    from lsjax.methods.longspec import checkpoint

    _, path = tiny_draft
    monkeypatch.setattr(checkpoint, "default_draft_path", lambda _model_path: path)  # as if one were shipped
    model = toy_model(tmp_path / "shipped.gguf")
    assert jax.default_backend() == "cpu"
    with warnings.catch_warnings():
        warnings.simplefilter("error", MethodNote)
        drafter, params = registry.build("auto", model)
    assert drafter.longspec is None and "longspec" not in params
    assert [c.name for c in drafter.candidates] == ["ar", "pld-8"]  # (CPU_PLD_TOKENS: pld-4 is not worth a program)
    assert [c.name for c in registry.build("auto", model, pld_tokens=(4, 8))[0].candidates] == ["ar", "pld-4", "pld-8"]
    assert draft_info(AutoOptions()) == {"dir": "none", "format": "none"}
    assert registry.build("auto", model, draft="shipped")[0].longspec is not None
    assert draft_info(AutoOptions(draft="shipped")) is None  # the shipped one: found once the model loads
    assert registry.build("longspec", model, draft="shipped")[0].draft is not None  # the word works there too
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    assert registry.build("auto", model)[0].longspec is not None  # elsewhere the default keeps it
    none = registry.build("auto", model, draft="none")[0]
    assert none.longspec is None and [c.name for c in none.candidates] == ["ar", "pld-4", "pld-8"]
    assert draft_info(AutoOptions(draft="none")) == {"dir": "none", "format": "none"}


def test_decode_auto_with_a_missing_or_corrupt_draft_fails(tmp_path):
    missing = tmp_path / "missing"
    line = only_line(run_decode("--prompt", "hi", "--draft", str(missing)))
    assert line == f"decode.py: error: no LongSpec draft at {missing} (expected model.safetensors and config.json)"
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "config.json").write_text("{not json")
    (bad / "model.safetensors").write_bytes(b"\0" * 16)
    line = only_line(run_decode("--prompt", "hi", "--draft", str(bad)))
    assert line.startswith(f"decode.py: error: {bad / 'config.json'}: not a LongSpec draft"), line


def test_auto_says_when_no_draft_matches_the_model(tmp_path):
    renamed = tmp_path / "my-model.Q4_1.gguf"
    renamed.symlink_to(default_model_path())
    # (on a CPU auto's default runs without a draft and looks for none: ask for the shipped one)
    argv = ["--model", str(renamed), "--prompt", "hi", "--max-new-tokens", "4", "--draft", "shipped"]
    lines = stderr_until(argv, "compiling")
    note = "[lsjax] no LongSpec draft for my-model: auto uses AR and prompt lookup only (pass --draft DIR)"
    assert lines.count(note) == 1, lines


# ------------------------------------------------------------------------------ 2. flags the method does not read


def test_which_method_reads_which_option_is_data():
    opts = {name: registry.get(name).options() for name in ("ar", "pld", "longspec", "hybrid", "auto")}
    assert opts["ar"] == frozenset()
    assert opts["pld"] == {"pld_tokens", "pld_ngram"}
    assert opts["longspec"] == {"draft", "tree"}
    assert opts["hybrid"] == {"draft", "tree", "pld_tokens", "pld_ngram"}  # its own and longspec's
    assert {"draft", "tree", "pld_tokens", "pld_ngram", "cost_profile", "budget"} <= opts["auto"]
    assert "heads" in registry.get("tokenswift").options() and "heads" not in opts["auto"]


def test_ignored_flags_are_the_ones_set_that_the_method_does_not_read():
    def ignored(*argv, method):
        return decode.ignored_flags(decode.parse_args(list(argv)), method)

    assert ignored("--tree", "2,2", "--heads", "/nope", method="ar") == ["--tree", "--heads"]
    assert ignored("--tree", "2,2", "--pld-tokens", "4", method="hybrid") == []
    assert ignored("--cost-profile", "prior", "--ts-draft-pass", "full", method="longspec") == [
        "--cost-profile",
        "--ts-draft-pass",
    ]
    assert ignored("--ts-draft-pass", "full", method="tokenswift") == []
    assert ignored("--branches", "1", "--alpha", "1.0", method="ar") == []  # their defaults: not set


def test_decode_warns_about_flags_the_method_does_not_read():
    lines = stderr_until(["--method", "ar", "--tree", "2,2", "--heads", "/nope", "--prompt", "hi"], "warning")
    assert lines == ["decode.py: warning: --tree, --heads do not apply to --method ar (ignored)"]
    lines = stderr_until(["--method", "pld", "--draft", "x", "--prompt", "hi"], "warning")
    assert lines == ["decode.py: warning: --draft does not apply to --method pld (ignored)"]


# ------------------------------------------------------------------------------ 3. a tree the draft cannot propose


def test_check_fits_names_the_tree_and_the_limit():
    check_fits(TreeConfig((4, 16, 16)), 49152, 8192, "paper")
    with pytest.raises(ConfigError) as e:
        check_fits(TreeConfig((2, 3000)), 2048, 8192, "2,3000", "its pruned vocabulary")
    assert (
        str(e.value)
        == "--tree 2,3000: 3000 nodes at depth 2, but the draft proposes from 2048 tokens (its pruned vocabulary)"
    )
    with pytest.raises(ConfigError, match=r"^--tree 64,64: 129 nodes, more than the model's context window \(100"):
        check_fits(TreeConfig((64, 64)), 49152, 100)


def test_longspec_rejects_a_tree_wider_than_the_vocabulary_before_compiling(tmp_path):
    model = toy_model(tmp_path / "tiny.gguf")  # vocabulary 97
    for method in ("longspec", "hybrid", "auto"):
        with pytest.raises(ConfigError, match=r"^--tree 2,100: 100 nodes at depth 2, .* from 97 tokens"):
            registry.build(method, model, draft="random", tree="2,100")
    proc = run_decode("--method", "longspec", "--draft", "random", "--tree", "100000", "--prompt", "hi")
    assert only_line(proc) == (
        "decode.py: error: --tree 100000: 100000 nodes at depth 1, but the draft proposes from 49152 tokens "
        "(the target's vocabulary)"
    )


# ------------------------------------------------------------------------------ 4. smaller ones


def test_a_directory_as_prompt_file(tmp_path):
    assert (
        only_line(run_decode("--prompt-file", str(tmp_path)))
        == f"decode.py: error: prompt file is a directory: {tmp_path}"
    )


def test_an_empty_tree_or_cache_dir():
    assert only_line(run_decode("--prompt", "hi", "--tree", "")) == (
        "decode.py: error: --tree is empty: give a preset (paper, gpu, cpu, cpu-small, chain4, chain8) or widths, "
        "e.g. 2,2,2"
    )
    line = only_line(run_decode("--prompt", "hi", "--compile-cache", " "))
    assert line == "decode.py: error: --compile-cache is empty: give a directory, or off"


def test_prefill_rate_is_printed_with_its_digits():
    assert [decode.rate(x) for x in (0.4213, 7.314, 42.14, 1234.6)] == ["0.421", "7.31", "42.1", "1235"]


def test_one_token_prompt_prints_no_prefill_rate(monkeypatch, capsys, tmp_path):
    import lsjax.loading
    from lsjax.loading import LoadedModel
    from tests.test_registry import ByteTokenizer

    config, params = tiny_model()
    model = LoadedModel(config, params, ByteTokenizer(), tmp_path / "toy.gguf")
    for name, fn in fake_loading(model).items():
        monkeypatch.setattr(lsjax.loading, name, fn)
    assert decode.main(["--prompt", "a", "--method", "ar", "--max-new-tokens", "3", "--ignore-eos"]) == 0
    summary = capsys.readouterr().err.strip().splitlines()[-1]
    assert summary.startswith("[lsjax] 3 tokens (max_new_tokens); prefill ") and "tok/s), decode" not in summary
    assert ", decode " in summary


@pytest.mark.parametrize(
    "method",
    [
        "ar",
        pytest.param("auto", marks=pytest.mark.slow),
        pytest.param("longspec", marks=pytest.mark.slow),
        pytest.param("longspec-random", marks=pytest.mark.slow),  # ~14 s: CPU start-up policy, not the output
    ],
)
def test_programs_compile_while_the_weights_load_where_cores_are_free(
    monkeypatch,
    capsys,
    tmp_path,
    method,
    tiny_draft,  # noqa: F811
):
    """Where the load leaves cores free (`lsjax.runtime.compile_beside_load`), a method that does not read the
    target's weights compiles its programs from the target's shapes while they load (`decode.Ahead`); one that
    reads them (a random LongSpec draft starts from the target's last layer) is built after the load, as
    everywhere else. The same text either way."""
    import lsjax.loading
    import lsjax.runtime
    from lsjax.loading import LoadedModel
    from tests.test_registry import ByteTokenizer

    config, params = tiny_model()
    model = LoadedModel(config, params, ByteTokenizer(), tmp_path / "toy.gguf")
    for name, fn in fake_loading(model).items():
        monkeypatch.setattr(lsjax.loading, name, fn)
    made = []

    class Seen(decode.Ahead):
        def __init__(self, *a, **k):
            made.append(1)
            super().__init__(*a, **k)

    monkeypatch.setattr(decode, "Ahead", Seen)
    draft = {"longspec": [str(tiny_draft[1])], "longspec-random": ["random"]}.get(method)
    draft = ["--draft", *draft, "--tree", "2,1"] if draft else []
    name = method.removesuffix("-random")
    argv = ["--prompt", "ab ab ab ab", "--method", name, *draft, "--max-new-tokens", "12", "--ignore-eos", "--json"]
    texts = []
    for free in (False, True):
        monkeypatch.setattr(lsjax.runtime, "compile_beside_load", lambda free=free: free)
        assert decode.main([*argv, "--compile-cache", str(tmp_path / f"cache-{free}")]) == 0
        out = capsys.readouterr()
        assert "Traceback" not in out.err
        texts.append(json.loads(out.out.strip().splitlines()[-1])["text"])
    assert texts[0] == texts[1]
    assert made == ([] if method == "longspec-random" else [1])


def test_ctrl_c_is_one_line_and_status_130():
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "decode.py"), "--method", "ar", "--prompt", "hi", "--compile-cache", "off"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    first = proc.stderr.readline()  # loaded; compiling... (XLA is busy: Python alone would not stop it)
    proc.send_signal(signal.SIGINT)
    _, rest = proc.communicate(timeout=30)
    assert proc.returncode == 130 and "compiling" in first, first + rest
    assert rest == "decode.py: interrupted\n"
    assert time.perf_counter() - t0 < 40


# ------------------------------------------------------------------------------ 5, 6. compile cache, progress


def test_the_ticker_prints_elapsed_seconds_while_it_runs(capsys):
    with decode.Ticker("compiling", every=0.2):
        time.sleep(1.4)
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) >= 3 and lines[0] == "[lsjax] compiling: 0s", lines
    assert all(line.startswith("[lsjax] compiling: ") and line.endswith("s") for line in lines), lines
    counts = [int(line.rsplit(" ", 1)[1][:-1]) for line in lines]
    assert counts == sorted(counts) and counts[-1] >= 1, lines  # counts up, a line every `every` (not per second)


def test_compile_cache_location(tmp_path, monkeypatch):
    from lsjax.runtime import cache as compile_cache

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.delenv(compile_cache.ENV, raising=False)
    assert compile_cache.default_dir() == tmp_path / "xdg" / "lsjax" / "jax-cache"
    assert compile_cache.resolve("off") is None and compile_cache.resolve(str(tmp_path / "c")) == tmp_path / "c"
    monkeypatch.setenv(compile_cache.ENV, "OFF")
    assert compile_cache.resolve(None) is None
    assert compile_cache.resolve(str(tmp_path / "c")) == tmp_path / "c"  # the flag wins over the variable
    monkeypatch.setenv(compile_cache.ENV, str(tmp_path / "env"))
    assert compile_cache.resolve(None) == tmp_path / "env"


@pytest.mark.slow
def test_a_second_run_compiles_from_the_cache(tmp_path):
    args = ("--method", "ar", "--max-new-tokens", "4", "--prompt", "def fib(n):", "--json")
    runs = [run_decode(*args, "--compile-cache", str(tmp_path / "cache")) for _ in range(2)]
    assert all(r.returncode == 0 for r in runs), runs[-1].stderr
    first, second = (json.loads(r.stdout.strip().splitlines()[-1]) for r in runs)
    assert second["compile_s"] < first["compile_s"] / 2, (first["compile_s"], second["compile_s"])
    assert second["text"] == first["text"]  # the cached program decodes the same
    assert any((tmp_path / "cache").iterdir())
    assert re.search(r"\[lsjax\] compiling[^\n]*: 5s", runs[0].stderr), runs[0].stderr  # progress, also under --json


# ------------------------------------------------------------------------------ 7. auto's time split


@pytest.mark.slow  # ~29 s (auto compiled and profiled): a report's layout, not an output
def test_auto_time_split_is_ms_per_step_of_each_candidate(tmp_path, monkeypatch):
    from lsjax.engine.host import Generator
    from lsjax.engine.profiling import time_split
    from lsjax.methods.auto.drafter import AutoDrafter, auto_params

    monkeypatch.setenv("LSJAX_PROFILE_DIR", str(tmp_path))
    config, params = tiny_model()
    drafter = AutoDrafter(pld_tokens=(3,))
    ids = [5, 6, 7, 8, 5, 6, 7, 8, 5, 6]
    gen = GenerateConfig(max_new_tokens=24, ignore_eos=True)
    g = Generator(config, params, dataclasses.replace(drafter, cost_profile="prior"), auto_params(drafter))
    split = time_split(g, ids, gen)
    assert split["step_ms_source"] == "measured" and set(split["step_ms_by_candidate"]) == {"ar", "pld-3"}
    assert all(ms > 0 for ms in split["step_ms_by_candidate"].values())
    g = Generator(config, params, drafter, auto_params(drafter))  # cost_profile "cached"
    g.run(ids, gen)  # measures the profile once (written under LSJAX_PROFILE_DIR)

    def no_prefill(*a, **k):  # the run read the costs: `decode.py --json` must not prefill again to report them
        raise AssertionError("prefilled again")

    monkeypatch.setattr("lsjax.engine.profiling.prefilled", no_prefill)
    split = time_split(g, ids, gen)
    assert split["step_ms_source"] == "profile" and split["step_ms_by_candidate"]["ar"] > 0


def test_a_ticker_label_can_follow_what_it_reports(capsys):
    """A label given as a function is read at each tick: "loading ... (prefilling meanwhile)" becomes
    "prefilling" once the program is ready, the count going on."""
    ready = threading.Event()
    err = ""
    with decode.Ticker("compiling", every=0.1) as ticker:
        ticker.restart(lambda: "prefilling 9 prompt tokens" if ready.is_set() else "loading (prefilling meanwhile)")
        deadline = time.perf_counter() + 10
        while "loading" not in err and time.perf_counter() < deadline:
            time.sleep(0.05)
            err += capsys.readouterr().err
        ready.set()
        while "prefilling 9" not in err and time.perf_counter() < deadline:
            time.sleep(0.05)
            err += capsys.readouterr().err
    labels = [line.rsplit(": ", 1)[0] for line in (err + capsys.readouterr().err).splitlines()]
    assert "[lsjax] loading (prefilling meanwhile)" in labels and labels[-1] == "[lsjax] prefilling 9 prompt tokens"
    assert labels == sorted(labels, key=lambda label: "prefilling 9" in label), labels


def test_the_ticker_restarts_under_a_new_label(capsys):
    # Ticks may land late on a loaded machine, so the test reads the count, not the exact last line: after 2 s
    # under the first label, a restart must count from 0 again (without it the count would be >= 2).
    err = ""
    with decode.Ticker("compiling", every=0.2) as ticker:
        time.sleep(2.0)
        ticker.restart("prefilling 9 prompt tokens")
        deadline = time.perf_counter() + 10
        while "prefilling" not in err and time.perf_counter() < deadline:
            time.sleep(0.05)
            err += capsys.readouterr().err
    lines = (err + capsys.readouterr().err).splitlines()
    assert lines[0] == "[lsjax] compiling: 0s", lines
    labels = [line.rsplit(": ", 1)[0] for line in lines]
    assert labels == sorted(labels, key=lambda label: "prefilling" in label), lines  # no old label after the new
    first = next(line for line in lines if "prefilling" in line)
    assert first.startswith("[lsjax] prefilling 9 prompt tokens: ") and int(first.rsplit(" ", 1)[1][:-1]) <= 1, lines


def test_invariant_rows_out_of_range_or_with_a_mesh():
    assert only_line(run_decode("--prompt", "hi", "--invariant-rows", "5000")) == (
        "decode.py: error: --invariant-rows must be in [0, 1024] (0 = off) or auto, got 5000"
    )
    assert only_line(run_decode("--prompt", "hi", "--invariant-rows", "many")) == (
        "decode.py: error: --invariant-rows must be an integer in [0, 1024] (0 = off) or auto, got 'many'"
    )
    assert only_line(run_decode("--prompt", "hi", "--invariant-rows", "auto", "--mesh", "model=1")) == (
        "decode.py: error: --invariant-rows with --mesh: batch-invariant numerics run on one device only for now"
    )
    assert only_line(run_decode("--prompt", "hi", "--invariant-rows", "8", "--mesh", "model=1")) == (
        "decode.py: error: --invariant-rows with --mesh: batch-invariant numerics run on one device only for now"
    )
