"""Tuning (benchmarks/tuning.py, hydra/sweeper=tune): the objective, the study loop on a real launcher and
SQLite database, resuming a killed study, and writing the best values back into the config files."""

import json
import shutil
import sys

import optuna
import pandas as pd
import pytest
from omegaconf import OmegaConf
from conftest import ROOT

from benchmarks import tuning
from tests.commands import run_python


def write_run(run_dir, status="complete", curve=((0, 10.0), (100, 30.0), (200, 30.0))):
    run_dir.mkdir(parents=True)
    config = {"env": {"name": "Toy", "random_score": 10.0, "reference_score": 50.0}}
    (run_dir / "summary.json").write_text(json.dumps({"status": status, "config": config}))
    pd.DataFrame(curve, columns=["env_steps", "eval_return_mean"]).to_csv(run_dir / "eval.csv", index=False)


def test_objective_is_the_normalised_area_under_the_eval_curve(tmp_path):
    write_run(tmp_path / "a")
    # normalised curve 0, 0.5, 0.5 over 0..200 steps: trapezoids (0 + 0.5)/2 * 100 + 0.5 * 100 = 75; / 200
    assert tuning.normalised_auc(tmp_path / "a") == pytest.approx(0.375, abs=1e-12)
    write_run(tmp_path / "b", status="failed")
    with pytest.raises(tuning.RunNotComplete, match="failed"):
        tuning.normalised_auc(tmp_path / "b")


def test_a_run_scored_at_a_rung_is_scored_on_its_curve_up_to_the_rung_however_far_it_trained(tmp_path):
    """At a rung of 150 env steps (iterations of 100: a run pauses at 200), a paused run and one that trained on to
    400 (a trial resumed past a rung it was judged at, or a run of another study in the sweep directory) score the
    same area, that of the curve up to 200; a run short of the rung is not scored."""
    curve = ((0, 10.0), (100, 30.0), (200, 30.0), (300, 50.0), (400, 50.0))
    write_run(tmp_path / "paused", status="paused", curve=curve[:3])
    write_run(tmp_path / "on", curve=curve)
    for name, steps in (("paused", 200), ("on", 400)):
        summary = json.loads((tmp_path / name / "summary.json").read_text())
        summary["env_steps"] = steps
        summary["config"]["env"].update(num_envs=2, num_steps=50)
        (tmp_path / name / "summary.json").write_text(json.dumps(summary))
    assert tuning.normalised_auc(tmp_path / "on", paused_at=150) == tuning.normalised_auc(tmp_path / "paused",
                                                                                          paused_at=150) == 0.375
    assert tuning.normalised_auc(tmp_path / "on") == pytest.approx((0.25 + 0.5 + 0.75 + 1.0) * 100 / 400)
    with pytest.raises(tuning.RunNotComplete, match="trained 200 env steps, short of this rung's 300"):
        tuning.normalised_auc(tmp_path / "paused", paused_at=300)


def tune_command(tmp_path, *extra):
    return [sys.executable, str(ROOT / "run.py"), "-m", "hydra/sweeper=tune", "+tune=classic", "algo=ppo",
            "env.num_steps=64", "total_steps=512", "eval.every_steps=256", "eval.episodes=1",
            "hydra.sweeper.tasks=[CartPole]", "hydra.sweeper.trials_per_batch=2",
            f"hydra.sweeper.storage=sqlite:///{tmp_path}/study.db", f"hydra.sweep.dir={tmp_path}/runs", *extra]


