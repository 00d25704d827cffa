"""The claims table: probability of improvement over PPO per task group, from stored runs."""

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from benchmarks.claims import GROUP_FAMILIES, claims_markdown, claims_table, measure, paper_verdict, verdict
from benchmarks.statistics import Z95, detectable_improvement, detectable_std_ratio, seed_std_ratio
from tests.commands import run_python


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
    row = measure(runs, "hp3o", "mujoco", "final")
    assert row["value"] == 1.0 and row["seeds"] == 3 and row["tasks"] == "Hopper, Walker2d"
    assert row["tuning"] == "hp3o: untuned; ppo: untuned" and (row["study"], row["ppo_study"]) == ("untuned",) * 2
    assert measure(runs, "ppo", "mujoco", "final")["value"] == 0.5  # ties count half
    assert measure(runs, "hp3o", "discrete", "final") is None  # no discrete task ran
    two_seeds = [r for r in runs if not (r["env"] == "Walker2d" and r["algo"] == "hp3o" and r["seed"] == 2)]
    assert measure(two_seeds, "hp3o", "mujoco", "final")["tasks"] == "Hopper"  # Walker2d: too few seeds
    longer = [{**r, "eval": r["eval"].assign(env_steps=[0, 100_000, 200_000])} if (r["env"], r["algo"]) ==
              ("Walker2d", "hp3o") else r for r in runs]
    assert measure(longer, "hp3o", "mujoco", "final")["tasks"] == "Hopper"  # Walker2d: not PPO's budget
    coarser = [{**r, "eval": r["eval"].iloc[[0, 2]].reset_index(drop=True)} if (r["env"], r["algo"]) ==
               ("Walker2d", "hp3o") else r for r in runs]  # the same budget, evaluated at its start and end only
    assert measure(coarser, "hp3o", "mujoco", "auc")["tasks"] == "Hopper"  # Walker2d: areas of other trapezoids
    assert measure(coarser, "hp3o", "mujoco", "final")["tasks"] == "Hopper, Walker2d"  # its final return compares
    beside = runs + [{**fake_run("Hopper", "ppo_kl", s, 50.0), "env_steps": 1_000_000} for s in range(3)]
    assert measure(beside, "hp3o", "mujoco", "final")["env_steps"] == "100k"  # the two compared, not a third preset


def test_variance_ratio_is_the_geometric_mean_of_per_task_seed_std_ratios():
    runs = [fake_run("Hopper", "ppo", s, v) for s, v in enumerate([0.0, 10.0, 20.0])]
    runs += [fake_run("Hopper", "hp3o", s, v) for s, v in enumerate([0.0, 5.0, 10.0])]
    runs += [fake_run("Walker2d", "ppo", s, v) for s, v in enumerate([0.0, 1.0, 2.0])]
    runs += [fake_run("Walker2d", "hp3o", s, v) for s, v in enumerate([0.0, 2.0, 4.0])]
    row = measure(runs, "hp3o", "mujoco", "std")
    assert np.isclose(row["value"], 1.0) and row["per_task"] == "0.50, 2.00"  # sqrt(0.5 * 2)
    assert row["ci_low"] < 1 < row["ci_high"] and math.isnan(row["detectable"])  # none at 3 seeds: below
    table = claims_table(runs)
    assert set(table["preset"]) == {"hp3o"} and (table["seeds"] == 3).all()
    assert "none at 3 seeds over 2 tasks (a resample without spread leaves the interval unbounded)" in \
        claims_markdown(table, [])


def test_the_variance_ratio_interval_resamples_seeds_within_each_task():
    """Known spreads: the candidate's seeds are PPO's halved about their mean, on 2 tasks of 40 seeds each, so every
    per-task ratio is exactly 0.5 and the interval, resampling each side's seeds within each task, lies below 1 around
    0.5; alike spreads give an interval across 1; a task where neither side spreads counts as equal (ratio 1)."""
    rng = np.random.default_rng(1)
    ppo = rng.normal(100.0, 10.0, size=(40, 2))
    half = ppo.mean(axis=0) + (ppo - ppo.mean(axis=0)) / 2
    point, low, high, per_task = seed_std_ratio(half, ppo)
    assert np.allclose(per_task, 0.5) and np.isclose(point, 0.5)
    # normal theory: log ratio sd sqrt(1/(n-1)/T) = 0.113 with both sides drawn, so 0.5 x e^(+-0.222) = [0.40, 0.62]
    assert 0.36 < low < 0.42 and 0.60 < high < 0.70, (low, high)
    assert seed_std_ratio(half, ppo)[:3] == (point, low, high)  # reproducible: a fixed random state
    point, low, high, _ = seed_std_ratio(ppo[:, ::-1], ppo)
    assert low < 1 < high
    flat = np.full((5, 1), 500.0)
    assert seed_std_ratio(flat, flat)[:3] == (1.0, 1.0, 1.0)
    # in the table, a task saturated on both sides (every seed 500) has no spread to compare and leaves the row
    runs = [fake_run("CartPole", algo, s, 500.0) for algo in ("ppo", "hp3o") for s in range(3)]
    runs += [fake_run("Acrobot", algo, s, -100.0 - s * (2 if algo == "hp3o" else 1), family="classic")
             for algo in ("ppo", "hp3o") for s in range(3)]
    assert measure(runs, "hp3o", "discrete", "std")["tasks"] == "Acrobot"


