"""Generate text with lsjax.

    python decode.py                                  # default model, bundled long prompt, streamed
    python decode.py --prompt-file doc.txt --chat --max-new-tokens 200
    python decode.py --model path/to/model.gguf --prompt "def fib(n):" --json

Errors in the input (missing file, empty prompt, a prompt longer than the
context window, a bad flag value) print one line and exit with status 2; a
method option the chosen method does not read prints one warning line. Ctrl-C
prints one line and exits with status 130.

Compiled programs are kept on disk (JAX's persistent cache, and whole programs
found without tracing: lsjax.engine.programs), so a second run of the same
decode starts in a fraction of the time: ~/.cache/lsjax/jax-cache
($XDG_CACHE_HOME/lsjax/jax-cache), moved or turned off by --compile-cache DIR|off
or $LSJAX_COMPILE_CACHE (lsjax.compile_cache).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import json
import os
import signal
import sys
import threading
import time
import warnings
from pathlib import Path

DEFAULT_PROMPT = Path(__file__).resolve().parent / "lsjax" / "assets" / "default_prompt.txt"
LAUNCHED = time.perf_counter()  # before any heavy import: what "seconds since launch" counts from


def _presets() -> dict:
    from lsjax.presets import PRESETS

    return PRESETS


def build_parser() -> tuple[argparse.ArgumentParser, tuple[str, ...]]:
    """The parser, and the dests of the method options: each method folder's options dataclass
    (`lsjax.methods.<name>.config`) declares its own flags, so a method registered anywhere brings them."""
    from lsjax.methods import registry

    methods = [registry.get(n) for n in registry.names()]
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", help="a .gguf file or an HF safetensors directory (default: SmolLM2-135M-Instruct)")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--prompt", help="the prompt text")
    src.add_argument("--prompt-file", help="read the prompt from this file")
    p.add_argument("--chat", action="store_true", help="wrap the prompt as a user turn in the model's chat template")
    p.add_argument("--max-new-tokens", type=int, default=256, help="stop after this many new tokens (default 256)")
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default); > 0 samples")
    p.add_argument("--top-k", type=int, default=0, help="sample among the k most likely tokens (0 = off)")
    p.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling mass (1 = off)")
    p.add_argument("--min-p", type=float, default=0.0, help="drop tokens below min_p x the top probability (0 = off)")
    p.add_argument(
        "--penalty",
        type=float,
        default=1.0,
        help="contextual penalty theta on the tokens of the last --penalty-window generated ones "
        "(TokenSwift; 1 = off, the paper uses 1.2 with min-p 0.1 at T=1); every method samples the same "
        "penalized distribution",
    )
    p.add_argument("--penalty-window", type=int, default=1024, help="the penalty's window W (default 1024)")
    p.add_argument("--seed", type=int, default=0, help="RNG seed for sampling")
    p.add_argument(
        "--draft-sampling",
        choices=("auto", "greedy", "sample"),
        default="auto",
        help="at T > 0, how drafters build trees: sample children from the draft (verified by recursive "
        "rejection sampling), or keep the deterministic top-k tree (sample-and-match). Both lossless; "
        "auto = sample (default)",
    )
    p.add_argument(
        "--method",
        choices=[m.name for m in methods],
        default=None,
        help="decoding method: "
        + "; ".join(f"{m.name} ({m.help})" if m.help else m.name for m in methods)
        + ". Default: auto (AR and prompt lookup, and on a GPU or TPU the draft's trees when a draft for the "
        "target is found)",
    )
    p.add_argument("--compare", choices=("ar",), help="also run AR on the same prompt; print speedup and equality")
    p.add_argument("--ignore-eos", action="store_true", help="keep generating past the end-of-sequence token")
    p.add_argument(
        "--backend",
        choices=("auto", "xla", "pallas", "reference"),
        default="auto",
        help="attention backend (default: xla on CPU, pallas on TPU/GPU)",
    )
    p.add_argument(
        "--mesh",
        default=None,
        help="decode on several devices: model=M[,data=D] splits the target's heads, MLP and K/V cache M ways "
        "(tensor parallel; M must divide the KV heads); default one device",
    )
    p.add_argument(
        "--dtype",
        default="auto",
        help="weights and K/V cache: bf16 | fp32 (default auto: fp32 on a CPU, bf16 on TPU/GPU; accumulation and "
        "softmax statistics are fp32 either way, and AR and verification share the dtype)",
    )
    p.add_argument(
        "--invariant-rows",
        default="0",
        metavar="R",
        help="batch-invariant numerics: every decode forward (AR's too) runs as R rows with attention that sums "
        "each query's keys alike in every step, so the output is AR's bit for bit in bf16 on any device; R >= the "
        "largest tree (128 covers every built-in method), the same R for runs compared; auto = the fewest the "
        "method fits (a power of 2 >= 16: fewer rows, less work per step); default 0 = off",
    )
    p.add_argument("--json", action="store_true", help="no streaming; print one JSON object with the text and timings")
    p.add_argument(
        "--preset",
        metavar="NAME",
        help="a method's own published decoding settings (flags given as well win): "
        + "; ".join(f"{name} = {text}" for name, (text, _) in _presets().items()),
    )
    p.add_argument(
        "--precompile",
        nargs="?",
        const="auto",
        default=None,
        metavar="WIDTHS",
        help="generate nothing: make the method's programs for these prompt widths (comma-separated, e.g. "
        "1024,4096; default every width up to the context window: 256, 512, 1024, ...) and --max-new-tokens, "
        "and auto's cost profile for each, ready in the compile cache, so later runs start without compiling",
    )
    p.add_argument(
        "--compile-cache",
        default=None,
        help="JAX's persistent compilation cache: a directory, or 'off' (default: $LSJAX_COMPILE_CACHE, else "
        "~/.cache/lsjax/jax-cache)",
    )
    return p, registry.add_flags(p)


def parse_args(argv=None) -> argparse.Namespace:
    from lsjax.config import ConfigError
    from lsjax.presets import expand

    parser = build_parser()[0]
    try:  # a preset is the flags it stands for, before the user's own (which win)
        argv = expand(list(sys.argv[1:] if argv is None else argv))
    except ConfigError as e:
        parser.error(str(e))
    return parser.parse_args(argv)


def ignored_flags(args: argparse.Namespace, method: str) -> list[str]:
    """The method options the user set (to other than their default) that `method` does not read."""
    from lsjax.methods import registry

    parser, dests = build_parser()
    reads = registry.get(method).options()
    return [registry.flag_of(d) for d in dests if getattr(args, d) != parser.get_default(d) and d not in reads]


def method_options(args: argparse.Namespace) -> dict:
    """{option: value} of every method option set on the command line, for `registry.build`."""
    _, dests = build_parser()
    return {d: getattr(args, d) for d in dests if getattr(args, d) is not None}


def fail(msg: str) -> None:
    print(f"decode.py: error: {msg}", file=sys.stderr)
    sys.exit(2)


def read_prompt(args) -> tuple[str, bool]:
    """The prompt text and whether to apply the chat template."""
    if args.prompt is not None:
        return args.prompt, args.chat
    path = Path(args.prompt_file) if args.prompt_file else DEFAULT_PROMPT
    if path.is_dir():
        fail(f"prompt file is a directory: {path}")
    if not path.is_file():
        fail(f"prompt file not found: {path}")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        fail(f"prompt file is not UTF-8 text: {path}")
    except OSError as e:
        fail(f"cannot read prompt file {path}: {e.strerror or e}")
    # The bundled prompt is an instruction (summarize the speech): it is meant for the chat template.
    return text, args.chat or args.prompt_file is None


class Ticker:
    """Elapsed seconds on stderr while something long runs in this thread (XLA compiling, which releases
    the GIL): on a terminal one line rewritten every second and cleared at the end, else a line every
    `every` seconds (a log, a pipe, `--json`)."""

    def __init__(self, label: str, every: float = 5.0):
        self.every, self.tty = every, sys.stderr.isatty()
        self._state = (label, 0.0)  # (label, start): one tuple, so the thread never pairs a new label with an old start
        self._stop = threading.Event()

    @property
    def label(self) -> str:
        return self._state[0]

    @label.setter
    def label(self, label: str):
        self._state = (label, self._state[1])

    def __enter__(self):
        self._state = (self.label, time.perf_counter())
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def _run(self):
        while not self._stop.wait(1.0 if self.tty else self.every):
            label, t0 = self._state
            label = label() if callable(label) else label  # (a label that follows what it reports)
            line = f"[lsjax] {label}: {time.perf_counter() - t0:.0f}s"
            sys.stderr.write(f"\r{line}\033[K" if self.tty else line + "\n")
            sys.stderr.flush()

    def __exit__(self, *exc):
        self.stop()

    def restart(self, label):
        """Counts again from 0 under a new label (a string, or a function returning one at each tick)."""
        self._state = (label, time.perf_counter())

    def stop(self):
        """Ends the ticker (once; later calls do nothing)."""
        if self._stop.is_set():
            return
        self._stop.set()
        self._thread.join()
        if self.tty:
            sys.stderr.write("\r\033[K")
            sys.stderr.flush()


def exit_on_interrupt(prog: str = "decode.py") -> None:
    """Ctrl-C (SIGINT) prints one line and exits with status 130 at once, even while XLA compiles (Python
    would raise KeyboardInterrupt only when the compile returns, minutes later, as a 40-line traceback): the
    signal's wakeup fd wakes a thread that exits. Only for the program's own process (the `__main__` call)."""
    r, w = os.pipe()
    os.set_blocking(w, False)
    signal.signal(signal.SIGINT, lambda *_: None)  # the main thread carries on; the thread below ends it
    signal.set_wakeup_fd(w)

    def watch():
        while signal.SIGINT not in os.read(r, 64):
            pass
        os.write(2, (("\n" if sys.stderr.isatty() else "") + f"{prog}: interrupted\n").encode())
        os._exit(130)

    threading.Thread(target=watch, daemon=True, name="sigint").start()


def rate(tokens_per_s: float) -> str:
    """A rate with at least 3 significant digits below 100 (0.42, 7.31, 42.1), whole above."""
    return f"{tokens_per_s:.0f}" if tokens_per_s >= 100 else f"{tokens_per_s:.3g}"


def main(argv=None, *, as_program: bool = False) -> int:
    """decode.py's command line. `as_program`: decode.py is the process (`python decode.py`), so it may set
    process-wide state: JAX's persistent compilation cache. Called from another program (a test), it leaves
    the caller's JAX configuration alone."""
    launched = LAUNCHED if as_program else time.perf_counter()
    args = parse_args(argv)
    method = args.method or "auto"
    if args.tree is not None and not args.tree.strip():
        fail("--tree is empty: give a preset (paper, gpu, cpu, cpu-small, chain4, chain8) or widths, e.g. 2,2,2")
    if args.compile_cache is not None and not args.compile_cache.strip():
        fail("--compile-cache is empty: give a directory, or off")
    ignored = ignored_flags(args, method)
    if ignored:
        verb = "does" if len(ignored) == 1 else "do"
        print(
            f"decode.py: warning: {', '.join(ignored)} {verb} not apply to --method {method} (ignored)",
            file=sys.stderr,
        )
    try:  # the chosen method's options, checked before anything loads (a one-line error naming the flag)
        from lsjax.methods import registry

        registry.get(method).make_options(**method_options(args))
    except ValueError as e:
        name, sep, rest = str(e).partition(": ")
        fail(f"{registry.flag_of(name)}: {rest}" if sep and name.isidentifier() else str(e))
    if args.dtype not in ("auto", "bf16", "fp32"):
        fail(f"--dtype must be bf16, fp32 or auto, got {args.dtype!r}")
    if args.invariant_rows != "auto":
        try:
            args.invariant_rows = int(args.invariant_rows)
        except ValueError:
            fail(f"--invariant-rows must be an integer in [0, 1024] (0 = off) or auto, got {args.invariant_rows!r}")
        if not 0 <= args.invariant_rows <= 1024:
            fail(f"--invariant-rows must be in [0, 1024] (0 = off) or auto, got {args.invariant_rows}")
    if args.invariant_rows and args.mesh:
        fail("--invariant-rows with --mesh: batch-invariant numerics run on one device only for now")
    if args.precompile is not None and (args.mesh or (args.compile_cache or "").strip() == "off"):
        why = "--mesh: programs over a mesh are not kept" if args.mesh else "--compile-cache off: nothing is kept"
        fail(f"--precompile with {why}; precompile on one device with a compile cache")
    if args.mesh and registry.get(method).no_mesh:
        fail(f"--method {method} with --mesh: it cannot decode on a mesh ({registry.get(method).no_mesh}); drop --mesh")
    # A warning (a kernel falling back to XLA, say) is one line on stderr, not a file:line and a source line.
    warnings.formatwarning = lambda message, category, *_a, **_k: f"decode.py: warning: {message}\n"
    # The engine's imports come after argument parsing, so `--help` and flag errors stay quick.
    programs = weights = None
    if as_program:
        from lsjax.engine import cpu

        cpu.no_fastbins()  # (before any program loads: they load faster without glibc's fastbins)
        from lsjax.compile_cache import enable, programs_dir, weights_dir
        from lsjax.engine.programs import ProgramCache

        enable(args.compile_cache, "decode.py")
        where = programs_dir(args.compile_cache)
        weights = weights_dir(args.compile_cache)
        if weights is not None:
            from lsjax.loading import stored

            stored.defer_writes()  # (begun after the output, waited for by `exit_now`)
        programs = ProgramCache(where) if where is not None else None
        if programs is not None:  # the programs the last such start fetched first, read while the model loads
            programs.read_ahead(launch_tag(args))
    from lsjax.config import ConfigError, GenerateConfig, SamplingConfig
    from lsjax.engine.host import Generator, check_prompt, compile_beside_load, first_difference
    from lsjax.errors import LsjaxError
    from lsjax.loading import load_model, read_header

    try:
        gen = GenerateConfig(
            max_new_tokens=args.max_new_tokens,
            sampling=SamplingConfig(
                temperature=args.temperature,
                top_k=args.top_k,
                top_p=args.top_p,
                min_p=args.min_p,
                draft_sampling=args.draft_sampling,
                penalty=args.penalty,
                penalty_window=args.penalty_window,
            ),
            ignore_eos=args.ignore_eos,
        )
    except ConfigError as e:
        fail(str(e))
    text, chat = read_prompt(args)
    if not text.strip():
        fail("the prompt is empty")
    mesh = None
    if args.mesh:  # the mesh against the devices here before the model loads (its heads are checked after)
        from lsjax import mesh as mesh_lib

        try:
            mesh = mesh_lib.make(args.mesh)
        except mesh_lib.MeshError as e:
            fail(str(e))

    try:
        t0 = time.perf_counter()
        header = read_header(args.model, dtype=args.dtype)
        tok = header.tokenizer
        if chat:
            rendered = tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True)
            ids = tok.encode(rendered, add_special_tokens=False)  # the template already holds the special tokens
        else:
            ids = tok.encode(text)
        check_prompt(header.config, ids, gen.max_new_tokens)
        ahead = None
        if mesh is None and args.precompile is None and compile_beside_load():
            # A method that does not read the target's weights (AR, prompt lookup, a draft-less auto) compiles
            # its programs from the target's shapes while the weights load (`Ahead`).
            built = build_method(header.pending(), method, args)
            if built is not None:
                ahead = Ahead(*built, args, ids, gen, programs, idle_loads=as_program)
        model = load_model(args.model, dtype=args.dtype, store=weights, header=header)
        load_s = time.perf_counter() - t0
        if ahead is None:
            # auto: on the held-out split it beat every fixed method on average (docs/methods/auto.md).
            drafter, draft_params, config = build_method(model, method, args)
            model = model._replace(config=config)
            if mesh is not None:
                mesh_lib.check(model.config, mesh, batch=1)
            generator = Generator(
                model.config,
                prepared(model, weights) if mesh is None else model.params,
                drafter,
                draft_params,
                backend=args.backend,
                mesh=mesh,
                program_cache=programs,
            )
            generator.idle_loads = as_program  # decode.py is the process: one decode, its loads in idle CPU time
        else:
            generator, drafter = ahead.generator, ahead.generator.drafter
            model = model._replace(config=generator.config)
            generator.give_weights(prepared(model, weights))
        print(
            f"[lsjax] {model.path.name} ({model.config.dtype}): {len(ids)} prompt tokens, method {method}, "
            f"loaded in {load_s:.1f}s; compiling...",
            file=sys.stderr,
            flush=True,
        )
        if args.precompile is not None:
            return precompile(generator, ids, gen, args, method)
        stream = tok.stream_decoder(skip_special_tokens=True)
        on_tokens = None if args.json else (lambda new: print(stream.push(new), end="", flush=True))
        stand_in = ahead.stand_in if ahead is not None else generator.stands_in(ids, gen, seed=args.seed)
        label = STAND_IN_LABEL if stand_in else compiling_label(drafter, decode_programs(generator))
        with Ticker(label) as ticker:
            # The decode program compiles on a host thread while the prompt is prefilled.
            if ahead is not None:
                compile_s = ahead.wait()
            else:
                compile_s = generator.compile(ids, gen, seed=args.seed, background=True)
            prefilling = f"prefilling {len(ids)} prompt tokens"
            making = loading_label(drafter, decode_programs(generator)) if generator.loading_decode else label
            prefilled = threading.Event()

            def status() -> str:
                # While the first decode program is made beside the prefill, both; once it is ready (one read
                # ahead: within the prefill's first second) the prefill; after the prefill, the program's wait.
                if not generator.first_pending:
                    return prefilling
                return making if prefilled.is_set() else f"{making} (prefilling meanwhile)"

            def on_prefilled() -> None:
                prefilled.set()
                if on_tokens is not None:
                    ticker.stop()  # the first token prints now: a status line would write over it
                else:
                    ticker.restart(status)

            ticker.restart(status)
            result = generator.run(
                ids, gen, seed=args.seed, on_tokens=on_tokens, on_ready=ticker.stop, on_prefilled=on_prefilled
            )
        done_at = time.perf_counter()
        result.compile_s += compile_s  # the prefill program's; run added the decode program's
        if not args.json:
            print(stream.flush())
        baseline = split = None
        if args.compare == "ar":
            baseline = Generator(model.config, model.params, backend=args.backend, mesh=mesh)
            baseline = baseline.run(ids, gen, seed=args.seed)
        if args.json and method != "ar" and not result.ar_stand_in:
            from lsjax.engine.profiling import time_split

            split = time_split(generator, ids, gen, seed=args.seed)
    except (LsjaxError, FileNotFoundError) as e:
        fail(str(e))
    except Exception as e:
        if programs is None or not programs.hits or type(e).__name__ != "JaxRuntimeError":
            raise
        # A program loaded from disk that XLA cannot run: dropped, so the next run compiles afresh.
        programs.clear()
        first = str(e).splitlines()[0]
        fail(f"a compiled program from {programs.root} failed to run ({first}); it was removed: run again")

    out_text = tok.decode(result.tokens, skip_special_tokens=True)
    summary = {
        "method": method,
        "model": str(model.path),
        "dtype": model.config.dtype,
        "invariant_rows": model.config.invariant_rows,
        "mesh": str(mesh_lib.shape_of(mesh)) if mesh is not None else None,
        "prompt_tokens": result.prompt_tokens,
        "new_tokens": result.new_tokens,
        "stop_reason": result.stop_reason,
        "load_s": round(load_s, 3),
        "compile_s": round(result.compile_s, 3),
        "prefill_s": round(result.prefill_s, 3),
        "prefill_alongside_compile": result.prefill_alongside_compile,
        "bridged_steps": result.bridged_steps,
        # A first start at this prompt width decoded with AR's own programs (`Generator.stands_in`).
        "ar_stand_in": result.ar_stand_in,
        "declined_loads": result.declined_loads,
        # How each program this run used was made ready, and when the method's own decode program took over.
        "programs": programs_json(generator.program_log),
        "programs_compiled": sum(p.how == "compiled" for p in generator.program_log),
        "programs_loaded": sum(p.how != "compiled" for p in generator.program_log),
        # Of those, read from disk while the model loaded (the programs the last such start fetched first).
        "programs_read_ahead": programs.read_ahead_hits if programs is not None else 0,
        # Seconds since launch (the process's start for `python decode.py`): what a user waits.
        "first_token_s": round(result.first_token_at - launched, 3),
        # (None: a first start that decoded with AR's programs, `ar_stand_in`: the method's never ran.)
        "decode_program_in_use_s": round(result.decode_program_at - launched, 3) if result.decode_program_at else None,
        "last_token_s": round(done_at - launched, 3),
        "decode_s": round(result.decode_s, 3),
        "tokens_per_s": round(result.tokens_per_s, 2),
        "target_forwards": result.target_forwards,
        "mean_accepted": round(result.mean_accepted, 3),
    }
    if split:
        summary.update(split)
    entry = registry.get(method)
    if entry.describe_draft:  # which draft ran, and the layout read from its directory
        summary["draft"] = registry.load(entry.describe_draft)(entry.make_options(**method_options(args)))
    if result.drafter_stats:
        summary.update(result.drafter_stats)
    if baseline is not None:
        speedup = result.tokens_per_s / baseline.tokens_per_s if baseline.tokens_per_s else 0.0
        summary.update(
            ar_tokens_per_s=round(baseline.tokens_per_s, 2),
            speedup_vs_ar=round(speedup, 3),
            identical_to_ar=baseline.tokens == result.tokens,
        )
        if baseline.tokens != result.tokens:
            summary["first_difference_vs_ar"] = first_difference(baseline.tokens, result.tokens)
    summary["text"] = out_text
    if result.stop_reason == "eos" and not out_text.strip() and not chat:
        # An instruct model given bare text often ends at once (e.g. SmolLM2-Instruct after a full sentence).
        print("[lsjax] the model ended without writing anything; for an instruct model add --chat", file=sys.stderr)
    if args.json:
        print(json.dumps(summary))
    else:
        if baseline is not None:
            same = "identical" if summary["identical_to_ar"] else "DIFFERENT"
            print(
                f"[lsjax] vs AR: {baseline.tokens_per_s:.1f} tok/s -> {result.tokens_per_s:.1f} tok/s "
                f"({summary['speedup_vs_ar']:.2f}x), outputs {same}",
                file=sys.stderr,
            )
            if not summary["identical_to_ar"]:
                import jax

                why = (
                    " (bf16 on an accelerator: a near-tied choice can round apart between AR and verification,"
                    " docs/hardware/README.md; --invariant-rows 128 makes bf16 exact)"
                    if summary["dtype"] == "bfloat16"
                    and jax.default_backend() != "cpu"
                    and not summary["invariant_rows"]
                    else " (a bug: please report it with this command)"
                )
                at = summary["first_difference_vs_ar"]
                print(f"[lsjax] first difference at new token {at}{why}", file=sys.stderr)
        # A one-token prompt's prefill rate says nothing (its time is the latency of one padded chunk).
        prefill_rate = (
            f" ({rate(result.prompt_tokens / result.prefill_s)} tok/s)"
            if result.prompt_tokens > 1 and result.prefill_s > 0
            else ""
        )
        if result.prefill_alongside_compile:
            prefill_rate += " while loading" if generator.loading_decode else " while compiling"
        print(
            f"[lsjax] {result.new_tokens} tokens ({result.stop_reason}); prefill {result.prefill_s:.2f}s"
            f"{prefill_rate}, decode {result.tokens_per_s:.1f} tok/s, "
            f"{result.target_forwards} target forwards (tau {result.mean_accepted:.2f}), "
            f"compile {result.compile_s:.1f}s"
            + (
                " (decoded as AR: this prompt width's first start)"
                if result.ar_stand_in
                else f" ({result.bridged_steps} steps restricted to the loaded programs)"
                if result.bridged_steps
                else ""
            )
            + f"; programs: {programs_said(generator.program_log)}",
            file=sys.stderr,
        )
    if weights is not None:  # (this run's store: `stored` is process-wide state)
        from lsjax.loading import stored

        if stored.pending():  # a first start's weights, written now that the output is out
            print("[lsjax] keeping the weights as loaded, for the next start (Ctrl-C skips)...", file=sys.stderr)
            stored.start_writes()
    finish(generator)
    if programs is not None:  # (after `finish`: a first start at this width made the method's own programs there)
        programs.remember(launch_tag(args), generator.first_programs())
    return 0


