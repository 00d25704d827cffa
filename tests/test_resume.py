"""Issue 8: interrupted runs resume to exactly the numbers of an uninterrupted run; bad states stop cleanly."""

from __future__ import annotations

import io
import json
import os
import random
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import gymnasium as gym
import numpy as np
import pandas as pd
import pytest
import torch

from algorithms.ppo import PPO
from benchmarks.engine.env_state import load_vector_env_state, vector_env_state
from benchmarks.engine.envs import make_vector_env
from benchmarks.engine.logger import read_csv_complete_rows
from benchmarks.engine.checkpoint import CheckpointError, read_checkpoint
from benchmarks.engine.trainer import NonFiniteError, train
from tests.conftest import QUIET, ROOT, before_each_update

TIMING = ("wall_time", "sps", "rollout_time", "update_time")
# CartPole: 4 envs x 128 steps = 512 env steps per iteration, 8 iterations, a checkpoint every iteration. The
# family's own values (CleanRL's 4 epochs x 4 minibatches), not the tuned 14 x 32: what resumes is the same either way.
SMALL_RUN = ["env=CartPole", "env_family/values@env=shipped", "total_steps=4096", "eval.every_steps=1024",
             "eval.episodes=2", "logging.checkpoint_every_steps=512", "logging.progress_bar=false"]


def metrics(run_dir: Path) -> dict[str, pd.DataFrame]:
    frames = {}
    for name in ("train", "eval", "episodes"):
        frame = pd.read_csv(run_dir / f"{name}.csv")
        frames[name] = frame[[c for c in frame.columns if c not in TIMING]]
    return frames


def assert_same_metrics(a: Path, b: Path) -> None:
    for name, frame in metrics(a).items():
        pd.testing.assert_frame_equal(frame, metrics(b)[name], check_exact=True, obj=name)


def launch(overrides: list[str], run_dir: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, str(ROOT / "run.py"), *overrides, f"hydra.run.dir={run_dir}"],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def wait_for_rows(run_dir: Path, rows: int, process: subprocess.Popen, timeout: float = 120) -> None:
    """Until train.csv holds `rows` data rows (the process is then mid-run)."""
    deadline = time.monotonic() + timeout
    path = run_dir / "train.csv"
    while time.monotonic() < deadline:
        if path.exists() and path.read_text().count("\n") - 1 >= rows:
            return
        assert process.poll() is None, f"the run ended early: {process.communicate()}"
        time.sleep(0.05)
    raise TimeoutError(f"{path} never reached {rows} rows")


@pytest.mark.slow
# A run of one seed (the one-run directory layout); PPO and HP3O are killed as populations of three in
# tests/test_batched.py, on the same loop and values.
@pytest.mark.parametrize("algo", ["outer_ppo_nesterov", "outer_ppo_nesterov+torch"])
def test_sigkill_at_a_random_iteration_then_rerun_logs_the_uninterrupted_numbers(algo, make_config, tmp_path):
    preset, _, backend = algo.partition("+")  # +torch: the eager backend (default: compiled, a population of one)
    overrides = [f"algo={preset}", *([f"algo.backend={backend}"] if backend else []), *SMALL_RUN]
    train(make_config(overrides), tmp_path / "reference")  # in this process: the same numbers

    kill_after = random.Random(f"kill-{algo}").randint(2, 6)  # fixed per algo, anywhere mid-run
    victim = launch(overrides, tmp_path / "killed")
    wait_for_rows(tmp_path / "killed", kill_after, victim)
    victim.send_signal(signal.SIGKILL)
    victim.wait()
    assert not (tmp_path / "killed" / "summary.json").exists()

    resumed = launch(overrides, tmp_path / "killed")
    _, stderr = resumed.communicate()
    assert resumed.returncode == 0, stderr
    assert "resuming" in stderr and "from its checkpoint at" in stderr
    assert_same_metrics(tmp_path / "reference", tmp_path / "killed")
    summary = json.loads((tmp_path / "killed" / "summary.json").read_text())
    assert summary["status"] == "complete" and len(summary["resumed_at_env_steps"]) == 1


