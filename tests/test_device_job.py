"""The draft-at-scale job (tools/device/device_job.py) on a CPU: the tiny target end to end within its budget, the
prompt file, and its bad input as one line each."""

from __future__ import annotations

import json

import numpy as np
import pytest

from lsjax.errors import LsjaxError
from tools.device import device_job as dj


@pytest.mark.jax011
def test_the_tiny_job_generates_trains_and_exports_within_its_budget(tmp_path):
    lines = []
    # 45 s: compiling the generator and the train step takes ~25 s of it on 2 busy cores (the clock covers all)
    job = dj.JobConfig(budget_minutes=0.75, gen_share=0.25, gen_batch=4, max_new_tokens=8)
    cfg = dj.tiny_train_config(tmp_path)
    report = dj.run(cfg, job, None, tmp_path, tiny=True, log=lines.append, config_path="configs/train/x.yaml")
    assert report["within_budget"] and report["total_s"] <= 45
    assert report["distilled_rows"] >= 4 and report["answer_tokens"] > 0
    assert report["train_steps"] > 0 and report["tokens_trained"] == report["train_steps"] * 4 * 64
    assert json.loads((tmp_path / "job.json").read_text())["train_steps"] == report["train_steps"]
    assert any("the budget ended the stage after" in line for line in lines)  # says it stopped early

    from lsjax.methods.longspec.checkpoint import load_draft

    arrays, draft_cfg, meta = load_draft(tmp_path / "draft")  # a draft decode.py can load
    assert draft_cfg.window == 16 and meta["device_job"]["train_steps"] == report["train_steps"]
    assert meta["train_config"] == "configs/train/x.yaml"  # what made it, after what it continued
    raw = (tmp_path / "draft" / "model.safetensors").read_bytes()
    header = json.loads(raw[8 : 8 + int.from_bytes(raw[:8], "little")])
    assert {v["dtype"] for k, v in header.items() if k != "__metadata__"} == {"BF16"}  # stored in bf16
    assert len(raw) < 16 << 20 and set(arrays) >= {"self_wq", "cross_wq", "w_down"}


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["dflash", "eagle3"])
def test_the_job_trains_and_exports_another_kind(tmp_path, kind):
    """Any registered kind goes through the same three phases, exported in its published layout."""
    job = dj.JobConfig(budget_minutes=1.5, gen_share=0.2, gen_batch=4, max_new_tokens=8)
    report = dj.run(dj.tiny_train_config(tmp_path, kind), job, None, tmp_path, tiny=True, log=lambda _: None)
    assert report["kind"] == kind and report["train_steps"] > 0
    config = json.loads((tmp_path / "draft" / "config.json").read_text())
    if kind == "dflash":
        assert config["block_size"] == 4  # z-lab's config.json
    else:
        assert config["draft_vocab_size"] == 64  # EAGLE's config.json


def test_a_tiny_stage_of_an_unknown_kind_is_one_line(tmp_path, capsys):
    line = main_line(capsys, "--tiny", "--kind", "nope", "--out", str(tmp_path))
    assert line.startswith("device job: error: --kind: no tiny stage for kind 'nope'; choose from longspec")


def test_the_prompt_file_round_trips(tmp_path):
    ps = dj.tiny_prompts(vocab=300, n=5, length=17)
    dj.write_prompts(tmp_path / "p.npz", ps)
    back = dj.read_prompts(tmp_path / "p.npz")
    assert back.ids == ps.ids and back.tasks == ps.tasks and back.vocab_size == 300
    assert all(np.array_equal(a, b) for a, b in zip(back.tokens, ps.tokens, strict=True))


def test_a_missing_or_truncated_prompt_file_is_one_line(tmp_path):
    with pytest.raises(LsjaxError, match=r"^prompts file not found: .*--make-prompts builds it\)$"):
        dj.read_prompts(tmp_path / "nope.npz")
    dj.write_prompts(tmp_path / "p.npz", dj.tiny_prompts(vocab=300, n=50, length=400))
    data = (tmp_path / "p.npz").read_bytes()
    (tmp_path / "cut.npz").write_bytes(data[: len(data) // 2])
    with pytest.raises(LsjaxError, match=r"^prompts file .*cut.npz is damaged or truncated"):
        dj.read_prompts(tmp_path / "cut.npz")


def main_line(capsys, *argv) -> str:
    assert dj.main(list(argv)) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    return err[0]


def test_the_command_line_says_what_is_wrong_in_one_line(tmp_path, capsys):
    dj.write_prompts(tmp_path / "p.npz", dj.tiny_prompts(vocab=300, n=3, length=10))
    line = main_line(capsys, "--prompts", str(tmp_path / "p.npz"), "--out", str(tmp_path / "o"))
    assert line.startswith("device job: error: no accelerator here (JAX sees only a CPU)")  # read before that
    assert main_line(capsys, "--prompts", str(tmp_path / "x.npz"), "--out", str(tmp_path)).startswith(
        "device job: error: prompts file not found"
    )
    assert main_line(capsys, "--tiny", "--out", str(tmp_path), "--gen-share", "1.5") == (
        "device job: error: gen_share: must be in (0, 1), got 1.5"
    )
    assert main_line(capsys, "--tiny") == "device job: error: --out is required"
    assert main_line(capsys, "--tiny", "--out", str(tmp_path / "t"), "--max-new-tokens", "400").startswith(
        "device job: error: self-distill: no prompt leaves room for 400 answer tokens in a row of 64"
    )


def test_later_passes_answer_each_prompt_another_way_and_are_read_back(tmp_path):
    from lsjax.cli.distill import sampling_index
    from lsjax.train.data import load_distilled

    # pass 0 alternates greedy/sampled parts, pass 1 flips them, later passes only sample (greedy would repeat)
    assert [sampling_index(p) for p in range(4)] == [0, 1, 0, 1]
    assert [sampling_index(p, parity=1) for p in range(4)] == [1, 0, 1, 0]
    assert {sampling_index(p, parity=0, sampled_only=True) for p in range(4)} == {1}
    for sub, value in (("", 1), ("pass-01", 2), ("pass-02", 3)):
        (tmp_path / sub).mkdir(exist_ok=True)
        tokens = np.full((2, 8), value, np.int32)
        np.savez(tmp_path / sub / "part-00000.npz", tokens=tokens, loss_mask=tokens > 0)
    tokens, mask = load_distilled(tmp_path)
    assert tokens[:, 0].tolist() == [1, 1, 2, 2, 3, 3] and mask.all()


def test_the_schedule_is_sized_to_the_time_left():
    from lsjax.train.config import OptimConfig

    optim = dj.sized_schedule(OptimConfig(warmup_steps=20, total_steps=900), seconds=300, steps_per_s=7.0)
    assert (optim.total_steps, optim.warmup_steps) == (2100, 20)
    tiny = dj.sized_schedule(OptimConfig(warmup_steps=20, total_steps=900), seconds=1, steps_per_s=0.5)
    assert (tiny.total_steps, tiny.warmup_steps) == (2, 1)
    with pytest.raises(Exception, match="steps_per_s"):
        dj.JobConfig(steps_per_s=-1)
