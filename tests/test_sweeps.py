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
    assert "sweep finished: 1 of 2 jobs complete" in result.stdout
    assert f"FAILED {tmp_path / '0'}: NameNotFound" in result.stdout
    assert json.loads((tmp_path / "0" / "summary.json").read_text())["status"] == "failed"
    good = tmp_path / "1"
    assert json.loads((good / "summary.json").read_text())["status"] == "complete"
    assert pd.read_csv(good / "train.csv")["env_steps"].iloc[-1] == 1024
