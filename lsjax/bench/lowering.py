"""Lower a function for a TPU or CUDA chip from any host (this CPU included), without the hardware.

`jax.export` lowers for a platform other than the host's, but the Pallas lowerings also ask which chip they
target: Mosaic (TPU) reads the chip kind and its TensorCore count, Pallas Triton (CUDA) the GPU kind. Both
read them from the abstract mesh in scope when it names an `AbstractDevice`, which is the one way that works
on JAX 0.10 and 0.11 alike (patching `jax._src.pallas.mosaic.tpu_info` stopped steering the chip in 0.11,
and 0.11's Triton lowering refuses to guess an abstract GPU). `lsjax.bench.plan` and tests/test_lowering.py
use it; nothing below the benchmarks imports it.

    with abstract_target("tpu", "TPU v5 lite"):
        exported = jax.export.export(jax.jit(fn), platforms=("tpu",))(*args)
    text = export_text(fn, args, "cuda")  # StableHLO text, the Triton custom calls allowed
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence

import jax

# Chip kinds as the runtime reports `device_kind`. v4 and v5p put two TensorCores behind one device
# (megacore); the lite chips have one. An H100 SXM has 132 SMs.
TPU_KINDS = ("TPU v4", "TPU v5 lite", "TPU v5p", "TPU v6 lite")
MEGACORE = ("TPU v4", "TPU v5p")
DEFAULT_KIND = {"tpu": "TPU v5 lite", "cuda": "NVIDIA H100 80GB HBM3"}
GPU_CORES = {"NVIDIA H100 80GB HBM3": 132}
# `jax.Device.platform` of the chip: a CUDA device reports "gpu" (what `jax.export` calls "cuda").
DEVICE_PLATFORM = {"tpu": "tpu", "cuda": "gpu"}
# Export refuses to serialize a Triton custom call unless told to; that refusal is not a lowering failure.
TRITON_CALL = "__gpu$xla.gpu.triton"


def _num_cores(platform: str, kind: str) -> int | None:
    if platform == "tpu":
        return 2 if kind in MEGACORE else 1
    return GPU_CORES.get(kind)


@contextlib.contextmanager
def abstract_target(platform: str, kind: str | None = None) -> Iterator[jax.sharding.AbstractMesh]:
    """Scope in which Pallas lowers for `platform` ("tpu" | "cuda") on a chip of `kind` (a `device_kind`
    string; default TPU v5 lite / H100): a one-device abstract mesh that names that chip."""
    if platform not in DEVICE_PLATFORM:
        raise ValueError(f"platform must be one of {sorted(DEVICE_PLATFORM)}, got {platform!r}")
    kind = kind or DEFAULT_KIND[platform]
    device = jax.sharding.AbstractDevice(
        device_kind=kind, num_cores=_num_cores(platform, kind), platform=DEVICE_PLATFORM[platform]
    )
    # Auto axes: the default differs between 0.10 (Auto) and 0.11 (Explicit); one device either way.
    mesh = jax.sharding.AbstractMesh((1,), ("x",), axis_types=(jax.sharding.AxisType.Auto,), abstract_device=device)
    with jax.sharding.use_abstract_mesh(mesh):
        yield mesh


def export(fn, args: Sequence, platform: str, kind: str | None = None) -> jax.export.Exported:
    """`jax.export` of `jax.jit(fn)` at `args` (arrays or `jax.ShapeDtypeStruct`s) for one chip."""
    checks = [jax.export.DisabledSafetyCheck.custom_call(TRITON_CALL)] if platform == "cuda" else []
    with abstract_target(platform, kind):
        return jax.export.export(jax.jit(fn), platforms=(platform,), disabled_checks=checks)(*args)


def export_text(fn, args: Sequence, platform: str, kind: str | None = None) -> str:
    """StableHLO text of `fn` exported for `platform` ("tpu" | "cuda") on a chip of `kind`."""
    return export(fn, args, platform, kind).mlir_module()
