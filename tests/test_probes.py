"""What a hostile user tries: each ends in one line naming the problem, a non-zero exit, nothing trained and no
run directory left behind."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from algorithms.ppo import PPO
from tests.commands import run_python
from tests.conftest import ROOT


def run_py(*arguments: str, cwd=ROOT) -> subprocess.CompletedProcess:
    return run_python([sys.executable, str(ROOT / "run.py"), *arguments], cwd=cwd, capture_output=True,
                      text=True, timeout=300)


@pytest.mark.parametrize("arguments, message", [
    (["seeds=abc"], "config error: seeds must be null (one seed, `seed`) or a list of distinct integers in "
                    "[0, 4294967295] trained as one batch, got 'abc'"),
    (["total_steps=1e6"], "config error: total_steps must be an integer >= 1, got 1000000.0 (a float: write the "
                          "integer, 1000000)"),
    (["total_steps=-1e6"], "config error: total_steps must be an integer >= 1, got -1000000.0\n"),  # no hint: refused too
    (["algo.hidden_sizes=[100000,100000]"], "config error: algo.hidden_sizes=[100000, 100000] gives 10,000,000,000 "
                                            "weights between hidden layers per network; at most 50,000,000"),
    (["env.id=Foo-v0"], "config error: env.id must be a registered Gymnasium id (a MuJoCo v5 or classic-control id, "
                        "or module:Id), got 'Foo-v0'"),
    (["env.id=nosuchmodule:Foo-v0"], "config error: env.id=nosuchmodule:Foo-v0: its module nosuchmodule cannot be "
                                     "imported"),
    (["env.id=FrozenLake-v1"], "config error: env.id=FrozenLake-v1: its observation space Discrete(16) is not "
                               "supported: the suite's networks read one flat vector of numbers per step"),
    (["env.id=tests.tasks:LineMultiDiscrete-v0"], "config error: env.id=tests.tasks:LineMultiDiscrete-v0: its action "
                                                  "space MultiDiscrete([2 3]) is not supported"),
    (["env.id=tests.tasks:LineBoxMatrix-v0"], "config error: env.id=tests.tasks:LineBoxMatrix-v0: its action space "
                                              "Box(-1.0, 1.0, (2, 2), float32) is not supported: the suite's policies "
                                              "act in a Discrete space starting at 0 or a Box of floats of shape (n,)"),
    (["env.id=tests.tasks:LineFromOne-v0"], "config error: env.id=tests.tasks:LineFromOne-v0: its action space "
                                            "Discrete(2, start=1) is not supported"),
    (["env.id=tests.tasks:LineIntegerBox-v0"], "config error: env.id=tests.tasks:LineIntegerBox-v0: its action space "
                                               "Box(0, 10, (3,), int64) is not supported"),
    (["env.id=tests.tasks:Blind-v0"], "config error: env.id=tests.tasks:Blind-v0: its observation space Box([], [], "
                                      "(0,), float32) is not supported"),
    (["env.id=tests.tasks:LineNoActions-v0"], "config error: env.id=tests.tasks:LineNoActions-v0: its action space "
                                              "Box([], [], (0,), float32) is not supported"),
    (["env.id=tests.tasks:LineOldGym-v0"], "config error: env.id=tests.tasks:LineOldGym-v0: its step() returns 4 "
                                           "values, where 5 are expected (observation, reward, terminated, truncated, "
                                           "info): Gymnasium's API, not the old gym's\n"),
    (["env.id=tests.tasks:LineOldGymTimed-v0"], "config error: env.id=tests.tasks:LineOldGymTimed-v0: its step() "
                                                "returns 4 values, where 5 are expected (observation, reward, "
                                                "terminated, truncated, info): Gymnasium's API, not the old gym's\n"),
    (["env.id=tests.tasks:LineMisshapen-v0"], "config error: env.id=tests.tasks:LineMisshapen-v0: its reset() returns an "
                                              "observation of shape (3,), where its observation space says (2,)\n"),
    (["env.id=tests.tasks:LinePairReward-v0"], "config error: env.id=tests.tasks:LinePairReward-v0: its step() "
                                               "returns a reward of shape (2,), where one number is expected\n"),
    (["env.id=tests.tasks:Unbuildable-v0", "seeds=[0,1]"],
     "config error: env.id=tests.tasks:Unbuildable-v0 cannot be made: RuntimeError: the task's licence server is "
     "not reachable"),
    # a config group's option misspelt: refused before Hydra composes anything, with the nearest option (and the
    # group's options, which a plugin or a task file of one's own adds to)
    (["env=cartpole"], "config error: env=cartpole: env has no option cartpole (did you mean CartPole?); its options: "
                       "Acrobot, Ant, CartPole, "),
    (["-m", "algo=ppo,outerppo"], "config error: algo=ppo,outerppo: algo has no option outerppo (did you mean "
                                  "outer_ppo?); its options: "),
    (["hydra/launcher=jobib"], "config error: hydra/launcher=jobib: hydra/launcher has no option jobib (did you mean "
                               "joblib?); its options: "),
    (["algo.lrr=0.001"], "config error: algo.lrr=0.001: algo has no key lrr (did you mean lr?); its keys: adam_eps, "
                         "algorithm, "),  # Hydra adds a key only when typed +algo.lrr=...: six lines of its own
    (["-m", "seed=0,1", "evall.episodes=3,5"], "config error: evall.episodes=3,5: the config has no key evall (did "
                                               "you mean eval?); its keys: algo, "),
    (["env.kwargs.x=1"], "config error: env.kwargs.x=1: env has no key kwargs; its keys: eval_episodes, "),
])
def test_a_bad_value_is_one_line_and_leaves_no_run_directory(arguments, message, tmp_path):
    result = run_py(*arguments, f"hydra.run.dir={tmp_path}/run", f"hydra.sweep.dir={tmp_path}/sweep")
    assert result.returncode == 2
    assert result.stderr.startswith(message) and result.stderr.count("\n") == 1, result.stderr
    assert "training" not in result.stdout + result.stderr
    assert not (tmp_path / "run").exists() and not (tmp_path / "sweep").exists()


def test_a_bad_value_in_the_default_run_directory_leaves_no_directory_above_it_either(tmp_path):
    """The default run directory is runs/<env>/<algo>/<overrides>/seed<k> under the working directory: Hydra makes
    all of it before the config is checked; what the refused run leaves empty goes, what holds anything stays."""
    (tmp_path / "runs" / "CartPole" / "hp3o").mkdir(parents=True)  # another preset's runs: kept
    (tmp_path / "runs" / "CartPole" / "hp3o" / "notes.txt").write_text("mine")
    result = run_py("algo.lr=-1", cwd=tmp_path)
    assert result.returncode == 2 and result.stderr == "config error: algo.lr must be a number > 0, got -1\n"
    assert sorted(path.relative_to(tmp_path).as_posix() for path in tmp_path.rglob("*")) == \
        ["runs", "runs/CartPole", "runs/CartPole/hp3o", "runs/CartPole/hp3o/notes.txt"]
    # a run directory given elsewhere: it goes, the (empty) directory one made for it stays
    (tmp_path / "mine").mkdir()
    assert run_py("algo.lr=-1", "hydra.run.dir=mine/run", cwd=tmp_path).returncode == 2
    assert (tmp_path / "mine").is_dir() and not (tmp_path / "mine" / "run").exists()


@pytest.mark.slow
def test_a_task_id_or_name_typed_over_a_presets_is_said_in_a_note(tmp_path):
    short_run = ["env=CartPole", "total_steps=512", "eval.at_start=false", "eval.episodes=1", "logging.tensorboard=false",
                 "logging.progress_bar=false", "algo.backend=torch"]
    result = run_py(*short_run, "env.id=Acrobot-v1", f"hydra.run.dir={tmp_path}/run")
    assert result.returncode == 0, result.stderr
    assert ("note: env.id=Acrobot-v1 env.name=CartPole over env=CartPole (id CartPole-v1): the run trains Acrobot-v1 "
            "under the name CartPole (its run directory and report rows) with env=CartPole's family values and "
            "scores; a task of its own is a conf/env/<Name>.yaml file (docs/extending.md)\n") in result.stderr
    renamed = run_py(*short_run, "env.id=Acrobot-v1", "env.name=Acrobot", f"hydra.run.dir={tmp_path}/renamed")
    assert renamed.returncode == 0 and "note: env.id=Acrobot-v1 env.name=Acrobot over env=CartPole" in renamed.stderr
    same = run_py(*short_run, "env.id=CartPole-v1", f"hydra.run.dir={tmp_path}/same")
    assert same.returncode == 0 and "note: env.id" not in same.stderr, same.stderr


def test_a_run_directory_that_is_a_file_is_one_line(tmp_path):
    (tmp_path / "afile").write_text("mine")
    result = run_py(f"hydra.run.dir={tmp_path}/afile")
    assert result.returncode == 2
    assert result.stderr == f"config error: hydra.run.dir={tmp_path}/afile is a file, not a directory: give a directory\n"
    assert (tmp_path / "afile").read_text() == "mine"
    inside = run_py("-m", f"hydra.sweep.dir={tmp_path}/afile/sweep", "seed=0,1")  # a path through the file
    assert inside.returncode == 2
    assert inside.stderr == f"config error: hydra.sweep.dir={tmp_path}/afile/sweep cannot be made: {tmp_path}/afile is a file\n"


def test_a_refused_config_leaves_an_earlier_runs_directory_as_it_was(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "train.csv").write_text("env_steps\n512\n")
    result = run_py("env.id=Foo-v0", f"hydra.run.dir={run_dir}")
    assert result.returncode == 2 and (run_dir / "train.csv").read_text() == "env_steps\n512\n"


def test_a_token_task_without_its_extra_names_the_extra(monkeypatch):
    import importlib.util

    from benchmarks.engine.config import compose_config
    from benchmarks.engine.validate import ConfigError, validate_config

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "transformers" else real(name, *a))
    with pytest.raises(ConfigError) as error:
        validate_config(compose_config(["env=RLHFPraise"]))
    assert str(error.value) == ("env=RLHFPraise (a token task) needs the [rlhf] extra, which is not installed: "
                                "pip install -e '.[rlhf]'")


def test_tuning_commands_name_what_does_not_exist(tmp_path):
    report = run_python([sys.executable, "-m", "benchmarks.tuning", "report", "--tune", "nosuch"], cwd=ROOT,
                        capture_output=True, text=True)
    have = ", ".join(sorted(path.stem for path in (ROOT / "conf" / "tune").glob("*.yaml")))
    assert report.returncode == 2 and report.stderr.splitlines()[-1] == (
        f"python -m benchmarks.tuning report: error: argument --tune: no conf/tune/nosuch.yaml (have: {have})")
    apply = run_python([sys.executable, "-m", "benchmarks.tuning", "apply", "--tune", "classic", "--algo", "nosuch"],
                       cwd=ROOT, capture_output=True, text=True)
    assert apply.returncode == 1 and apply.stderr.startswith("error: no study 'nosuch' in sqlite:///results/tuning/"
                                                             "classic.db (have: ")
    (tmp_path / "results" / "tuning").mkdir(parents=True)  # where a study run here would be: none was
    elsewhere = run_python([sys.executable, "-m", "benchmarks.tuning", "report", "--tune", "classic", "--out",
                                str(tmp_path / "out")], cwd=tmp_path, capture_output=True, text=True)
    assert elsewhere.returncode == 1 and elsewhere.stderr == (
        f"error: no study database results/tuning/classic.db under {tmp_path} (a study writes it where run.py ran)\n")
    assert list((tmp_path / "results" / "tuning").iterdir()) == []  # nor an empty one made by looking
    storage = run_py("-m", "hydra/sweeper=tune", "+tune=classic", "algo=ppo",
                     "hydra.sweeper.storage=sqlite:////proc/nope/x.db", f"hydra.sweep.dir={tmp_path}/sweep")
    assert storage.returncode == 1
    assert storage.stderr.strip().splitlines()[-1] == ("config error: hydra.sweeper.storage=sqlite:////proc/nope/x.db: "
                                                       "cannot write the study database there (No such file or "
                                                       "directory)")

    def refused_study(*overrides: str) -> str:
        """The last line of a tuning command refused before its study is stored."""
        refused = run_py("-m", "hydra/sweeper=tune", "+tune=classic", *overrides,
                         f"hydra.sweeper.storage=sqlite:///{tmp_path}/study.db", f"hydra.sweep.dir={tmp_path}/sweep")
        assert refused.returncode == 1 and not (tmp_path / "study.db").exists()
        return refused.stderr.strip().splitlines()[-1]

    assert refused_study("algo=ppo_kl", "~hydra.sweeper.search_spaces.ppo_kl") == (
        "config error: no search space for algo=ppo_kl in hydra.sweeper.search_spaces (have: hp3o, hp3o_plus, "
        "outer_ppo, outer_ppo_biased, outer_ppo_lr, outer_ppo_nesterov, ppo): add one in the round's "
        "conf/tune/<round>.yaml, or give it as an override, e.g. "
        "'+hydra.sweeper.search_spaces.ppo_kl={algo.ent_coef:{low:0.0,high:0.02}}' ({}: nothing searched, the study "
        "trains the values so far once)")
    assert refused_study("algo=ppo", "algo.lr=0.01") == (
        "config error: hydra.sweeper.search_spaces.ppo.env.hparams.lr: no key of algo=ppo reads env.hparams.lr: a "
        "value typed over the key that read it (as algo.lr=... replaces algo.lr's ${env.hparams.lr}) would train "
        "every trial on the typed value; drop that override, or search the algo key itself")


def test_reproduce_says_a_native_run_from_another_cpu_cannot_be_confirmed_here(tmp_path):
    from benchmarks import reproduce

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "summary.json").write_text(json.dumps({"machine": {"cpu": "Some Other CPU 9000",
                                                                  "numerics": {"mode": "native"}}}))
    here = reproduce.machine()["cpu"]
    assert reproduce.not_comparable_here(run_dir) == (
        f"made with native kernels on Some Other CPU 9000; this machine is {here}: bit-identity is promised only "
        f"for portable-mode runs (SUITE_NUMERICS=portable, the default), so it is not rerun here")
    (run_dir / "summary.json").write_text(json.dumps({"machine": {"cpu": "Some Other CPU 9000",
                                                                  "numerics": {"mode": "portable"}}}))
    assert reproduce.not_comparable_here(run_dir) is None  # portable: it must reproduce anywhere


@pytest.mark.slow
def test_a_batch_given_a_run_directory_writes_its_seeds_inside_it(tmp_path):
    # Two batches given two directories never share seed directories (beside them, the second was refused by the
    # first's lock); a job directory with the suite's own batch name keeps its seeds beside it, as suites lay out.
    from pathlib import Path

    from benchmarks.engine.batch_trainer import seed_run_dirs

    for name in ("Swimmer", "Reacher"):
        result = run_py("env=CartPole", "seeds=[0,1]", "total_steps=512", "eval.every_steps=512", "eval.episodes=1",
                        "logging.progress_bar=false", "logging.tensorboard=false", f"hydra.run.dir={tmp_path}/{name}")
        assert result.returncode == 0, result.stderr
        for seed in (0, 1):
            assert json.loads((tmp_path / name / f"seed{seed}" / "summary.json").read_text())["status"] == "complete"
    assert not (tmp_path / "seed0").exists()
    suite_layout = seed_run_dirs(Path("runs/CartPole/ppo/seeds0-4"), [0, 1, 2, 3, 4])
    assert suite_layout == [Path(f"runs/CartPole/ppo/seed{seed}") for seed in range(5)]


def test_a_full_disk_wherever_it_strikes_is_one_line():
    # run.py prints this line (exit 1) for a full disk or quota met outside a checkpoint too (a log line, a summary);
    # a checkpoint's own DiskFullError is tested with the resume it allows (tests/test_resume.py).
    import errno

    import run

    error = run.disk_full(OSError(errno.ENOSPC, "No space left on device", "/x/train.csv"))
    assert str(error) == ("no space left on the device (/x/train.csv): a resume starts from the last whole checkpoint; "
                          "free space and rerun the same command")
    assert run.disk_full(OSError(errno.EDQUOT, "Disk quota exceeded")) is not None
    assert run.disk_full(OSError(errno.EACCES, "Permission denied")) is None  # another fault keeps its traceback


@pytest.mark.slow
@pytest.mark.parametrize("seeds", [[], ["seeds=[0,1]"]], ids=["one run", "a batch"])
def test_a_task_failing_mid_run_is_one_line_and_recorded_in_each_seeds_summary(seeds, tmp_path):
    """A task's own error (gymnasium.error.Error) mid-run, alone or in a batch: one line naming it, exit 1, and each
    seed's summary.json says why it failed, so that a sweep lists it."""
    result = run_py("env=CartPole", "env.id=tests.tasks:LineFailsMidRun-v0", "total_steps=2048", "eval.at_start=false",
                    "eval.episodes=1", "logging.tensorboard=false", "logging.progress_bar=false", *seeds,
                    f"hydra.run.dir={tmp_path}/run")
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert errors == [f"error: {tmp_path}/run: the simulator lost its connection at step 300"], result.stderr
    for run_dir in [tmp_path / "run" / "seed0", tmp_path / "run" / "seed1"] if seeds else [tmp_path / "run"]:
        summary = json.loads((run_dir / "summary.json").read_text())
        assert summary["status"] == "failed" and summary["error"] == "Error: the simulator lost its connection at step 300"


