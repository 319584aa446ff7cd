"""auto's cost profile (`lsjax.methods.auto.profile`): keyed by device, model, backend and candidates, measured
once and read after, rebuilt when damaged or when it may not hold, borrowed by a new prompt width from its nearest
neighbour."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from lsjax.methods.auto import profile as auto_profile
from tests.test_auto import FULL
from tests.tiny import tiny_model

NAMES = ("ar", "pld-4", "ls-tree")


def test_profile_is_keyed_by_device_model_backend_and_candidates(tmp_path, monkeypatch):
    monkeypatch.setenv("LSJAX_PROFILE_DIR", str(tmp_path))
    p = auto_profile.profile_path("cpu", "SmolLM2", "auto", NAMES)
    assert p.parent == tmp_path
    others = [
        auto_profile.profile_path("TPU v5 lite", "SmolLM2", "auto", NAMES),
        auto_profile.profile_path("cpu", "Llama-3", "auto", NAMES),
        auto_profile.profile_path("cpu", "SmolLM2", "pallas", NAMES),
        auto_profile.profile_path("cpu", "SmolLM2", "auto", NAMES + ("hybrid",)),
    ]
    assert len({p, *others}) == 5
    assert (
        auto_profile.entry_key(1024, True) != auto_profile.entry_key(2048, True) != auto_profile.entry_key(2048, False)
    )


def test_a_draft_of_another_shape_has_its_own_profile():
    """The profile key holds the draft's tensor shapes: a deeper draft (or another vocabulary) is measured on its
    own; new values of the same shapes (a retrained draft, the measured costs) are not."""
    from lsjax.config import DraftConfig
    from lsjax.methods.longspec.model import random_draft_params

    config, _ = tiny_model()
    one = random_draft_params(config, np.uint32([0, 1]), draft=DraftConfig())
    again = random_draft_params(config, np.uint32([0, 2]), draft=DraftConfig())
    two = random_draft_params(config, np.uint32([0, 1]), draft=DraftConfig(depth=2))
    sig = auto_profile.draft_signature
    assert sig(one) == sig(again) == sig({**one, "costs": np.ones(3)}) != sig(two)
    assert sig(()) == sig({}) == ""
    assert sig({**one, "vocab_ids": np.arange(8)}) != sig(one)


def test_profiles_live_beside_the_program_cache_unless_placed(tmp_path, monkeypatch):
    from lsjax.runtime import cache as compile_cache

    monkeypatch.delenv("LSJAX_PROFILE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert auto_profile.profile_dir() == tmp_path / "xdg" / "lsjax" / "profiles"
    assert auto_profile.profile_dir().parent == compile_cache.default_dir().parent
    monkeypatch.setenv("LSJAX_PROFILE_DIR", str(tmp_path / "mine"))
    assert auto_profile.profile_dir() == tmp_path / "mine"


def test_a_cpu_profile_names_the_processor_and_its_cores(monkeypatch):
    class Dev:
        def __init__(self, platform, kind):
            self.platform, self.device_kind = platform, kind

    assert auto_profile.device_name(Dev("gpu", "NVIDIA H200")) == "NVIDIA H200"
    here = auto_profile.device_name(Dev("cpu", "cpu"))
    assert here.startswith("cpu ") and here != "cpu "
    monkeypatch.setattr(auto_profile.os, "sched_getaffinity", lambda pid: {0, 1, 2, 3, 4, 5, 6, 7, 8}, raising=False)
    wider = auto_profile.device_name(Dev("cpu", "cpu"))
    assert wider.endswith(" x9") and wider != here
    paths = {auto_profile.profile_path(k, "SmolLM2", "auto", NAMES) for k in (here, wider)}
    assert len(paths) == 2


def test_a_profile_measured_on_another_device_is_named(tmp_path, monkeypatch):
    monkeypatch.setenv("LSJAX_PROFILE_DIR", str(tmp_path))
    epyc = auto_profile.profile_path("cpu AMD EPYC 9B14 x2", "SmolLM2", "auto", NAMES)
    xeon = auto_profile.profile_path("cpu Intel(R) Xeon(R) Processor x2", "SmolLM2", "auto", NAMES)
    assert auto_profile.measured_elsewhere(xeon) == []
    auto_profile.write_profile(epyc, NAMES, {"2048/greedy": [0.07, 0.1, 0.12]}, {})
    auto_profile.write_profile(auto_profile.profile_path("cpu x", "Llama-3", "auto", NAMES), NAMES, {}, {})
    auto_profile.write_profile(auto_profile.profile_path("cpu y", "SmolLM2", "auto", NAMES[:2]), NAMES[:2], {}, {})
    assert auto_profile.measured_elsewhere(xeon) == ["cpu_AMD_EPYC_9B14_x2"]  # not another model or candidate set
    assert auto_profile.measured_elsewhere(epyc) == []


def test_profile_is_measured_once_then_read(tmp_path):
    path, calls = tmp_path / "p.json", []

    def measure():
        calls.append(1)
        return [0.05, 0.07, 0.06]

    costs, fresh = auto_profile.cached_costs(path, NAMES, "1024/greedy", measure)
    assert fresh and len(calls) == 1 and np.allclose(costs, [0.05, 0.07, 0.06])
    costs, fresh = auto_profile.cached_costs(path, NAMES, "1024/greedy", measure)
    assert not fresh and len(calls) == 1
    auto_profile.cached_costs(path, NAMES, "4096/greedy", measure)  # another bucket: measured, kept beside
    assert len(calls) == 2 and set(json.loads(path.read_text())["entries"]) == {"1024/greedy", "4096/greedy"}
    auto_profile.cached_costs(path, NAMES[:2], "1024/greedy", lambda: [1.0, 2.0])  # other candidates: stale
    assert auto_profile.read_profile(path, NAMES) == {}


@pytest.mark.parametrize(
    "content",
    [
        b"",
        b"{not json",
        b"\x00\xff\xfe",
        b'{"format": 1, "candidates": ["ar", "pld-4", "ls-tree"], "entries": []}',
        b'{"format": 1, "candidates": ["ar", "pld-4", "ls-tree"], "entries": {"1024/greedy": [1, -2, "x"]}}',
        b'{"format": 99, "candidates": ["ar", "pld-4", "ls-tree"], "entries": {"1024/greedy": [1, 2, 3]}}',
    ],
)
def test_corrupt_profile_is_rebuilt(tmp_path, content):
    path = tmp_path / "p.json"
    path.write_bytes(content)
    costs, fresh = auto_profile.cached_costs(path, NAMES, "1024/greedy", lambda: [0.1, 0.2, 0.3])
    assert fresh and np.allclose(costs, [0.1, 0.2, 0.3])
    assert auto_profile.read_profile(path, NAMES) == {"1024/greedy": [0.1, 0.2, 0.3]}


def test_a_profile_that_may_not_hold_is_measured_again_with_one_line(tmp_path, capsys):
    """Another lsjax version's file, or an entry whose AR step now takes other time than when it was measured
    (a profile cached while the machine was busy), is measured again and says why; a fresh one is used."""
    path = tmp_path / "p.json"
    auto_profile.write_profile(path, NAMES, {"1024/greedy": [0.1, 0.2, 0.3]}, {"lsjax": "0.0.9"})
    costs, fresh = auto_profile.cached_costs(path, NAMES, "1024/greedy", lambda: [0.5, 0.6, 0.7], version="0.1.0")
    assert fresh and np.allclose(costs, [0.5, 0.6, 0.7])
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        f"[lsjax] auto's cost profile {path.name} was measured by lsjax 0.0.9, this is 0.1.0: measuring it again"
    ]
    assert json.loads(path.read_text())["lsjax"] == "0.1.0"

    def check(ar_now):
        return lambda entry: auto_profile.stale_reason(ar_now, entry[0])

    costs, fresh = auto_profile.cached_costs(path, NAMES, "1024/greedy", lambda: [9, 9, 9], check(0.55), "0.1.0")
    assert not fresh and np.allclose(costs, [0.5, 0.6, 0.7]) and not capsys.readouterr().err  # within 1.35x
    costs, fresh = auto_profile.cached_costs(path, NAMES, "1024/greedy", lambda: [1.0, 1.2, 1.4], check(1.0), "0.1.0")
    assert fresh and np.allclose(costs, [1.0, 1.2, 1.4])
    assert capsys.readouterr().err.strip().splitlines() == [
        "[lsjax] an AR step takes 1000.0 ms now and took 500.0 ms when auto's cost profile was measured "
        "(another load on the machine?): measuring auto's costs again"
    ]


def test_stale_reason_bounds():
    assert auto_profile.stale_reason(None, 0.1) is None  # nothing could be timed: keep the profile
    assert auto_profile.stale_reason(0.1 * 1.3, 0.1) is None and auto_profile.stale_reason(0.1 / 1.3, 0.1) is None
    assert auto_profile.stale_reason(0.1 * 1.4, 0.1) and auto_profile.stale_reason(0.1 / 1.4, 0.1)


def test_profiles_of_two_configurations_of_one_model_live_apart(tmp_path, monkeypatch):
    """bf16 and fp32 steps of one model cost other ratios: the model configuration keys the file."""
    monkeypatch.setenv("LSJAX_PROFILE_DIR", str(tmp_path))
    config, _ = tiny_model()
    sig = type(config).signature
    fp32, bf16 = sig(config), sig(dataclasses.replace(config, dtype="bfloat16"))
    assert fp32 != bf16 and fp32 == sig(dataclasses.replace(config))
    paths = {auto_profile.profile_path("cpu", "tiny", "auto", NAMES, s) for s in (fp32, bf16, "")}
    assert len(paths) == 3


def test_prior_costs_grow_with_the_tree():
    prior = auto_profile.prior_costs(FULL)
    by = dict(zip((c.name for c in FULL.candidates), prior))
    assert by["ar"] == 1.0 and by["pld-4"] < by["pld-8"] and by["ls-chain2"] < by["ls-chain4"] < by["hybrid"]


def test_a_new_prompt_width_borrows_its_nearest_neighbours_profile(tmp_path):
    """Only ratios steer the policy: a width without an entry takes the nearest width's (same sampling mode)
    rather than measuring before its first speculative step; its own entry, another mode's or none: no."""
    path = tmp_path / "p.json"
    assert auto_profile.borrowed_costs(path, NAMES, 2048, True) is None  # no file
    entries = {"1024/greedy": [0.1, 0.2, 0.3], "8192/greedy": [0.4, 0.5, 0.6], "2048/sampled": [1.0, 1.0, 1.0]}
    auto_profile.write_profile(path, NAMES, entries, {})
    costs, width = auto_profile.borrowed_costs(path, NAMES, 2048, True)
    assert width == 1024 and np.allclose(costs, [0.1, 0.2, 0.3])
    assert auto_profile.borrowed_costs(path, NAMES, 4096, True)[1] == 8192  # 2x from 8192, 4x from 1024
    assert auto_profile.borrowed_costs(path, NAMES, 1024, True) is None  # its own entry is read as it is
    assert auto_profile.borrowed_costs(path, NAMES, 4096, False)[1] == 2048  # the same sampling mode only
    assert auto_profile.borrowed_costs(path, NAMES[:2], 2048, True) is None  # other candidates: not this file's