def build_method(model, method: str, args: argparse.Namespace):
    """(drafter, draft params, the target's config with `--invariant-rows`) of `--method` for `model`, what its
    builder says printed one line each; None where `model`'s weights are still to come (`ModelHeader.pending`)
    and the method reads them (a draft sharing the target's embeddings): built again once they are loaded."""
    from lsjax.engine.types import invariant_rows_for
    from lsjax.errors import MethodNote, WeightsPending
    from lsjax.methods import registry

    with warnings.catch_warnings(record=True) as notes:
        warnings.simplefilter("always", MethodNote)
        try:
            drafter, draft_params = registry.build(method, model, **method_options(args))
        except WeightsPending:
            return None
    for note in notes:  # what the method's builder says about what it will run, one line each
        if issubclass(note.category, MethodNote):
            print(f"[lsjax] {note.message}", file=sys.stderr)
        else:
            warnings.warn_explicit(note.message, note.category, note.filename, note.lineno)
    config = model.config
    if args.invariant_rows:  # after the build, which reads no numerics setting, since auto sizes it
        rows = invariant_rows_for(drafter) if args.invariant_rows == "auto" else args.invariant_rows
        if rows < drafter.num_nodes:
            fail(
                f"--invariant-rows {rows}: --method {method} verifies trees of up to {drafter.num_nodes} nodes, "
                f"which {rows} rows do not fit; give >= {drafter.num_nodes}, or auto"
            )
        config = dataclasses.replace(config, invariant_rows=rows)
    return drafter, draft_params, config


