"""decode.py's command line (`python decode.py`, installed as `lsjax-decode`): parse the flags into one
`DecodeRun` (`lsjax.cli.flags`), build the model, method and generator, run, report (`lsjax.cli.report`)."""

from __future__ import annotations

import dataclasses
import sys
import threading
import time
import warnings

from lsjax.cli.console import (
    STAND_IN_LABEL,
    Ticker,
    compiling_label,
    exit_now,
    exit_on_interrupt,
    loading_label,
    rate,
)
from lsjax.cli.flags import DecodeRun, build_parser, fail, ignored_flags, parse_args, read_prompt

__all__ = [
    "DecodeRun",
    "Ticker",
    "build_parser",
    "compiling_label",
    "exit_now",
    "ignored_flags",
    "loading_label",
    "main",
    "parse_args",
    "prepared",
    "rate",
    "run_program",
]


def main(argv=None, *, as_program: bool = False, launched: float | None = None) -> int:
    """decode.py's command line: parse into a `DecodeRun`, build, run, report. `as_program`: this is the
    process (`python decode.py`), so it may set process-wide state (`Startup.for_process`: JAX's persistent
    compilation cache, the program and weight stores); called from another program (a test), it leaves the
    caller's JAX configuration alone. `launched`: what "seconds since launch" counts from."""
    launched = time.perf_counter() if launched is None else launched
    args = parse_args(argv)
    run = DecodeRun.from_args(args)
    # A warning (a kernel falling back to XLA, say) is one line on stderr, not a file:line and a source line.
    warnings.formatwarning = lambda message, category, *_a, **_k: f"decode.py: warning: {message}\n"
    # The engine's imports come after argument parsing, so `--help` and flag errors stay quick.
    startup = weights = None
    if as_program:
        from lsjax.runtime import Startup

        startup, weights = Startup.for_process(run.compile_cache, "decode.py", launch_tag(run))
    return build_and_run(run, startup, weights, launched)


def build_and_run(run: DecodeRun, startup, weights, launched: float) -> int:
    """The model, the method and the generator of `run`, run on its prompt and reported; the exit status."""
    from lsjax import mesh as mesh_lib
    from lsjax.engine.host import Generator, check_prompt
    from lsjax.errors import LsjaxError
    from lsjax.loading import hub, load_model, read_header
    from lsjax.runtime import compile_beside_load

    text, chat = read_prompt(run.prompt, run.prompt_file, run.chat)
    if not text.strip():
        fail("the prompt is empty")
    mesh = None
    if run.mesh:  # the mesh against the devices here before the model loads (its heads are checked after)
        try:
            mesh = mesh_lib.make(run.mesh)
        except mesh_lib.MeshError as e:
            fail(str(e))
    store = startup.store if startup is not None else None
    try:
        t0 = time.perf_counter()
        model_path = hub.resolve(run.model, "--model") if run.model is not None else None
        run = run.with_draft(hub.resolve(run.draft, "--draft")) if hub.is_repo_id(run.draft) else run
        header = read_header(model_path, dtype=run.dtype)
        tok = header.tokenizer
        if chat:
            rendered = tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True)
            ids = tok.encode(rendered, add_special_tokens=False)  # the template already holds the special tokens
        else:
            ids = tok.encode(text)
        check_prompt(header.config, ids, run.gen.max_new_tokens)
        ahead = None
        if mesh is None and run.precompile is None and compile_beside_load():
            # A method that does not read the target's weights (AR, prompt lookup, a draft-less auto) compiles
            # its programs from the target's shapes while the weights load (`Ahead`).
            made = build_method(header.pending(), run)
            if made is not None:
                ahead = Ahead(*made, run, ids, startup)
        model = load_model(model_path, dtype=run.dtype, store=weights, header=header)
        load_s = time.perf_counter() - t0
        if ahead is None:
            drafter, draft_params, config = build_method(model, run)
            model = model._replace(config=config)
            if mesh is not None:
                mesh_lib.check(model.config, mesh, batch=1)
            params = prepared(model, weights) if mesh is None else model.params
            generator = Generator(
                model.config, params, drafter, draft_params, backend=run.backend, mesh=mesh, startup=startup
            )
        else:
            generator, drafter = ahead.generator, ahead.generator.drafter
            model = model._replace(config=generator.config)
            generator.give_weights(prepared(model, weights))
        print(
            f"[lsjax] {model.path.name} ({model.config.dtype}): {len(ids)} prompt tokens, method {run.method}, "
            f"loaded in {load_s:.1f}s; compiling...",
            file=sys.stderr,
            flush=True,
        )
        if run.precompile is not None:
            from lsjax.cli.precompile import precompile

            return precompile(generator, ids, run)
        stream = tok.stream_decoder(skip_special_tokens=True)
        on_tokens = None if run.json else (lambda new: print(stream.push(new), end="", flush=True))
        stand_in = ahead.stand_in if ahead is not None else generator.stands_in(ids, run.gen, seed=run.seed)
        result, done_at = generate(generator, drafter, ids, run, on_tokens, stand_in, ahead)
        if not run.json:
            print(stream.flush())
        baseline = split = None
        if run.compare == "ar":
            baseline = Generator(model.config, model.params, backend=run.backend, mesh=mesh)
            baseline = baseline.run(ids, run.gen, seed=run.seed)
        if run.json and run.method != "ar" and not result.ar_stand_in:
            from lsjax.engine.profiling import time_split

            split = time_split(generator, ids, run.gen, seed=run.seed)
    except (LsjaxError, FileNotFoundError) as e:
        fail(str(e))
    except Exception as e:
        if store is None or not store.hits or type(e).__name__ != "JaxRuntimeError":
            raise
        # A program loaded from disk that XLA cannot run: dropped, so the next run compiles afresh.
        store.clear()
        fail(
            f"a compiled program from {store.root} failed to run ({str(e).splitlines()[0]}); it was removed: run again"
        )
    from lsjax.cli.report import report

    times = {"launched": launched, "done_at": done_at, "load_s": load_s}
    report(run, result, model, mesh, tok, chat, generator, baseline, split, times)
    finish(generator, startup, weights, run)
    return 0