class _UpdateRaises(PPO):
    """A variant with a fault in its own code (algo.algorithm=tests.test_probes:_UpdateRaises)."""

    def update(self, rollout, iteration):
        raise RuntimeError("a fault in the variant's update")


@pytest.mark.slow
def test_a_fault_in_the_code_fails_a_batch_job_of_a_sweep_alone_and_the_sweeps_end_lists_its_seeds(tmp_path):
    """A batch job (seeds=[...]) of a sweep that meets a fault of the code (not a refusal nor a run's own error)
    fails as a single seed's job does: its traceback logged, each seed's summary.json saying why, the sweep's end
    listing them and exiting 1 (not Hydra's own error, which stops the report of the sweep's other jobs)."""
    result = run_py("-m", "env=CartPole", "algo.name=faulty", "algo.algorithm=tests.test_probes:_UpdateRaises",
                    "algo.backend=torch", "seeds=[0,1]", "total_steps=512", "eval.episodes=1",
                    "logging.tensorboard=false", "logging.progress_bar=false", f"hydra.sweep.dir={tmp_path}")
    assert result.returncode == 1, result.stderr
    assert f"job failed: {tmp_path}/CartPole/faulty" in result.stdout + result.stderr
    assert "RuntimeError: a fault in the variant's update" in result.stdout + result.stderr  # with its traceback
    assert "sweep finished: 0 of 2 runs complete (1 jobs)" in result.stdout, result.stdout + result.stderr
    for seed in (0, 1):
        assert f"FAILED {tmp_path}/CartPole/faulty/seed{seed}: RuntimeError: a fault in the variant's update" \
            in result.stdout


