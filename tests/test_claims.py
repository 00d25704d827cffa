"""The claims table: probability of improvement over PPO per task group, from stored runs."""

import numpy as np
import pandas as pd

from benchmarks.claims import claims_table, measure


FAMILIES = {"Pendulum": "classic_continuous", "CartPole": "classic", "RLHFPraise": "rlhf"}  # others: mujoco


def fake_run(env: str, algo: str, seed: int, final: float, family: str | None = None,
             evaluation: str = "sampled") -> dict:
    steps = [0, 50_000, 100_000]
    curve = pd.DataFrame({"env_steps": steps, "eval_return_mean": [0.0, final / 2, final]})
    family = family or FAMILIES.get(env, "mujoco")
    config = {"env": {"name": env, "family": family, "hparams": {}}, "algo": {"name": algo}}  # no tuned values
    if family == "rlhf" and evaluation is not None:  # a token task's evaluation (None: a run stored before the key)
        config["env"]["evaluation"] = {"kind": evaluation, "seed": 0}
    return {"env": env, "algo": algo, "seed": seed, "env_steps": steps[-1], "eval": curve, "config": config}


def test_a_candidate_better_on_every_seed_and_task_has_probability_one():
    runs = [fake_run(env, "ppo", s, 100.0 + s) for env in ("Hopper", "Walker2d") for s in range(3)]
    runs += [fake_run(env, "hp3o", s, 200.0 + s) for env in ("Hopper", "Walker2d") for s in range(3)]
    row = measure(runs, "hp3o", "continuous", "final")
    assert row["value"] == 1.0 and row["seeds"] == 3 and row["tasks"] == "Hopper, Walker2d"
    assert row["tuning"] == "hp3o: untuned; ppo: untuned"
    assert measure(runs, "ppo", "continuous", "final")["value"] == 0.5  # ties count half
    assert measure(runs, "hp3o", "discrete", "final") is None  # no discrete task ran
    two_seeds = [r for r in runs if not (r["env"] == "Walker2d" and r["algo"] == "hp3o" and r["seed"] == 2)]
    assert measure(two_seeds, "hp3o", "continuous", "final")["tasks"] == "Hopper"  # Walker2d: too few seeds


def test_variance_ratio_is_the_geometric_mean_of_per_task_seed_std_ratios():
    runs = [fake_run("Hopper", "ppo", s, v) for s, v in enumerate([0.0, 10.0, 20.0])]
    runs += [fake_run("Hopper", "hp3o", s, v) for s, v in enumerate([0.0, 5.0, 10.0])]
    runs += [fake_run("Pendulum", "ppo", s, v) for s, v in enumerate([0.0, 1.0, 2.0])]
    runs += [fake_run("Pendulum", "hp3o", s, v) for s, v in enumerate([0.0, 2.0, 4.0])]
    row = measure(runs, "hp3o", "continuous", "std")
    assert np.isclose(row["value"], 1.0)  # sqrt(0.5 * 2)
    table = claims_table(runs)
    assert set(table["preset"]) == {"hp3o"} and (table["seeds"] == 3).all()


def test_a_suite_without_runs_is_one_line_and_leaves_the_committed_table_alone(tmp_path, capsys):
    import pytest

    from benchmarks.claims import main as claims_main

    (tmp_path / "suite").mkdir()
    with pytest.raises(SystemExit) as exit_:
        claims_main([str(tmp_path / "suite"), "--out", str(tmp_path / "tables")])
    assert exit_.value.code == 2 and not (tmp_path / "tables").exists()
    assert capsys.readouterr().err.strip().endswith("no claim can be checked from " + str(tmp_path / "suite") +
                                                    " (no complete runs of a preset and of ppo on a common task)")


def test_token_tasks_are_a_group_of_their_own_never_discrete_control():
    runs = [fake_run("RLHFPraise", algo, s, (2.0 if algo == "hp3o" else 1.0) + s / 10)
            for algo in ("ppo", "hp3o") for s in range(3)]
    assert measure(runs, "hp3o", "discrete", "final") is None
    row = measure(runs, "hp3o", "rlhf", "auc")
    assert row["value"] == 1.0 and row["tasks"] == "RLHFPraise"
    assert set(claims_table(runs)["group"]) == {"rlhf"}


