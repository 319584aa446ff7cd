"""What a user of the library measures; run each as `python -m lsjax.bench.<name>` (docs/benchmarks.md).

run           the evaluation harness: every method on a suite's prompts; speed, tau, T = 0 equality
tables        a run's aggregates, results.md and figures, and the Markdown tables of the docs
repeat        methods against AR in interleaved rounds; each method's extra parameters and FLOPs per step
methods       the harness's method adapters; as a command, AR decoding against HF transformers
draft_accept  a draft's acceptance, teacher-forced on the target's own continuations, without timing
launch        `decode.py` as a user launches it, the default method against AR, cold and warm
plan          per-chip memory and roofline on a TPU/GPU mesh, from the compiler (`lowering`: for chips not here)
device        the device check on a GPU/TPU (its parts: `device_kernels`, `device_model`)

The one-off studies and paper sweeps are in the repository's studies/, outside the package.
"""
