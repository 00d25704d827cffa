"""run.py from the command line: bad input fails fast with one clear line; a good run lands where expected."""

import json
import sys

import pytest
from conftest import ROOT, SMALL_UPDATE

from tests.commands import run_python


def run_cli(*overrides, cwd=ROOT):
    return run_python([sys.executable, str(ROOT / "run.py"), *overrides], cwd=cwd, capture_output=True,
                      text=True, timeout=120)


# The messages themselves are checked in-process (tests/test_validation.py); here, that the command line
# prints them as they are, exits 2 and trains nothing: a range, an algorithm's own check, the run's.
@pytest.mark.parametrize(
    "overrides, message",
    [
        (["algo.lr=0"], "config error: algo.lr must be a number > 0, got 0"),
        (["algo.num_minibatches=3"],
         "config error: algo.num_minibatches must divide the rollout size env.num_envs * env.num_steps = 512, got 3"),
        (["total_steps=100"],
         "config error: total_steps must be >= one rollout (env.num_envs * env.num_steps = 512), got 100"),
        (["seeds=[0,1]", "seed=3"],
         "config error: seed=3 and seeds=[0,1] are both given (one of them may be the experiment's sweep): "
         "seeds=[...] trains its seeds as one population and ignores seed; give one of them (seeds=[3] trains seed 3 "
         "alone)"),
    ],
)
def test_bad_value_fails_with_one_clear_line_before_any_env(overrides, message, tmp_path):
    result = run_cli(*overrides, f"hydra.run.dir={tmp_path}/run")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [message]
    assert not (tmp_path / "run" / "train.csv").exists()  # nothing was trained


def test_several_bad_values_are_all_reported(tmp_path):
    result = run_cli("algo.lr=0", "algo.clip_coef=0", f"hydra.run.dir={tmp_path}")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "config error: algo.lr must be a number > 0, got 0",
        "config error: algo.clip_coef must be a number > 0, got 0",
    ]


@pytest.mark.parametrize("group, option", [("algo", "nope"), ("env", "NoSuchTask")])
def test_unknown_option_names_the_available_ones(group, option):
    result = run_cli(f"{group}={option}")
    assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr  # one line, not Hydra's list
    assert result.stderr.startswith(f"config error: {group}={option}: {group} has no option {option}")
    options = result.stderr.split("its options: ")[1].strip().split(", ")
    assert ("ppo" if group == "algo" else "HalfCheetah") in options


