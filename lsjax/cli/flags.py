"""decode.py's flags, parsed once into one frozen `DecodeRun`; a bad value is one line and exit status 2 before
anything loads."""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

HELP = """Generate text with lsjax (`python decode.py`, installed as `lsjax-decode`).

    python decode.py                                  # default model, bundled long prompt, streamed
    python decode.py --prompt-file doc.txt --chat --max-new-tokens 200
    python decode.py --model path/to/model.gguf --prompt "def fib(n):" --json
    python decode.py --model HuggingFaceTB/SmolLM2-135M-Instruct --prompt "Hi" --chat

--model and --draft take a local path or a Hugging Face repository id (downloaded into the Hugging Face cache
when online; read from it with HF_HUB_OFFLINE=1).

Errors in the input (missing file, empty prompt, a prompt longer than the
context window, a bad flag value) print one line and exit with status 2; a
method option the chosen method does not read prints one warning line. Ctrl-C
prints one line and exits with status 130.

Compiled programs are kept on disk (JAX's persistent cache, and whole programs
found without tracing: lsjax.runtime.programs), so a second run of the same
decode starts in a fraction of the time: ~/.cache/lsjax/jax-cache
($XDG_CACHE_HOME/lsjax/jax-cache), moved or turned off by --compile-cache DIR|off
or $LSJAX_COMPILE_CACHE (lsjax.runtime.cache).
"""
DEFAULT_PROMPT = Path(__file__).resolve().parents[1] / "assets" / "default_prompt.txt"
# Settings that change only the prompt or the report: starts that differ in them alone fetch the same programs
# first (`DecodeRun.program_settings`).
PER_PROMPT = ("prompt", "prompt_file", "chat", "json", "compare", "seed", "gen")


def fail(msg: str) -> None:
    print(f"decode.py: error: {msg}", file=sys.stderr)
    sys.exit(2)


def _presets() -> dict:
    from lsjax.presets import PRESETS

    return PRESETS


def build_parser() -> tuple[argparse.ArgumentParser, tuple[str, ...]]:
    """The parser, and the dests of the method options: each method folder's options dataclass
    (`lsjax.methods.<name>.config`) declares its own flags, so a method registered anywhere brings them."""
    from lsjax.methods import registry

    methods = [registry.get(n) for n in registry.names()]
    p = argparse.ArgumentParser(
        prog="decode.py", description=HELP, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--model",
        help="a .gguf file, an HF safetensors directory, or a Hugging Face repository id (default: "
        "SmolLM2-135M-Instruct)",
    )
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


def read_prompt(prompt: str | None, prompt_file: str | None, chat: bool) -> tuple[str, bool]:
    """The prompt text and whether to apply the chat template."""
    if prompt is not None:
        return prompt, chat
    path = Path(prompt_file) if prompt_file else DEFAULT_PROMPT
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
    return text, chat or prompt_file is None


