"""Many seeds in one process (seeds=[...]; algorithms/batched.py, benchmarks/engine/batch_trainer.py): each seed of a
batch is the run it would be alone up to float rounding, every preset runs batched, kill -9 resumes a batch
exactly, and a sweep packs seeds into batched jobs."""

from __future__ import annotations

import json
import signal
import subprocess
import sys

import pandas as pd
import pytest
import torch

from benchmarks.engine.batch_trainer import train_batch
from benchmarks.engine.checkpoint import read_checkpoint
from benchmarks.engine.config import compose_config
from benchmarks.engine.trainer import train
from tests.conftest import ROOT
from tests.test_resume import assert_same_metrics, launch, wait_for_rows

STAT_COLUMNS = ["loss", "policy_loss", "value_loss", "entropy", "approx_kl", "grad_norm", "ratio_mean",
                "explained_variance", "episode_return_mean"]


def one_iteration(env: str, algo: str) -> list[str]:
    return [f"env={env}", f"algo={algo}", "algo.backend=numpy", "env.num_envs=2", "env.num_steps=256",
            "total_steps=512", "eval.every_steps=512", "eval.episodes=2", "logging.progress_bar=false",
            "logging.tensorboard=false"]


@pytest.mark.parametrize("env,algo", [("CartPole", "ppo"), ("Pendulum", "ppo"), ("CartPole", "outer_ppo"),
                                      ("Pendulum", "outer_ppo_nesterov"), ("Pendulum", "hp3o_plus")])
def test_seed_i_of_a_batch_takes_the_first_update_seed_i_takes_alone(env, algo, tmp_path):
    overrides = one_iteration(env, algo)
    batch_cfg = compose_config([*overrides, "seeds=[3,7,11]"])
    train_batch(batch_cfg, [tmp_path / "batch" / f"seed{seed}" for seed in (3, 7, 11)])
    for seed in (3, 11):
        train(compose_config([*overrides, f"seed={seed}"]), tmp_path / f"alone{seed}")
        alone = read_checkpoint(tmp_path / f"alone{seed}" / "checkpoint.pt")
        batched = read_checkpoint(tmp_path / "batch" / f"seed{seed}" / "checkpoint.pt")
        for name, value in alone["algorithm"]["policy"].items():
            torch.testing.assert_close(batched["algorithm"]["policy"][name], value, rtol=0, atol=1e-5,
                                       msg=lambda text: f"seed {seed}, {name}: {text}")
        assert batched["config"]["seed"] == seed and batched["config"]["seeds"] == [3, 7, 11]
        rows = [pd.read_csv(path / "train.csv").iloc[0] for path in (tmp_path / f"alone{seed}",
                                                                        tmp_path / "batch" / f"seed{seed}")]
        for column in [c for c in STAT_COLUMNS if c in rows[0]]:  # each algorithm logs its own statistics
            assert rows[1][column] == pytest.approx(rows[0][column], rel=1e-4, abs=1e-6), column
        summary = json.loads((tmp_path / "batch" / f"seed{seed}" / "summary.json").read_text())
        assert summary["status"] == "complete" and summary["batched"]["seeds"] == [3, 7, 11]
    # the seeds of a batch are different runs, not copies of one
    first, last = (read_checkpoint(tmp_path / "batch" / f"seed{s}" / "checkpoint.pt")["algorithm"]["policy"]
                   for s in (3, 11))
    assert all(not torch.equal(first[name], last[name]) for name in first if name.endswith("weight"))


# 8 iterations of 512 steps per seed, a checkpoint after each; the family's own values (as SMALL_RUN)
SMALL_BATCH = ["env=CartPole", "env_family/values@env=shipped", "algo.backend=numpy", "seeds=[0,1,2]",
               "total_steps=4096", "eval.every_steps=1024", "eval.episodes=2", "logging.checkpoint_every_steps=512",
               "logging.progress_bar=false"]


@pytest.mark.slow
@pytest.mark.parametrize("algo", ["ppo", "hp3o"])
def test_sigkill_mid_batch_then_rerun_logs_the_uninterrupted_numbers_for_every_seed(algo, tmp_path):
    overrides = [f"algo={algo}", *SMALL_BATCH]
    train_batch(compose_config(overrides), [tmp_path / "reference" / f"seed{s}" for s in (0, 1, 2)])  # in this process
    victim = launch(overrides, tmp_path / "killed" / "job")
    wait_for_rows(tmp_path / "killed" / "job" / "seed2", 5, victim)
    victim.send_signal(signal.SIGKILL)
    victim.wait()
    # A kill can land between two seeds' checkpoint writes, leaving a seed one checkpoint behind the others;
    # if this one did not, seed 1 is put there.
    newest = [read_checkpoint(path)["iteration"] if path.exists() else None  # None: killed mid-write
              for path in (tmp_path / "killed" / "job" / f"seed{s}" / "checkpoint.pt" for s in range(3))]
    if len(set(newest)) == 1 and None not in newest:
        seed1 = tmp_path / "killed" / "job" / "seed1"
        (seed1 / "checkpoint.prev.pt").replace(seed1 / "checkpoint.pt")
    resumed = launch(overrides, tmp_path / "killed" / "job")
    _, stderr = resumed.communicate()
    assert resumed.returncode == 0, stderr
    for seed in (0, 1, 2):
        assert_same_metrics(tmp_path / "reference" / f"seed{seed}", tmp_path / "killed" / "job" / f"seed{seed}")
        assert json.loads((tmp_path / "killed" / "job" / f"seed{seed}" / "summary.json").read_text())["resumed_at_env_steps"]


def test_a_sweep_packs_seeds_into_batched_jobs_in_the_directories_of_single_seed_runs(tmp_path):
    command = [sys.executable, str(ROOT / "run.py"), "-m", "algo=ppo", "env=CartPole", "algo.backend=numpy",
               "seeds=[0,1],[2,3]", "total_steps=1024", "eval.every_steps=1024", "eval.episodes=1",
               "logging.progress_bar=false", f"hydra.sweep.dir={tmp_path}"]
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-3000:]
    for seed in range(4):
        summary = json.loads((tmp_path / "CartPole" / "ppo" / f"seed{seed}" / "summary.json").read_text())
        assert summary["status"] == "complete" and summary["seed"] == seed
        assert summary["batched"]["seeds"] == [seed - seed % 2, seed - seed % 2 + 1]
    assert sorted(p.name for p in (tmp_path / "CartPole" / "ppo").iterdir()) == [
        "seed0", "seed1", "seed2", "seed3", "seeds0-1", "seeds2-3"]
    # rerunning skips the complete seeds
    again = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    output = again.stdout + again.stderr
    assert again.returncode == 0 and output.count("already complete, skipped") == 4, output[-2000:]


@pytest.mark.parametrize("override,message", [
    (["seeds=[0,1]", "algo.backend=torch"], "seeds=[0, 1] (one batched process) runs on algo.backend=compiled or numpy, got 'torch'"),
    (["seeds=[0,0]"], "seeds must be null (one seed, `seed`) or a list of distinct integers"),
    (["seeds=[0,1]", "algo.target_kl=0.02"], "algo.target_kl must be null with seeds=[...]"),
])
def test_a_batch_the_fast_path_cannot_run_is_refused_in_one_line(override, message, tmp_path):
    result = subprocess.run([sys.executable, str(ROOT / "run.py"), *override, f"hydra.run.dir={tmp_path}/job"],
                            cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 2
    assert message in result.stderr and result.stderr.count("\n") == 1, result.stderr
