"""Seconds to read and load each program stored in a program cache, one after another in this process (nothing
else running): what a `decode.py` start's loads cost the CPU, beside the prefill they share it with.

    python scripts/program_load_time.py DIR [--no-fastbins]

DIR: a program cache (`python scripts/first_call_cost.py DIR make` fills one with `auto`'s programs; `--method ar`
after DIR, AR's). `--no-fastbins` loads as decode.py does (`lsjax.engine.cpu.no_fastbins`); glibc tunables
(`GLIBC_TUNABLES=glibc.malloc.mxfast=0`, ...) apply when set in the environment.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0].startswith("-"):
        print(__doc__, file=sys.stderr)
        return 2
    if "--no-fastbins" in argv:
        from lsjax.engine import cpu

        cpu.no_fastbins()
    import pickle
    import zlib

    import jax
    from jax.experimental.serialize_executable import deserialize_and_load

    from lsjax.engine.programs import SUFFIX

    jax.devices()
    rows = []
    # smallest first: the first load in a process also pays one-time set-up, which the start program's takes
    for path in sorted(Path(argv[0]).glob(f"*{SUFFIX}"), key=lambda p: p.stat().st_size):
        data = path.read_bytes()
        payload, in_tree, out_tree = pickle.loads(zlib.decompress(data))
        t = time.perf_counter()
        deserialize_and_load(payload, in_tree, out_tree)
        rows.append((path.name.removesuffix(SUFFIX).rsplit("-", 1)[0], time.perf_counter() - t, len(data)))
    for name, s, size in rows:
        print(f"{name:12s} {s:6.3f} s  ({size / 1e6:.2f} MB stored)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