def finish(generator, startup, weights, run: DecodeRun) -> None:
    """After the output: a first start's weights are written for the next start; a run that decoded while its
    programs compiled (`auto` from AR's group) compiles the rest and measures its costs at this width, so the
    next start loads and reads them; the rest of what was still loading is not needed. The programs this start
    fetched first are noted for the next start's read-ahead."""
    if weights is not None:
        from lsjax.runtime import weights as store

        if store.pending():  # a first start's weights, written now that the output is out
            print("[lsjax] keeping the weights as loaded, for the next start (Ctrl-C skips)...", file=sys.stderr)
            store.start_writes()
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
    if startup is not None and startup.store is not None:  # (after `finish`: it may have made the first programs)
        startup.store.remember(launch_tag(run), generator.first_programs())


def generate(generator, drafter, ids: list[int], run: DecodeRun, on_tokens, stand_in: bool, ahead):
    """The run, with a status line while its programs are made and its prompt prefilled."""
    from lsjax.engine.step import variant_groups

    programs = len(variant_groups(generator.drafter)) if generator.splits() else 1
    label = STAND_IN_LABEL if stand_in else compiling_label(drafter, programs)
    with Ticker(label) as ticker:
        # The decode program compiles on a host thread while the prompt is prefilled.
        if ahead is not None:
            compile_s = ahead.wait()
        else:
            compile_s = generator.compile(ids, run.gen, seed=run.seed, background=True)
        prefilling = f"prefilling {len(ids)} prompt tokens"
        making = loading_label(drafter, programs) if generator.loading_decode else label
        prefilled = threading.Event()

        def status() -> str:
            # While the first decode program is made beside the prefill, both; once it is ready the prefill;
            # after the prefill, the program's wait.
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
            ids, run.gen, seed=run.seed, on_tokens=on_tokens, on_ready=ticker.stop, on_prefilled=on_prefilled
        )
    done_at = time.perf_counter()
    result.compile_s += compile_s  # the prefill program's; run added the decode program's
    return result, done_at