def test_families_are_never_pooled_in_one_row():
    """MuJoCo tasks and Pendulum (classic control, continuous) are both continuous control, yet each family is a
    row of its own: every group is one family."""
    assert all(len(families) == 1 for families in GROUP_FAMILIES.values())
    runs = [fake_run(env, algo, s, (2.0 if algo == "hp3o" else 1.0) + s) for env in ("Hopper", "Walker2d", "Pendulum")
            for algo in ("ppo", "hp3o") for s in range(3)]
    table = claims_table(runs)
    assert set(table["group"]) == {"mujoco", "classic_continuous"}
    assert set(table.loc[table["group"] == "mujoco", "tasks"]) == {"Hopper, Walker2d"}
    assert set(table.loc[table["group"] == "classic_continuous", "tasks"]) == {"Pendulum"}


def test_each_row_comes_from_the_first_suite_where_its_preset_ran_every_task_and_suites_are_never_pooled():
    """A newer suite (listed first) where hp3o has run one of PPO's two tasks, an older one where it ran both: hp3o's
    rows come from the older suite until the newer has every task; outer_ppo_lr, on no common task in the newer
    suite, from the older; seeds are never taken from both."""
    def suite(algo_tasks: dict, shift: float) -> list[dict]:
        return [fake_run(env, algo, s, shift + (10.0 if algo != "ppo" else 0.0) + s)
                for algo, tasks in algo_tasks.items() for env in tasks for s in range(3)]

    older = suite({"ppo": ["Hopper", "Walker2d"], "hp3o": ["Hopper", "Walker2d"],
                   "outer_ppo_lr": ["Hopper", "Walker2d"]}, shift=0.0)
    newer = suite({"ppo": ["Hopper", "Walker2d"], "hp3o": ["Hopper"]}, shift=-1000.0)
    table = claims_table({"newer": newer, "older": older})
    assert set(table["suite"]) == {"older"} and set(table["tasks"]) == {"Hopper, Walker2d"}
    assert (table["seeds"] == 3).all()
    newer += suite({"hp3o": ["Walker2d"]}, shift=-1000.0)
    table = claims_table({"newer": newer, "older": older})
    assert set(table.loc[table["preset"] == "hp3o", "suite"]) == {"newer"}
    assert set(table.loc[table["preset"] == "outer_ppo_lr", "suite"]) == {"older"}
    alone = claims_table({"newer": [r for r in newer if r["env"] == "Hopper"]})  # no complete one: the first common
    assert set(alone.loc[alone["preset"] == "hp3o", "tasks"]) == {"Hopper"}


def test_the_verdict_against_the_paper_follows_the_interval_and_what_the_paper_reports():
    above, spans, below = ({"ci_low": low, "ci_high": high} for low, high in ((0.6, 0.9), (0.3, 0.7), (0.1, 0.4)))
    assert [paper_verdict("gain", row, "final") for row in (above, spans, below)] == [
        "consistent", "not reproduced", "contradicted"]
    assert [paper_verdict("no gain", row, "auc") for row in (above, spans, below)] == [
        "contradicted", "consistent", "consistent"]  # a loss is no gain either
    assert [verdict(row, "final") for row in (above, spans, below)] == [
        "better (CI above 0.5)", "no difference established (CI spans 0.5)", "worse (CI below 0.5)"]
    lower, across, higher = ({"ci_low": low, "ci_high": high} for low, high in ((0.2, 0.9), (0.7, 1.3), (1.1, 3.0)))
    assert [paper_verdict("lower spread", row, "std") for row in (lower, across, higher)] == [
        "consistent", "not reproduced", "contradicted"]
    assert verdict(lower, "std") == "lower variance (CI below 1)" and verdict(higher, "std").startswith("higher")
    assert paper_verdict(None, above, "final") == "not a paper claim"
    assert paper_verdict("context", below, "final") == "not claimed (context)"


