"""Ship a trained EAGLE-3 or DFlash draft with the package, with its card, and let `auto` run it (a developer
tool, run from a checkout: it writes into `lsjax/drafts/`).

    python -m lsjax.bench.draft_accept --method eagle3 --draft DIR --suite dev --json dev.json
    python -m lsjax.bench.draft_accept --method eagle3 --draft DIR --suite heldout --json heldout.json
    python -m tools.ship_draft --method eagle3 --draft DIR --dev dev.json --heldout heldout.json [--auto]

The draft is read for the bundled target as decoding reads it, so a draft of another target or a corrupt one stops
here in one line. Its files go to `lsjax/drafts/<target>/<method>/` unchanged (the published layout), beside
`accept.json` (the `draft_accept` summaries of both suites and their rows) and a generated `MODEL_CARD.md`. From
then on `--method eagle3` (or `dflash`) runs it without `--draft`.

`--auto` also makes it the draft `auto` runs for the target on accelerators (the target's `auto.json`), and only
when its dev first-level acceptance is above that of the draft auto runs now (its `accept.json`): dev chooses,
held-out is reported and never compared. `--force` replaces the choice without that comparison.
"""

from __future__ import annotations

import argparse
import datetime
import importlib
import json
import shutil
import sys
from pathlib import Path

from lsjax.errors import InputError

METHODS = {"eagle3": "EAGLE-3", "dflash": "DFlash"}
ACCEPT = "accept.json"
CARD = "MODEL_CARD.md"
# (key, temperature): what a card and a comparison read from `draft_accept`'s rows.
KEYS = (("first", 0.0), ("top2", 0.0), ("chain2", 0.0), ("chain4", 0.0), ("sampled", 1.0), ("sampled2", 1.0))


def summary(report: dict, suite: str, draft: str, where: str) -> dict:
    """The mean over prompts of each `KEYS` entry of one draft's rows in a `draft_accept --json` report, which
    must be of `suite`. Rows are the draft's as `draft_accept` named it (`draft`); a report of one draft is
    read whatever it was called."""
    got = report.get("suite")
    if got != suite:
        raise InputError(f"{where}: a draft_accept report of the {suite} suite is needed, this one is of {got!r}")
    rows = report.get("rows") or []
    names = sorted({r.get("draft") for r in rows})
    if draft not in names:
        if len(names) != 1:
            raise InputError(f"{where}: no rows of draft {draft}; it has {', '.join(map(str, names)) or 'none'}")
        draft = names[0]
    rows = [r for r in rows if r.get("draft") == draft]
    out = {"prompts": len({r["prompt"] for r in rows})}
    for key, temp in KEYS:
        vals = [r[key] for r in rows if r.get("T") == temp and key in r]
        if vals:
            out[key] = round(sum(vals) / len(vals), 4)
    if "first" not in out:
        raise InputError(f"{where}: no T = 0 rows with `first` for draft {draft}")
    return {"summary": out, "rows": rows}


def auto_choice_first(model_path) -> tuple[str, float | None]:
    """(the method auto runs now for the target, its dev first-level acceptance from its accept.json or None)."""
    from lsjax.methods.auto.config import shipped_choice
    from lsjax.methods.longspec.checkpoint import shipped_dir

    method, path = shipped_choice(model_path) or ("longspec", shipped_dir(model_path))
    acc = Path(path) / ACCEPT
    first = json.loads(acc.read_text())["dev"]["summary"]["first"] if acc.is_file() else None
    return method, first


