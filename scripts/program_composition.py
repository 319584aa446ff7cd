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
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

INSTRUCTION = re.compile(r"^\s+(?:ROOT )?%?[\w.-]+ = \S+ ([\w-]+)\(")


def _section(text: str, name: str) -> list[str]:
    """The lines of one of the tables XLA prints after a module's computations (FileNames, StackFrames, ...)."""
    lines = text.split(f"\n{name}\n", 1)[1].splitlines() if f"\n{name}\n" in text else []
    return list(_until_blank(lines))


def _until_blank(lines):
    for ln in lines:
        if not ln.strip() or not ln[0].isdigit():
            return
        yield ln


def frames(text: str):
    """stack frame id -> [(file, function)] innermost first, from the module's tables."""
    files = {
        int(ln.split()[0]): ln.split(None, 1)[1].strip('"').rsplit("/", 1)[-1] for ln in _section(text, "FileNames")
    }
    funcs = {int(ln.split()[0]): ln.split(None, 1)[1].strip('"') for ln in _section(text, "FunctionNames")}
    locs = {}
    for ln in _section(text, "FileLocations"):
        m = re.match(r"(\d+) \{file_name_id=(\d+) function_name_id=(\d+)", ln)
        locs[int(m[1])] = (files.get(int(m[2]), "?"), funcs.get(int(m[3]), "?"))
    parent = {}
    for ln in _section(text, "StackFrames"):
        m = re.match(r"(\d+) \{file_location_id=(\d+)(?: parent_frame_id=(\d+))?", ln)
        parent[int(m[1])] = (int(m[2]), int(m[3] or 0))

    def chain(f: int):
        out, seen = [], set()
        while f and f not in seen and f in parent:  # (a root frame may name itself as its parent)
            seen.add(f)
            loc, f2 = parent[f]
            out.append(locs.get(loc, ("?", "?")))
            f = f2
        return out

    return chain


def composition(text: str):
    chain = frames(text)
    by_file, by_function, ops = collections.Counter(), collections.Counter(), collections.Counter()
    for ln in text.splitlines():
        m = INSTRUCTION.match(ln)
        if not m:
            continue
        ops[m[1]] += 1
        f = re.search(r"stack_frame_id=(\d+)", ln)
        where = chain(int(f[1])) if f else []
        file, func = where[0] if where else ("(none)", "")
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
