"""Sweeps through Hydra's real launchers: joblib (cores of one machine) and submitit (Slurm; local mode here)."""

import json
import subprocess
import sys

import pandas as pd
import pytest
from conftest import ROOT


@pytest.mark.parametrize("launcher", ["joblib", "submitit_local"])
def test_sweep_with_a_failing_job_keeps_the_others_and_names_the_failure(launcher, tmp_path):
    result = subprocess.run(
        [sys.executable, str(ROOT / "run.py"), "-m", f"hydra/launcher={launcher}",
         "env.id=NoSuchTask-v0,CartPole-v1", "seed=0", "total_steps=1024", "eval.episodes=1",
         "logging.tensorboard=false", f"hydra.sweep.dir={tmp_path}", "hydra.sweep.subdir=${hydra.job.num}"],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 1
    assert "sweep finished: 1 of 2 runs complete" in result.stdout
    assert f"FAILED {tmp_path / '0'}: NameNotFound" in result.stdout
    assert json.loads((tmp_path / "0" / "summary.json").read_text())["status"] == "failed"
    good = tmp_path / "1"
    assert json.loads((good / "summary.json").read_text())["status"] == "complete"
    assert pd.read_csv(good / "train.csv")["env_steps"].iloc[-1] == 1024


def test_submitit_preemption_requeues_the_job_and_it_resumes(tmp_path):
    """submitit_local sends SIGUSR2 30 s before its 1-minute time limit, as Slurm does before preemption:
    the run checkpoints, submitit requeues it, and the requeued job resumes and completes."""
    result = subprocess.run(
        [sys.executable, str(ROOT / "run.py"), "-m", "hydra/launcher=submitit_local", "hydra.launcher.timeout_min=1",
         # the torch backend: the run must still be going when SIGUSR2 comes at 30 s (numpy finishes before)
         "env=HalfCheetah", "algo=ppo", "algo.backend=torch", "seed=0", "total_steps=61440", "eval.every_steps=20480",
         "eval.episodes=1",
         "logging.tensorboard=false", f"hydra.sweep.dir={tmp_path}", "hydra.sweep.subdir=${hydra.job.num}"],
        cwd=tmp_path, capture_output=True, text=True, timeout=600,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    logs = "".join(path.read_text() for path in (tmp_path / ".submitit").rglob("*_log.*"))
    assert "Caught signal SIGUSR2" in logs and "Requeued job" in logs
    assert "resuming" in logs and "from its checkpoint at" in logs
    summary = json.loads((tmp_path / "0" / "summary.json").read_text())
    assert summary["status"] == "complete" and summary["resumed_at_env_steps"]
    iterations = pd.read_csv(tmp_path / "0" / "train.csv")["iteration"].tolist()
    assert iterations == list(range(1, 31)), "every iteration logged exactly once across the requeue"
