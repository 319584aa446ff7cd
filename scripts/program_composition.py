"""What each stored program is made of: its optimized HLO's instructions (fused computations' included), by the
lsjax source file and function that traced them, and its YNNPACK-relevant counts. A program's load time grows
with its instructions (XLA:CPU parses its HLO from the stored proto, twice, and builds a thunk per kernel), so
this says where a smaller program would come from.

    python scripts/program_composition.py DIR [--top N]

DIR: a program cache (`python scripts/first_call_cost.py DIR make` fills one with `auto`'s programs; `--method
ar` after DIR, AR's). Instructions without a traceback (XLA's own) count under "(none)".
"""

from __future__ import annotations

import collections
import itertools
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

INSTRUCTION = re.compile(r"^\s+(?:ROOT )?%?[\w.-]+ = \S+ ([\w-]+)\(")


def _section(text: str, name: str) -> list[str]:
    """The rows of one of the tables XLA prints beside a module's computations (FileNames, StackFrames, ...)."""
    lines = text.split(f"\n{name}\n", 1)[1].splitlines() if f"\n{name}\n" in text else []
    return list(itertools.takewhile(lambda ln: ln[:1].isdigit(), lines))


def frames(text: str) -> dict[int, tuple[str, str]]:
    """stack frame id -> (file, function) of the frame itself (the innermost: what traced the instruction)."""
    files = {int(ln.split()[0]): Path(ln.split(None, 1)[1].strip('"')).name for ln in _section(text, "FileNames")}
    funcs = {int(ln.split()[0]): ln.split(None, 1)[1].strip('"') for ln in _section(text, "FunctionNames")}
    locs = {}
    for ln in _section(text, "FileLocations"):
        m = re.match(r"(\d+) \{file_name_id=(\d+) function_name_id=(\d+)", ln)
        locs[int(m[1])] = (files.get(int(m[2]), "?"), funcs.get(int(m[3]), "?"))
    out = {}
    for ln in _section(text, "StackFrames"):
        m = re.match(r"(\d+) \{file_location_id=(\d+)", ln)
        out[int(m[1])] = locs.get(int(m[2]), ("?", "?"))
    return out


def composition(text: str):
    where_of = frames(text)
    by_file, by_function, ops = collections.Counter(), collections.Counter(), collections.Counter()
    for ln in text.splitlines():
        m = INSTRUCTION.match(ln)
        if not m:
            continue
        ops[m[1]] += 1
        f = re.search(r"stack_frame_id=(\d+)", ln)
        file, func = where_of.get(int(f[1]), ("?", "?")) if f else ("(none)", "")
        by_file[file] += 1
        by_function[f"{file}:{func}"] += 1
    return by_file, by_function, ops


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0].startswith("-"):
        print(__doc__, file=sys.stderr)
        return 2
    top = int(argv[argv.index("--top") + 1]) if "--top" in argv else 12
    from lsjax.engine.programs import SUFFIX, ProgramCache

    cache = ProgramCache(argv[0])
    for path in sorted(Path(argv[0]).glob(f"*{SUFFIX}")):
        text = cache._read(path).as_text()
        by_file, by_function, ops = composition(text)
        name = path.name.removesuffix(SUFFIX).rsplit("-", 1)[0]
        print(f"{name}: {sum(ops.values())} instructions, {ops['fusion']} fusions, {ops['dot']} dots")
        print("  by file:", ", ".join(f"{f} {n}" for f, n in by_file.most_common(top)))
        print("  by function:", ", ".join(f"{f} {n}" for f, n in by_function.most_common(top)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