@pytest.mark.slow
def test_study_runs_on_the_joblib_launcher_and_a_killed_study_resumes(tmp_path):
    result = run_python(tune_command(tmp_path, "hydra.sweeper.n_trials=3", "hydra/launcher=joblib",
                                         "hydra.launcher.n_jobs=2"),
                        cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    study = optuna.load_study(study_name="ppo", storage=f"sqlite:///{tmp_path}/study.db")
    assert [t.state for t in study.trials] == [optuna.trial.TrialState.COMPLETE] * 3
    defaults = study.trials[0]
    family_lr = OmegaConf.load(ROOT / "conf" / "tuning" / "classic_100k.yaml").hparams.lr
    assert defaults.user_attrs["defaults"] and defaults.params["env.hparams.lr"] == family_lr  # the values it started from
    for trial in study.trials:  # one run per tuning task x seed, its objective recorded per run
        run_dir = tmp_path / "runs" / f"trial{trial.number:03d}" / "CartPole" / "seed1000"
        assert trial.value == pytest.approx(tuning.normalised_auc(run_dir))
        assert trial.user_attrs["CartPole/seed1000"] == trial.value
    assert json.loads((tmp_path / "runs/trial001/CartPole/seed1000/summary.json").read_text())["config"]["env"][
        "hparams"]["lr"] == study.trials[1].params["env.hparams.lr"]

    # A kill leaves a trial RUNNING (asked, not told): the rerun runs it again with its values, then goes on.
    study.sampler = optuna.samplers.RandomSampler(seed=0)
    space = {key: optuna.distributions.distribution_to_json(dist) for key, dist in
             study.trials[1].distributions.items()}
    stale = study.ask({key: optuna.distributions.json_to_distribution(dist) for key, dist in space.items()})
    result = run_python(tune_command(tmp_path, "hydra.sweeper.n_trials=5"), cwd=tmp_path, capture_output=True,
                        text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    study = optuna.load_study(study_name="ppo", storage=f"sqlite:///{tmp_path}/study.db")
    assert [t.state for t in study.trials] == [optuna.trial.TrialState.COMPLETE] * 5
    assert study.trials[stale.number].params == stale.params
    assert f"trial {stale.number}: normalised AUC" in result.stdout


def test_a_batch_whose_jobs_are_all_refused_stops_the_study_and_costs_no_trial(tmp_path):
    """Values its jobs refuse before the first env step (here a search space of negative learning rates): the
    command stops after that batch in one line, instead of asking trial after trial that fails at once, and the
    refused trials are kept as failed but do not count towards n_trials."""
    command = tune_command(tmp_path, "hydra.sweeper.n_trials=3", "hydra.sweeper.enqueue_defaults=false",
                           "hydra.sweeper.search_spaces.ppo={env.hparams.lr:{low:-2.0,high:-1.0,log:false}}")
    result = run_python(command, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert result.returncode != 0
    assert "error: no trial of the batch (0, 1) trained an env step: their jobs were refused" in result.stderr
    assert "env.hparams.lr must be a number > 0" in result.stderr  # named at its source, once
    study = optuna.load_study(study_name="ppo", storage=f"sqlite:///{tmp_path}/study.db")
    assert [t.state for t in study.trials] == [optuna.trial.TrialState.FAIL] * 2
    assert [t.user_attrs["env_steps"] for t in study.trials] == [0, 0]
    assert all(tuning.never_trained(t) for t in study.trials)  # so neither counts towards n_trials
    again = run_python(command, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert "error: no trial of the batch (2, 3) trained an env step" in again.stderr
    study = optuna.load_study(study_name="ppo", storage=f"sqlite:///{tmp_path}/study.db")
    values = [t.params["env.hparams.lr"] for t in study.trials]
    assert len(set(values)) == 4  # the rerun asked other values, not the refused ones again


@pytest.mark.slow
def test_a_study_refuses_another_baseline_and_sweep_overrides(tmp_path):
    first = run_python(tune_command(tmp_path, "hydra.sweeper.n_trials=1"), cwd=tmp_path, capture_output=True,
                       text=True, timeout=600)
    assert first.returncode == 0, first.stderr[-3000:]
    other = run_python(tune_command(tmp_path, "hydra.sweeper.n_trials=2", "total_steps=1024"), cwd=tmp_path,
                       capture_output=True, text=True, timeout=600)
    assert other.returncode != 0
    assert "config error: study ppo" in other.stderr and "was started with other total_steps" in other.stderr
    swept = run_python(tune_command(tmp_path, "seed=0,1"), cwd=tmp_path, capture_output=True, text=True,
                       timeout=600)
    assert swept.returncode != 0 and "takes no sweep overrides (got seed=0,1)" in swept.stderr


def test_a_second_tuning_command_on_a_study_being_tuned_is_refused_before_it_reads_the_study(tmp_path):
    """Two tuning commands on one study (a rerun while the first still runs): the second would take the first's
    running trials for those of a killed command and train them again. It is refused in one line naming the
    holder, before it stores or asks anything; the lock goes with the command that held it."""
    import os

    with tuning.study_lock(f"sqlite:///{tmp_path}/study.db", "ppo", tmp_path / "runs"):
        refused = run_python(tune_command(tmp_path, "hydra.sweeper.n_trials=1"), cwd=tmp_path, timeout=600)
    assert refused.returncode != 0 and refused.stderr.strip().splitlines()[-1] == (
        f"config error: study ppo in sqlite:///{tmp_path}/study.db is being tuned by another process (pid "
        f"{os.getpid()}); wait for it to finish, or give this command another hydra.sweeper.study_name or storage")
    assert optuna.get_all_study_names(storage=f"sqlite:///{tmp_path}/study.db") == []
    assert not (tmp_path / "study.db.ppo.lock").exists()


def test_apply_writes_the_best_values_where_the_presets_read_them(tmp_path, monkeypatch):
    conf = tmp_path / "conf"
    shutil.copytree(ROOT / "conf", conf)
    monkeypatch.setattr(tuning, "PROJECT_ROOT", tmp_path)
    storage = f"sqlite:///{tmp_path}/study.db"
    for name, params in [("ppo", {"env.hparams.lr": 7.5e-4, "env.hparams.update_epochs": 6}),
                         ("outer_ppo", {"env.tuned.outer_ppo.outer_lr": 0.02, "env.tuned.outer_ppo.inner_loop": "ppo"})]:
        study = optuna.create_study(study_name=name, storage=storage, direction="maximize")
        worse = {k: v * 2.0 if isinstance(v, float) else v for k, v in params.items()}
        dists = {k: optuna.distributions.CategoricalDistribution(sorted({worse[k], params[k]}, key=str))
                 for k in params}
        for values, objective in [(worse, 0.1), (params, 0.3)]:  # the second trial is the best
            study.add_trial(optuna.trial.create_trial(params=values, distributions=dists, value=objective))
    monkeypatch.setattr(tuning, "tune_config", lambda tune: {"hydra": {"sweeper": {
        "storage": storage, "values_file": "conf/tuning/classic_100k.yaml"}}})
    tuning.main(["apply", "--tune", "classic", "--algo", "ppo", "outer_ppo"])

    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(conf), version_base="1.3"):
        for env in ("CartPole", "Pendulum"):  # both classic families take the values file by default
            for extra in ([], ["+tuning=classic_100k"]):
                cfg = compose(config_name="config", overrides=[f"env={env}", "algo=outer_ppo", *extra])
                assert cfg.algo.lr == 7.5e-4 and cfg.algo.update_epochs == 6
                assert cfg.algo.outer_optimizer.lr == 0.02 and cfg.algo.inner_loop == "ppo"
        # the values before tuning stay one key away, each family's own
        cfg = compose(config_name="config", overrides=["env=CartPole", "algo=outer_ppo", "env_family/values@env=shipped"])
        assert cfg.algo.lr == 2.5e-4 and cfg.algo.update_epochs == 4 and cfg.algo.outer_optimizer.lr == 1e-3
        cfg = compose(config_name="config", overrides=["env=Pendulum", "algo=ppo", "env_family/values@env=shipped"])
        assert cfg.algo.lr == 1e-3 and cfg.algo.update_epochs == 10
    text = (conf / "tuning" / "classic_100k.yaml").read_text()
    assert "  # tuned: study outer_ppo in" in text and "best of 2 trials (trial 1, normalised AUC 0.3000" in text
    assert "    outer_lr: 0.02\n" in text and "  lr: 0.00075\n" in text


def test_apply_refuses_values_a_values_file_cannot_hold_and_leaves_it_untouched(tmp_path, monkeypatch, capsys):
    """A study of a space given on the command line may search an algo key, or a variant's env.tuned key the values
    file lacks: apply says which, in one line each, before it writes anything (it wrote the keys before the first
    it could not place, then ended in a traceback)."""
    values = tmp_path / "values.yaml"
    values.write_text("hparams:\n  lr: 0.001\n  ent_coef: 0.0\n")
    storage = f"sqlite:///{tmp_path}/study.db"
    params = {"env.hparams.lr": 5e-4, "algo.vf_coef": 0.75, "env.tuned.ppo_huber.delta": 2.0}
    study = optuna.create_study(study_name="ppo_huber", storage=storage, direction="maximize")
    study.add_trial(optuna.trial.create_trial(params=params, value=0.3, distributions={
        key: optuna.distributions.FloatDistribution(0.0, 10.0) for key in params}))
    monkeypatch.setattr(tuning, "tune_config", lambda tune: {"hydra": {"sweeper": {"storage": storage,
                                                                                   "values_file": str(values)}}})
    with pytest.raises(SystemExit) as refused:
        tuning.main(["apply", "--tune", "classic", "--algo", "ppo_huber"])
    assert str(refused.value) == (
        "error: study ppo_huber searched algo.vf_coef: a values file holds env.hparams and env.tuned values only "
        "(what the presets read); pass it as algo.vf_coef=0.75, or write it into the preset\n"
        f"error: {values} has no key tuned: add it there (with the preset's value so far) and apply again")
    assert values.read_text() == "hparams:\n  lr: 0.001\n  ent_coef: 0.0\n"


def test_apply_of_several_studies_writes_none_while_one_is_refused(tmp_path, monkeypatch):
    """`--algo ppo outer_ppo` checks both studies before it writes: a refused second study (here one whose trials
    were all pruned, or one that does not exist) leaves the first study's values unwritten too (it wrote them, then
    refused the second; a study without a complete trial ended in Optuna's ValueError traceback)."""
    text = "hparams:\n  lr: 0.001\n"
    values = tmp_path / "values.yaml"
    values.write_text(text)
    storage = f"sqlite:///{tmp_path}/study.db"
    ppo = optuna.create_study(study_name="ppo", storage=storage, direction="maximize")
    ppo.add_trial(optuna.trial.create_trial(params={"env.hparams.lr": 5e-4}, value=0.3, distributions={
        "env.hparams.lr": optuna.distributions.FloatDistribution(1e-5, 1e-2, log=True)}))
    pruned = optuna.create_study(study_name="outer_ppo", storage=storage, direction="maximize")
    pruned.add_trial(optuna.trial.create_trial(state=optuna.trial.TrialState.PRUNED, params={}, distributions={}))
    monkeypatch.setattr(tuning, "tune_config", lambda tune: {"hydra": {"sweeper": {"storage": storage,
                                                                                   "values_file": str(values)}}})
    with pytest.raises(SystemExit) as refused:
        tuning.main(["apply", "--tune", "classic", "--algo", "ppo", "outer_ppo"])
    assert str(refused.value) == f"error: study outer_ppo in {storage} has no complete trial yet (of 1): nothing to apply"
    with pytest.raises(SystemExit) as missing:
        tuning.main(["apply", "--tune", "classic", "--algo", "ppo", "nosuch"])
    assert str(missing.value) == f"error: no study 'nosuch' in {storage} (have: outer_ppo, ppo)"
    assert values.read_text() == text
    tuning.main(["apply", "--tune", "classic", "--algo", "ppo"])
    assert "  lr: 0.0005\n" in values.read_text()


def test_a_run_counts_as_tuned_only_with_every_best_value_of_its_family(tmp_path, monkeypatch):
    (tmp_path / "results" / "tuning").mkdir(parents=True)
    storage = f"sqlite:///{tmp_path}/results/tuning/mujoco.db"
    monkeypatch.setattr(tuning, "PROJECT_ROOT", tmp_path)
    monkeypatch.setattr(tuning, "_studies_cache", {})
    second_round = f"sqlite:///{tmp_path}/results/tuning/mujoco_300k.db"
    for storage, steps, name, params in [
            (storage, 100000, "ppo", {"env.hparams.lr": 0.001431}), (storage, 100000, "hp3o", {"env.tuned.hp3o.buffer_size": 40}),
            (second_round, 300000, "ppo", {"env.hparams.lr": 3e-4}), (second_round, 300000, "hp3o", {"env.tuned.hp3o.buffer_size": 10})]:
        study = optuna.create_study(study_name=name, storage=storage, direction="maximize")
        study.set_user_attr("base", {"tasks": ["HalfCheetah", "Hopper"], "seeds": [1000], "total_steps": steps})
        dists = {k: optuna.distributions.CategoricalDistribution([v]) for k, v in params.items()}
        study.add_trial(optuna.trial.create_trial(params=params, distributions=dists, value=0.2))

    def config(lr, buffer_size, algo="hp3o"):
        return {"env": {"family": "mujoco", "hparams": {"lr": lr}, "tuned": {"hp3o": {"buffer_size": buffer_size}}},
                "algo": {"name": algo}}

    text, tasks = tuning.study_provenance(config(0.0014306, 40))  # as written to conf/ (4 significant digits)
    assert text == "1 trial x 2 tasks x 1 seed x 100k steps" and tasks == ("HalfCheetah", "Hopper")
    assert tuning.study_provenance(config(3e-4, 40)) is None  # PPO's core untuned: the variant is not "tuned"
    assert tuning.study_provenance(config(0.001431, 20)) is None
    assert tuning.study_provenance(config(0.001431, 40, algo="hp3o_plus")) is None  # no study of its own
    # a second tuning round of the family (results/tuning/mujoco_300k.db) is found as well
    assert tuning.study_provenance(config(3e-4, 10))[0] == "1 trial x 2 tasks x 1 seed x 300k steps"
    assert tuning.study_provenance(config(3e-4, 40)) is None  # the rounds' values are not mixed
    # a round whose study's best is still its trial 0 (the values it started from: the 300k round's) tuned nothing:
    # a run with those values is the 300k round's, though "mujoco_1m" sorts first
    started = optuna.create_study(study_name="ppo", storage=f"sqlite:///{tmp_path}/results/tuning/mujoco_1m.db",
                                  direction="maximize")
    started.set_user_attr("base", {"tasks": ["HalfCheetah", "Hopper"], "seeds": [1000, 1001], "total_steps": 1000000})
    dists = {"env.hparams.lr": optuna.distributions.CategoricalDistribution([3e-4])}
    started.add_trial(optuna.trial.create_trial(params={"env.hparams.lr": 3e-4}, distributions=dists, value=0.3,
                                                user_attrs={"defaults": True}))
    monkeypatch.setattr(tuning, "_studies_cache", {})
    assert tuning.study_provenance(config(3e-4, 10, algo="ppo"))[0] == "1 trial x 2 tasks x 1 seed x 300k steps"


def test_every_mujoco_round_sets_every_key_the_familys_default_round_sets():
    """A run or suite that takes another round (+tuning=mujoco_300k, an experiment's /tuning/<round>@env) layers that
    file on the family's default round: a key only the default sets would leak into it and change its runs' numbers
    (the 1M round's sigma_eff into the 300k round's named preset, say)."""
    from benchmarks.engine.logger import flatten

    def value_keys(path) -> set[str]:
        return set(flatten(OmegaConf.to_container(OmegaConf.load(path))))

    default = OmegaConf.load(ROOT / "conf" / "env_family" / "mujoco.yaml").defaults[0]  # /tuning/<round>@_here_
    round_name = default.split("/")[-1].split("@")[0]
    expected = value_keys(ROOT / "conf" / "tuning" / f"{round_name}.yaml")
    rounds = sorted((ROOT / "conf" / "tuning").glob("mujoco_*.yaml"))
    assert round_name == "mujoco_1m" and len(rounds) == 4
    for path in rounds:
        assert value_keys(path) >= expected, path.name


def test_a_tuning_round_extends_another_with_its_own_budget_storage_and_values():
    first, second = (tuning.tune_config(name)["hydra"]["sweeper"] for name in ("mujoco", "mujoco_300k"))
    assert second["search_spaces"] == first["search_spaces"] and second["tasks"] == first["tasks"]
    assert (second["storage"], second["values_file"]) == ("sqlite:///results/tuning/mujoco_300k.db",
                                                          "conf/tuning/mujoco_300k.yaml")
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base=None):
        cfg = compose("config", overrides=["hydra/sweeper=tune", "+tune=mujoco_300k", "algo=outer_ppo"])
    # trials run the final evaluation's budget, from the values of this round's values file
    values = OmegaConf.load(ROOT / "conf" / "tuning" / "mujoco_300k.yaml")
    assert cfg.total_steps == 300000 and cfg.eval.every_steps == 25000
    assert cfg.algo.lr == values.hparams.lr and cfg.algo.outer_optimizer.lr == values.tuned.outer_ppo.outer_lr


@pytest.mark.parametrize("family, pruned, budget", [("mujoco", "mujoco_1m", 1_000_000), ("classic", "classic_pruned", 100_000)])
def test_a_pruned_round_keeps_its_familys_tasks_and_budget_with_two_seeds_and_equal_env_steps(family, pruned, budget):
    first, second = (tuning.tune_config(name) for name in (family, pruned))
    sweeper = second["hydra"]["sweeper"]
    assert sweeper["tasks"] == first["hydra"]["sweeper"]["tasks"]
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base=None):
        assert compose("config", overrides=["hydra/sweeper=tune", f"+tune={pruned}"]).total_steps == budget
    assert sweeper["seeds"] == [1000, 1001] and sweeper["population"]
    assert tuning.rung_steps(sweeper["pruner"], budget)[:2] == [budget // 9 + 1, 3 * (budget // 9 + 1)]
    assert sweeper["env_step_budget"] == 10 * 2 * 2 * budget  # ten unpruned trials' worth, the same for every preset
    assert (sweeper["storage"], sweeper["values_file"]) == (f"sqlite:///results/tuning/{pruned}.db",
                                                            f"conf/tuning/{pruned}.yaml")


@pytest.mark.slow
def test_a_study_runs_its_trials_as_submitit_jobs(tmp_path):
    """The Slurm path, locally: each run of a trial is a submitit job in a fresh process."""
    result = run_python(tune_command(tmp_path, "hydra.sweeper.n_trials=1", "hydra/launcher=submitit_local"),
                        cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    study = optuna.load_study(study_name="ppo", storage=f"sqlite:///{tmp_path}/study.db")
    assert [t.state for t in study.trials] == [optuna.trial.TrialState.COMPLETE]
    assert (tmp_path / "runs" / "trial000" / "CartPole" / "seed1000" / "eval.csv").exists()


def test_pruner_rungs_are_successive_halvings_of_the_budget():
    assert tuning.rung_steps(None, 1_000_000) == [1_000_000]
    assert tuning.rung_steps({"min_steps": 111112, "reduction_factor": 3}, 1_000_000) == [111112, 333336, 1_000_000]


@pytest.mark.slow
def test_a_pruned_population_study_counts_every_env_step_it_trains(tmp_path):
    """Successive halving stops trials at rungs (pause_at_steps); each trial's env_steps is what its runs trained,
    pruned ones included, and the study asks no new trial once env_step_budget is spent."""
    command = tune_command(tmp_path, "total_steps=2048", "hydra.sweeper.seeds=[1000,1001]",
                           "hydra.sweeper.population=true", "hydra.sweeper.pruner={min_steps:512,reduction_factor:2}",
                           "hydra.sweeper.env_step_budget=12000", "hydra.sweeper.n_trials=20",
                           "hydra.sweeper.trials_per_batch=3", "hydra.sweeper.n_startup_trials=20",
                           # the accounting, not the search, is under test: updates of at most 2 epochs of 4
                           # minibatches, and a continuous key so that no two trials repeat each other's values
                           "hydra.sweeper.search_spaces.ppo={env.hparams.update_epochs:{low:1,high:2,int:true},"
                           "env.hparams.num_minibatches:{choices:[4]},env.hparams.clip_coef:{low:0.1,high:0.3}}",
                           "hydra.sweeper.enqueue_defaults=false")
    result = run_python(command, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    study = optuna.load_study(study_name="ppo", storage=f"sqlite:///{tmp_path}/study.db")
    states = [t.state for t in study.trials]
    assert optuna.trial.TrialState.PRUNED in states and optuna.trial.TrialState.COMPLETE in states
    spent = 0
    for trial in study.trials:
        runs = [tmp_path / "runs" / f"trial{trial.number:03d}" / "CartPole" / f"seed{seed}" for seed in (1000, 1001)]
        summaries = [json.loads((run / "summary.json").read_text()) for run in runs]
        trained = [summary["env_steps"] for summary in summaries]
        assert trial.user_attrs["env_steps"] == sum(trained)
        # the loop's wall time over every segment (a pruned run's last paused summary), shared by the two seeds
        assert trial.user_attrs["train_seconds"] == pytest.approx(sum(s["wall_time_s"] for s in summaries) / 2)
        assert trial.user_attrs["train_seconds"] > 0
        if trial.state == optuna.trial.TrialState.PRUNED:  # stopped at a rung: 512 or 1024 steps per seed
            assert set(trained) < {512, 1024} and max(trial.intermediate_values) == trained[0]
        else:
            assert trained == [2048, 2048]
        spent += sum(trained)
    # every batch but the last started with budget left; the last one ended the study
    before_last = spent - sum(t.user_attrs["env_steps"] for t in study.trials[-3:])
    assert before_last < 12000 <= spent
    assert f"{spent:,} env steps" in result.stdout


def test_a_pruned_studys_report_lists_every_trial_with_the_rung_it_reached():
    import optuna

    from benchmarks.tuning import trial_lines

    study = optuna.create_study(direction="maximize")
    study.set_user_attr("base", {"total_steps": 9000})
    distributions = {"algo.sigma": optuna.distributions.FloatDistribution(0.1, 3.0, log=True)}
    study.add_trial(optuna.trial.create_trial(params={"algo.sigma": 0.5}, distributions=distributions, value=0.3,
                                              intermediate_values={1000: 0.1, 3000: 0.2}))
    study.add_trial(optuna.trial.create_trial(params={"algo.sigma": 2.0}, distributions=distributions, value=0.05,
                                              state=optuna.trial.TrialState.PRUNED,
                                              intermediate_values={1000: 0.01, 3000: 0.05}))
    lines = trial_lines(study)
    assert lines[2] == "| trial | state | env steps per run | objective | sigma |"
    assert lines[4:] == ["| 0 | complete | 9,000 | 0.3000 | 0.5 |", "| 1 | pruned | 3,000 | 0.0500 | 2.0 |"]


def test_a_studys_budget_counts_trials_that_trained_and_a_pruned_studys_env_steps():
    """The claims table's header: trials x tasks x seeds x steps; a pruned study's trials pruned early and the env
    steps all its trials trained; a trial refused before its first env step is not counted."""
    import optuna

    from benchmarks.tuning import budget_text

    study = optuna.create_study(direction="maximize")
    study.set_user_attr("base", {"tasks": ["HalfCheetah", "Hopper"], "seeds": [1000, 1001], "total_steps": 1_000_000})
    distributions = {"algo.sigma": optuna.distributions.FloatDistribution(0.1, 3.0, log=True)}
    for state, value, steps in ((optuna.trial.TrialState.COMPLETE, 0.3, 4_000_000),
                                (optuna.trial.TrialState.PRUNED, 0.1, 444_448),
                                (optuna.trial.TrialState.FAIL, None, 0)):  # refused: trained nothing
        study.add_trial(optuna.trial.create_trial(params={"algo.sigma": 0.5}, distributions=distributions,
                                                  value=value, state=state, user_attrs={"env_steps": steps}))
    assert budget_text(study) == ("2 trials x 2 tasks x 2 seeds x 1000k steps at most (1 pruned early; 4.4M env "
                                  "steps trained in all)")
    unpruned = optuna.create_study(direction="maximize")
    unpruned.set_user_attr("base", {"tasks": ["CartPole", "Pendulum"], "seeds": [1000], "total_steps": 100_000})
    unpruned.add_trial(optuna.trial.create_trial(params={"algo.sigma": 0.5}, distributions=distributions, value=0.3))
    assert budget_text(unpruned) == "1 trial x 2 tasks x 1 seed x 100k steps"


def test_values_a_trial_already_trained_are_not_trained_again_nor_counted(capsys):
    """In a discrete space TPE asks values it has tried before (the classic hp3o study repeated 4 of its 36
    trials); with the same tuning seeds they would train the same runs again and spend the env-step budget twice.
    Such a trial is told failed before its first env step (uncounted) and the sampler is asked again; a space with
    no new values ends the study."""
    distributions = {"algo.k": optuna.distributions.CategoricalDistribution([1, 2])}
    study = optuna.create_study(direction="maximize")
    study.add_trial(optuna.trial.create_trial(params={"algo.k": 1}, distributions=distributions, value=0.5,
                                              user_attrs={"env_steps": 100}))
    tuner = tuning.TuningStudy.__new__(tuning.TuningStudy)  # the asking alone: no config, no training
    tuner.study, tuner.space, tuner.stale, tuner.env_step_budget = study, distributions, [], None
    tuner.n_trials, tuner.trials_per_batch, tuner.sampler_seed, tuner.n_startup_trials = 10, 2, 0, 10
    batch = tuner.next_trials()
    assert [trial.params for trial in batch] == [{"algo.k": 2}]  # the one value not tried yet
    repeated = [t for t in study.trials if t.state == optuna.trial.TrialState.FAIL]
    assert repeated and all(tuning.never_trained(t) and t.user_attrs["repeats_trial"] in (0, batch[0].number)
                            for t in repeated)
    assert tuner.finished() == 1  # the repeats are not counted
    out = capsys.readouterr().out
    assert "would repeat trial 0's values: not trained, not counted; asking again" in out
    assert "the search space gave 1 new value(s) in 20 asks: a batch of 1" in out
    assert tuner.next_trials() == []  # nothing new left: only now does the study end, and say so
    assert "the search space gave no new values in 20 asks: the study asks no more" in capsys.readouterr().out


def test_a_batch_asks_no_more_trials_than_the_env_step_budget_left_would_train_unpruned():
    """Four trials to a batch, each at most 2 tasks x 2 seeds x 1,000 env steps: with 5,000 of 40,000 left, two
    trials (8,000 at most), not four (the committed rounds, asked in full batches, ended up to 15% past their
    budget); with one step left, one; with the budget spent, none."""
    distributions = {"algo.x": optuna.distributions.FloatDistribution(0.0, 1.0)}
    for spent, asked in ((0, 4), (35_000, 2), (39_999, 1), (40_000, 0)):
        study = optuna.create_study(direction="maximize")
        study.add_trial(optuna.trial.create_trial(params={"algo.x": 0.5}, distributions=distributions, value=0.5,
                                                  user_attrs={"env_steps": spent}))
        tuner = tuning.TuningStudy.__new__(tuning.TuningStudy)  # the asking alone: no training
        tuner.study, tuner.space, tuner.stale, tuner.env_step_budget = study, distributions, [], 40_000
        tuner.n_trials, tuner.trials_per_batch, tuner.sampler_seed, tuner.n_startup_trials = 100, 4, 0, 10
        tuner.tasks, tuner.seeds, tuner.config = ["CartPole", "Pendulum"], [1000, 1001], OmegaConf.create(
            {"total_steps": 1000})
        assert len(tuner.next_trials()) == asked, spent


def test_a_trial_whose_values_differ_below_the_values_files_precision_repeats_the_earlier_one():
    """The HP3O+ 1M study's trial 5 drew its 300k best unrounded (threshold 0.21674264) beside trial 0's written
    0.2167, trained the same runs again and scored the same AUC: such values count as a repeat."""
    distributions = {"algo.threshold": optuna.distributions.FloatDistribution(0.1, 10.0, log=True),
                     "algo.k": optuna.distributions.CategoricalDistribution([1, 2])}
    study = optuna.create_study(direction="maximize")
    study.add_trial(optuna.trial.create_trial(params={"algo.threshold": 0.2167, "algo.k": 1},
                                              distributions=distributions, value=0.5, user_attrs={"env_steps": 100}))
    tuner = tuning.TuningStudy.__new__(tuning.TuningStudy)  # the check alone: no config, no training
    tuner.study = study
    for threshold, k, repeated in ((0.21674264425031792, 1, 0), (0.21674264425031792, 2, None), (0.2169, 1, None)):
        study.enqueue_trial({"algo.threshold": threshold, "algo.k": k})
        trial = study.ask(distributions)
        assert tuner.repeats(trial) == repeated, (threshold, k)
        study.tell(trial, state=optuna.trial.TrialState.FAIL)  # never trained: no later trial repeats it


def test_transfer_refuses_a_missing_suite_and_suites_with_nothing_in_common_in_one_line(tmp_path, capsys):
    from benchmarks.tuning import main as tuning_main

    (tmp_path / "empty").mkdir()
    for arguments, message in (
            (["--tuned", str(tmp_path / "nothing"), "--untuned", str(tmp_path / "empty")],
             f"argument --tuned: {tmp_path / 'nothing'} does not exist"),
            (["--tuned", str(tmp_path / "empty"), "--untuned", str(tmp_path / "empty")],
             f"no preset has complete runs of a task in both {tmp_path / 'empty'} and {tmp_path / 'empty'} with at "
             f"least 3 seeds each: nothing to compare")):
        with pytest.raises(SystemExit) as stop:
            tuning_main(["transfer", *arguments, "--out", str(tmp_path / "transfer.md")])
        assert stop.value.code == 2 and not (tmp_path / "transfer.md").exists()
        assert capsys.readouterr().err.strip().splitlines()[-1] == (
            f"python -m benchmarks.tuning transfer: error: {message}")


def test_a_resumed_trial_reports_each_rung_once(recwarn):
    """A study stopped between rungs judges its running trials again from their first rung: each rung's value is
    reported once (Optuna would keep the first and warn about the second)."""
    tuner = tuning.TuningStudy.__new__(tuning.TuningStudy)  # only judge_at_rung's parts
    tuner.study = optuna.create_study(direction="maximize")
    tuner.scores = lambda trial, rung: ({"CartPole/seed1000": 0.5}, [])
    trial = tuner.study.ask()
    assert tuner.judge_at_rung(trial, 1000) and tuner.judge_at_rung(trial, 1000)
    assert tuner.study.trials[trial.number].intermediate_values == {1000: 0.5}
    assert not [w for w in recwarn if "already reported" in str(w.message)]


def test_a_trial_failing_at_a_rung_names_the_run_that_failed_not_the_ones_paused_there(capsys):
    """One seed of a population goes non-finite before a rung, the other pauses there as asked: the trial fails
    naming the failed run only (its paused seed was listed as a failure too, rescored as if at the end)."""
    tuner = tuning.TuningStudy.__new__(tuning.TuningStudy)  # only judge_at_rung's and finish's parts
    tuner.study = optuna.create_study(direction="maximize")
    at_end = ({}, ["runs/seed1000: paused at 512 env steps (resumable)", "runs/seed1001: failed: NonFiniteError"])
    tuner.scores = lambda trial, rung: ({"CartPole/seed1000": 0.5}, ["runs/seed1001: failed: NonFiniteError"]) \
        if rung is not None else at_end
    tuner.record_spent = lambda trial: None
    trial = tuner.study.ask()
    assert not tuner.judge_at_rung(trial, 512)
    assert tuner.study.trials[trial.number].user_attrs["failed_runs"] == ["runs/seed1001: failed: NonFiniteError"]
    assert capsys.readouterr().out == f"trial {trial.number} failed: runs/seed1001: failed: NonFiniteError\n"


def test_every_committed_study_table_regenerates_byte_for_byte_and_names_the_committed_figures(tmp_path, monkeypatch):
    """`python -m benchmarks.tuning report --tune <round>` on each committed study database gives the committed
    results/tuning/<round>.md to the byte, and the sensitivity figures committed beside it, no more and no fewer:
    one drawn (its pixels depend on the fonts installed: not compared), the others named."""
    monkeypatch.chdir(ROOT)  # the rounds' storage paths are relative to the repository's root
    committed = ROOT / "results" / "tuning"
    rounds = sorted(path.stem for path in committed.glob("*.db"))
    assert {"classic_pruned", "mujoco_1m"} <= set(rounds)

    def round_of(figure: str) -> str:  # classic_pruned_ppo_sensitivity.png is classic_pruned's, not classic's
        return max((name for name in rounds if figure.startswith(f"{name}_")), key=len)

    draw, drawn = tuning.sensitivity_figure, []

    def draw_the_first(tune, row, complete, space, out):
        if drawn:
            (out / f"{tune}_{row['preset']}_sensitivity.png").touch()
        else:
            drawn.append(draw(tune, row, complete, space, out))

    monkeypatch.setattr(tuning, "sensitivity_figure", draw_the_first)
    for name in rounds:
        tuning.main(["report", "--tune", name, "--out", str(tmp_path / name)])
        assert (tmp_path / name / f"{name}.md").read_bytes() == (committed / f"{name}.md").read_bytes(), name
        figures = sorted(path.name for path in committed.glob("*_sensitivity.png") if round_of(path.name) == name)
        assert figures and sorted(path.name for path in (tmp_path / name).glob("*.png")) == figures, name


def test_a_study_run_elsewhere_is_reported_beside_its_database_and_the_rounds_report_is_left_alone(tmp_path,
                                                                                                   monkeypatch, capsys):
    """`report --storage` reads a study a user ran with hydra.sweeper.storage=...; without --out its report goes
    beside that database, not over the round's committed one; a storage that is no file needs --out."""
    import shutil

    monkeypatch.chdir(ROOT)
    committed = (ROOT / "results" / "tuning" / "classic.md").read_bytes()
    shutil.copy(ROOT / "results" / "tuning" / "classic.db", tmp_path / "mine.db")
    monkeypatch.setattr(tuning, "sensitivity_figure", lambda tune, row, complete, space, out: None)
    tuning.main(["report", "--tune", "classic", "--storage", f"sqlite:///{tmp_path}/mine.db"])
    written = (tmp_path / "mine.md").read_text().split("\n")  # named after its database: no round's report
    assert written[0] == f"# Tuning studies: classic (sqlite:///{tmp_path}/mine.db)"
    assert written[1:] == committed.decode().split("\n")[1:]  # the same studies, so the same table
    assert (ROOT / "results" / "tuning" / "classic.md").read_bytes() == committed
    # the round's own database given as --storage: the round's own report
    tuning.main(["report", "--tune", "classic", "--storage", "sqlite:///results/tuning/classic.db", "--out",
                 str(tmp_path / "own")])
    assert (tmp_path / "own" / "classic.md").read_bytes() == committed
    with pytest.raises(SystemExit):
        tuning.main(["report", "--tune", "classic", "--storage", "postgresql://somewhere/studies"])
    assert capsys.readouterr().err.endswith(
        "error: --storage postgresql://somewhere/studies is no SQLite file to write beside: give --out\n")


@pytest.mark.parametrize("value, override, written", [
    (None, "null", "null"),  # a choice of no target_kl: once 'None', a string the validator refused every time
    (True, "True", "true"), (3, "3", "3"), (1e-05, "1e-05", "1.0e-05"), ("ppo", "ppo", "ppo"),
    ([64, 64], "[64, 64]", "[64, 64]"),
    ("yes", "yes", '"yes"'), ("1e-3", "'1e-3'", '"1e-3"'), ("null", "'null'", '"null"'), ("it's", "'it\\'s'", "it's")])
def test_a_searched_value_is_given_to_its_trials_and_written_by_apply_as_the_value_it_is(value, override, written):
    """What a trial trains (its Hydra override) and what apply writes (YAML) read back as the value drawn, of its
    type: None is null, a string that would read as a number or a bool is quoted; numbers and plain strings keep
    the text they always had (the run directories of stored trials are named by it)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    assert tuning.override_value(value) == override and tuning.yaml_scalar(value) == written
    read = OverridesParser.create().parse_override(f"key={override}").value()
    assert type(read) is type(value) and read == value
    loaded = OmegaConf.to_container(OmegaConf.create(f"key: {written}"))["key"]
    assert type(loaded) is type(value) and loaded == value


def test_a_search_space_that_cannot_be_searched_is_refused_entry_by_entry(make_config):
    """Each entry a study could not search, one line naming it: not a range, bounds Optuna refuses, a key the
    config lacks, and a searched env.hparams value that a key typed on the command line stops the preset reading."""
    config = make_config(["algo=ppo", "env=CartPole", "algo.gae_lambda=0.9"])
    space = {"algo.ent_coef": [0.0, 0.01], "algo.clip_coef": {"low": 0.3, "high": 0.1},
             "algo.vf_coef": {"low": 0.0, "high": 1.0, "log": True}, "algo.gamma": {"low": 0.9, "high": "abc"},
             "algo.lrr": {"low": 1e-4, "high": 1e-2}, "env.hparams.gae_lambda": {"low": 0.8, "high": 0.99},
             "env.hparams.lr": {"low": 1e-4, "high": 1e-2, "log": True}, "algo.max_grad_norm": {"choices": [0.5, 1]},
             "env.hparams.update_epochs": {"low": 1, "high": 20, "int": True},
             "algo.num_minibatches": {"int": True, "low": 8}, "algo.norm_adv": {"choices": "ab"},
             "algo.clip_vloss": {"choices": [True, True]}, "env.hparams.num_minibatches": {"low": 0.5, "high": 4.5,
                                                                                             "int": True}}
    assert tuning.search_space_problems("spaces.ppo", space, config) == [
        "spaces.ppo.algo.ent_coef: give {low: .., high: ..} (with log: true or int: true) or {choices: [..]}, got "
        "[0.0, 0.01]",
        "spaces.ppo.algo.clip_coef: `low <= high` must hold, but got (low=0.3, high=0.1).",
        "spaces.ppo.algo.vf_coef: `low > 0` must hold for `log=True`, but got (low=0.0, high=1.0).",
        "spaces.ppo.algo.gamma: could not convert string to float: 'abc'",
        "spaces.ppo.algo.lrr: the run's config has no key algo.lrr",
        "spaces.ppo.env.hparams.gae_lambda: no key of algo=ppo reads env.hparams.gae_lambda: a value typed over the "
        "key that read it (as algo.lr=... replaces algo.lr's ${env.hparams.lr}) would train every trial on the typed "
        "value; drop that override, or search the algo key itself",
        "spaces.ppo.algo.num_minibatches: give low/high (float; int: true for integers) or choices, got {'int': True, "
        "'low': 8}",
        "spaces.ppo.algo.norm_adv: choices must be a non-empty list, got 'ab'",
        "spaces.ppo.algo.clip_vloss: choices repeat True",
        "spaces.ppo.env.hparams.num_minibatches: int: true takes whole bounds (an integer range would quietly round "
        "them), got low=0.5, high=4.5"]
    for pruner in ({"min_steps": 0, "reduction_factor": 3}, {"min_steps": 1000, "reduction_factor": 1}):
        with pytest.raises(SystemExit) as refused:  # the rungs would never reach the budget: it hung, growing
            tuning.rung_steps(pruner, 100_000)
        assert str(refused.value) == (
            f"config error: hydra.sweeper.pruner: min_steps must be >= 1 and reduction_factor >= 2 (successive "
            f"halving keeps 1 in reduction_factor at each rung), got min_steps={pruner['min_steps']}, "
            f"reduction_factor={pruner['reduction_factor']}")
    # keys read through env.tuned, in a list (outer optimizer's betas) and by oc.select (a key the round adds)
    outer = make_config(["hydra/sweeper=tune", "+tune=classic_pruned", "algo=outer_ppo", "env=CartPole"])
    assert tuning.search_space_problems("s", {"env.tuned.outer_ppo.beta1": {"low": 0.0, "high": 0.99},
                                              "env.tuned.outer_ppo.beta2": {"low": 0.9, "high": 0.9999}}, outer) == []
    # a value the probe cannot change by adding to it (infinite) is read all the same
    unclipped = make_config(["algo=ppo", "env=CartPole", "env.hparams.ent_coef=.inf"])
    assert tuning.search_space_problems("s", {"env.hparams.ent_coef": {"low": 0.0, "high": 0.1}}, unclipped) == []
    unset = make_config(["algo=ppo", "env=CartPole", "+env.tuned.ppo.temperature=???"])
    assert tuning.search_space_problems("s", {"env.tuned.ppo.temperature": {"low": 0.1, "high": 2.0}}, unset) == [
        "s.env.tuned.ppo.temperature: env.tuned.ppo.temperature has no value (???) to start the study from"]
    broken = make_config(["algo=ppo", "env=CartPole", "algo.lr=${env.hparams.nope}"])  # as a run says it
    assert tuning.search_space_problems("s", {}, broken) == [
        "config does not resolve: algo.lr: Interpolation key 'env.hparams.nope' not found"]
