"""Sweeps through Hydra's real launchers: joblib (cores of one machine) and submitit (Slurm; local mode here)."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pandas as pd
import pytest
from conftest import ROOT, SMALL_UPDATE

from benchmarks.engine.checkpoint import read_checkpoint
from tests.commands import run_python
from tests.test_resume import wait_for_rows


@pytest.mark.slow
@pytest.mark.parametrize("launcher", ["joblib", "submitit_local"])
def test_sweep_with_a_failing_job_keeps_the_others_and_names_the_failure(launcher, tmp_path):
    result = run_python(
        [sys.executable, str(ROOT / "run.py"), "-m", f"hydra/launcher={launcher}",
         "env.id=NoSuchTask-v0,CartPole-v1", "seed=0", "total_steps=1024", "eval.episodes=1",
         "logging.tensorboard=false", f"hydra.sweep.dir={tmp_path}", "hydra.sweep.subdir=${hydra.job.num}"],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 1
    assert "sweep finished: 1 of 2 runs complete" in result.stdout
    # an unknown task is refused at config time; in a sweep it fails its job alone
    assert f"FAILED {tmp_path / '0'}: config error: env.id must be a registered Gymnasium id" in result.stdout
    assert json.loads((tmp_path / "0" / "summary.json").read_text())["status"] == "failed"
    good = tmp_path / "1"
    assert json.loads((good / "summary.json").read_text())["status"] == "complete"
    assert pd.read_csv(good / "train.csv")["env_steps"].iloc[-1] == 1024
    # the launcher passed the sweep's id on to both jobs: its end counts them as its own by it
    sweep_ids = {json.loads((tmp_path / job / ".job").read_text())["sweep"] for job in ("0", "1")}
    assert len(sweep_ids) == 1 and None not in sweep_ids


@pytest.mark.slow
def test_submitit_preemption_requeues_the_job_and_it_resumes(tmp_path):
    """Slurm signals a job it preempts (SIGUSR2 with submitit's --signal); the test sends that signal to the
    running job's process: the run checkpoints, submitit requeues the job, and the requeued job resumes and
    completes. (submitit_local would send it itself only 30 s before its shortest, 1-minute time limit.)"""
    # 16 iterations of 512 steps on the torch backend: still going when the signal comes after the second
    sweep = subprocess.Popen(
        [sys.executable, str(ROOT / "run.py"), "-m", "hydra/launcher=submitit_local", "hydra.launcher.timeout_min=5",
         "env=CartPole", "algo=ppo", "algo.backend=torch", "seed=0", "total_steps=8192", "eval.every_steps=2048",
         "eval.episodes=1", "logging.checkpoint_every_steps=100000",
         "logging.tensorboard=false", f"hydra.sweep.dir={tmp_path}", "hydra.sweep.subdir=${hydra.job.num}"],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    wait_for_rows(tmp_path / "0", 2, sweep)
    job_pid = int((tmp_path / "0" / ".lock").read_text())  # the process training the run holds its lock
    os.kill(job_pid, signal.SIGUSR2)
    output, _ = sweep.communicate(timeout=600)
    assert sweep.returncode == 0, output
    logs = "".join(path.read_text() for path in (tmp_path / ".submitit").rglob("*_log.*"))
    assert "Caught signal SIGUSR2" in logs and "Requeued job" in logs
    assert "resuming" in logs and "from its checkpoint at" in logs
    summary = json.loads((tmp_path / "0" / "summary.json").read_text())
    assert summary["status"] == "complete" and summary["resumed_at_env_steps"]
    iterations = pd.read_csv(tmp_path / "0" / "train.csv")["iteration"].tolist()
    assert iterations == list(range(1, 17)), "every iteration logged exactly once across the requeue"


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "Ctrl-C"])
def test_a_joblib_sweep_sent_a_stop_signal_checkpoints_every_running_job_and_the_rerun_resumes(signum, tmp_path):
    """Slurm, `timeout` and `kill -- -PGID` (SIGTERM), and Ctrl-C in a terminal (SIGINT), signal a sweep's whole
    process group: the launcher's process and its joblib workers. Every running job must finish its iteration,
    checkpoint and record why it stopped - none killed before it could by the launcher tearing its workers down
    (joblib does on a KeyboardInterrupt) - and rerunning the command resumes both."""
    command = [sys.executable, str(ROOT / "run.py"), "-m", "hydra/launcher=joblib", "hydra.launcher.n_jobs=2",
               "env=CartPole", "algo=ppo", "algo.backend=torch", "seed=0,1", "total_steps=32768",
               # 16 minibatch steps an iteration, not the tuned 448: short iterations, 64 of them, so that each job
               # is still running when the later-started one logs its second row (the two start within a second
               # of each other and stop after about 3 iterations); the rerun trains the rest
               *SMALL_UPDATE,
               "eval.every_steps=8192", "eval.episodes=1", "logging.checkpoint_every_steps=100000",
               "logging.tensorboard=false", "logging.progress_bar=false", f"hydra.sweep.dir={tmp_path}"]
    log = tmp_path / "sweep.log"  # a file, not a pipe: the workers, which outlive the launcher, hold it open
    with log.open("w") as output:
        sweep = subprocess.Popen(command, cwd=tmp_path, stdout=output, stderr=subprocess.STDOUT,
                                 start_new_session=True,  # Ctrl-C as a terminal's foreground job gets it:
                                 preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    runs = [tmp_path / "CartPole" / "ppo" / f"seed{seed}" for seed in (0, 1)]
    try:
        for run_dir in runs:
            wait_for_rows(run_dir, 2, sweep)
        os.killpg(sweep.pid, signum)
        sweep.wait(timeout=120)
        deadline = time.monotonic() + 60  # the workers outlive the launcher's process by their last iteration
        while not all((run_dir / "summary.json").exists() for run_dir in runs) and time.monotonic() < deadline:
            time.sleep(0.1)
    finally:
        try:  # joblib's idle workers, left without their parent
            os.killpg(sweep.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    stopped_at = {}
    for run_dir in runs:
        assert (run_dir / "summary.json").exists(), f"{run_dir} stopped without its summary: {log.read_text()}"
        summary = json.loads((run_dir / "summary.json").read_text())
        assert summary["status"] == "interrupted" and summary["signal"] == signum.name, log.read_text()
        assert summary["checkpointed"] and summary["env_steps"] < 32768
        assert read_checkpoint(run_dir / "checkpoint.pt")["env_steps"] == summary["env_steps"]
        stopped_at[run_dir] = summary["env_steps"]
    rerun = run_python(command, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert rerun.returncode == 0, rerun.stdout + rerun.stderr
    for run_dir in runs:
        summary = json.loads((run_dir / "summary.json").read_text())
        assert summary["status"] == "complete" and summary["resumed_at_env_steps"] == [stopped_at[run_dir]]
        assert pd.read_csv(run_dir / "train.csv")["iteration"].tolist() == list(range(1, 65))


@pytest.mark.slow
def test_a_refused_batch_job_records_its_failure_in_its_seeds_directories(tmp_path):
    """A batch job's directory (seeds0-1) is no run's: a refused config is recorded in each seed's own directory,
    so that the suite lists those seeds as failed and a corrected rerun leaves no failure behind."""
    command = [sys.executable, str(ROOT / "run.py"), "-m", "env=CartPole", "seeds=[0,1]", "total_steps=512",
               "env.num_steps=128", "eval.every_steps=256", "eval.episodes=1", "logging.tensorboard=false",
               f"hydra.sweep.dir={tmp_path}"]
    refused = run_python([*command, "algo.lr=-1"], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                         env={**os.environ, "POPULATION_COMPILE": "0"})
    assert refused.returncode == 1 and "config error: algo.lr must be a number > 0" in refused.stderr
    seeds = [tmp_path / "CartPole" / "ppo" / f"seed{seed}" for seed in (0, 1)]
    assert not (tmp_path / "CartPole" / "ppo" / "seeds0-1" / "summary.json").exists()
    for run_dir in seeds:
        summary = json.loads((run_dir / "summary.json").read_text())
        assert summary == {"status": "failed", "error": "config error: algo.lr must be a number > 0, got -1"}
    run_python([*command, "algo.lr=-2"], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    for run_dir in seeds:  # the latest refusal's reason, not the first's
        assert json.loads((run_dir / "summary.json").read_text())["error"].endswith("got -2")
    fixed = run_python(command, cwd=tmp_path, capture_output=True, text=True, timeout=300,
                       env={**os.environ, "POPULATION_COMPILE": "0"})
    assert fixed.returncode == 0, fixed.stderr[-2000:]
    from benchmarks.runs import load_runs

    skipped = []
    assert [run["seed"] for run in load_runs(tmp_path, skipped)] == [0, 1] and skipped == []


def test_a_sweeps_end_reports_its_own_jobs_not_those_another_sweep_trains_into_the_same_directory(
        tmp_path, monkeypatch, capsys):
    """Two sweeps into one suite directory at once (two presets from two terminals): the first to end reports its
    jobs, and the other's, still training (no summary.json yet), are neither counted nor called failed."""
    from omegaconf import OmegaConf

    from benchmarks.engine.hydra_callbacks import JOB_MARK, SWEEP_ID, SweepReport

    monkeypatch.setenv(SWEEP_ID, "")  # recorded, so that the id set below is undone after the test
    monkeypatch.delenv(SWEEP_ID)
    config = OmegaConf.create({"hydra": {"sweep": {"dir": str(tmp_path)}}})
    report = SweepReport()
    report.on_multirun_start(config)
    assert os.environ[SWEEP_ID] == report.sweep_id  # what the launcher's jobs inherit

    def job(name, sweep, complete):
        job_dir = tmp_path / name / "seed0"
        job_dir.mkdir(parents=True)
        (job_dir / JOB_MARK).write_text(json.dumps({"seeds": None, "sweep": sweep}))
        if complete:
            (job_dir / "summary.json").write_text(json.dumps({"status": "complete"}))

    job("Ant/ppo", report.sweep_id, complete=True)
    job("Ant/outer_ppo", "4242-1", complete=False)  # the other sweep's, training now
    (tmp_path / "Ant" / "hp3o" / "seed0").mkdir(parents=True)
    (tmp_path / "Ant" / "hp3o" / "seed0" / JOB_MARK).write_text('{"seeds": nu')  # another sweep's, half written
    report.on_multirun_end(config)
    assert "sweep finished: 1 of 1 runs complete (1 jobs)" in capsys.readouterr().out

    job("Hopper/ppo", None, complete=False)  # a launcher that dropped the environment: counted by its time
    with pytest.raises(SystemExit):
        report.on_multirun_end(config)
    out = capsys.readouterr().out
    assert "1 of 2 runs complete (2 jobs)" in out and "FAILED" in out and "Hopper/ppo" in out and "outer_ppo" not in out


def test_the_slurm_launcher_off_a_cluster_is_one_line_before_any_job(tmp_path):
    if shutil.which("srun") is not None:
        pytest.skip("this machine is a Slurm node: the launcher would submit")
    result = run_python([sys.executable, str(ROOT / "run.py"), "-m", "hydra/launcher=submitit_slurm", "env=CartPole",
                             "seed=0,1", f"hydra.sweep.dir={tmp_path}/sweep"], cwd=tmp_path, capture_output=True,
                        text=True, timeout=300)
    assert result.returncode == 2 and result.stderr == (
        "error: hydra/launcher=submitit_slurm submits to a Slurm cluster, and this machine has no srun; "
        "hydra/launcher=submitit_local or hydra/launcher=joblib run the same jobs here\n"), result.stderr
    assert not (tmp_path / "sweep").exists()


def test_a_joblib_launcher_given_no_jobs_at_once_is_one_line_before_any_job(tmp_path):
    result = run_python([sys.executable, str(ROOT / "run.py"), "-m", "hydra/launcher=joblib",
                             "hydra.launcher.n_jobs=0", "env=CartPole", "seed=0,1", f"hydra.sweep.dir={tmp_path}/sweep"],
                        cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert result.returncode == 2 and result.stderr == (
        "error: hydra.launcher.n_jobs=0 runs no job: give the number of jobs at once (-1: one per core)\n"), \
        result.stderr
    assert not (tmp_path / "sweep").exists()