class Ahead:
    """A start's programs made from the target's shapes while its weights load (`Generator.give_weights`), where
    the load leaves cores free (`compile_beside_load`): a first start compiles beside the load, not after it."""

    def __init__(self, drafter, draft_params, config, args, ids, gen, programs, idle_loads: bool):
        from lsjax.engine.host import Generator
        from lsjax.models import target

        self.generator = Generator(
            config,
            target.abstract_params(config),
            drafter,
            draft_params,
            backend=args.backend,
            program_cache=programs,
        )
        self.generator.idle_loads = idle_loads  # (decode.py: read before the programs are made)
        self.stand_in = self.generator.stands_in(ids, gen, seed=args.seed)
        self._compiled = concurrent.futures.Future()

        def compile_():
            try:
                self._compiled.set_result(self.generator.compile(ids, gen, seed=args.seed, background=True))
            except BaseException as e:  # raised by `wait`  # noqa: BLE001
                self._compiled.set_exception(e)

        # A daemon: a load that fails (a damaged file) exits with its one line, not after the compile.
        threading.Thread(target=compile_, daemon=True, name="lsjax-ahead").start()

    def wait(self) -> float:
        """The seconds the start's programs took to make (as `Generator.compile` returns them); its error, if any."""
        return self._compiled.result()


