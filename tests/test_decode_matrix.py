"""Every registered method in every decode.py mode (one device, a 2-way mesh, batch-invariant rows, T = 1 with
top-p, --compare ar, auto's cost profile measured then read from its cache, on one device and on the mesh),
through decode.py's own `main()` on a tiny target with fake CPU devices (tests/decode_matrix.py). A cell runs,
and at T = 0 writes AR's tokens, or is refused before anything compiles with one line; none may crash.

The default suite runs the default method (auto) with its profile, on one device and on the mesh (~2 min);
the whole matrix (~13 min on 2 cores) is `slow`: pytest -m slow tests/test_decode_matrix.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from lsjax.methods import registry

ROOT = Path(__file__).resolve().parents[1]

# The combinations decode.py refuses, and what their one line must say. A refusal not listed here fails (for
# a built-in method: a regression that hides behind a clean exit); a method added later may be refused.
REFUSED = {
    ("streams", "mesh"): "--method streams with --mesh: it cannot decode on a mesh",
}
BUILTIN = set(registry.BUILTIN) | {"block"}


def matrix(tmp_path: Path, selection: str, arch: str = "llama") -> list[dict]:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "tests" / "decode_matrix.py"), "2", str(tmp_path), selection],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=1500,
        env={**os.environ, "LSJAX_MATRIX_ARCH": arch},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]


def problems(cells: list[dict], reference: str) -> list[str]:
    """What is wrong with each cell, against AR's one-device text `reference`."""
    from tests.decode_matrix import GREEDY, NEW

    bad = []
    for c in cells:
        where = f"{c['method']} x {c['mode']}"
        if c["status"] == "crashed":
            bad.append(f"{where}: crashed\n{c.get('error') or c.get('stderr')}")
            continue
        if c["status"] == "refused":
            said = REFUSED.get((c["method"], c["mode"].removesuffix("-profile")))
            if len(c["errors"]) != 1 or "Traceback" in c["stderr"] or "compiling" in c["stderr"]:
                bad.append(f"{where}: refused without one line before compiling: {c['stderr']}")
            elif said is None and c["method"] in BUILTIN:
                bad.append(f"{where}: refused, expected to run: {c['errors'][0]}")
            elif said is not None and said not in c["errors"][0]:
                bad.append(f"{where}: refused with {c['errors'][0]!r}, expected {said!r}")
            continue
        if (c["method"], c["mode"].removesuffix("-profile")) in REFUSED:
            bad.append(f"{where}: ran, expected the refusal {REFUSED[c['method'], c['mode']]!r}")
        out = c["out"]
        if out["new_tokens"] != NEW:
            bad.append(f"{where}: {out['new_tokens']} tokens, asked for {NEW}")
        if c["mode"] in GREEDY and out["text"] != reference:
            bad.append(f"{where}: differs from AR at T = 0")
        if c["mode"] == "compare" and not out.get("identical_to_ar"):
            bad.append(f"{where}: --compare ar says different")
        if c["mode"].endswith("profile"):
            again = c["cached"]
            if again["status"] != "ran" or again["out"]["text"] != reference:
                bad.append(f"{where}: the run from the cached profile: {again}")
            # Read from the cache, or found there and measured again only because an AR step no longer takes
            # what it took (a tiny model's ~1 ms step on a busy machine), which says it found the entry.
            elif not c["profiled"] or (
                again["profiled"] and not any("AR step takes" in x for x in again["profile_lines"])
            ):
                bad.append(
                    f"{where}: the profile was not measured once and then read from the cache: {again['profile_lines']}"
                )
    return bad


def check(tmp_path: Path, selection: str, arch: str = "llama") -> list[dict]:
    cells = matrix(tmp_path, "ar:one," + selection, arch)
    reference = next(c for c in cells if (c["method"], c["mode"]) == ("ar", "one"))["out"]["text"]
    bad = problems(cells, reference)
    assert not bad, "\n".join(bad)
    return cells