@dataclasses.dataclass(frozen=True)
class DecodeRun:
    """One decode.py run, as its flags say, checked: a bad value raises `lsjax.config.ConfigError` naming the
    flag (`from_args` makes it one line and exit status 2). `options`: the method options set, as (name,
    value) pairs."""

    method: str
    gen: object  # lsjax.config.GenerateConfig
    options: tuple = ()
    model: str | None = None
    prompt: str | None = None
    prompt_file: str | None = None
    chat: bool = False
    compare: str | None = None
    backend: str = "auto"
    mesh: str | None = None
    dtype: str = "auto"
    invariant_rows: int | str = 0
    json: bool = False
    precompile: str | None = None
    compile_cache: str | None = None
    seed: int = 0

    def __post_init__(self):
        from lsjax.config import ConfigError
        from lsjax.methods import registry

        opts = dict(self.options)
        tree = opts.get("tree")
        if tree is not None and not str(tree).strip():
            raise ConfigError(
                "--tree is empty: give a preset (paper, gpu, cpu, cpu-small, chain4, chain8) or widths, e.g. 2,2,2"
            )
        if self.compile_cache is not None and not self.compile_cache.strip():
            raise ConfigError("--compile-cache is empty: give a directory, or off")
        try:  # the chosen method's options, checked before anything loads (a one-line error naming the flag)
            registry.get(self.method).make_options(**opts)
        except ValueError as e:
            name, sep, rest = str(e).partition(": ")
            raise ConfigError(f"{registry.flag_of(name)}: {rest}" if sep and name.isidentifier() else str(e)) from e
        if self.dtype not in ("auto", "bf16", "fp32"):
            raise ConfigError(f"--dtype must be bf16, fp32 or auto, got {self.dtype!r}")
        rows = self.invariant_rows
        if rows != "auto" and not (isinstance(rows, int) and 0 <= rows <= 1024):
            raise ConfigError(f"--invariant-rows must be in [0, 1024] (0 = off) or auto, got {rows}")
        if rows and self.mesh:
            raise ConfigError("--invariant-rows with --mesh: batch-invariant numerics run on one device only for now")
        if self.precompile is not None and (self.mesh or (self.compile_cache or "").strip() == "off"):
            why = "--mesh: programs over a mesh are not kept" if self.mesh else "--compile-cache off: nothing is kept"
            raise ConfigError(f"--precompile with {why}; precompile on one device with a compile cache")
        if self.mesh and registry.get(self.method).no_mesh:
            raise ConfigError(
                f"--method {self.method} with --mesh: it cannot decode on a mesh "
                f"({registry.get(self.method).no_mesh}); drop --mesh"
            )

    @property
    def draft(self) -> str | None:
        return dict(self.options).get("draft")

    def with_draft(self, path) -> DecodeRun:
        """This run with `--draft` resolved to a local directory (a Hugging Face repository id's snapshot)."""
        options = tuple((k, str(path) if k == "draft" else v) for k, v in self.options)
        return dataclasses.replace(self, options=options)

    def program_settings(self) -> list:
        """Every setting but the prompt's and the report's: what a start's first programs follow from."""
        fields = [(f.name, getattr(self, f.name)) for f in dataclasses.fields(self) if f.name not in PER_PROMPT]
        return sorted((k, repr(v)) for k, v in fields)

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> DecodeRun:
        """The run the parsed flags describe; a bad value is one line and exit status 2, and a method option the
        method does not read one warning line."""
        from lsjax.config import ConfigError, GenerateConfig, SamplingConfig

        method = args.method or "auto"
        ignored = ignored_flags(args, method)
        if ignored:
            verb = "does" if len(ignored) == 1 else "do"
            print(
                f"decode.py: warning: {', '.join(ignored)} {verb} not apply to --method {method} (ignored)",
                file=sys.stderr,
            )
        rows = args.invariant_rows
        if rows != "auto":
            try:
                rows = int(rows)
            except ValueError:
                fail(f"--invariant-rows must be an integer in [0, 1024] (0 = off) or auto, got {rows!r}")
        try:
            sampling = SamplingConfig(
                temperature=args.temperature,
                top_k=args.top_k,
                top_p=args.top_p,
                min_p=args.min_p,
                draft_sampling=args.draft_sampling,
                penalty=args.penalty,
                penalty_window=args.penalty_window,
            )
            gen = GenerateConfig(max_new_tokens=args.max_new_tokens, sampling=sampling, ignore_eos=args.ignore_eos)
            return cls(
                method=method,
                gen=gen,
                options=tuple(sorted(method_options(args).items())),
                model=args.model,
                prompt=args.prompt,
                prompt_file=args.prompt_file,
                chat=args.chat,
                compare=args.compare,
                backend=args.backend,
                mesh=args.mesh,
                dtype=args.dtype,
                invariant_rows=rows,
                json=args.json,
                precompile=args.precompile,
                compile_cache=args.compile_cache,
                seed=args.seed,
            )
        except ConfigError as e:
            fail(str(e))
