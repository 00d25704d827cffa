"""Many seeds in one process (seeds=[...]; benchmarks/engine/batch_trainer.py): kill -9 resumes a batch exactly, a
sweep packs seeds into batched jobs, and what a batch cannot run is refused in one line. That seed i of a batch
takes the update it takes alone is tests/test_population.py's."""

from __future__ import annotations

import json
import signal
import subprocess
import sys

import pytest

from benchmarks.engine.batch_trainer import train_batch
from benchmarks.engine.checkpoint import read_checkpoint
from benchmarks.engine.config import compose_config
from tests.conftest import ROOT
from tests.test_resume import assert_same_metrics, launch, wait_for_rows

# 8 iterations of 512 steps per seed, a checkpoint after each; the family's own values (as SMALL_RUN)
SMALL_BATCH = ["env=CartPole", "env_family/values@env=shipped", "seeds=[0,1,2]",
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
    command = [sys.executable, str(ROOT / "run.py"), "-m", "algo=ppo", "env=CartPole",
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
    (["seeds=[0,1]", "algo.backend=torch"], "seeds=[0, 1] (one batched process) runs on algo.backend=compiled, got 'torch'"),
    (["seeds=[0,0]"], "seeds must be null (one seed, `seed`) or a list of distinct integers"),
    (["seeds=[0,1]", "algo.target_kl=0.02"], "algo.target_kl must be null with seeds=[...]"),
])
def test_a_batch_the_fast_path_cannot_run_is_refused_in_one_line(override, message, tmp_path):
    result = subprocess.run([sys.executable, str(ROOT / "run.py"), *override, f"hydra.run.dir={tmp_path}/job"],
                            cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 2
    assert message in result.stderr and result.stderr.count("\n") == 1, result.stderr