@pytest.mark.slow
def test_sigterm_checkpoints_exits_cleanly_and_the_rerun_resumes_mujoco_exactly(tmp_path):
    # HalfCheetah: the resume must restore the MuJoCo state mid-episode (episodes last 1000 steps).
    # 4 minibatches a epoch (the task's 32 would be minibatches of 8 steps here): the resume is what is tested
    overrides = ["env=HalfCheetah", "algo=ppo", "total_steps=3072", "env.num_steps=256", "algo.num_minibatches=4",
                 "eval.every_steps=1024", "eval.episodes=1", "logging.checkpoint_every_steps=100000",
                 "logging.progress_bar=false"]
    reference = launch(overrides, tmp_path / "reference")
    assert reference.wait() == 0, reference.communicate()

    victim = launch(overrides, tmp_path / "run")
    wait_for_rows(tmp_path / "run", 5, victim)
    victim.send_signal(signal.SIGTERM)
    _, stderr = victim.communicate(timeout=60)
    assert victim.returncode == 128 + signal.SIGTERM, stderr
    assert "Traceback" not in stderr
    assert "SIGTERM at" in stderr and "rerun the same command to resume" in stderr
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["status"] == "interrupted" and summary["signal"] == "SIGTERM"
    stopped_at = summary["env_steps"]
    # The only checkpoint is the signal's (the periodic interval is never reached).
    assert read_checkpoint(tmp_path / "run" / "checkpoint.pt")["env_steps"] == stopped_at

    resumed = launch(overrides, tmp_path / "run")
    _, stderr = resumed.communicate()
    assert resumed.returncode == 0, stderr
    assert f"from its checkpoint at {stopped_at} env steps" in stderr
    assert_same_metrics(tmp_path / "reference", tmp_path / "run")


def test_sigterm_during_a_mid_run_evaluation_stops_after_that_iteration(make_config, tmp_path, monkeypatch):
    """The signal is read after the iteration's evaluations: a preemption that lands in a (long) evaluation is
    checkpointed at once, not one more rollout and update later."""
    from benchmarks.engine import trainer

    evaluate = trainer.Evaluator.__call__
    calls = []

    def evaluate_then_signal(self, algorithm, obs_normalizer):
        if not calls:  # the first evaluation: mid-run (eval.at_start=false)
            os.kill(os.getpid(), signal.SIGTERM)
        calls.append(1)
        return evaluate(self, algorithm, obs_normalizer)

    monkeypatch.setattr(trainer.Evaluator, "__call__", evaluate_then_signal)
    with pytest.raises(trainer.TrainingInterrupted):
        train(make_config(["algo=ppo", *SMALL_RUN, *QUIET]), tmp_path / "run")
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    evaluated_at = pd.read_csv(tmp_path / "run" / "eval.csv")["env_steps"].tolist()
    assert summary["status"] == "interrupted" and [summary["env_steps"]] == evaluated_at


def test_ctrl_c_stops_after_the_iteration_with_a_checkpoint_as_sigterm_does(make_config, tmp_path, monkeypatch,
                                                                              capsys):
    """Ctrl-C (SIGINT) mid-update: no KeyboardInterrupt half-way through it; it is answered at once, the iteration
    ends, is checkpointed and the run is marked interrupted, so that rerunning the command resumes where it
    stopped."""
    from benchmarks.engine import trainer

    def interrupt_in_iteration_2(algorithm, rollout, iteration):
        if iteration == 2:  # unhandled, the signal would stop the test session itself
            assert signal.getsignal(signal.SIGINT) is not signal.default_int_handler, "Ctrl-C is not handled"
            os.kill(os.getpid(), signal.SIGINT)

    before_each_update(monkeypatch, interrupt_in_iteration_2)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)  # a terminal's, whatever started pytest
    try:
        with pytest.raises(trainer.TrainingInterrupted, match="^SIGINT at 1024 env steps: checkpoint written; rerun"):
            train(make_config(["algo=ppo", *SMALL_RUN, *QUIET]), tmp_path / "run")
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # given back after the run
    finally:
        signal.signal(signal.SIGINT, previous)
    assert "Ctrl-C: stopping after this iteration, with a checkpoint; Ctrl-C again stops at once\n" in \
        capsys.readouterr().err
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["status"] == "interrupted" and summary["signal"] == "SIGINT" and summary["env_steps"] == 1024
    assert read_checkpoint(tmp_path / "run" / "checkpoint.pt")["env_steps"] == 1024


@pytest.mark.parametrize("seeds", [None, [0, 1]])
def test_a_stop_signal_in_the_last_iteration_completes_the_run_and_still_stops_the_process(seeds, make_config,
                                                                                            tmp_path, monkeypatch):
    """The run completes (its summaries say so), then the signal is handed over as in any other iteration: the
    process stops (the signal was dropped: a sweep went on to its next job, a launcher's handler never ran)."""
    from benchmarks.engine import trainer
    from benchmarks.engine.batch_trainer import train_batch

    before_each_update(monkeypatch, lambda algorithm, rollout, iteration:
                       os.kill(os.getpid(), signal.SIGTERM) if iteration == 4 else None)
    cfg = make_config(["algo=ppo", *SMALL_RUN, *QUIET, "total_steps=2048",
                       *([f"seeds=[{','.join(map(str, seeds))}]"] if seeds else [])])
    run_dirs = [tmp_path / f"seed{seed}" for seed in seeds] if seeds else [tmp_path / "run"]
    with pytest.raises(trainer.TrainingInterrupted, match=r"^SIGTERM in the iteration the run completed in \(2048 "
                                                          r"env steps\); rerunning the command skips it$"):
        train_batch(cfg, run_dirs) if seeds else train(cfg, run_dirs[0])
    for run_dir in run_dirs:
        summary = json.loads((run_dir / "summary.json").read_text())
        assert summary["status"] == "complete" and summary["env_steps"] == 2048


