"""The layers of the house (docs/design.md, "Architecture") and what each may import, read from the code's
own imports (every `import`, at module level or inside a function): a new arrow that runs up, or a cycle,
fails here with the file and the import that made it."""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# Layer of a module, bottom up. A module may import its own layer and the layers below it.
BASE, MODELS, ENGINE, TRAIN, METHODS, TOP = range(6)
# Files of a method folder that belong to training: decoding never loads them.
METHOD_TRAINING_FILES = ("train", "train_config", "train_local_head", "export", "losses", "step")


def layer(module: str) -> int:
    parts = module.split(".")
    if parts[0] != "lsjax" or module in ("lsjax", "lsjax.api") or parts[1:2] in (["bench"], ["cli"]):
        return TOP
    top = parts[1] if len(parts) > 1 else ""
    if top == "methods":
        return METHODS
    if top == "train":
        return TRAIN
    if top == "engine":
        return ENGINE
    if top in ("models", "loading", "sharding", "mesh"):  # sharding and mesh map the models' axes onto a mesh
        return MODELS
    return BASE


def module_of(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
    return ".".join(parts)


def sources() -> dict[str, Path]:
    files = list((ROOT / "lsjax").rglob("*.py")) + list((ROOT / "pallas_kernels").rglob("*.py"))
    files += [ROOT / "decode.py", ROOT / "train.py"]
    return {module_of(p): p for p in files}


MODULES = sources()


def imports(module: str) -> list[tuple[str, int]]:
    """(imported lsjax / pallas_kernels module, line) of every import in `module`, resolved to modules."""
    path = MODULES[module]
    tree = ast.parse(path.read_text(), str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(a.name, node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(
                    package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else [])
                )
            for a in node.names:
                full = f"{base}.{a.name}"
                out.append((full if full in MODULES else base, node.lineno))
    return [(m, line) for m, line in out if m.split(".")[0] in ("lsjax", "pallas_kernels")]


def test_the_scan_sees_the_imports():
    """The checks below can fail: the scan finds known arrows."""
    found = {m for m, _ in imports("lsjax.engine.loop")}
    assert {"lsjax.engine.step", "lsjax.engine.types", "lsjax.models.target"} <= found
    assert layer("lsjax.engine.loop") > layer("lsjax.models.target") > layer("lsjax.config")


@pytest.mark.parametrize("module", sorted(MODULES))
def test_no_arrow_runs_up(module):
    if module in ("decode", "train"):
        return  # the programs stand on top of everything
    if module.startswith("pallas_kernels"):
        bad = [(m, line) for m, line in imports(module) if m.startswith("lsjax")]
        assert not bad, f"kernels never import lsjax: {MODULES[module]}:{bad[0][1]} imports {bad[0][0]}"
        return
    own = layer(module)
    for target, line in imports(module):
        if target.startswith("pallas_kernels"):
            continue
        where = f"{MODULES[module].relative_to(ROOT)}:{line} imports {target}"
        assert layer(target) <= own, f"an arrow up: {where}"
        assert not (own < TOP and target.startswith("lsjax.bench")), f"only benches import lsjax.bench: {where}"


def test_decoding_never_imports_training():
    """A method's decode side (its folder minus the training files), the engine and the programs' decode path
    never import lsjax.train."""
    for module in MODULES:
        parts = module.split(".")
        decode_side = parts[:2] == ["lsjax", "engine"] or (
            parts[:2] == ["lsjax", "methods"] and parts[-1] not in METHOD_TRAINING_FILES
        )
        if module == "decode" or decode_side:
            bad = [(m, line) for m, line in imports(module) if m.startswith("lsjax.train")]
            assert not bad, f"{MODULES[module].relative_to(ROOT)}:{bad[0][1]} imports {bad[0][0]}"


def test_no_import_cycles():
    graph = {m: {t for t, _ in imports(m) if t in MODULES and t != m} for m in MODULES}
    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))
    index, low, stack, on, cycles = {}, {}, [], set(), []

    def visit(v):  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                cycles.append(sorted(comp))

    for v in graph:
        if v not in index:
            visit(v)
    assert not cycles, f"import cycles: {cycles}"


def _snake(identifier: str) -> str:
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", identifier).lower()


def method_names_in(source: str, names) -> list[tuple[int, str, str]]:
    """(line, what, the name) of each method or kind name in `source`'s code: a string (not a docstring) that
    holds it as a word, an identifier that is it or holds it between underscores (`DelsConfig`: dels_config)."""
    tree = ast.parse(source)
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    snaked = {n: n.replace("-", "_").lower() for n in names}
    words = {n: re.compile(rf"(?<![A-Za-z0-9_-]){re.escape(n)}(?![A-Za-z0-9_-])", re.IGNORECASE) for n in names}
    out = []
    for node in ast.walk(tree):
        line = getattr(node, "lineno", 0)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            out += [(line, repr(node.value), n) for n in names if words[n].search(node.value)]
            continue
        ident = {
            ast.Name: "id",
            ast.Attribute: "attr",
            ast.arg: "arg",
            ast.keyword: "arg",
            ast.FunctionDef: "name",
            ast.AsyncFunctionDef: "name",
            ast.ClassDef: "name",
            ast.alias: "asname",
        }.get(type(node))
        text = getattr(node, ident, None) if ident else None
        for part in [text] + (node.name.split(".") if isinstance(node, ast.alias) else []):
            if part:
                padded = f"_{_snake(part)}_"
                out += [(line, part, n) for n, s in snaked.items() if f"_{s}_" in padded]
    return out


def test_the_training_scaffold_names_no_method():
    """No module of lsjax/train/ names a registered method or training kind in its code: the scaffold serves
    every kind, and the method folders, which register themselves, are where a kind's name and sections live.
    Comments and docstrings are not read (a method's or a paper's name may explain a choice there)."""
    from lsjax.methods import registry

    names = sorted(set(registry.names()) | set(registry.kind_names()))
    planted = (
        '"""A docstring may say longspec."""\n'
        'KIND = "tokenswift-heads"  # so may a comment: pld\n'
        "cfg.block.size\n"
        "class DelsConfig: pass\n"
    )
    assert {n for _, _, n in method_names_in(planted, names)} == {"tokenswift-heads", "block", "dels"}
    found = [
        f"{path.relative_to(ROOT)}:{line}: {what} names {name!r}"
        for path in sorted((ROOT / "lsjax" / "train").rglob("*.py"))
        for line, what, name in method_names_in(path.read_text(), names)
    ]
    assert not found, "the training scaffold names a method:\n" + "\n".join(found)