def test_token_task_claims_read_the_sampled_evaluation_only():
    def runs_of(evaluation):
        return [fake_run("RLHFPraise", algo, s, (2.0 if algo == "hp3o" else 1.0) + s / 10, evaluation=evaluation)
                for algo in ("ppo", "hp3o") for s in range(3)]

    assert measure(runs_of("sampled"), "hp3o", "rlhf", "final")["value"] == 1.0
    assert measure(runs_of("greedy"), "hp3o", "rlhf", "final") is None
    assert measure(runs_of(None), "hp3o", "rlhf", "final") is None  # stored before the sampled evaluation: greedy
    mixed = runs_of("greedy")[:3] + runs_of("sampled")[3:]  # ppo greedy, hp3o sampled: nothing to compare
    assert measure(mixed, "hp3o", "rlhf", "final") is None


def test_the_claims_command_says_how_many_greedy_token_task_runs_it_left_out(tmp_path, capsys, monkeypatch):
    import benchmarks.claims as claims

    runs = [fake_run("RLHFPraise", "ppo", s, 1.0, evaluation=None) for s in range(3)]
    runs += [fake_run("Hopper", algo, s, 1.0 + s) for algo in ("ppo", "hp3o") for s in range(3)]
    monkeypatch.setattr(claims, "load_runs", lambda suite: runs)
    monkeypatch.setattr(claims, "study_provenance", lambda config: None)
    (tmp_path / "suite").mkdir()
    claims.main([str(tmp_path / "suite"), "--out", str(tmp_path / "tables")])
    assert capsys.readouterr().err.strip() == ("left out: 3 token-task runs evaluated greedily (made before the "
                                               "sampled evaluation, docs/rlhf.md); rerun them to compare presets on "
                                               "token tasks")


def test_tasks_of_two_families_name_each_familys_study(monkeypatch):
    """HP3O's continuous-control group holds MuJoCo tasks and Pendulum, each tuned by its family's study:
    the row names both studies, never 'untuned'."""
    import benchmarks.claims as claims

    studies = {"mujoco": ("16 trials x 2 tasks x 1 seed x 300k steps", ("HalfCheetah", "Hopper")),
               "classic_continuous": ("16 trials x 2 tasks x 1 seed x 100k steps", ("CartPole", "Pendulum"))}
    monkeypatch.setattr(claims, "study_provenance", lambda config: studies[config["env"]["family"]])
    runs = [{"config": {"env": {"family": family}}} for family in ("mujoco", "classic_continuous", "mujoco")]
    tuning = claims.tuning_of(runs)
    assert tuning["text"] == ("16 trials x 2 tasks x 1 seed x 100k steps (CartPole+Pendulum) + "
                              "16 trials x 2 tasks x 1 seed x 300k steps (HalfCheetah+Hopper)")
    assert tuning["tasks"] == {"CartPole", "Pendulum", "HalfCheetah", "Hopper"}
    monkeypatch.setattr(claims, "study_provenance", lambda config: None if config["env"]["family"] == "mujoco"
                        else studies["classic_continuous"])
    assert claims.tuning_of(runs) is None  # one untuned family makes the group untuned


def test_a_task_lands_in_the_group_of_its_own_family_with_no_list_to_update():
    """A MuJoCo task the suite never heard of (added as docs/extending.md says, under env_family mujoco) counts as
    MuJoCo and continuous control, never as discrete; a new classic task with discrete actions counts as discrete."""
    runs = [fake_run("Swimmer2", algo, s, (2.0 if algo == "hp3o" else 1.0) + s) for algo in ("ppo", "hp3o")
            for s in range(3)]
    runs += [fake_run("LunarLander", algo, s, (2.0 if algo == "hp3o" else 1.0) + s, family="classic")
             for algo in ("ppo", "hp3o") for s in range(3)]
    assert measure(runs, "hp3o", "mujoco", "final")["tasks"] == "Swimmer2"
    assert measure(runs, "hp3o", "continuous", "final")["tasks"] == "Swimmer2"
    assert measure(runs, "hp3o", "discrete", "final")["tasks"] == "LunarLander"


def test_the_committed_claims_table_regenerates_byte_for_byte_from_the_committed_runs(tmp_path):
    """No training: benchmarks.claims over the committed tuned suites writes what results/tables holds."""
    import subprocess
    import sys

    from tests.conftest import ROOT

    result = subprocess.run([sys.executable, "-m", "benchmarks.claims", "--out", str(tmp_path)], cwd=ROOT,
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    for name in ("claims.md", "claims.csv"):
        assert (tmp_path / name).read_bytes() == (ROOT / "results" / "tables" / name).read_bytes(), name