def prepared(model, weights):
    """The target's params as the engine decodes with them (`prepare_for_decode`), read-only, kept in `weights`
    (decode.py's store, `lsjax.loading.stored`) by the first start and mapped back by later ones."""
    from lsjax.loading import stored
    from lsjax.models import target

    file = stored.model_file(model.path) if weights is not None else None
    if file is None:  # this process's own copy, which nothing changes: used in place (`stored.read_only`)
        return stored.read_only(target.prepare_for_decode(model.params, model.config))
    what = ("prepared", file, model.config.dtype, target.default_layout())
    return stored.kept(weights, what, lambda: target.prepare_for_decode(model.params, model.config))


# Flags that change only the prompt or the report: starts that differ in them alone fetch the same programs first
# (a prompt of another width fetches others: `ProgramCache.read_ahead` reads them for nothing, and they go unused).
PER_PROMPT = ("prompt", "prompt_file", "chat", "json", "compare", "seed", "max_new_tokens")


def launch_tag(args: argparse.Namespace) -> str:
    """What a start's first programs follow from, known before the model loads: the model file (as it is on
    disk) and every other flag but `PER_PROMPT`'s."""
    from lsjax.errors import LsjaxError
    from lsjax.loading import default_model_path, stored

    try:
        model = stored.model_file(args.model or default_model_path()) or (args.model,)
    except LsjaxError:  # (the load names what is wrong)
        model = (args.model,)
    flags = sorted((k, repr(v)) for k, v in vars(args).items() if k not in PER_PROMPT)
    return repr((model, flags))