@pytest.mark.slow
def test_run_directory_is_derived_from_env_algo_seed_and_every_other_override(tmp_path):
    result = run_cli("total_steps=512", "seed=3", "eval.episodes=1", "logging.tensorboard=false", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    # logging switches change no number and stay out of the name; other overrides name the directory
    run_dir = tmp_path / "runs" / "CartPole" / "ppo" / "eval.episodes=1,total_steps=512" / "seed3"
    for name in ("train.csv", "eval.csv", "episodes.csv", "summary.json", "checkpoint.pt"):
        assert (run_dir / name).exists(), name
    # a second config does not collide with the first; the same command finds its run complete
    other = run_cli("total_steps=1024", "seed=3", "eval.episodes=1", "logging.tensorboard=false", cwd=tmp_path)
    assert other.returncode == 0, other.stderr
    assert (tmp_path / "runs" / "CartPole" / "ppo" / "eval.episodes=1,total_steps=1024" / "seed3" / "summary.json").exists()
    again = run_cli("total_steps=512", "seed=3", "eval.episodes=1", cwd=tmp_path)
    assert again.returncode == 0 and "already complete, skipped" in again.stdout + again.stderr
    # a dozen values of one's own would name a directory past a file system's 255 bytes: its beginning and a digest
    many = [f"algo.{key}={value}{'0' * 30}" for key, value in (("gamma", "0.99"), ("gae_lambda", "0.95"),
                                                                ("clip_coef", "0.2"), ("vf_coef", "0.5"),
                                                                ("max_grad_norm", "0.5"), ("ent_coef", "0.0"))]
    long = run_cli("total_steps=512", "seed=3", "eval.episodes=1", "logging.tensorboard=false", *many, cwd=tmp_path)
    assert long.returncode == 0, long.stderr
    (named,) = [path for path in (tmp_path / "runs" / "CartPole" / "ppo").iterdir() if "sha256-" in path.name]
    assert len(named.name.encode()) <= 200 and named.name.startswith("algo.clip_coef=0.2000")
    assert (named / "seed3" / "summary.json").exists()


def test_a_long_overrides_name_keeps_its_beginning_and_a_digest_of_the_whole():
    from benchmarks.engine.validate import MAX_OVERRIDES_NAME, overrides_dir

    assert overrides_dir("algo.lr=0.001,total_steps=512") == "algo.lr=0.001,total_steps=512"
    assert overrides_dir("") == ""
    long, longer = "a=" + "1" * 300, "a=" + "1" * 299 + "2"
    assert len(overrides_dir(long).encode()) <= MAX_OVERRIDES_NAME and overrides_dir(long).startswith("a=111")
    assert overrides_dir(long) == overrides_dir(long) != overrides_dir(longer)  # the same name, another for others
    assert len(overrides_dir("é" * 200).encode()) <= MAX_OVERRIDES_NAME  # cut between characters, not bytes


def test_tensorboard_event_file_is_written(tmp_path):
    result = run_cli("total_steps=512", "eval.episodes=1", f"hydra.run.dir={tmp_path}")
    assert result.returncode == 0, result.stderr
    assert list((tmp_path / "tb").glob("events.out.tfevents*"))


def test_a_measured_result_for_the_preset_and_family_is_said_at_the_start(tmp_path):
    """A family's values may hold a known_result per preset (env.tuned.<preset>): the run prints it before training."""
    result = run_cli("algo=hp3o", "+env.tuned.hp3o.known_result='did not learn in 16 trials (study hp3o)'",
                     "total_steps=512", "eval.episodes=1", "logging.tensorboard=false", "logging.progress_bar=false",
                     f"hydra.run.dir={tmp_path}")
    assert result.returncode == 0, result.stderr
    assert "note: hp3o on the classic family: did not learn in 16 trials (study hp3o)" in result.stderr.splitlines()


def test_a_budget_that_is_not_whole_iterations_says_what_it_trains(tmp_path):
    result = run_cli("env=Pendulum", "total_steps=3000", "eval.episodes=1", "eval.at_start=false",
                     "logging.tensorboard=false", "logging.progress_bar=false", f"hydra.run.dir={tmp_path}")
    assert result.returncode == 0, result.stderr
    assert "note: total_steps=3000 trains 2048 env steps (1 iteration(s) of 4 envs x 512 steps)" in result.stderr


def snapshot(directory) -> dict:
    """Every file's bytes under a directory (the lock and job marks aside: they hold a pid and a time)."""
    return {path.relative_to(directory): path.read_bytes() for path in sorted(directory.rglob("*"))
            if path.is_file() and path.name not in (".lock", ".job")}


def test_a_seed_trained_alone_and_then_in_a_population_is_refused_with_what_trains_the_rest(tmp_path):
    """A seed's complete run is skipped only by the same config; trained alone and then asked for in a population
    of two or more (or the other way round) it would round differently, so it is refused, saying what trains the
    other seeds. A population of one is the seed alone (the same numbers): either finds the other complete."""
    small = ["env=CartPole", "total_steps=512", "env.num_steps=128", *SMALL_UPDATE, "eval.episodes=1",
             "logging.tensorboard=false", "logging.progress_bar=false"]
    assert run_cli(*small, "seed=0", f"hydra.run.dir={tmp_path}/seed0").returncode == 0
    refused = run_cli(*small, "seeds=[0,2]", f"hydra.run.dir={tmp_path}/seeds0_2")
    assert refused.returncode == 2 and refused.stderr.strip().splitlines()[-1] == (
        f"config error: {tmp_path}/seed0 holds a complete run of seed 0 trained alone, and this command trains it "
        f"in a population of seeds=[0,2]: the two round differently; train the others without it (seeds=[2]), or "
        f"add restart=true to train it again in a population of seeds=[0,2]")
    assert run_cli(*small, "seeds=[2]", f"hydra.run.dir={tmp_path}/seeds2-2").returncode == 0
    alone = run_cli(*small, "seed=2", f"hydra.run.dir={tmp_path}/seed2")  # (it was refused: "round differently")
    assert alone.returncode == 0 and f"already complete, skipped: {tmp_path}/seed2 " in alone.stderr, alone.stderr
    again = run_cli(*small, "seeds=[0,2]", "restart=true", f"hydra.run.dir={tmp_path}/seeds0_2")
    assert again.returncode == 0, again.stderr  # the remedy it gave
    assert json.loads((tmp_path / "seed0" / "summary.json").read_text())["config"]["seeds"] == [0, 2]
    refused = run_cli(*small, "seed=0", f"hydra.run.dir={tmp_path}/seed0")
    assert refused.returncode == 2 and refused.stderr.strip().splitlines()[-1] == (
        f"config error: {tmp_path}/seed0 holds a complete run of seed 0 trained in a population of seeds=[0,2], and "
        f"this command trains it alone: the two round differently; rerun seeds=[0,2] (it skips the complete "
        f"seeds), or add restart=true to train it again alone")


def test_a_refused_run_leaves_the_other_run_byte_identical(tmp_path):
    run_dir = tmp_path / "run"
    first = run_cli("total_steps=512", "eval.episodes=1", "logging.tensorboard=false", f"hydra.run.dir={run_dir}")
    assert first.returncode == 0, first.stderr
    before = snapshot(run_dir)
    assert (run_dir / ".hydra" / "overrides.yaml").exists() and (run_dir / "run.log").exists()
    refused = run_cli("total_steps=1024", "eval.episodes=1", "logging.tensorboard=false", f"hydra.run.dir={run_dir}")
    assert refused.returncode == 2
    assert f"config error: {run_dir} holds a complete run with a different config (differs in: total_steps)" \
        in refused.stderr
    assert snapshot(run_dir) == before


def test_a_sweep_job_refused_by_another_configs_complete_run_leaves_the_other_jobs_to_run(tmp_path):
    """Like any refused job of a sweep: recorded and listed at the sweep's end, the complete run left byte for byte
    as it was, the other jobs trained (the refusal ended the whole sweep, exit 2, its other jobs never run)."""
    sweep = ["-m", "total_steps=512", "env.num_steps=128", *SMALL_UPDATE, "eval.episodes=1",
             "logging.tensorboard=false", "logging.progress_bar=false", f"hydra.sweep.dir={tmp_path}"]
    assert run_cli(*sweep, "seed=0").returncode == 0
    first = tmp_path / "CartPole" / "ppo" / "seed0"
    before = snapshot(first)
    refused = run_cli(*sweep, "seed=0,1", "algo.lr=0.001")
    assert refused.returncode != 0
    assert f"config error: {first} holds a complete run with a different config (differs in: algo.lr)" \
        in refused.stderr
    assert f"FAILED {first}: config error: {first} holds a complete run" in refused.stdout
    assert snapshot(first) == before
    other = json.loads((tmp_path / "CartPole" / "ppo" / "seed1" / "summary.json").read_text())
    assert other["status"] == "complete" and other["config"]["algo"]["lr"] == 0.001


def test_a_sweep_over_another_key_is_told_how_to_give_each_point_its_own_directory(tmp_path):
    """A sweep's runs go to <env>/<algo>/seed<k>: a second point of a sweep over algo.lr finds the first's run
    there (complete, or paused with its checkpoint: its record of how it ran stays as it was, and it resumes) and
    is refused, with the subdir that names each point's overrides (docs/configuration.md), which trains it beside
    the first."""
    # one iteration of 4 x 128 steps and a small update: the refusals, not the training, are under test
    sweep = ["-m", "seed=0", "total_steps=512", "env.num_steps=128", *SMALL_UPDATE, "eval.episodes=1",
             "logging.tensorboard=false", "logging.progress_bar=false", f"hydra.sweep.dir={tmp_path}"]
    assert run_cli(*sweep).returncode == 0
    refused = run_cli(*sweep, "algo.lr=0.001")
    subdir = '"${env.name}/${algo.name}/${overrides_dir:${hydra:job.override_dirname}}/${seed_dir:${seed},${seeds}}"'
    assert refused.returncode != 0
    assert (f"config error: {tmp_path / 'CartPole' / 'ppo' / 'seed0'} holds a complete run with a different config "
            f"(differs in: algo.lr); choose another hydra.sweep.dir or delete it; if the points of this sweep differ "
            f"in a key besides env, algo and seed, add 'hydra.sweep.subdir={subdir}' to give each point its own "
            f"directory") in refused.stderr
    again = run_cli(*sweep, "algo.lr=0.001", f"hydra.sweep.subdir={subdir}")
    assert again.returncode == 0, again.stderr
    point = ("algo.lr=0.001,env.hparams.num_minibatches=8,env.hparams.update_epochs=2,env.num_steps=128,"
             "eval.episodes=1,total_steps=512")
    assert (tmp_path / "CartPole" / "ppo" / point / "seed0" / "summary.json").exists()
    # a first point paused (or interrupted) leaves its checkpoint there: the second point's refusal says the same
    paused = [{"seed=0": "seed=1", "total_steps=512": "total_steps=1024"}.get(argument, argument) for argument in sweep]
    assert run_cli(*paused, "pause_at_steps=512").returncode == 0
    record = {path.name: path.read_bytes() for path in (tmp_path / "CartPole" / "ppo" / "seed1" / ".hydra").iterdir()}
    run_log = (tmp_path / "CartPole" / "ppo" / "seed1" / "run.log").read_bytes()
    refused = run_cli(*paused, "algo.lr=0.001")
    assert refused.returncode != 0
    assert (f"job failed: {tmp_path / 'CartPole' / 'ppo' / 'seed1'}: {tmp_path / 'CartPole' / 'ppo' / 'seed1'}"
            f"/checkpoint.pt was written with a different config (differs in: algo.lr); choose another run directory "
            f"or delete this one; if the points of this sweep differ in a key besides env, algo and seed, add "
            f"'hydra.sweep.subdir={subdir}' to give each point its own directory") in refused.stdout + refused.stderr
    assert f"FAILED {tmp_path / 'CartPole' / 'ppo' / 'seed1'}: CheckpointOfAnotherConfig: " in refused.stdout
    assert {path.name: path.read_bytes() for path in (tmp_path / "CartPole" / "ppo" / "seed1" / ".hydra").iterdir()} \
        == record  # the first point's record of how it was run, as it was
    assert (tmp_path / "CartPole" / "ppo" / "seed1" / "run.log").read_bytes() == run_log  # its log: no refused job's line
    resumed = run_cli(*paused)  # and its run resumes
    assert resumed.returncode == 0 and "from its checkpoint at 512 env steps" in resumed.stdout + resumed.stderr
    assert json.loads((tmp_path / "CartPole" / "ppo" / "seed1" / "summary.json").read_text())["status"] == "complete"


def test_a_sweep_job_refused_by_a_held_run_directory_says_how_points_get_their_own(tmp_path):
    """Points of a sweep launched in parallel (joblib) meet on a run directory while the first trains: the second
    is refused by its lock, with the same hint (here this test holds the lock)."""
    import os

    from benchmarks.engine.run_dir import run_lock

    run_dir = tmp_path / "CartPole" / "ppo" / "seed0"
    run_dir.mkdir(parents=True)
    with run_lock(run_dir):
        refused = run_cli("-m", "seed=0", "total_steps=512", "logging.progress_bar=false", f"hydra.sweep.dir={tmp_path}")
    assert not (run_dir / ".hydra").exists()  # the running job's record (none here) as it was
    assert not (run_dir / "run.log").exists() or not (run_dir / "run.log").read_text()  # and its log: no line of this job
    subdir = '"${env.name}/${algo.name}/${overrides_dir:${hydra:job.override_dirname}}/${seed_dir:${seed},${seeds}}"'
    assert (f"error: {run_dir} is being trained by another process (pid {os.getpid()}); wait for it to finish, or "
            f"choose another run directory; if the points of this sweep differ in a key besides env, algo and seed, add "
            f"'hydra.sweep.subdir={subdir}' to give each point its own directory") in refused.stderr, refused.stderr


@pytest.mark.slow
def test_a_sweep_rerun_that_skips_complete_runs_changes_no_file(tmp_path):
    sweep = ["-m", "seed=0,1", "total_steps=512", "eval.episodes=1", "logging.tensorboard=false",
             "logging.progress_bar=false", f"hydra.sweep.dir={tmp_path}"]
    assert run_cli(*sweep).returncode == 0
    before = snapshot(tmp_path)
    assert (tmp_path / "multirun.yaml").exists() and (tmp_path / "CartPole" / "ppo" / "seed1" / ".hydra").is_dir()
    again = run_cli(*sweep[:-1], "eval.at_start=true", sweep[-1])  # another spelling of the same config
    assert again.returncode == 0, again.stderr
    assert "sweep finished: 2 of 2 runs complete (2 jobs)" in again.stdout
    assert again.stderr.count("already complete, skipped") == 2
    assert snapshot(tmp_path) == before


def test_a_sweep_that_refuses_a_jobs_config_does_not_count_the_run_stored_there_as_complete(tmp_path):
    """A complete run from an earlier sweep stays as it is when this sweep refuses its job's config, and the
    sweep's end counts that job failed, not complete."""
    sweep = ["-m", "seed=0", "total_steps=512", "eval.episodes=1", "logging.tensorboard=false",
             "logging.progress_bar=false", f"hydra.sweep.dir={tmp_path}"]
    assert run_cli(*sweep).returncode == 0
    run_dir = tmp_path / "CartPole" / "ppo" / "seed0"
    stored = (run_dir / "summary.json").read_bytes()
    refused = run_cli(*sweep[:-1], "algo.clip_coef=-1", sweep[-1])
    assert refused.returncode == 1
    assert "sweep finished: 0 of 1 runs complete (1 jobs)" in refused.stdout
    assert f"FAILED {run_dir}: config error: algo.clip_coef" in refused.stdout
    assert (run_dir / "summary.json").read_bytes() == stored


@pytest.mark.slow
def test_restart_true_trains_the_same_command_again_from_the_first_step(tmp_path):
    run_dir = tmp_path / "run"
    command = ["total_steps=1024", "eval.episodes=1", "logging.tensorboard=false", f"hydra.run.dir={run_dir}"]
    assert run_cli(*command).returncode == 0
    import pandas as pd

    def eval_numbers():
        return pd.read_csv(run_dir / "eval.csv").drop(columns="wall_time")

    first_eval = eval_numbers()
    skipped = run_cli(*command)
    assert "already complete, skipped" in skipped.stderr
    again = run_cli(*command, "restart=true")
    assert again.returncode == 0, again.stderr
    assert f"restart=true: removed summary.json, train.csv, eval.csv, episodes.csv, checkpoint.pt from {run_dir}" \
        in again.stderr
    output = again.stdout + again.stderr
    assert "training ppo on CartPole" in output and "resuming" not in output
    pd.testing.assert_frame_equal(eval_numbers(), first_eval)  # same seed, same numbers, trained anew


def test_eval_lines_say_whose_they_are(tmp_path):
    """Parallel sweep jobs print to one console: every eval line names its task, preset and seed."""
    result = run_cli("algo=hp3o", "seed=4", "total_steps=1024", "eval.every_steps=512", "eval.episodes=1",
                     "logging.tensorboard=false", "logging.progress_bar=false", f"hydra.run.dir={tmp_path}")
    assert result.returncode == 0, result.stderr
    lines = [line for line in (result.stdout + result.stderr).splitlines() if "eval @" in line]
    assert lines and all(line.startswith("CartPole hp3o seed 4: eval @ ") for line in lines), lines


@pytest.mark.parametrize("command, argument, message", [
    ("report", "{missing}", "argument suites: {missing} does not exist"),
    ("claims", "{missing}", "argument suites: {missing} does not exist"),
    ("summarize", "{missing}", "argument runs_dir: {missing} does not exist"),
    ("reproduce", "{missing}", "argument run_dirs: {missing} does not exist"),
    ("reproduce", "{empty}", "argument run_dirs: {empty} is not a run directory (no summary.json) nor a suite "
                             "holding complete runs"),
    ("pack", "{file}", "argument suites: {file} is not a directory"),
    ("evaluate", "{missing}", "argument checkpoint: {missing} does not exist"),
    ("evaluate", "{empty}", "argument checkpoint: {empty} is a directory without a checkpoint.pt (a run directory "
                            "holds one once its first checkpoint is written)"),
    ("evaluate", "{file}", "argument checkpoint: {file} is not a checkpoint this suite wrote (torch.load: "
                           "UnpicklingError)"),
    ("evaluate", "{batch}", "argument checkpoint: {batch} is a directory without a checkpoint.pt (a run directory "
                            "holds one once its first checkpoint is written); its runs: {batch}/seed0, {batch}/seed1 "
                            "(give one)"),
    ("evaluate", "{job}", "argument checkpoint: {job} is a directory without a checkpoint.pt (a run directory "
                          "holds one once its first checkpoint is written); its runs: {batch}/seed0, {batch}/seed1 "
                          "(give one)"),
])
def test_an_analysis_command_on_a_path_that_is_not_there_says_so_in_one_line(command, argument, message, tmp_path):
    (tmp_path / "file").write_text("x")
    batch = tmp_path / "batch"  # an algorithm's folder: its seeds' runs inside, and a batch job's, beside them
    for seed in ("seed0", "seed1"):
        (batch / seed).mkdir(parents=True)
        (batch / seed / "checkpoint.pt").write_text("x")
    (batch / "seeds0-1").mkdir()
    (batch / "seeds0-1" / ".job").write_text('{"seeds": [0, 1]}')
    paths = {"missing": tmp_path / "nothing", "empty": tmp_path, "file": tmp_path / "file", "batch": batch,
             "job": batch / "seeds0-1"}
    result = run_python([sys.executable, "-m", f"benchmarks.{command}", argument.format(**paths)], cwd=ROOT,
                        capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.splitlines()[-1] == f"python -m benchmarks.{command}: error: {message.format(**paths)}"


def test_mujocos_warning_about_gymnasiums_own_halfcheetah_model_is_not_repeated_every_compile(tmp_path):
    result = run_cli("env=HalfCheetah", "total_steps=2048", "eval.episodes=1", "logging.tensorboard=false",
                     "logging.progress_bar=false", f"hydra.run.dir={tmp_path}/run", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "settotalmass" not in result.stdout + result.stderr
    assert not (tmp_path / "MUJOCO_LOG.TXT").exists()


def test_other_mujoco_warnings_are_said_once_each(capsys):
    from benchmarks.engine.envs import mujoco_warning

    for _ in range(3):
        mujoco_warning("Nan, Inf or huge value in QACC at DOF 0. The simulation is unstable.")
        mujoco_warning("compiler attribute 'settotalmass' is deprecated and will be removed in a future release")
    assert capsys.readouterr().err == ("mujoco warning: Nan, Inf or huge value in QACC at DOF 0. The simulation "
                                       "is unstable.\n")