@pytest.mark.parametrize("seeds", [None, [0, 1]])
def test_a_stop_signal_in_the_iteration_every_seed_stopped_in_still_stops_the_process(seeds, make_config, tmp_path,
                                                                                      monkeypatch):
    """The failures are recorded, then the signal is handed over (it was dropped: the run's error ended it, and in a
    sweep the next job started)."""
    from benchmarks.engine import trainer
    from benchmarks.engine.batch_trainer import train_batch

    def signal_and_poison(algorithm, rollout, iteration):
        if iteration == 2:
            os.kill(os.getpid(), signal.SIGTERM)
            with torch.no_grad():
                algorithm.policy.actor.layers[0].weight.fill_(float("nan"))

    before_each_update(monkeypatch, signal_and_poison)
    cfg = make_config(["algo=ppo", "algo.backend=torch", *SMALL_RUN, *QUIET,
                       *([f"seeds=[{','.join(map(str, seeds))}]"] if seeds else [])])
    run_dirs = [tmp_path / f"seed{seed}" for seed in seeds] if seeds else [tmp_path / "run"]
    ended = ("the run stopped in (non-finite " if seeds is None else
             "every seed of the batch stopped in (see their summary.json)")
    with pytest.raises(trainer.TrainingInterrupted, match=rf"^SIGTERM in the iteration {re.escape(ended)}"):
        train_batch(cfg, run_dirs) if seeds else train(cfg, run_dirs[0])
    for run_dir in run_dirs:
        summary = json.loads((run_dir / "summary.json").read_text())
        assert summary["status"] == "failed" and summary["error"].startswith("NonFiniteError: non-finite ")


def test_a_stop_without_checkpoints_says_the_rerun_starts_over(make_config, tmp_path, monkeypatch):
    """logging.checkpoint=false: a signal still stops the run cleanly, and its line does not promise a resume."""
    from benchmarks.engine import trainer

    before_each_update(monkeypatch, lambda algorithm, rollout, iteration:
                       os.kill(os.getpid(), signal.SIGTERM) if iteration == 2 else None)
    with pytest.raises(trainer.TrainingInterrupted, match=r"^SIGTERM at 1024 env steps: no checkpoint "
                                                          r"\(logging.checkpoint=false\): rerunning the command trains "
                                                          r"the run again from the start$"):
        train(make_config(["algo=ppo", *SMALL_RUN, *QUIET, "logging.checkpoint=false"]), tmp_path / "run")
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["status"] == "interrupted" and summary["checkpointed"] is False
    assert not (tmp_path / "run" / "checkpoint.pt").exists()


def test_a_run_trained_again_without_checkpoints_removes_the_earlier_runs_checkpoint(make_config, tmp_path, capsys):
    """The rerun's logs start again; the earlier checkpoint would resume a later run (checkpoints on) and cut those
    logs at its own byte lengths, mid-row where a timing column's width differed."""
    train(make_config(["algo=ppo", *SMALL_RUN, *QUIET, "pause_at_steps=1024"]), tmp_path)
    assert (tmp_path / "checkpoint.pt").exists() and (tmp_path / "checkpoint.prev.pt").exists()
    capsys.readouterr()
    train(make_config(["algo=ppo", *SMALL_RUN, *QUIET, "logging.checkpoint=false"]), tmp_path)
    assert not (tmp_path / "checkpoint.pt").exists() and not (tmp_path / "checkpoint.prev.pt").exists()
    assert (f"note: {tmp_path} trains from the start (logging.checkpoint=false): removed the earlier run's "
            f"checkpoint.pt, checkpoint.prev.pt\n") in capsys.readouterr().err


def test_a_run_started_with_ctrl_c_ignored_leaves_it_ignored(make_config, tmp_path, monkeypatch):
    """A script's background job (`python run.py ... &`) starts with SIGINT ignored: the Ctrl-C the terminal sends to
    the script's foreground job is not for it."""
    seen = []
    before_each_update(monkeypatch, lambda algorithm, rollout, iteration: seen.append(signal.getsignal(signal.SIGINT)))
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        train(make_config(["algo=ppo", *SMALL_RUN, *QUIET, "total_steps=1024"]), tmp_path / "run")
    finally:
        signal.signal(signal.SIGINT, previous)
    assert seen and all(handler is signal.SIG_IGN for handler in seen)


