"""Multi-host training with real processes on this machine: jax.distributed over localhost, 2 CPU devices per
process, the LongSpec trainer's own wiring (env -> jax.distributed.initialize -> mesh -> per-process rows ->
global batches -> orbax from every process). Also the pure parts: the launcher's variables, the row split,
per-process data positions, and a launch that is missing a process."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import jax
import numpy as np
import pytest
import yaml

from lsjax import sharding
from lsjax.config import ConfigError
from lsjax.train import checkpoint as ckpt_lib
from lsjax.train import data as data_lib
from tests.test_train import TINY, tiny_cfg, tiny_dict

ROOT = Path(__file__).resolve().parents[1]

# One process of a run: the real trainer (ls_train.fit), told about its peers only through the environment.
WORKER = textwrap.dedent(
    """
    import json, sys
    sys.path.insert(0, {tests!r})
    run_dir, (data, fsdp, stop_after, resume, dev) = sys.argv[1], map(int, sys.argv[2:7])
    import jax
    from test_train import tiny_cfg
    from lsjax.methods.longspec import train as ls_train
    cfg = tiny_cfg(
        run_dir, steps=4, data__batch_size=8, mesh__data=data, mesh__fsdp=fsdp, optim__total_steps=4,
        checkpoint__every=2, log__eval_every=2 * dev, log__eval_batches=1,
    )
    out = ls_train.fit(cfg, stop_after=stop_after or None, resume=bool(resume), log=lambda *a: None)
    result = dict(process=jax.process_index(), of=jax.process_count(), devices=jax.device_count())
    print("RESULT " + json.dumps(dict(result, start=out["start"], losses=out["losses"])), flush=True)
    """
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def _env(devices: int, **extra) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JAX_", "LSJAX_DIST"))}
    env |= {"XLA_FLAGS": f"--xla_force_host_platform_device_count={devices}", "PYTHONPATH": str(ROOT)}
    return env | {k: str(v) for k, v in extra.items()}


def _run(script: Path, args: list, processes: int, devices: int, timeout: float = 240) -> list[dict]:
    """Starts `processes` workers (one jax.distributed run when more than one); their RESULT lines."""
    port = _free_port()
    procs = []
    for pid in range(processes):
        extra = (
            dict(JAX_COORDINATOR_ADDRESS=f"localhost:{port}", JAX_NUM_PROCESSES=processes, JAX_PROCESS_ID=pid)
            if processes > 1
            else {}
        )
        procs.append(
            subprocess.Popen(
                [sys.executable, str(script), *map(str, args)],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                cwd=ROOT,
                env=_env(devices, LSJAX_DIST_TIMEOUT_S=120, **extra),
            )
        )
    results = []
    try:
        for p in procs:
            out, err = p.communicate(timeout=timeout)
            assert p.returncode == 0, err[-3000:]
            line = [x for x in out.splitlines() if x.startswith("RESULT ")]
            assert line, (out[-2000:], err[-2000:])
            results.append(json.loads(line[-1][len("RESULT ") :]))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    return results


@pytest.mark.slow  # ~2 min here: four runs, two of them with two processes, on 2 shared cores
def test_two_processes_train_like_one_and_resume_on_any_mesh(tmp_path):
    """(a) 2 processes x 2 devices on a (data=2, fsdp=2) mesh give the losses of 1 process x 4 devices on the
    same mesh and global batches; (b) killed after step 3 (checkpoint at 2) and resumed by 2 processes, or by
    1 process on a (data=1, fsdp=2) mesh (the checkpoint resharded), the run continues the same trajectory."""
    script = tmp_path / "worker.py"
    script.write_text(WORKER.format(tests=str(ROOT / "tests")))
    # rtol 1e-5: the cross-process all-reduce (gloo) may add the shards' partial sums in another order than
    # one process does, so the last bits are not promised; a wrong row split or a stale data position moves
    # the loss by ~1e-3 relative (steps differ by that much). Measured here: identical (max abs diff 0).
    close = dict(rtol=1e-5, atol=0)

    # Arguments: run dir, mesh data, mesh fsdp, stop after (0: no), resume (0/1), dev loss every 2 steps (0/1).
    (ref,) = _run(script, [tmp_path / "ref", 2, 2, 0, 0, 1], processes=1, devices=4)
    assert ref["of"] == 1 and ref["devices"] == 4 and len(ref["losses"]) == 4

    killed = _run(script, [tmp_path / "mh", 2, 2, 3, 0, 1], processes=2, devices=2)
    assert [r["process"] for r in killed] == [0, 1] and all(r["of"] == 2 and r["devices"] == 4 for r in killed)
    for r in killed:
        np.testing.assert_allclose(r["losses"], ref["losses"][:3], **close)
    assert ckpt_lib.latest_step(tmp_path / "mh" / "checkpoints") == 2
    shutil.copytree(tmp_path / "mh", tmp_path / "other")

    resumed = _run(script, [tmp_path / "mh", 2, 2, 0, 1, 1], processes=2, devices=2)
    for r in resumed:
        assert r["start"] == 2
        np.testing.assert_allclose(r["losses"], ref["losses"][2:], **close)
    # One metrics file, written by process 0 only: each step once, the killed run's step 3 replaced.
    records = [json.loads(x) for x in (tmp_path / "mh" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2, 3, 4]
    np.testing.assert_allclose([r["loss"] for r in records], ref["losses"], **close)
    # The dev loss (every 2 steps) of the whole draft, gathered from the processes' shards on each host.
    ref_records = [json.loads(x) for x in (tmp_path / "ref" / "metrics.jsonl").read_text().splitlines()]
    dev = [[r["dev_ce"] for r in rs if "dev_ce" in r] for rs in (records, ref_records)]
    assert len(dev[1]) == 2
    np.testing.assert_allclose(dev[0], dev[1], **close)
    # The checkpoint both processes wrote holds the whole draft: the one-process run's weights.
    for a, b in zip(
        jax.tree.leaves(ckpt_lib.load_draft_params(tmp_path / "mh")),
        jax.tree.leaves(ckpt_lib.load_draft_params(tmp_path / "ref")),
    ):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)  # measured: 1.2e-7 at most

    (other,) = _run(script, [tmp_path / "other", 1, 2, 0, 1, 0], processes=1, devices=2)
    assert other["start"] == 2 and other["devices"] == 2
    np.testing.assert_allclose(other["losses"], ref["losses"][2:], **close)


def test_a_missing_process_is_one_line_within_the_timeout(tmp_path):
    """A launcher that announces 2 processes but starts 1: train.py exits 2 with one line naming the count and
    the coordinator after LSJAX_DIST_TIMEOUT_S (jax alone would abort with a C++ stack dump after 300 s)."""
    import time

    cfg = tmp_path / "tiny.yaml"
    cfg.write_text(yaml.safe_dump(tiny_dict(tmp_path / "run")))
    for pid in (0, 1):  # the coordinator's host, and a host whose coordinator never comes up
        coordinator = f"localhost:{_free_port()}"
        env = _env(1, JAX_COORDINATOR_ADDRESS=coordinator, JAX_NUM_PROCESSES=2, JAX_PROCESS_ID=pid)
        t0 = time.monotonic()
        out = subprocess.run(
            [sys.executable, str(ROOT / "train.py"), "--config", str(cfg)],
            capture_output=True,
            text=True,
            cwd=tmp_path,
            env=env | {"LSJAX_DIST_TIMEOUT_S": "3"},
            timeout=120,
        )
        assert out.returncode == 2 and out.stderr.count("\n") == 1, out.stderr[-2000:]
        assert out.stderr == (
            f"error: distributed: process {pid} of 2 waited 3 s at coordinator {coordinator} for all 2 processes "
            "to connect; start every host with the same coordinator and process count (or raise "
            "LSJAX_DIST_TIMEOUT_S)\n"
        )
        assert time.monotonic() - t0 < 60 and not (tmp_path / "run" / "checkpoints").exists()
    bad = subprocess.run(
        [sys.executable, str(ROOT / "train.py"), "--config", str(cfg)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=_env(1, JAX_COORDINATOR_ADDRESS="localhost:1", JAX_NUM_PROCESSES="two", JAX_PROCESS_ID=0),
        timeout=120,
    )
    assert bad.returncode == 2 and bad.stderr == "error: JAX_NUM_PROCESSES: must be an integer >= 1, got 'two'\n"


def test_a_one_host_trainer_refuses_a_multi_host_launch(tmp_path, monkeypatch):
    """A kind whose step has no mesh layout would train the same batches on every host: one line instead."""
    from lsjax.train import runner

    monkeypatch.setattr(jax, "process_count", lambda: 2)
    monkeypatch.setattr(jax, "process_index", lambda: 1)
    with pytest.raises(ConfigError, match=r"^kind longspec: trains on one host only .* process 1 of 2$"):
        runner.run_steps(tiny_cfg(tmp_path), None, None, None, None, None, run_dir=tmp_path, log=lambda *_: None)
    assert not (tmp_path / "checkpoints").exists()


def test_distributed_env_reads_the_launchers_variables():
    env = sharding.distributed_env
    assert env({}) is None
    assert env({"JAX_COORDINATOR_ADDRESS": "h:1", "JAX_NUM_PROCESSES": "1", "JAX_PROCESS_ID": "0"}) is None
    got = env({"JAX_COORDINATOR_ADDRESS": "h0:1234", "JAX_NUM_PROCESSES": "4", "JAX_PROCESS_ID": "3"})
    assert got == sharding.DistributedEnv("h0:1234", 4, 3, sharding.DEFAULT_DIST_TIMEOUT_S)
    for detected in ({"LSJAX_DISTRIBUTED": "1"}, {"SLURM_NTASKS": "8"}, {"TPU_WORKER_HOSTNAMES": "a,b"}):
        assert env({**detected, "LSJAX_DIST_TIMEOUT_S": "30"}) == sharding.DistributedEnv(None, None, None, 30)
    for single in ({"SLURM_NTASKS": "1"}, {"TPU_WORKER_HOSTNAMES": "localhost"}, {"LSJAX_DISTRIBUTED": "0"}):
        assert env(single) is None
    for bad, field in (
        ({"JAX_COORDINATOR_ADDRESS": "h:1", "JAX_NUM_PROCESSES": "2"}, "JAX_PROCESS_ID"),
        ({"JAX_COORDINATOR_ADDRESS": "h", "JAX_NUM_PROCESSES": "2", "JAX_PROCESS_ID": "0"}, "JAX_COORDINATOR_ADDRESS"),
        ({"JAX_COORDINATOR_ADDRESS": "h:1", "JAX_NUM_PROCESSES": "2", "JAX_PROCESS_ID": "2"}, "JAX_PROCESS_ID"),
        ({"LSJAX_DISTRIBUTED": "1", "LSJAX_DIST_TIMEOUT_S": "0"}, "LSJAX_DIST_TIMEOUT_S"),
    ):
        with pytest.raises(ConfigError, match=f"^{field}:"):
            env(bad)


def test_process_rows_put_together_are_the_global_batch():
    """Each host's rows (any split, across epochs) side by side are the one-process batch, element for
    element: tokens, masks, anchor offsets, sequence indices."""
    cfg = tiny_cfg()  # A = 2 micro-batches of B = 4
    seqs, mask = data_lib.load_sequences(cfg.data, None, 2, TINY.vocab_size)
    whole = data_lib.batches(seqs, mask, cfg, TINY.max_position)
    parts = [data_lib.batches(seqs, mask, cfg, TINY.max_position, rows=r) for r in ((0, 1), (1, 3), (3, 4))]
    epoch = len(seqs) // 8
    for k in (0, 1, epoch - 1, epoch, 3 * epoch + 5):
        for field, want in whole[k].items():
            got = np.concatenate([p[k][field] for p in parts], axis=1)
            np.testing.assert_array_equal(got, want, err_msg=f"batch {k} {field}")
    assert not np.array_equal(whole[epoch]["index"], whole[0]["index"])  # the epochs really differ
    mesh = sharding.make_mesh(tiny_cfg().mesh)
    assert sharding.process_rows(mesh, 8) == (0, 8)  # one process: every row


def test_per_process_data_positions():
    pick = ckpt_lib.process_data_state
    saved = {"per_process": [{"next_index": 5, "p": 0}, {"next_index": 5, "p": 1}]}
    assert pick(saved, 1, 2) == {"next_index": 5, "p": 1}
    with pytest.raises(ckpt_lib.CheckpointMeshError, match="written by 2 processes .* with 2 processes, not 1"):
        pick(saved, 0, 1)
    same = {"per_process": [{"next_index": 5}] * 2}
    assert pick(same, 0, 1) == pick(same, 3, 4) == {"next_index": 5}  # steps count the same on any split
    assert pick({"next_index": 7}, 0, 1) == {"next_index": 7}  # a checkpoint from before per-process positions