def finish(generator) -> None:
    """After the output: a run that decoded while its programs compiled (`auto` from AR's group) compiles the
    rest and measures its costs at this width, so the next start loads and reads them; the rest of what was
    still loading is not needed."""
    if generator.owes:
        print(
            "[lsjax] compiling the method's programs and measuring its costs at this prompt width, "
            "for the next start (Ctrl-C skips)...",
            file=sys.stderr,
            flush=True,
        )
        with Ticker("compiling for the next start"):
            generator.finish()
    generator.close()


def precompile_widths(text: str, max_position: int) -> list[int]:
    """The prompt widths `--precompile` makes programs for: the ones given, else every width a prompt that fits
    the context window can have."""
    from lsjax.engine.loop import PROMPT_BUCKETS

    if text == "auto":
        return [b for b in PROMPT_BUCKETS if b < max_position] or [PROMPT_BUCKETS[0]]
    try:
        widths = [int(w) for w in text.split(",")]
    except ValueError:
        fail(f"--precompile: expected prompt widths like 1024,4096, got {text!r}")
    bad = [w for w in widths if w not in PROMPT_BUCKETS or w >= max_position]
    if bad:
        fits = [b for b in PROMPT_BUCKETS if b < max_position]
        fail(f"--precompile: {bad[0]} is not a prompt width below the context window; choose from {fits}")
    return widths