def test_sigterm_during_the_first_evaluation_is_honoured_not_a_silent_kill(make_config, tmp_path, monkeypatch):
    from benchmarks.engine import trainer

    evaluate = trainer.Evaluator.__call__
    calls = []

    def evaluate_then_signal(self, algorithm, obs_normalizer):
        if not calls:  # the evaluation at env step 0, before the first iteration
            os.kill(os.getpid(), signal.SIGTERM)
        calls.append(1)
        return evaluate(self, algorithm, obs_normalizer)

    monkeypatch.setattr(trainer.Evaluator, "__call__", evaluate_then_signal)
    cfg = make_config(["algo=ppo", *SMALL_RUN, *QUIET, "eval.at_start=true"])
    with pytest.raises(trainer.TrainingInterrupted):
        train(cfg, tmp_path / "run")
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    first_iteration = pd.read_csv(tmp_path / "run" / "train.csv")["env_steps"].iloc[0]
    assert summary["status"] == "interrupted" and summary["signal"] == "SIGTERM"
    assert summary["env_steps"] == first_iteration  # stopped after the first iteration, checkpointed
    monkeypatch.setattr(trainer.Evaluator, "__call__", evaluate)
    train(cfg, tmp_path / "run")  # and the rerun resumes to the uninterrupted numbers
    train(cfg, tmp_path / "reference")
    assert_same_metrics(tmp_path / "reference", tmp_path / "run")


def test_sigusr1_from_slurm_checkpoints_and_stops_the_run_like_sigterm(tmp_path):
    victim = launch(["algo=hp3o", *SMALL_RUN], tmp_path / "run")
    wait_for_rows(tmp_path / "run", 3, victim)
    victim.send_signal(signal.SIGUSR1)
    _, stderr = victim.communicate(timeout=60)
    assert victim.returncode == 128 + signal.SIGUSR1, stderr
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["status"] == "interrupted" and summary["signal"] == "SIGUSR1"
    checkpoint = read_checkpoint(tmp_path / "run" / "checkpoint.pt")
    assert checkpoint["env_steps"] == summary["env_steps"]
    assert len(checkpoint["algorithm"]["buffer"]["trajectories"]) > 0, "HP3O's buffer travels with the checkpoint"
    rows = pd.read_csv(tmp_path / "run" / "train.csv")
    assert rows["env_steps"].iloc[-1] == summary["env_steps"], "no row after the checkpoint"


@pytest.mark.parametrize("backend", ["compiled", "torch"])
def test_a_signal_is_handed_to_the_launchers_own_handler_after_the_checkpoint(backend, make_config, tmp_path,
                                                                             monkeypatch):
    """submitit installs a SIGUSR2 handler that requeues the job; it must still run, after our checkpoint."""
    from conftest import before_each_update

    cfg = make_config(["algo=ppo", f"algo.backend={backend}", *SMALL_RUN, *QUIET])
    train(cfg, tmp_path / "reference")

    calls = []

    def launcher_handler(signum, frame):  # stands in for submitit's checkpoint_and_try_requeue
        calls.append(read_checkpoint(tmp_path / "run" / "checkpoint.pt")["iteration"])
        raise SystemExit(-1)

    def signal_at_iteration_4(algorithm, rollout, iteration):
        if iteration == 4:
            os.kill(os.getpid(), signal.SIGUSR2)  # arrives mid-iteration

    previous = signal.signal(signal.SIGUSR2, launcher_handler)
    try:
        with monkeypatch.context() as patched:
            before_each_update(patched, signal_at_iteration_4)
            with pytest.raises(SystemExit):
                train(cfg, tmp_path / "run")
        assert signal.getsignal(signal.SIGUSR2) is launcher_handler  # restored
    finally:
        signal.signal(signal.SIGUSR2, previous)
    assert calls == [4], "the launcher's handler runs once, after the iteration finished and was checkpointed"
    train(cfg, tmp_path / "run")
    assert_same_metrics(tmp_path / "reference", tmp_path / "run")