def test_the_trainer_refuses_spaces_the_policies_cannot_read_as_the_validator_does():
    """Whatever path makes the envs (a run, `benchmarks.evaluate`, the speed tools), the spaces are checked there too."""
    from benchmarks.engine.envs import UnsupportedTaskError, make_vector_env, space_dims

    envs = make_vector_env("FrozenLake-v1", 1, 0)
    with pytest.raises(UnsupportedTaskError, match=r"^env.id=FrozenLake-v1: its observation space Discrete\(16\) is"):
        space_dims(envs, "FrozenLake-v1")
    envs.close()


class StandStill:
    """A policy that always takes action 0 (the evaluator's only call)."""

    def act_deterministic(self, obs):
        import torch

        return torch.zeros(obs.shape[0], dtype=torch.long)


def test_an_evaluation_episode_that_never_ends_fails_in_one_line_instead_of_running_forever(monkeypatch):
    """A task without a time limit whose episodes never end: the evaluation stops past its step bound with an error
    run.py reports in one line (a gymnasium.error.Error); tasks that end, on their own or by their time limit,
    evaluate as before, and a registered limit longer than the bound lifts it."""
    import gymnasium as gym

    from benchmarks.engine.trainer import EpisodeNeverEnds, Evaluator

    monkeypatch.setattr(Evaluator, "MOST_STEPS", 300)
    no_normalizer = lambda raw_obs, update: raw_obs  # noqa: E731
    evaluator = Evaluator("tests.tasks:LineNeverEnds-v0", 2, seed=0)
    with pytest.raises(EpisodeNeverEnds) as raised:
        evaluator(StandStill(), no_normalizer)
    assert isinstance(raised.value, gym.error.Error)
    assert str(raised.value) == ("evaluation: an episode of env.id=tests.tasks:LineNeverEnds-v0 has not ended after "
                                 "300 steps: its episodes do not end on their own; register the task with a time "
                                 "limit (gymnasium.register(..., max_episode_steps=N))")
    ends_itself = Evaluator("tests.tasks:Line-v0", 2, seed=0)  # 20-step episodes, no registered limit
    assert ends_itself(StandStill(), no_normalizer).tolist() == [-210.0, -210.0]
    monkeypatch.setattr(Evaluator, "MOST_STEPS", 100)
    assert Evaluator("CartPole-v1", 1, seed=0).most_steps == 500  # the registered time limit is longer
    assert Evaluator("CartPole-v1", 1, 0, {"max_episode_steps": 1000}).most_steps == 1000  # and the one given
    for opened in (evaluator, ends_itself):
        opened.close()