def test_the_detectable_effect_at_a_designs_seeds_and_tasks():
    """0.5 + 1.96 sd of P(improvement) under no difference. By hand: 5 seeds, 3 tasks, variance 11 / (12 x 25 x 3)
    = 0.012222, sd 0.11055, so 0.5 + 0.21668 = 0.71668; the std ratio exp(-1.96 / sqrt(4 x 3)) = 0.5679. The null
    variance itself, (2n+1) / (12 n^2), is checked against every split of 2 + 2 ranks."""
    import itertools

    assert np.isclose(detectable_improvement(5, 3), 0.71668, atol=1e-5)
    assert np.isclose(detectable_improvement(5, 1), 0.87530, atol=1e-5)
    assert np.isclose(detectable_std_ratio(5, 3), 0.56790, atol=1e-5)
    # So few seeds that over 2.5% of the bootstrap's resamples draw one seed n times on some task, a side without
    # spread: the interval is [0, inf] whatever the runs (here a spread a hundred times smaller), so none is
    # detectable, where the normal formula promised 0.25
    ppo = np.array([[0.0], [100.0], [200.0]])
    assert seed_std_ratio(ppo / 100, ppo)[1:3] == (0.0, math.inf)
    assert math.isnan(detectable_std_ratio(3, 1)) and math.isnan(detectable_std_ratio(4, 2))
    assert np.isclose(detectable_std_ratio(4, 1), np.exp(-Z95 / np.sqrt(3)))  # 4^-3 = 1.6% of resamples: bounded
    n = 2
    shares = [sum(x > y for x in ours for y in set(range(2 * n)) - set(ours)) / n**2
              for ours in itertools.combinations(range(2 * n), n)]
    assert np.isclose(np.var(shares), (2 * n + 1) / (12 * n**2))  # 0.104167
    runs = [fake_run(env, algo, s, 1.0 + s) for env in ("Hopper", "Walker2d", "Ant") for algo in ("ppo", "hp3o")
            for s in range(5)]
    assert np.isclose(measure(runs, "hp3o", "mujoco", "final")["detectable"], 0.71668, atol=1e-5)


def test_a_suite_without_runs_is_one_line_and_leaves_the_committed_table_alone(tmp_path, capsys):
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
    monkeypatch.setattr(claims, "study_of", lambda config: None)
    (tmp_path / "suite").mkdir()
    claims.main([str(tmp_path / "suite"), "--out", str(tmp_path / "tables")])
    assert capsys.readouterr().err.strip() == ("left out: 3 token-task runs evaluated greedily (made before the "
                                               "sampled evaluation, docs/rlhf.md); rerun them to compare presets on "
                                               "token tasks")


def test_the_header_states_each_studys_budget_once_and_each_row_the_values_its_runs_used(monkeypatch):
    """Every row names its study and the values at the keys that study tuned, read from the runs' configs; the
    budget (trials x tasks x seeds x steps) appears once, in the header, with PPO's core; a count of comparisons."""
    import benchmarks.claims as claims

    budgets = {"mujoco": ("mujoco_300k", "16 trials x 2 tasks x 1 seed x 300k steps", ("HalfCheetah", "Hopper")),
               "classic_continuous": ("classic", "16 trials x 2 tasks x 1 seed x 100k steps", ("CartPole", "Pendulum"))}

    def study_of(config):
        name, text, tasks = budgets[config["env"]["family"]]
        keys = ("env.hparams.lr",) if config["algo"]["name"] == "ppo" else ("env.tuned.hp3o.buffer_size",)
        return {"study": name, "text": text, "tasks": tasks, "keys": keys, "budget": f"{text} ({', '.join(tasks)})"}

    monkeypatch.setattr(claims, "study_of", study_of)
    runs = [fake_run(env, algo, s, (2.0 if algo == "hp3o" else 1.0) + s) for env in ("Hopper", "Walker2d", "Pendulum")
            for algo in ("ppo", "hp3o") for s in range(3)]
    for run in runs:
        run["config"]["env"]["hparams"]["lr"] = 3e-4 if run["env"] != "Pendulum" else 1e-3
        run["config"]["env"]["tuned"] = {"hp3o": {"buffer_size": 20 if run["env"] != "Pendulum" else 10}}
    table = claims.claims_table(runs)
    mujoco = table[(table["group"] == "mujoco") & (table["metric"] == "auc")].iloc[0]
    assert (mujoco["tasks"], mujoco["values_tested"], mujoco["ppo_values"], mujoco["study"]) == (
        "Hopper*, Walker2d", "buffer_size 20", "lr 0.0003", "mujoco_300k")
    assert table.loc[table["group"] == "classic_continuous", "values_tested"].eq("buffer_size 10").all()
    text = claims.claims_markdown(table, [Path("results/runs/suite")])
    assert text.count("300k steps") == 1 and "tuning (candidate; PPO)" not in text
    assert ("- results/tuning/mujoco_300k.db (MuJoCo): 16 trials x 2 tasks x 1 seed x 300k steps (HalfCheetah, "
            "Hopper) each for ppo, hp3o; PPO's core, under every preset: lr 0.0003\n") in text
    assert f"this table makes {len(table)} (one interval per row)" in text and len(table) == 6
    # runs of two families (benchmarks.verdict may pass any): both studies named, never 'untuned'
    assert claims.tuning_of([r for r in runs if r["algo"] == "hp3o"])["text"] == (
        "16 trials x 2 tasks x 1 seed x 100k steps (CartPole+Pendulum) + "
        "16 trials x 2 tasks x 1 seed x 300k steps (HalfCheetah+Hopper)")
    monkeypatch.setattr(claims, "study_of", lambda config: None if config["env"]["family"] == "mujoco"
                        else study_of(config))
    assert claims.tuning_of(runs) is None  # one untuned family makes the runs untuned
    assert claims.values_tested([r for r in runs if r["env"] == "Hopper" and r["algo"] == "hp3o"], None) == (
        "untuned: buffer_size 20")