def truncated(data: bytes) -> bytes:
    return data[: len(data) // 2]


def with_flipped_bytes(data: bytes) -> bytes:
    middle = len(data) // 2  # inside the file's pickle: torch.load fails on it
    return data[:middle] + bytes(b ^ 0xFF for b in data[middle:middle + 8]) + data[middle + 8:]


def with_a_bit_flipped_in_its_payload(data: bytes) -> bytes:
    """A flip the file's own format does not see (torch.load reads it, a weight changed): only the digest the
    checkpoint keeps beside its payload catches it."""
    stored = torch.load(io.BytesIO(data), weights_only=True)
    payload = bytearray(stored["payload"])
    payload[len(payload) // 2] ^= 0x01
    buffer = io.BytesIO()
    torch.save({"sha256": stored["sha256"], "payload": bytes(payload)}, buffer)
    return buffer.getvalue()


def test_a_damaged_newest_checkpoint_is_set_aside_and_the_previous_one_takes_its_place(make_config, tmp_path,
                                                                                        capfd):
    cfg = make_config(["algo=ppo", *SMALL_RUN, *QUIET])
    train(cfg, tmp_path / "reference")
    run = tmp_path / "run"
    train(cfg, run)
    for damage in (truncated, with_flipped_bytes, with_a_bit_flipped_in_its_payload):
        # As if killed right after the last checkpoint was written, with the file then damaged.
        (run / "summary.json").unlink()
        newest = run / "checkpoint.pt"
        damaged = damage(newest.read_bytes())
        newest.write_bytes(damaged)
        train(cfg, run)
        err = capfd.readouterr().err
        assert "checkpoint.pt is unreadable" in err and "resuming from checkpoint.prev.pt" in err, damage.__name__
        if damage is with_a_bit_flipped_in_its_payload:
            assert "(CheckpointDamaged: its bytes do not match their SHA-256 digest (damaged on disk))" in err
        assert_same_metrics(tmp_path / "reference", run)
        # the damaged file was set aside, so the fallback slot now holds a good checkpoint, not it
        assert (run / "checkpoint.pt.damaged").read_bytes() == damaged
        read_checkpoint(run / "checkpoint.prev.pt")


@pytest.mark.slow
def test_a_second_process_on_a_run_directory_in_use_is_refused_and_touches_nothing(tmp_path):
    run, longer = tmp_path / "run", ["algo=ppo", *SMALL_RUN, "total_steps=409600"]  # still running when the second comes
    first = launch(longer, run)
    wait_for_rows(run, 2, first)
    files_before = {path: path.read_bytes() for path in run.glob("*.csv")}
    second = launch(longer, run)
    _, stderr = second.communicate()
    assert second.returncode == 1
    error_lines = [line for line in stderr.splitlines() if line.startswith("error:")]
    assert len(error_lines) == 1 and "is being trained by another process (pid" in error_lines[0], stderr
    assert "Traceback" not in stderr and not (run / "summary.json").exists()
    for path, content in files_before.items():  # the first run's logs only grew
        assert path.read_bytes().startswith(content)
    assert first.poll() is None, "the first run goes on"
    first.send_signal(signal.SIGTERM)  # and stops as any run does (no need to train it to the end)
    assert first.wait(timeout=60) == 128 + signal.SIGTERM
    assert json.loads((run / "summary.json").read_text())["status"] == "interrupted"
    assert pd.read_csv(run / "eval.csv")["env_steps"].is_monotonic_increasing
    assert (run / "run.log").read_text().count(" - training ppo on CartPole") == 1  # the first's: none of the second's


def test_no_readable_checkpoint_is_a_one_line_error_never_a_fresh_start(make_config, tmp_path):
    run = tmp_path / "run"
    train(make_config(["algo=ppo", *SMALL_RUN]), run)
    (run / "summary.json").unlink()
    for name in ("checkpoint.pt", "checkpoint.prev.pt"):
        (run / name).write_bytes(b"PK\x03\x04 truncated")
    rows_before = (run / "train.csv").read_text()
    process = launch(["algo=ppo", *SMALL_RUN], run)
    _, stderr = process.communicate()
    assert process.returncode == 1
    error_lines = [line for line in stderr.splitlines() if line.startswith("error:")]
    assert len(error_lines) == 1 and "Traceback" not in stderr
    assert "checkpoint.pt is unreadable" in error_lines[0] and "checkpoint.prev.pt is unreadable" in error_lines[0]
    assert "Delete the run directory to start over" in error_lines[0]
    assert (run / "train.csv").read_text() == rows_before  # nothing trained, nothing overwritten
    assert json.loads((run / "summary.json").read_text())["status"] == "failed"


def test_a_checkpoint_of_the_retired_numpy_backend_is_refused_in_one_line(make_config, tmp_path):
    from benchmarks.engine.checkpoint import save_checkpoint_file

    cfg = make_config(["algo=ppo", *SMALL_RUN, *QUIET])
    train(cfg, tmp_path)
    (tmp_path / "summary.json").unlink()  # as if killed mid-run
    for name in ("checkpoint.pt", "checkpoint.prev.pt"):
        checkpoint = read_checkpoint(tmp_path / name)
        checkpoint["config"]["algo"]["backend"] = "numpy"  # as that backend's runs stored it
        save_checkpoint_file(checkpoint, tmp_path / name)
    with pytest.raises(CheckpointError) as refused:
        train(cfg, tmp_path)
    assert str(refused.value) == (
        f"{tmp_path / 'checkpoint.pt'} was written by the retired algo.backend=numpy (a hand-derived gradient of "
        f"PPO's loss; autograd computes it now), which cannot resume it: rerun with restart=true to train the run "
        f"afresh")


def test_a_checkpoint_of_another_config_is_refused(make_config, tmp_path):
    train(make_config(["algo=ppo", *SMALL_RUN, *QUIET]), tmp_path)
    (tmp_path / "summary.json").unlink()
    with pytest.raises(CheckpointError) as refused:
        train(make_config(["algo=ppo", *SMALL_RUN, *QUIET, "algo.lr=1e-3", "seeds=[0,1]"]), tmp_path)
    assert str(refused.value) == (f"{tmp_path / 'checkpoint.pt'} was written with a different config (differs in: "
                                  f"algo.lr, seeds); choose another run directory or delete this one")
    # the same seed in a population of two: the run alone is the one remedy (a population of one is the run alone)
    with pytest.raises(CheckpointError) as refused:
        train(make_config(["algo=ppo", *SMALL_RUN, *QUIET, "seeds=[0,1]"]), tmp_path)
    assert str(refused.value) == (f"{tmp_path / 'checkpoint.pt'} was written by a run of its seed alone (seed=0), "
                                  f"which alone resumes it (the seeds of a population resume in lockstep); rerun "
                                  f"that, or delete this run directory to train it again")
    # a population of one (seeds=[0]) is the run alone: it resumes the checkpoint (it was refused as another config)
    assert train(make_config(["algo=ppo", *SMALL_RUN, *QUIET, "seeds=[0]"]), tmp_path)["status"] == "complete"


def test_the_keys_two_configs_differ_in_are_named_dotted_a_missing_key_included():
    from benchmarks.engine.config import differing_keys

    stored = {"algo": {"lr": 1e-3, "clip": 0.2, "extra": None}, "seeds": [0, 1], "seed": 0}
    current = {"algo": {"lr": 2e-3, "clip": 0.2}, "seeds": [0, 1, 2], "seed": 0, "new": None}
    assert differing_keys(stored, current) == ["algo.extra", "algo.lr", "new", "seeds"]
    assert differing_keys(stored, stored) == []


@pytest.mark.parametrize("poison, message", [
    ("parameter", r"non-finite parameter actor\.layers\.0\.weight at iteration 3 \(1536 env steps\); "
                  r"the last good checkpoint is kept"),
    ("loss", r"non-finite policy_loss \(nan\) at iteration 3 \(1536 env steps\)"),
])
@pytest.mark.parametrize("backend", ["compiled", "torch"])
def test_non_finite_update_stops_the_run_keeps_the_last_good_checkpoint(poison, message, backend, make_config,
                                                                        tmp_path, monkeypatch):
    from algorithms.population import PopulationBatch

    def poisoned(stats: dict, algorithm, iteration: int) -> dict:
        if iteration == 3:
            if poison == "parameter":
                with torch.no_grad():
                    algorithm.policy.actor.layers[0].weight[0, 0] = float("nan")
            else:
                stats["policy_loss"] = float("nan")
        return stats

    original_update, original_population_update = PPO.update, PopulationBatch.update
    monkeypatch.setattr(PPO, "update", lambda self, rollout, iteration: poisoned(
        original_update(self, rollout, iteration), self, iteration))
    monkeypatch.setattr(PopulationBatch, "update", lambda self, rollouts, iteration, active: [
        poisoned(stats, algorithm, iteration) for stats, algorithm in
        zip(original_population_update(self, rollouts, iteration, active), self.algorithms)])
    with pytest.raises(NonFiniteError, match=message):
        train(make_config(["algo=ppo", f"algo.backend={backend}", *SMALL_RUN, *QUIET]), tmp_path)
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["status"] == "failed" and "non-finite" in summary["error"]
    checkpoint = read_checkpoint(tmp_path / "checkpoint.pt")
    assert checkpoint["iteration"] == 2
    assert all(torch.isfinite(p).all() for p in checkpoint["algorithm"]["policy"].values())
    assert pd.read_csv(tmp_path / "train.csv")["iteration"].tolist() == [1, 2]


@pytest.mark.parametrize("task, number, iteration", [
    ("LineNaNReward-v0", "reward", 2),
    ("LineNaNObservation-v0", "observation", 1),  # mid-rollout: the policy acts on it (a sampler raised)
    ("LineNaNLastObservation-v0", "observation", 1),  # the one after the rollout's last row: the bootstrap's input
])
@pytest.mark.parametrize("backend", ["compiled", "torch"])
def test_a_non_finite_number_from_the_task_is_named_as_the_cause(task, number, iteration, backend, make_config,
                                                                 tmp_path):
    """A NaN the env returned poisons the update too; the error names the env's number, not the loss it spoiled."""
    with pytest.raises(NonFiniteError, match=rf"^the task's env returned a non-finite {number} at iteration "
                                             rf"{iteration} \({512 * iteration} env steps\); the last good "
                                             rf"checkpoint is kept$"):
        train(make_config(["env=CartPole", f"env.id=tests.tasks:{task}", f"algo.backend={backend}", *SMALL_RUN,
                           *QUIET]), tmp_path)
    assert len((tmp_path / "train.csv").read_text().splitlines()[1:]) == iteration - 1  # the iterations before it


ALL_TASKS = ["CartPole-v1", "Acrobot-v1", "MountainCar-v0", "Pendulum-v1", "MountainCarContinuous-v0",
             "HalfCheetah-v5", "Hopper-v5", "Walker2d-v5", "Ant-v5", "Humanoid-v5", "Swimmer-v5",
             "InvertedPendulum-v5", "InvertedDoublePendulum-v5", "Reacher-v5", "Pusher-v5"]


def rollout(envs, actions) -> list:
    steps = []
    for action in actions:
        obs, reward, terminated, truncated, info = envs.step(action)
        steps.append((obs.copy(), reward.copy(), terminated.copy(), truncated.copy(),
                      info.get("episode", {}).get("r", np.zeros(0)).copy()))
    return steps


@pytest.mark.parametrize("env_id", ALL_TASKS)
def test_env_snapshot_restores_every_task_bit_exactly(env_id):
    """Mid-episode snapshot -> fresh env in another state -> identical future for identical actions."""
    source = make_vector_env(env_id, 2, seed=0)
    source.reset(seed=0)
    source.action_space.seed(1)
    actions = [source.action_space.sample() for _ in range(260)]
    rollout(source, actions[:130])  # classic-control episodes end and autoreset in here
    buffer = io.BytesIO()
    torch.save(vector_env_state(source), buffer)
    buffer.seek(0)
    state = torch.load(buffer, weights_only=True)

    target = make_vector_env(env_id, 2, seed=7)
    target.reset(seed=7)
    rollout(target, actions[:17])
    load_vector_env_state(target, state)
    expected, restored = rollout(source, actions[130:]), rollout(target, actions[130:])
    for step, (a, b) in enumerate(zip(expected, restored)):
        for x, y in zip(a, b):
            assert np.array_equal(x, y), f"{env_id}: differs at step {step} after the restore"


def test_env_snapshot_refuses_a_different_layout():
    state = vector_env_state(make_vector_env("CartPole-v1", 2, seed=0))
    with pytest.raises(ValueError, match="num_envs or wrappers changed"):
        load_vector_env_state(make_vector_env("CartPole-v1", 3, seed=0), state)
    assert isinstance(make_vector_env("CartPole-v1", 1, seed=0).unwrapped, gym.vector.SyncVectorEnv)


def test_reader_drops_a_half_written_last_line(tmp_path):
    path = tmp_path / "train.csv"
    path.write_text("env_steps,episode_return\n512,21.5\n1024,3")  # killed mid-row
    frame = read_csv_complete_rows(path)
    assert frame["env_steps"].tolist() == [512]


@pytest.mark.parametrize("batched", [False, True], ids=["one seed", "population"])
def test_a_paused_run_continues_to_the_uninterrupted_numbers(batched, make_config, tmp_path):
    """pause_at_steps (a pruned study's rungs): checkpoint and status "paused" at the first iteration boundary
    at or past it; a rerun with the same pause trains nothing; a rerun without it ends where an unpaused run ends."""
    from benchmarks.engine.batch_trainer import train_batch
    from benchmarks.runs import read_summary

    overrides = [*SMALL_RUN, *(["seeds=[0,1]"] if batched else [])]

    def run(run_dir: Path, *extra: str) -> list[Path]:
        cfg = make_config([*overrides, *extra])
        if not batched:
            train(cfg, run_dir)
            return [run_dir]
        dirs = [run_dir / f"seed{seed}" for seed in (0, 1)]
        train_batch(cfg, dirs)
        return dirs

    reference = run(tmp_path / "reference")
    paused = run(tmp_path / "paused", "pause_at_steps=1500")  # iterations of 512 steps: pauses at 1536
    for run_dir in paused:
        summary = read_summary(run_dir)
        assert (summary["status"], summary["env_steps"]) == ("paused", 1536)
        assert len(pd.read_csv(run_dir / "train.csv")) == 3
    run(tmp_path / "paused", "pause_at_steps=1500")  # already there: nothing more is trained
    assert all(len(pd.read_csv(run_dir / "train.csv")) == 3 for run_dir in paused)
    run(tmp_path / "paused")
    for done, uninterrupted in zip(paused, reference):
        assert read_summary(done)["status"] == "complete"
        assert_same_metrics(done, uninterrupted)


def test_pause_at_steps_needs_checkpoints(make_config):
    from benchmarks.engine.validate import ConfigError, validate_config

    with pytest.raises(ConfigError) as error:
        validate_config(make_config([*SMALL_RUN, "pause_at_steps=1024", "logging.checkpoint=false"]))
    assert str(error.value) == ("pause_at_steps=1024 needs logging.checkpoint=true: a paused run resumes from the "
                                "checkpoint it writes there")


def test_a_full_disk_mid_checkpoint_is_one_line_leaves_nothing_behind_and_resumes_exactly(monkeypatch, tmp_path):
    import builtins
    import errno

    from benchmarks.engine import logger
    from benchmarks.engine.logger import DiskFullError
    from benchmarks.engine.config import compose_config
    from benchmarks.engine.trainer import train

    cfg = compose_config([*SMALL_RUN, "logging.tensorboard=false"])
    train(cfg, tmp_path / "reference")
    checkpoints = {"written": 0}

    class FullDisk:
        """A file that takes half of what it is given, then finds the disk full."""

        def __init__(self, handle):
            self.handle = handle

        def write(self, data):
            self.handle.write(data[:len(data) // 2])
            raise OSError(errno.ENOSPC, "No space left on device")

        def __getattr__(self, name):
            return getattr(self.handle, name)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.handle.close()

    def opening(path, mode="r", *args, **kwargs):
        handle = builtins.open(path, mode, *args, **kwargs)
        if str(path).endswith("checkpoint.pt.tmp"):
            checkpoints["written"] += 1
            if checkpoints["written"] == 3:  # the third checkpoint: the disk is full
                return FullDisk(handle)
        return handle

    monkeypatch.setattr(logger, "open", opening, raising=False)
    with pytest.raises(DiskFullError) as error:
        train(cfg, tmp_path / "run")
    assert str(error.value) == (f"no space left on the device to write {tmp_path / 'run' / 'checkpoint.pt'}: nothing "
                                f"half-written is left, and a resume starts from the last whole checkpoint; free "
                                f"space and rerun the same command")
    left = sorted(path.name for path in (tmp_path / "run").iterdir())
    assert not [name for name in left if name.endswith(".tmp") or name == ".lock"], left
    monkeypatch.undo()  # space freed
    train(cfg, tmp_path / "run")
    assert_same_metrics(tmp_path / "reference", tmp_path / "run")
    assert not (tmp_path / "reference" / ".lock").exists()  # a finished run leaves no lock either


@pytest.mark.slow
def test_a_signal_landing_inside_a_compiled_program_is_recorded_not_raised():
    """Preemption signals arrive at any moment, so also while a compiled population program runs with its guards
    skipped (UncheckedCalls: a rollout, an update). There a new Python frame - a Python signal handler - made torch
    raise (a cache miss under skip_guard_eval_unsafe), failing a 10-seed MuJoCo population instead of
    checkpointing it. So the handler must be C code: the assertion on its type is what fails if a Python handler
    comes back (this small program, called under the same storm with a Python function as the handler, ran over
    20,000 calls without a failure, so the storm alone would not catch one). With the C handler, a storm of SIGTERM
    every 0.3 ms leaves every call of the program intact and the signal recorded."""
    import _thread
    import threading
    import types

    from algorithms.population import CompiledOnce, UncheckedCalls
    from benchmarks.engine.trainer import PreemptionSignals

    program = CompiledOnce(lambda x: torch.outer(x.sin(), x.cos()).tanh().sum(), "compiled")
    x = torch.randn(8, 128)  # about 1 ms a call: signals land inside calls, 3000 calls in seconds
    program(x)  # compiled, outside the block
    firing = threading.Event()
    firing.set()

    def fire():
        while firing.is_set():
            _thread.interrupt_main(signal.SIGTERM)
            time.sleep(0.0003)

    calls = 0
    # Ctrl-C as in a terminal, whatever started pytest: a shell's background job starts with SIGINT ignored, and
    # a run leaves it so (test_a_run_started_with_ctrl_c_ignored_leaves_it_ignored)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with PreemptionSignals() as signals:
            for signum in PreemptionSignals.SIGNALS:  # no Python frame when a signal lands
                handler = signal.getsignal(signum)
                assert callable(handler) and not isinstance(handler, (types.FunctionType, types.MethodType)), handler
            thread = threading.Thread(target=fire, daemon=True)
            thread.start()
            try:
                with UncheckedCalls([program]):
                    while calls < 3000:
                        program(x)
                        calls += 1
            finally:
                firing.clear()
                thread.join()
            assert signals.received == signal.SIGTERM
    finally:
        signal.signal(signal.SIGINT, previous)
    assert calls == 3000