def build_method(model, run: DecodeRun):
    """(drafter, draft params, the target's config with `--invariant-rows`) of `run.method` for `model`, what its
    builder says printed one line each; None where `model`'s weights are still to come (`ModelHeader.pending`)
    and the method reads them (a draft sharing the target's embeddings): built again once they are loaded."""
    from lsjax.engine.types import invariant_rows_for
    from lsjax.errors import MethodNote, WeightsPending
    from lsjax.methods import registry

    with warnings.catch_warnings(record=True) as notes:
        warnings.simplefilter("always", MethodNote)
        try:
            drafter, draft_params = registry.build(run.method, model, **dict(run.options))
        except WeightsPending:
            return None
    for note in notes:  # what the method's builder says about what it will run, one line each
        if issubclass(note.category, MethodNote):
            print(f"[lsjax] {note.message}", file=sys.stderr)
        else:
            warnings.warn_explicit(note.message, note.category, note.filename, note.lineno)
    config = model.config
    if run.invariant_rows:  # after the build, which reads no numerics setting, since auto sizes it
        rows = invariant_rows_for(drafter) if run.invariant_rows == "auto" else run.invariant_rows
        if rows < drafter.num_nodes:
            fail(
                f"--invariant-rows {rows}: --method {run.method} verifies trees of up to {drafter.num_nodes} "
                f"nodes, which {rows} rows do not fit; give >= {drafter.num_nodes}, or auto"
            )
        config = dataclasses.replace(config, invariant_rows=rows)
    return drafter, draft_params, config


class Ahead:
    """A start's programs made from the target's shapes while its weights load (`Generator.give_weights`), where
    the load leaves cores free (`lsjax.runtime.compile_beside_load`): a first start compiles beside the load."""

    def __init__(self, drafter, draft_params, config, run: DecodeRun, ids, startup):
        import concurrent.futures

        from lsjax.engine.host import Generator
        from lsjax.models import target

        self.generator = Generator(
            config, target.abstract_params(config), drafter, draft_params, backend=run.backend, startup=startup
        )
        self.stand_in = self.generator.stands_in(ids, run.gen, seed=run.seed)
        self._compiled = concurrent.futures.Future()

        def compile_():
            try:
                self._compiled.set_result(self.generator.compile(ids, run.gen, seed=run.seed, background=True))
            except BaseException as e:  # raised by `wait`  # noqa: BLE001
                self._compiled.set_exception(e)

        # A daemon: a load that fails (a damaged file) exits with its one line, not after the compile.
        threading.Thread(target=compile_, daemon=True, name="lsjax-ahead").start()

    def wait(self) -> float:
        """The seconds the start's programs took to make (as `Generator.compile` returns them); its error, if any."""
        return self._compiled.result()


def prepared(model, weights):
    """The target's params as the engine decodes with them (`prepare_for_decode`), read-only, kept in `weights`
    (the weight store's directory, `lsjax.runtime.weights`) by the first start and mapped back by later ones."""
    from lsjax.models import target
    from lsjax.runtime import weights as store

    file = store.model_file(model.path) if weights is not None else None
    if file is None:  # this process's own copy, which nothing changes: used in place (`store.read_only`)
        return store.read_only(target.prepare_for_decode(model.params, model.config))
    what = ("prepared", file, model.config.dtype, target.default_layout())
    return store.kept(weights, what, lambda: target.prepare_for_decode(model.params, model.config))


def launch_tag(run: DecodeRun) -> str:
    """What a start's first programs follow from, known before the model loads: the model file (as it is on
    disk) and every setting but the prompt's and the report's (`DecodeRun.program_settings`)."""
    from lsjax.errors import LsjaxError
    from lsjax.loading import default_model_path
    from lsjax.runtime import weights

    try:
        model = weights.model_file(run.model or default_model_path()) or (run.model,)
    except LsjaxError:  # (the load names what is wrong)
        model = (run.model,)
    return repr((model, run.program_settings()))


def run_program(launched: float | None = None) -> None:
    """`python decode.py` and `lsjax-decode`: this process is the program (Ctrl-C exits at once; the process
    ends as soon as its output is out)."""
    exit_on_interrupt()
    exit_now(main(as_program=True, launched=launched))