def card(method: str, target: str, files: list[Path], fmt: str, dev: dict, heldout: dict, auto: bool) -> str:
    """The model card: what the draft is, where it came from, and what it accepts on both suites."""
    name = METHODS[method]
    size = sum(f.stat().st_size for f in files) / 1e6
    cols = [k for k, _ in KEYS if k in dev["summary"] or k in heldout["summary"]]
    head = "| suite | prompts | " + " | ".join(c if c != "sampled" else "T = 1 sampled" for c in cols) + " |"
    lines = [head, "|" + "---|" * (len(cols) + 2)]
    for label, s in (("dev (chooses)", dev["summary"]), ("held-out (reported)", heldout["summary"])):
        vals = " | ".join(f"{s[c]:.3f}" if c in s else "-" for c in cols)
        lines.append(f"| {label} | {s['prompts']} | {vals} |")
    runs = f"`--method {method}` runs this draft without `--draft`"
    if auto:
        runs += "; `--method auto` runs it on accelerators (`../auto.json`)"
    made = ""
    for extra in ("lsjax_export.json", "job.json"):
        if any(f.name == extra for f in files):
            made = f" How it was trained: `{extra}` beside the weights."
    return "\n".join(
        [
            f"# {name} draft for {target}",
            "",
            f"{runs}. Layout: {fmt} (the published one, as lsjax reads and writes it). Files: "
            f"{', '.join(f'`{f.name}`' for f in files)} ({size:.1f} MB). Shipped {datetime.date.today()} with "
            f"`python -m tools.ship_draft`.{made}",
            "",
            "## Acceptance",
            "",
            "Teacher-forced on the target's own continuations (`python -m lsjax.bench.draft_accept --method "
            f"{method} --draft DIR --suite dev`, then `--suite heldout`; rows in `{ACCEPT}`): `first` is the "
            "share of roots whose first drafted token is the target's greedy next token, `chain4` a 4-token "
            "chain's tokens per verification, `T = 1 sampled` the acceptance probability of a drafted child.",
            "",
            *lines,
            "",
        ]
    )


def ship(model, method: str, draft: str | Path, dev: dict, heldout: dict, auto: bool = False, force: bool = False):
    """Copy the draft at `draft` into the package for `model`'s target (see the module's docstring); returns the
    directory written. `dev`/`heldout` are `draft_accept --json` reports."""
    from lsjax.methods import registry
    from lsjax.methods.auto.config import AUTO_CHOICE
    from lsjax.methods.longspec.checkpoint import shipped_dir, target_key

    if method not in METHODS:
        raise InputError(f"--method: one of {', '.join(METHODS)} ships this way, got {method!r}")
    src = Path(draft)
    if not (src / "config.json").is_file():
        raise InputError(f"--draft {draft}: no config.json there (a {METHODS[method]} draft directory has one)")
    registry.build(method, model, draft=str(src))  # reads it for this target: refuses another target's draft
    fmt = importlib.import_module(f"lsjax.methods.{method}.checkpoint").draft_info(argparse.Namespace(draft=str(src)))
    fmt = fmt["format"]
    acc = {
        "dev": summary(dev, "dev", str(draft), "--dev"),
        "heldout": summary(heldout, "heldout", str(draft), "--heldout"),
    }
    target_dir = shipped_dir(model.path)
    if auto and not force:
        current, first = auto_choice_first(model.path)
        new = acc["dev"]["summary"]["first"]
        if first is not None and new <= first:
            raise InputError(
                f"--auto: this draft's dev first-level acceptance {new:.3f} is not above {first:.3f}, the {current} "
                "draft's that auto runs now (--force replaces it anyway)"
            )
    out = shipped_dir(model.path, method)
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    files = []
    for f in sorted(p for p in src.iterdir() if p.is_file() and p.name not in (ACCEPT, CARD)):
        shutil.copyfile(f, out / f.name)
        files.append(out / f.name)
    (out / ACCEPT).write_text(json.dumps(acc, indent=1) + "\n")
    (out / CARD).write_text(card(method, target_key(model.path), files, fmt, acc["dev"], acc["heldout"], auto))
    if auto:
        (target_dir / AUTO_CHOICE).write_text(json.dumps({"draft": method}) + "\n")
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m tools.ship_draft", description=__doc__.split("\n\n")[0])
    p.add_argument("--method", required=True, choices=tuple(METHODS))
    p.add_argument("--draft", required=True, metavar="DIR", help="the draft, in its published layout")
    p.add_argument("--dev", required=True, metavar="JSON", help="draft_accept --suite dev --json's report of it")
    p.add_argument("--heldout", required=True, metavar="JSON", help="the same with --suite heldout")
    p.add_argument("--auto", action="store_true", help="make it the draft auto runs, if dev says it accepts more")
    p.add_argument("--force", action="store_true", help="with --auto: without comparing on dev")
    args = p.parse_args(argv)
    reports = {}
    for flag in ("dev", "heldout"):
        f = Path(getattr(args, flag))
        try:
            reports[flag] = json.loads(f.read_text())
        except OSError as e:
            p.error(f"--{flag} {f}: {e.strerror}")
        except ValueError:
            p.error(f"--{flag} {f}: not JSON (draft_accept --json writes it)")
    from lsjax.errors import LsjaxError
    from lsjax.loading import load_model

    try:
        out = ship(load_model(), args.method, args.draft, reports["dev"], reports["heldout"], args.auto, args.force)
    except LsjaxError as e:
        p.error(str(e))
    print(f"shipped: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
