"""Session-wide fixtures: the real default model, ours and transformers', loaded once for every test file."""

from __future__ import annotations

import pytest


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
