"""Session-wide fixtures: the real default model, ours and transformers', loaded once for every test file."""

from __future__ import annotations

import os

import pytest

# The suite's time is XLA:CPU compiling (two thirds of it: ~11,600 programs, most a tiny model's), not running
# them; LLVM's optimisation levels cost a third of each compile and buy nothing on programs this small. Set before
# JAX starts its backend; exactness tests compare programs compiled alike, and subprocesses that set their own
# XLA_FLAGS (the meshes) keep theirs.
if "--xla_backend_optimization_level" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} --xla_backend_optimization_level=0".strip()


@pytest.fixture(scope="session")
def ours():
    """lsjax's load of the default SmolLM2 GGUF: config, params (numpy), tokenizer."""
    from lsjax.loading import load_model

    return load_model()


@pytest.fixture(scope="session")
def hf_gguf_tokenizer():
    """transformers' tokenizer and config from the default GGUF (~15 s: once per session)."""
    pytest.importorskip("torch")
    import transformers

    from lsjax.loading import default_model_path

    path = default_model_path()
    tok = transformers.AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    return tok, transformers.AutoConfig.from_pretrained(path.parent, gguf_file=path.name)


@pytest.fixture(scope="session")
def hf_gguf():
    """transformers' model (eval, fp32) from the same GGUF (~60 s on 2 cores: its dequantization; slow tests)."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("accelerate")
    import transformers

    from lsjax.loading import default_model_path

    path = default_model_path()
    model = transformers.AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32)
    return model.eval()


@pytest.fixture(autouse=True, scope="module")
def _release_compiled_programs():
    """Free each module's compiled programs when it ends. Every XLA:CPU executable holds its own memory
    mappings; the whole suite's (~1000 programs) exceeded the kernel's map limit and LLVM aborted with
    "Cannot allocate memory" at ~10 GB RSS."""
    yield
    import gc

    import jax

    jax.clear_caches()
    gc.collect()


# Modules that tell a program compiled from one read from JAX's persistent cache (the program store's "compiled"
# against "jax-cache", decode.py's counts) run without the suite's shared cache.
OWN_CACHE = {"test_programs", "test_precompile", "test_bench_launch"}


@pytest.fixture(autouse=True, scope="module")
def _shared_compile_cache(request, tmp_path_factory):
    """JAX's persistent compilation cache for the whole run, shared by the pytest-xdist workers: most modules
    compile the same tiny model's programs, and each module's are dropped when it ends
    (`_release_compiled_programs`), so a later module reads them instead of compiling them again. Locked
    (`jax_compilation_cache_max_size` turns JAX's file lock on), so one worker never reads another's half-written
    entry."""
    import os

    import jax
    from jax._src import compilation_cache

    root = tmp_path_factory.getbasetemp()
    shared = (root.parent if os.environ.get("PYTEST_XDIST_WORKER") else root) / "jax-compile-cache"
    want = None if request.module.__name__.rsplit(".", 1)[-1] in OWN_CACHE else str(shared)
    if jax.config.jax_compilation_cache_dir != want:
        compilation_cache.reset_cache()  # JAX decides once per process whether it has a cache
        jax.config.update("jax_compilation_cache_dir", want)
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.2)
        jax.config.update("jax_compilation_cache_max_size", 8 << 30)
    yield