def test_a_task_lands_in_the_group_of_its_own_family_with_no_list_to_update():
    """A MuJoCo task the suite never heard of (added as docs/extending.md says, under env_family mujoco) counts as
    MuJoCo, never as classic control; a new classic task with discrete actions counts as discrete."""
    runs = [fake_run("Swimmer2", algo, s, (2.0 if algo == "hp3o" else 1.0) + s) for algo in ("ppo", "hp3o")
            for s in range(3)]
    runs += [fake_run("LunarLander", algo, s, (2.0 if algo == "hp3o" else 1.0) + s, family="classic")
             for algo in ("ppo", "hp3o") for s in range(3)]
    assert measure(runs, "hp3o", "mujoco", "final")["tasks"] == "Swimmer2"
    assert measure(runs, "hp3o", "classic_continuous", "final") is None
    assert measure(runs, "hp3o", "discrete", "final")["tasks"] == "LunarLander"


@pytest.mark.slow
def test_the_committed_claims_table_regenerates_byte_for_byte_from_the_committed_runs(tmp_path):
    """No training: benchmarks.claims over the committed tuned suites writes what results/tables holds."""
    import sys

    from tests.conftest import ROOT

    result = run_python([sys.executable, "-m", "benchmarks.claims", "--out", str(tmp_path)], cwd=ROOT,
                        capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    for name in ("claims.md", "claims.csv"):
        assert (tmp_path / name).read_bytes() == (ROOT / "results" / "tables" / name).read_bytes(), name


def test_a_variance_ratio_bound_decided_by_a_side_without_spread_is_unbounded_not_a_huge_number():
    """Three of five PPO seeds at the floor: a fifth of the resamples draw no PPO spread at all, so the upper bound
    of the candidate's std over PPO's is infinite (the clip's e^50 once printed as 5e21), the lower one finite."""
    ppo = np.array([[-500.0], [-500.0], [-500.0], [-81.0], [-84.0]])
    candidate = np.array([[-90.0], [-85.0], [-500.0], [-80.0], [-88.0]])
    point, low, high, _ = seed_std_ratio(candidate, ppo)
    assert high == math.inf and 0 < low < point < 10
    assert seed_std_ratio(ppo, candidate)[1] == 0.0  # and the other way round, the lower bound is 0
    # PPO's seeds all at the floor on one of three tasks: that task's ratio, and the geometric mean, are infinite
    # (the clip once gave a point estimate of e^(50/3), 1.7e7); the other way round 0; both kinds at once undefined
    spread = np.array([[1.0, 2.0, 3.0], [2.0, 4.0, 1.0], [3.0, 1.0, 2.0]])
    floor = spread.copy()
    floor[:, 0] = -500.0
    point, _, _, per_task = seed_std_ratio(spread, floor)
    assert point == math.inf and per_task[0] == math.inf and np.isfinite(per_task[1:]).all()
    point, _, _, per_task = seed_std_ratio(floor, spread)
    assert point == 0.0 and per_task[0] == 0.0
    both = spread.copy()
    both[:, 1] = -500.0
    assert math.isnan(seed_std_ratio(both, floor)[0])