@pytest.mark.slow  # the default run keeps mesh equality in tests/test_mesh.py
def test_the_default_on_a_mesh_with_its_profile(tmp_path):
    """The default method on a 2-way mesh (issue 56's crash; its trees run LongSpec's draft there), its cost
    profile measured there and on one device. Every other method on the mesh: the slow set (below)."""
    cells = check(tmp_path, "auto:profile,auto:mesh-profile")
    assert {(c["method"], c["mode"]) for c in cells} >= {("auto", "mesh-profile"), ("auto", "profile")}
    _profiles_keyed_by_mesh(tmp_path)


@pytest.mark.slow  # ~7 min: every method on the mesh and the default in every mode
def test_every_method_on_a_mesh_and_the_default_in_every_mode(tmp_path):
    # auto's mesh cell is its mesh-profile one (a mesh run measures its profile unless it is cached).
    on_mesh = ",".join(f"{m}:mesh" for m in registry.names() if m != "auto")
    cells = check(tmp_path, on_mesh + ",auto:sampled,auto:compare,auto:profile,auto:mesh-profile")
    methods = {c["method"] for c in cells if c["mode"].startswith("mesh")}
    assert methods == set(registry.names())  # read from the registry: a method added later is in the matrix
    assert {c["mode"] for c in cells if c["method"] == "auto"} >= {"profile", "mesh-profile", "sampled", "compare"}
    _profiles_keyed_by_mesh(tmp_path)


def _profiles_keyed_by_mesh(tmp_path):
    # The profile is keyed by the mesh: one file for one device, another for the mesh, neither read for the other.
    profiles = sorted(p.name for p in (tmp_path / "profiles").glob("*.json"))
    on_mesh = [p for p in profiles if "_mesh_model_2_data_1--" in p]
    assert len(profiles) == 2 and len(on_mesh) == 1, profiles
    assert on_mesh[0].split("--", 1)[1] == next(p for p in profiles if p not in on_mesh).split("--", 1)[1]


@pytest.mark.slow  # ~4 min: every method on one device and on the mesh
def test_every_method_on_a_qwen3_target(tmp_path):
    """Every method decodes a Qwen3-shaped target (per-head q/k norms perturbed from 1) as AR does, on one
    device and on a 2-way mesh, through decode.py."""
    cells = check(tmp_path, "*:one,*:mesh", arch="qwen3")
    assert {c["method"] for c in cells} == set(registry.names())


@pytest.mark.slow  # ~13 min on 2 cores: every method in every mode
def test_the_whole_matrix(tmp_path):
    cells = check(tmp_path, "*:*")
    assert len(cells) >= len(registry.names()) * 5


def test_the_runner_names_the_cells():
    from tests.decode_matrix import cells

    names = ("ar", "pld", "auto")
    assert cells("*:mesh", names) == [("ar", "mesh"), ("pld", "mesh"), ("auto", "mesh")]
    assert [m for m, _ in cells("*:profile", names)] == ["auto"]  # only a method with a cost profile
    assert cells("pld:one,auto:sampled", names) == [("pld", "one"), ("auto", "sampled")]


def test_a_crash_or_a_wrong_token_fails_the_matrix():
    """The checks can fail: a crash, a refusal a built-in method should not get, a T = 0 difference."""
    ok = {"status": "ran", "stderr": "", "out": {"new_tokens": 12, "text": "abc", "identical_to_ar": True}}
    measured = {**ok, "profiled": True, "profile_lines": []}
    read = {"method": "auto", "mode": "profile", **measured, "cached": {**ok, "profiled": False, "profile_lines": []}}
    assert problems([read], "abc") == []
    assert "not measured once" in problems([{**read, "cached": measured}], "abc")[0]
    assert problems([{"method": "pld", "mode": "mesh", **ok}], "abc") == []
    assert problems([{"method": "pld", "mode": "mesh", **ok}], "abd")[0].startswith("pld x mesh: differs")
    crash = {"method": "auto", "mode": "mesh", "status": "crashed", "error": "Traceback ..."}
    assert "crashed" in problems([crash], "abc")[0]
    refused = {"status": "refused", "errors": ["decode.py: error: nope"], "stderr": "decode.py: error: nope"}
    assert "expected to run" in problems([{"method": "pld", "mode": "one", **refused}], "abc")[0]
    assert problems([{"method": "streams", "mode": "mesh", **ok}], "abc")[0].endswith("cannot decode on a mesh'")
