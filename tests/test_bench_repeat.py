"""`lsjax.bench.repeat`'s report: auto and its variants are each compared with the best *fixed* method."""

from __future__ import annotations

import pytest

from lsjax.bench import repeat


def _rows():
    speed = {"ar": (1.0, 1.0), "auto": (1.10, 0.95), "auto-free": (1.20, 0.80), "pld": (1.05, 0.60)}
    rows = []
    for i, pid in enumerate(("a", "b")):
        for m, s in speed.items():
            rows.append(
                {
                    "prompt": pid,
                    "T": 0.0,
                    "method": m,
                    "speedup": s[i],
                    "cpu_speedup": s[i],
                    "tau": 1.0 if m == "ar" else 1.5,
                    "tok_s": 10.0 * s[i],
                    "equal_to_ar": True,
                }
            )
    return rows


def test_report_compares_auto_variants_with_fixed_methods_only(capsys):
    repeat.report(_rows(), ["ar", "auto", "pld", "auto-free"], [0.0])
    out = capsys.readouterr().out
    # pld is the only fixed method (mean 0.825x): auto's variant must not be taken as the "best fixed".
    assert "auto = 124.2% of the best fixed method (pld); worst prompt b 0.95x" in out
    assert "auto-free = 121.2% of the best fixed method (pld); worst prompt b 0.80x" in out
    # Each method's means (the paper's Table 2 columns): tau, tok/s, speed over AR.
    assert "| ar | 1.00 | 10.0 | 1.00x |" in out and "| pld | 1.50 | 8.2 | 0.82x |" in out


def test_bad_variant_is_one_line_exit_2(capsys):
    with pytest.raises(SystemExit) as e:
        repeat.main(["--variant", "no-equals-sign"])
    assert e.value.code == 2
    assert "--variant 'no-equals-sign'" in capsys.readouterr().err


def test_report_reprints_saved_runs_without_decoding(tmp_path, capsys):
    import json

    path = tmp_path / "run.json"
    path.write_text(json.dumps({"command": ["lsjax/bench/repeat.py", "--suite", "dev"], "rows": _rows()}))
    assert repeat.main(["--report", str(path)]) == 0
    out = capsys.readouterr().out
    assert "run: lsjax/bench/repeat.py --suite dev" in out
    assert "| a | 0 | 1.10x (1.10-1.10), tau 1.50 |" in out  # per prompt: speed over AR and tau
    assert "auto = 124.2% of the best fixed method (pld)" in out


def test_report_of_a_file_that_is_not_a_run_is_exit_2(tmp_path, capsys):
    bad = tmp_path / "notes.json"
    bad.write_text("[1, 2]")
    with pytest.raises(SystemExit) as e:
        repeat.main(["--report", str(bad)])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "--report" in err and "not a file written by --out" in err.strip().splitlines()[-1]


def test_accept_memory_counts_the_rate_after_a_hit_and_after_a_miss(capsys):
    from lsjax.bench.accept_memory import main, memory

    # hit, hit, miss, hit, miss, miss: after a hit (3 steps) 1 of 3 hits; after a miss (2 steps) 1 of 2.
    p, p11, p01, n1, n0 = memory([2, 1, 0, 1, 0, 0])
    assert (round(p, 3), round(p11, 3), round(p01, 3), n1, n0) == (0.5, 0.333, 0.5, 3, 2)
    # Alternating steps: all memory, no hit after a hit.
    assert memory([1, 0, 1, 0, 1])[1:3] == (0.0, 1.0)
    with pytest.raises(SystemExit) as e:
        main(["--steps", "1"])
    assert e.value.code == 2 and "--steps: must be >= 2" in capsys.readouterr().err


def test_saved_command_names_the_module_and_no_path_of_this_machine():
    """Saved rows go into docs/: the command they carry is the one a user types, whatever the paths here."""
    args = ["--suite", "dev", "--out", "/some/where/runs/dev.json", "--methods", "auto"]
    got = repeat.portable_command(args)
    assert got == ["python", "-m", "lsjax.bench.repeat", "--suite", "dev", "--out", "dev.json", "--methods", "auto"]
    assert not any("/" in a for a in got)