def precompile(generator, ids: list[int], gen, args, method: str) -> int:
    """`--precompile`: for each prompt width, a prompt of that width (the given one's tokens repeated) prefilled
    and decoded for a few tokens with the programs `--max-new-tokens` compiles: every program is compiled (or
    found) and stored in the compile cache, and auto measures its cost profile for the width."""
    import dataclasses

    from lsjax.engine.loop import PROMPT_BUCKETS

    widths = precompile_widths(args.precompile, generator.config.max_position)
    rows = []
    t0 = time.perf_counter()
    generator.warming_up = True  # auto measures each width's own cost profile
    for i, width in enumerate(widths):
        lower = max([b for b in PROMPT_BUCKETS if b < width], default=0)
        n = min(width - 8, generator.config.max_position - 2)
        prompt = (ids * (n // len(ids) + 1))[: max(n, lower + 1)]
        fit = dataclasses.replace(gen, max_new_tokens=min(gen.max_new_tokens, generator.config.max_position - n - 1))
        before = len(generator.program_log)
        with Ticker(f"precompiling {i + 1}/{len(widths)}: prompt width {width}"):
            generator.run(prompt, fit, seed=args.seed, max_new=64)
        made = generator.program_log[before:]
        print(f"[lsjax] width {width}: {programs_said(made) or 'already in this process'}", file=sys.stderr)
        rows.append({"width": width, "programs": programs_json(made)})
    summary = {"method": method, "precompiled": rows, "seconds": round(time.perf_counter() - t0, 1)}
    print(
        json.dumps(summary)
        if args.json
        else f"[lsjax] precompiled {len(widths)} prompt widths in {summary['seconds']:.0f}s"
    )
    return 0


def programs_json(log) -> list[dict]:
    return [{"name": p.name, "how": p.how, "s": round(p.seconds, 3)} for p in log]


def programs_said(log) -> str:
    """'start loaded, decode compiled (46.8s)': how each program was made ready, seconds where they count."""
    return ", ".join(f"{p.name} {p.how}" + (f" ({p.seconds:.1f}s)" if p.seconds >= 1 else "") for p in log)


def decode_programs(generator) -> int:
    """How many decode programs the generator makes: one per node-count group where it splits (`SplitDecode`)."""
    from lsjax.engine.step import variant_groups

    return len(variant_groups(generator.drafter)) if generator.splits() else 1


def loading_label(drafter, programs: int = 1) -> str:
    """What the ticker says while decode programs load from the compile cache (not compiled). Split
    (`programs` > 1), AR's group's loads beside the prefill and the others as auto asks for them, while it
    decodes (`SplitDecode`); two load one after the other, both beside the prefill (`host.split_loading`)."""
    from lsjax.engine.host import split_loading

    names = [n for n in getattr(drafter, "cost_names", None) or () if n != "shadow"]
    if names and programs > 1 and split_loading(stored=True, idle=True, groups=programs) == "eager":
        return f"loading auto's {programs} programs from the compile cache"
    if names and programs > 1:
        return f"loading auto's first program from the compile cache ({programs - 1} more as it asks for them)"
    what = f"auto's program ({len(names)} candidates)" if names else "the decode program"
    return f"loading {what} from the compile cache"


# A first start at a prompt width on a CPU, at T = 0 (`Generator.stands_in`): AR's programs compile in ~AR's
# time and the method's after the output.
STAND_IN_LABEL = "compiling AR's programs (this prompt width's first start; auto's compile after the output)"


def compiling_label(drafter, programs: int = 1) -> str:
    """What the compile ticker says: auto compiles all its candidates, into one program (the engine switches
    over them on device) or one per node-count group (`programs`), so it names them; it cannot say which one
    XLA is at."""
    names = getattr(drafter, "cost_names", None)
    if not names:
        return "compiling"
    steps = [n for n in names if n != "shadow"]
    into = f"as {programs} programs" if programs > 1 else "into one program"
    return f"compiling auto's {len(steps)} candidates ({', '.join(steps)}) {into}"


def exit_now(code: int) -> None:
    """Ends the process as soon as its output is out. Whatever is left then is work nobody waits for: a split
    program still loading in the background (its thread is not a daemon, so Python's exit would wait for XLA
    to finish reading it, 1-4 s on 2 cores) and tearing down the loaded executables (AR: ~0.3 s of the 0.7 s
    from its last token to the process's end). Programs compiled in the background are stored before this
    (`finish`), and the weights a first start keeps are waited for here (`lsjax.loading.stored`)."""
    sys.stdout.flush()
    sys.stderr.flush()
    stored = sys.modules.get("lsjax.loading.stored")
    if stored is not None:
        stored.wait()  # a first start's weights, kept for the next start (`stored.defer_writes`)
    os._exit(code)


if __name__ == "__main__":
    exit_on_interrupt()
    exit_now(main(as_program=True))
